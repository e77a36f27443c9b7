"""`python -m data_prep dataset=c4 input=... out_root=... tokenizer=...` (plain: every part here, then merge)
`python -m data_prep -m part=0,1,2,3 num_parts=4 ...` (one job per part through the sweep launcher:
data_prep/sweep_app.py)."""
import sys
import time

_STARTED = time.perf_counter()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from common.help import register as register_help  # noqa: E402
from data_prep.errors import DataPrepError, write_error  # noqa: E402

register_help()


def _fail(err: Exception, message: str, code: int) -> None:
    """A plain run prints the message and exits; a sweep's part raises, so that the launcher's summary and the
    command's exit status show the part as failed, with this message as its error."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.get().mode == RunMode.MULTIRUN:
        raise err
    print(message, file=sys.stderr)
    sys.exit(code)


@hydra.main(config_path="../conf", config_name="data_prep", version_base=None)
def main(cfg: DictConfig):
    from data_prep.app import run

    try:
        return run(cfg, started=_STARTED)  # the merged dataset's summary, from the part that merged
    except DataPrepError as err:
        _fail(err, str(err), 2)
    except OSError as err:  # disk full, permissions changed mid-run: say which file, not a traceback
        full = write_error(err.filename or cfg.get("out_root"), err)  # writes not wrapped in errors.writing
        _fail(full or err, str(full) if full else f"data_prep: {err.filename or ''}: {err.strerror or err}",
              2 if full else 1)


if __name__ == "__main__":
    import os

    os.umask(os.umask(0o027) | 0o027)  # its plans, sweep scripts and pickles are not world-readable
    from common.plugins import scan_or_say

    scan_or_say()  # a broken Hydra plugin installed here is named, not Hydra's scan traceback
    from common.help import one_command

    two = one_command(sys.argv[1:], "`--cfg job` without -m shows the config of one run")
    if two:  # Hydra's own refusal is a traceback
        print(DataPrepError(problems=two), file=sys.stderr)
        sys.exit(2)
    from common.compat import patch_hydra_compose_once_per_command

    patch_hydra_compose_once_per_command(sys.argv[1:])
    main()
