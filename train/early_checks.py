"""Checks that must run before Hydra writes anything.

Hydra creates a plain run's folder (`<storage>/outputs/<run_name>/.hydra/`, with every override in it) before the
task function starts: a run_name like `../../x` would already have made a folder outside the storage root, and a
credential in `cluster.env` would already be on disk. A Hydra callback's `on_run_start` runs before that.
"""
import sys

from hydra.experimental.callback import Callback


class RefuseBeforeWriting(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        from train.validate import ConfigError, check_credentials, check_shell_safety

        HydraConfig.instance().set_config(config)  # as run_job does next: `${run_id:...}` reads the overrides
        try:
            check_credentials(config)
            check_shell_safety(config)
        except ConfigError as err:
            print(err, file=sys.stderr)
            sys.exit(2)
