"""Compose the training config outside a plain `python -m train` (a sweep's points, tests, benchmarks), with the
same Hydra context a job has, so `${hydra:...}` and `${run_id:...}` resolve as they do in a run."""
import os
import re

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


# Hydra's flags that take the next word as their value (`--cfg job`, `-cn train`).
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                    "-cd", "--experimental-rerun", "--info", "-i"}


def command_line(args: list) -> list:
    """The command line as Hydra should read it: `-m` moved first (the pinned Hydra's argparse refuses it after
    an override), overrides of OPEN_MAPS written as `++key=value` (add or replace), and the user's llm-foundry
    YAML as `yaml=<absolute path>`, given as llm-foundry's train.py takes it (`python -m train my.yaml k=v`) or
    as `yaml=my.yaml`."""
    flags = [a for a in args if a in ("-m", "--multirun")]
    rest = [a for a in args if a not in ("-m", "--multirun")]
    out = []
    for i, arg in enumerate(rest):
        after_flag = i > 0 and rest[i - 1] in FLAGS_WITH_VALUE
        if not after_flag and not arg.startswith("-") and "=" not in arg and arg.endswith((".yaml", ".yml")):
            arg = f"yaml={arg}"
        out.append(arg if after_flag else recipe_override(open_map_override(arg)))
    return flags + out


def recipe_override(arg: str) -> str:
    """`yaml=PATH` (or a sweep `yaml=A,B`) with each path absolute and quoted for Hydra: a Slurm job composes the
    config again in its own folder, and a path may hold characters Hydra's grammar does not take unquoted."""
    if not arg.startswith("yaml="):
        return arg
    paths = arg[len("yaml="):]
    if paths.startswith(("'", '"')) or any(c in paths for c in "[]()${}"):
        return arg  # quoted, a list or a function: Hydra's own syntax, left as written
    return "yaml=" + ",".join(_quoted(os.path.abspath(os.path.expanduser(p))) for p in paths.split(",") if p)


def _quoted(path: str) -> str:
    if re.fullmatch(r"[\w./@:+-]+", path):
        return path
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def open_map_override(arg: str) -> str:
    key = arg.split("=", 1)[0]
    if "=" in arg and not arg.startswith(("+", "~", "-")) and any(
            key == m or key.startswith(m + ".") for m in OPEN_MAPS):
        return "++" + arg
    return arg


def compose(overrides=(), config_name: str = "train") -> DictConfig:
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = hydra_compose(config_name, overrides=[recipe_override(open_map_override(o)) for o in overrides],
                            return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # `hydra.run.dir` holds `${run_name}`, which reads the overrides
    return without_hydra(cfg, OmegaConf.select(cfg, "hydra.run.dir"))
