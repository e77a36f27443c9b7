"""Hydra callback for -m sweeps: validate once before any job is launched (bad input launches and writes
nothing). Each part's own settings are checked by the launcher's hook (data_prep/sweep_app.py), which also
prints the merged dataset's summary at the end of a sweep it waited for."""
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ValidateBeforeLaunch(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Sweep values (part=0,1,2,3) are not applied to this config; everything common to the jobs is.
        from data_prep.app import prepare
        from data_prep.errors import DataPrepError

        try:
            prepare(config)
        except DataPrepError as err:
            print(err, file=sys.stderr)
            sys.exit(2)
