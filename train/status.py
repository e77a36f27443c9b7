"""`python -m train.status [SWEEP_FOLDER] [--watch [SECONDS]]`: where every point of a training sweep stands,
from anywhere (hydra_plugins/pretrain_launcher/sweep_status.py): Slurm state, requeues, step, loss, tokens/s, MFU,
ETA and log per point; (re)writes the sweep's summary.md and summary.csv. Without a folder: the newest sweep
under the local storage preset's output root (`$PRETRAIN_ROOT/outputs`, or `./runs/outputs`)."""
import os
import sys
from pathlib import Path

from hydra_plugins.pretrain_launcher.sweep_status import main, newest


def _latest() -> Path:
    return newest(Path(os.path.abspath(os.environ.get("PRETRAIN_ROOT", "runs"))) / "outputs" / "sweeps")


if __name__ == "__main__":
    sys.exit(main("python -m train.status", _latest))
