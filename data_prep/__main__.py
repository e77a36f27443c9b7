"""`python -m data_prep dataset=c4 input=... out_root=... tokenizer=...` (plain: every part here, then merge)
`python -m data_prep ... num_parts=4 -m part=0,1,2,3` (one job per part through hydra/launcher)."""
import sys
import time

_STARTED = time.perf_counter()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from data_prep.errors import DataPrepError  # noqa: E402


@hydra.main(config_path="../conf", config_name="data_prep", version_base=None)
def main(cfg: DictConfig):
    from data_prep.app import run

    try:
        run(cfg, started=_STARTED)
    except DataPrepError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    except OSError as err:  # disk full, permissions changed mid-run: say which file, not a traceback
        print(f"data_prep: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
