"""The `-m` launcher as Hydra finds it: its settings (`hydra/launcher`: pretrain, data_prep_local|slurm,
sweep_local|slurm) and its class, hydra-submitit-launcher's BaseSubmititLauncher with the work of
common/sweep/launch.py over it. Only what Hydra's plugin scan must find lives here (the scan executes this module
again in place, so it defines nothing another module holds on to)."""
from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore

from common.sweep.launch import SweepLaunch
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher


@dataclass
class SweepLauncherConf:
    _target_: str = "hydra_plugins.pretrain_launcher.pretrain_launcher.SweepLauncher"
    app: Optional[str] = None  # a SweepApp subclass (common/sweep/contract.py); null: any Hydra task (the generic app)
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    poll_s: float = 2.0  # how often the waiting launcher looks at its jobs
    # Resources for apps that take them from here (the generic app, data_prep: one task per point), in
    # hydra-submitit-launcher's names (`hydra.launcher.cpus_per_task=64`). Training's come from each point's
    # cluster group.
    scheduler: str = "local"  # local | slurm
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    timeout_min: int = 60
    max_num_timeout: int = 0  # requeues after a time limit or preemption
    signal_delay_s: int = 120
    array_parallelism: int = 256
    setup: List[str] = field(default_factory=list)  # shell lines before srun
    wait: bool = False  # Slurm: wait for every point (a local sweep always does)
    summary_partition: Optional[str] = None  # where the summary job runs; null: partition


_store = ConfigStore.instance()
_store.store(group="hydra/launcher", name="pretrain", provider="pretrain",
             node=SweepLauncherConf(app="train.launch.sweep_app.TrainApp"))
for _scheduler in ("local", "slurm"):
    _store.store(group="hydra/launcher", name=f"data_prep_{_scheduler}", provider="pretrain",
                 node=SweepLauncherConf(app="data_prep.sweep_app.DataPrepApp", scheduler=_scheduler))
    _store.store(group="hydra/launcher", name=f"sweep_{_scheduler}", provider="pretrain",
                 node=SweepLauncherConf(scheduler=_scheduler))


class SweepLauncher(SweepLaunch, BaseSubmititLauncher):
    _EXECUTOR = "auto"
