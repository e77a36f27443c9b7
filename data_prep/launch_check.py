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
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from data_prep.app import prepare
        from data_prep.errors import DataPrepError

        try:
            swept = {o.key_or_group for o in OverridesParser.create().parse_overrides(
                list(config.hydra.overrides.task)) if o.is_sweep_override()}
            if "input" in swept:  # each point a dataset of its own files, all in one out_root: never one dataset
                raise DataPrepError("input", "is swept (-m input=A,B): each point would prepare its own files into "
                                    "the same out_root, as separate runs that refuse each other's folder",
                                    "give the files as one list, quoted for the shell: 'input=[A,B]' (and -m "
                                    "'part=range(0,N)' num_parts=N to spread them over jobs)")
            prepare(config)
        except DataPrepError as err:
            print(err, file=sys.stderr)
            sys.exit(2)
