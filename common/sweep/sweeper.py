"""Hydra's basic sweeper (the command line's sweeps and `hydra.sweeper.params`), with every point checked before
anything is written.

BasicSweeper writes the sweep folder's `multirun.yaml`, then composes and launches one batch at a time. This one
first hands every point of every batch to the launcher's `prepare` (composed once, checked together, planned with
`plan=true`): a refused sweep or a plan writes nothing. Then it launches the batches as BasicSweeper does, and
ends the command with the app's exit status if a point did not complete (the launcher has printed why).

Hydra's plugin class, `CheckedSweeper` (`hydra/sweeper: basic`'s `_target_`), puts this over BasicSweeper, whose
`split_arguments`, `_parse_config` (common/compat.py), `max_batch_size`, `config` and `launcher` it uses.
"""
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from common.compat import hydra_basic_sweeper_params


class CheckedSweep:
    def sweep(self, arguments: list) -> Any:
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        batches = self.split_arguments(parser.parse_overrides(hydra_basic_sweeper_params(self) + list(arguments)),
                                       self.max_batch_size)
        prepare = getattr(self.launcher, "prepare", None)
        if prepare is not None:  # every point, before anything is written (may exit: refused, or a plan shown)
            prepare([o for batch in batches for o in batch], 0)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, first = [], 0
        for batch in batches:
            returns.append(self.launcher.launch(batch, initial_job_idx=first))
            first += len(batch)
        if any(r.status == JobStatus.FAILED for results in returns for r in results):
            sys.exit(getattr(getattr(self.launcher, "app", None), "failed_exit", 1))
        if getattr(self.launcher, "failed_checks", False):
            sys.exit(1)
        return returns
