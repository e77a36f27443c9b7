"""`python -m data_prep dataset=c4 input=... out_root=... tokenizer=...` (plain: every part here, then merge)
`python -m data_prep -m part=0,1,2,3 num_parts=4 ...` (one job per part through hydra/launcher)."""
import sys
import time

_STARTED = time.perf_counter()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from common.help import register as register_help  # noqa: E402
from data_prep.errors import DataPrepError, write_error  # noqa: E402

register_help()

ERROR_FILE = "data_prep_error.txt"  # a failed sweep job's message, collected by launch_check


def _fail(message: str, code: int) -> None:
    print(message, file=sys.stderr)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # A job that exits leaves the launcher a traceback about a missing result; this message is the news.
        from pathlib import Path

        try:
            Path(hydra_cfg.runtime.output_dir, ERROR_FILE).write_text(message + "\n")
        except OSError:  # the disk that is full may be this one: the message is in the job's log already
            pass
        return
    sys.exit(code)


@hydra.main(config_path="../conf", config_name="data_prep", version_base=None)
def main(cfg: DictConfig):
    from data_prep.app import run

    try:
        run(cfg, started=_STARTED)
    except DataPrepError as err:
        _fail(str(err), 2)
    except OSError as err:  # disk full, permissions changed mid-run: say which file, not a traceback
        full = write_error(err.filename or cfg.get("out_root"), err)  # writes not wrapped in errors.writing
        _fail(str(full) if full else f"data_prep: {err.filename or ''}: {err.strerror or err}", 2 if full else 1)


if __name__ == "__main__":
    import os

    os.umask(os.umask(0o027) | 0o027)  # its plans, sweep scripts and pickles are not world-readable
    main()
