"""Compose the training config outside a plain `python -m train` (a sweep's points, tests, benchmarks), with the
same Hydra context a job has, so `${hydra:...}` and `${run_id:...}` resolve as they do in a run."""
import copy
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

import train  # noqa: F401  (registers resolvers)
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


def without_hydra(cfg: DictConfig, output_dir) -> DictConfig:
    """The job's config as the task sees it: Hydra's context set (as run_job does), the `hydra` node dropped."""
    cfg = copy.deepcopy(cfg)
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def sweep_overrides(config: DictConfig) -> list:
    """A `-m` command line's points, each a list of overrides, in Hydra's order (its basic sweeper's)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    return [list(p) for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]


def sweep_point(loader, config: DictConfig, num: int, overrides: list, sweep_dir) -> DictConfig:
    """One point composed exactly as its job will be (same Hydra context), its hydra node dropped, unresolved."""
    cfg = loader.load_sweep_config(config, list(overrides))
    with open_dict(cfg.hydra.job), read_write(cfg.hydra):
        cfg.hydra.job.num = num
    HydraConfig.instance().set_config(cfg)
    return without_hydra(cfg, Path(sweep_dir) / str(cfg.hydra.sweep.subdir))
