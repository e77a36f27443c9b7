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
from train.config.recipe_yaml import run_name_placeholder

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
        out.append(arg if after_flag else as_hydra_reads(arg))
    if any(a.startswith("yaml=") for a in out):  # a YAML may leave out any key llm-foundry has a default for
        out = [a if i > 0 and out[i - 1] in FLAGS_WITH_VALUE else foundry_key_override(a) for i, a in enumerate(out)]
    return flags + out


def as_hydra_reads(arg: str) -> str:
    """One override as Hydra should read it (command_line, compose): composer's {run_name} in save_folder, our
    open maps, a YAML's path."""
    return recipe_override(open_map_override(save_folder_override(arg)))


def foundry_key_override(arg: str) -> str:
    """With a user's YAML, `eval_interval=2000ba`, `scheduler.alpha_f=0.0`: a key in llm-foundry's TrainConfig is
    set as llm-foundry's own command line sets it, added where the YAML left it to llm-foundry's default or
    replaced where it is set: Hydra's `++`, instead of its "Key ... is not in struct" (a misspelt key is still
    refused or warned by the checks, by the arguments of what it configures). (`model=` is our preset group.)"""
    key, eq, _ = arg.partition("=")
    if not eq or not re.fullmatch(r"[a-z_]+(\.[A-Za-z0-9_]+)*", key) or key == "model":
        return arg
    from train.checks.values import FOUNDRY_KEYS

    return "++" + arg if key.split(".")[0] in FOUNDRY_KEYS else arg


def recipe_override(arg: str) -> str:
    """`yaml=PATH` (or a sweep `yaml=A,B`) with each path absolute and quoted for Hydra: a Slurm job composes the
    config again in its own folder, and a path may hold characters Hydra's grammar does not take unquoted."""
    if not arg.startswith("yaml="):
        return arg
    paths = arg[len("yaml="):]
    if paths.startswith(("'", '"')) or any(c in paths for c in "[]()${}"):
        return arg  # quoted, a list or a function: Hydra's own syntax, left as written
    return "yaml=" + ",".join(quoted_path(os.path.abspath(os.path.expanduser(p))) for p in paths.split(",") if p)


def quoted_path(path: str) -> str:
    if re.fullmatch(r"[\w./@:+-]+", path):
        return path
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def save_folder_override(arg: str) -> str:
    return run_name_placeholder(arg) if arg.split("=", 1)[0].lstrip("+") == "save_folder" else arg


def open_map_override(arg: str) -> str:
    key = arg.split("=", 1)[0]
    if "=" in arg and not arg.startswith(("+", "~", "-")) and any(
            key == m or key.startswith(m + ".") for m in OPEN_MAPS):
        return "++" + arg
    return arg


def compose(overrides=(), config_name: str = "train") -> DictConfig:
    overrides = [as_hydra_reads(o) for o in overrides]
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = _composed(config_name, overrides)
    HydraConfig.instance().set_config(cfg)  # `hydra.run.dir` holds `${run_name}`, which reads the overrides
    return without_hydra(cfg, OmegaConf.select(cfg, "hydra.run.dir"), in_place=True)


# Hydra's composition of each set of group choices this process has composed (its defaults tree: every YAML file
# read and merged, most of the cost), by what it was composed from.
_BASES: dict = {}
_REPOS: dict = {}


def _composed(config_name: str, overrides: list) -> DictConfig:
    """Hydra's composition of `overrides`, in Hydra's two steps (the defaults tree from the group choices, then the
    value overrides), the first made once per set of group choices in this process, as a sweep's points are
    (common/compose.py; tests/test_compose.py checks the two against each other). A process that composes many
    configs (the tests, a benchmark) reads and merges conf/ once per set of group choices, not per config. Composed
    from scratch where the first step may read more than conf/: the user's YAML (`yaml=`) and Hydra's own settings
    (`hydra.searchpath`)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from common.compat import hydra_caching_repo, hydra_with_value_overrides
    from common.compose import split

    loader = GlobalHydra.instance().config_loader()
    parsed = OverridesParser.create().parse_overrides(overrides)
    loader.validate_sweep_overrides_legal(parsed, run_mode=RunMode.RUN, from_shell=False)  # as Hydra's compose
    if any(re.split(r"[./@]", o.key_or_group)[0] in ("yaml", "hydra") for o in parsed):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=True)
    # conf/ as it is now (a test may add a file to a group), and the working directory Hydra records
    conf = (config_name, os.getcwd(), _files(CONF))
    if conf not in _REPOS:  # which overrides choose a group (the primary config read for its search path)
        _REPOS[conf] = hydra_caching_repo(loader, config_name)
    values, groups = split(_REPOS[conf], parsed)
    key = (conf, groups)
    if key not in _BASES:
        _BASES[key] = hydra_compose(config_name, overrides=list(groups), return_hydra_config=True)
    return hydra_with_value_overrides(_BASES[key], parsed, values)


def _files(folder) -> tuple:
    """(path, mtime, size) of each YAML file under folder; one removed while this reads is left out."""
    found = []
    for path in sorted(folder.rglob("*.yaml")):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        found.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(found)
