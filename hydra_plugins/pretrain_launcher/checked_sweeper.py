"""The sweeper that checks every point before anything is written, as Hydra finds it: its settings
(`hydra/sweeper: checked`, conf/hydra/sweeper/basic.yaml) and its class, Hydra's BasicSweeper with the work of
common/sweep/sweeper.py over it."""
from dataclasses import dataclass
from typing import Dict, Optional

from hydra.core.config_store import ConfigStore

from common.compat import hydra_basic_sweeper
from common.sweep.sweeper import CheckedSweep


@dataclass
class CheckedSweeperConf:
    _target_: str = "hydra_plugins.pretrain_launcher.checked_sweeper.CheckedSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="checked", node=CheckedSweeperConf, provider="pretrain")


class CheckedSweeper(CheckedSweep, hydra_basic_sweeper()):
    pass
