"""Compose the training config outside a plain `python -m train` (a sweep's points, tests, benchmarks), with the
same Hydra context a job has, so `${hydra:...}` and `${run_id:...}` resolve as they do in a run."""
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import train  # noqa: F401  (registers resolvers)
from common.compose import without_hydra
from common.paths import CONF

# Maps users extend with their own keys (environment variables, #SBATCH flags): `key=value` adds a key there, as
# it would in a shell script, instead of Hydra's "Key ... is not in struct" (its `+` or `++` still work).
OPEN_MAPS = ("cluster.env", "cluster.sbatch_extra")


def command_line(args: list) -> list:
    """The command line as Hydra should read it: `-m` moved first (the pinned Hydra's argparse refuses it after
    an override), and overrides of OPEN_MAPS written as `++key=value` (add or replace)."""
    flags = [a for a in args if a in ("-m", "--multirun")]
    rest = [a for a in args if a not in ("-m", "--multirun")]
    return flags + [open_map_override(a) for a in rest]


def open_map_override(arg: str) -> str:
    key = arg.split("=", 1)[0]
    if "=" in arg and not arg.startswith(("+", "~", "-")) and any(
            key == m or key.startswith(m + ".") for m in OPEN_MAPS):
        return "++" + arg
    return arg


def compose(overrides=(), config_name: str = "train") -> DictConfig:
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = hydra_compose(config_name, overrides=[open_map_override(o) for o in overrides],
                            return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # `hydra.run.dir` holds `${run_name}`, which reads the overrides
    return without_hydra(cfg, OmegaConf.select(cfg, "hydra.run.dir"))
