"""`python -m train.status [SWEEP_FOLDER] [--watch [SECONDS]]`: where every point of a training sweep stands,
from anywhere (common/sweep/status.py): Slurm state, requeues, step, loss, tokens/s, MFU,
goodput (train/task/goodput.py), ETA and log per point; (re)writes the sweep's summary.md and summary.csv.
Without a folder: the newest sweep under the storage's output root: the local preset's (`$PRETRAIN_ROOT/outputs`, or `./runs/outputs`), or the one
the training command's storage overrides name (`python -m train.status storage=amlfs storage.root=/lustre/x`)."""
import sys

from common.sweep.status import main, newest
from train.config.storage_args import roots, take

if __name__ == "__main__":
    argv, storage = take(sys.argv[1:])
    sys.exit(main("python -m train.status", lambda: newest(roots(storage)[1] / "sweeps"), argv))
