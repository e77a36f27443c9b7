"""`python -m train [overrides] [-m]`: compose conf/, check (train/checks/gate.py, before Hydra writes), then plan, train
here, or launch."""
import os
import sys

import hydra
from omegaconf import DictConfig

import train  # noqa: F401  (registers resolvers before composing)
from train.config.compose import command_line


@hydra.main(config_path="../conf", config_name="train", version_base=None)
def main(cfg: DictConfig):
    # Checked (and planned) already, before Hydra wrote anything: train/checks/gate.py.
    from common.errors import UserError
    from train.checkpoint.resume import FolderInUse
    from train.task.main import run  # the heavy imports (torch, llm-foundry) start here
    from train.task.shards import DamagedShard, NotMounted, OtherData

    try:
        return run(cfg)
    except UserError as err:  # key / problem / fix, no traceback: refused at the start, or stopped in training
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # a sweep job: its summary shows the error
        print(err, file=sys.stderr)
        # 2: refused before training (as the checks refuse); 1: a run that stopped (a non-finite loss, a full disk)
        sys.exit(2 if isinstance(err, (FolderInUse, DamagedShard, NotMounted, OtherData)) else 1)


if __name__ == "__main__":
    # Submission scripts, submitit's pickles, `.hydra/` and multirun.yaml hold job commands and the whole config:
    # nothing this command (or a job it starts: Slurm and submitit pass the umask on) writes is world-readable.
    os.umask(os.umask(0o027) | 0o027)
    sys.argv[1:] = command_line(sys.argv[1:])
    from common.plugins import scan_or_say

    scan_or_say()  # a broken Hydra plugin installed here is named, not Hydra's scan traceback
    from common.compat import patch_hydra_compose_once_per_command
    from train.checks.gate import before_hydra

    patch_hydra_compose_once_per_command(sys.argv[1:])

    before_hydra(sys.argv[1:])  # what Hydra itself refuses, before and as it composes: key / problem / fix (exit 2)
    main()
