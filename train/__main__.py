"""`python -m train [overrides] [-m]`: compose conf/, check (train/checks/gate.py, before Hydra writes), then plan, train
here, or launch."""
import os
import sys

import hydra
from omegaconf import DictConfig

import train  # noqa: F401  (registers resolvers before composing)
from common.paths import CONF
from train.config.compose import command_line


# conf/ by its absolute path: the same folder whether this module runs as `python -m train` or is imported (cli)
@hydra.main(config_path=str(CONF), config_name="train", version_base=None)
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


def cli(args: list) -> None:
    """The command `python -m train ARGS`, in this process: the command line as Hydra reads it, checked by the gate
    (before_hydra), then Hydra's main (a refusal or a look exits through SystemExit, as the command does). Hydra's
    patches made for this command line are undone as it returns (the tests run many command lines in one process)."""
    from common.plugins import scan_or_say

    args = sys.argv[1:] = command_line(args)  # what Hydra's main reads
    scan_or_say()  # a broken Hydra plugin installed here is named, not Hydra's scan traceback
    from common.compat import patch_hydra_compose_once_per_command
    from train.checks.gate import before_hydra

    undo = [patch_hydra_compose_once_per_command(args)]
    try:
        # what Hydra itself refuses, before and as it composes: key / problem / fix (exit 2)
        undo.append(before_hydra(args))
        main()
    finally:
        for step in reversed(undo):
            step()


if __name__ == "__main__":
    # Submission scripts, submitit's pickles, `.hydra/` and multirun.yaml hold job commands and the whole config:
    # nothing this command (or a job it starts: Slurm and submitit pass the umask on) writes is world-readable.
    os.umask(os.umask(0o027) | 0o027)
    cli(sys.argv[1:])
