"""Compose the training config outside `python -m train` (tests, benchmarks, the launcher's checks),
with the same Hydra context a job has, so `${hydra:...}` and `${run_id:...}` resolve as they do in a run."""
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

import train  # noqa: F401  (registers resolvers)

CONF = Path(__file__).resolve().parents[1] / "conf"


def compose(overrides=(), config_name: str = "train") -> DictConfig:
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # as hydra's run_job does, before `hydra` is dropped
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = OmegaConf.select(cfg, "hydra.run.dir")
    HydraConfig.instance().set_config(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg
