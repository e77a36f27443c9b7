"""Typed schemas of our own config groups (cluster, storage, checkpoint, data, export, spike), registered in Hydra's ConfigStore.

conf/train.yaml puts each schema under its group's node before the group's YAML is merged on top, so a value of
the wrong type (`cluster.nodes=two`) or a key the group does not have (`cluster.node=2`) is refused by
Hydra/OmegaConf at composition, with the full key, before anything is checked or written; `???` fields must be
set by a preset. Ranges and relations (a positive node count, a batch that divides) stay in train/checks/.
llm-foundry's own keys are not described here: its TrainConfig is their schema (tests/test_config.py).

Light: dataclasses and Hydra only.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class Container:
    image: Optional[str] = None  # pyxis/enroot: a .sqsh file or a registry URI; null: bare mode
    mounts: List[str] = field(default_factory=list)


@dataclass
class BusBandwidth:
    intra: Optional[float] = None  # GB/s, all-reduce within one node; null: reported, not judged
    inter: Optional[float] = None  # GB/s, all-reduce over two nodes


@dataclass
class Preflight:  # conf/cluster/_preflight.yaml, train/task/preflight.py
    enabled: bool = False
    only: bool = False
    node_check: Optional[str] = None
    node_check_timeout_s: float = 300.0
    bytes: int = 1073741824
    iters: int = 10
    tolerance: float = 0.75
    expected_busbw_GBps: BusBandwidth = field(default_factory=BusBandwidth)
    min_free_memory_fraction: float = 0.9
    on_fail: str = "requeue"  # requeue | stop: checked in train/checks/preflight_rules.py
    max_exclusions: int = 2


@dataclass
class Cluster:
    name: str = MISSING
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    exclusive: bool = False
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    timeout_min: int = 60
    max_num_timeout: int = 0
    signal_delay_s: int = 120
    # `-m` on Slurm submits and returns (follow with `python -m train.status`); true: wait for every job, as a
    # local sweep always does (its tasks are this command's children)
    wait: bool = False
    # where the sweep's summary job runs (1 CPU, a few seconds, after every point ends); null: `partition`
    summary_partition: Optional[str] = None
    sbatch_extra: Dict[str, Any] = field(default_factory=dict)
    srun_extra: List[str] = field(default_factory=list)
    container: Container = field(default_factory=Container)
    setup: List[str] = field(default_factory=list)
    gpu: Optional[str] = None
    gpu_memory_gb: Optional[float] = None
    peak_flops: Optional[float] = None
    mfu: Optional[float] = None
    # Strings, as the environment holds them: `cluster.env.NCCL_IB_TIMEOUT=22` arrives as "22".
    env: Dict[str, str] = field(default_factory=dict)
    preflight: Preflight = field(default_factory=Preflight)
    # folders each node has its own of: checkpoints written there stay on the node that wrote them
    node_local: List[str] = field(default_factory=list)


@dataclass
class Storage:
    root: str = MISSING
    data_root: str = MISSING
    data_local_root: Optional[str] = None
    data_remote_root: Optional[str] = None
    checkpoint_root: str = MISSING
    output_root: str = MISSING
    mounts: List[str] = field(default_factory=list)
    write_GBps: float = MISSING
    file_GBps: Optional[float] = None
    tier: Optional[str] = None  # tiered file systems (amlfs): write_GBps follows tiers[tier]
    tiers: Optional[Dict[str, float]] = None


@dataclass
class Checkpoint:
    folder: Optional[str] = None
    state_dict_type: str = "sharded"  # full | sharded: checked with fsdp_config.state_dict_type (train/checks/)
    autoresume: bool = False


@dataclass
class Data:
    kind: str = MISSING  # mock | mds
    train_samples: Optional[int] = None  # mock only: samples written per split
    val_samples: Optional[int] = None


@dataclass
class Export:
    format: str = "none"  # none | hf (conf/export/)
    precision: Optional[str] = None  # float32 | bfloat16 | float16: checked in train/checks/values.py
    interval: Optional[str] = None  # a composer duration: checked in train/checks/values.py
    folder: Optional[str] = None
    dtype_of: Dict[str, str] = field(default_factory=dict)  # the trainer's precision -> the export's


@dataclass
class Spike:  # conf/train.yaml `spike`, train/task/spike.py; ranges checked in train/checks/spike.py
    action: str = "stop"  # stop | rollback
    skip_batches: int = 200
    lr_scale: float = 1.0
    max_rollbacks: int = 3


SCHEMAS = {"cluster": Cluster, "storage": Storage, "checkpoint": Checkpoint, "data": Data, "export": Export,
           "spike": Spike}


def register() -> None:
    """Store each schema as `schema/<group>` (conf/train.yaml's defaults place it at the group's node)."""
    store = ConfigStore.instance()
    for group, node in SCHEMAS.items():
        store.store(group="schema", name=group, node=node)
