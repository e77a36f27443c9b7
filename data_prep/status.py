"""`python -m data_prep.status SWEEP_FOLDER [--watch [SECONDS]]`: where every part of a data_prep sweep stands
(common/sweep/status.py); the folder is the one the submission printed
(`<out_root>/.data_prep_jobs/<split>/<time>`)."""
import sys

from common.errors import UserError
from common.sweep.status import main


def _latest():
    raise UserError("sweep", "data_prep sweeps live beside their dataset", "pass the folder the submission printed "
                    "(<out_root>/.data_prep_jobs/<split>/<time>)")


if __name__ == "__main__":
    sys.exit(main("python -m data_prep.status", _latest))
