"""`yaml=PATH`: the user's own llm-foundry YAML as an option of the `yaml` group (conf/train.yaml's defaults).

Hydra finds group options in config sources; ours (the `recipe://` scheme of conf/train.yaml's search path, a thin
plugin class over the functions below) answers for the group `yaml` with any YAML file on disk, named by its path
(train/config/compose.py makes it absolute before Hydra reads the command line, so a Slurm job that composes again
finds the same file). The file is read as llm-foundry reads it (its keys, `variables:` and
interpolations) and placed at the top of the config, after our groups and before the command line.

What is added keeps the YAML the whole recipe: a key it leaves out is llm-foundry's default, as if
llm-foundry read the file, not a value of ours.
- `override /recipe: null`: the MPT recipe our presets share (conf/recipe/mpt.yaml: scheduler, optimizer,
  clipping, loaders, evaluation, FSDP) does not apply: otherwise a YAML without `alpha_f`, `weight_decay`,
  `algorithms`, `shuffle_seed` or `eval_loader` would train with ours (alpha_f 0.1 against composer's 0.0,
  clipping it never asked for, another data order, an evaluation of the whole val split), exit 0.
- `override /model: null`: our model presets do not apply (a preset key the YAML leaves out, such as mpt-tiny's
  save_interval, would otherwise leak in); `model=<preset>` on the command line still picks one beneath it.
- `override /data: _recipe`: the YAML's `variables.data_local` is an MDS folder (llm-foundry's text loader), not
  our mock data; its model's vocab_size is its own (data=mds would size it from the tokenizer).
- A YAML without `device_train_microbatch_size` gets llm-foundry's `auto` (composer's search, on a GPU).
- A YAML without `eval_loader` (or `fsdp_config`) gets `null` there: no evaluation (no FSDP), as in llm-foundry,
  whatever our groups set inside them (a CPU cluster's loader workers, the checkpoint group's state_dict_type);
  without FSDP the default checkpoint is `checkpoint=full` (one file, what composer writes then).
A blank `run_name` (llm-foundry would read $RUN_NAME) gets our name: the YAML's stem and the hash of what it
trains (train/config/identity.py); `run_name: ${variables.run_name}` still takes the variable when the command line
gives it (`variables.run_name=my-run`), as in llm-foundry. An `eval_loader` list (several evaluators, each with a
label) becomes `eval_loaders`, as llm-foundry itself does. A `{run_name}` in `save_folder` (composer's placeholder)
becomes `${run_name}`: the same folder, seen by every reader here.

A file is read once per process (`read`): every later composition in it (a sweep's points, an Optuna batch launched
an hour later) is of the recipe as first read, and a sweep's jobs compose from a copy of those bytes (`pinned`), so
that a job that starts after hours in the queue, or again after a requeue, trains the recipe that was checked and
submitted, not the file as edited since (which would also be another run: its name hashes what it trains).
"""
import functools
import hashlib
import io
import re
from pathlib import Path
from typing import Optional

from hydra.plugins.config_source import ConfigLoadError, ConfigResult
from omegaconf import OmegaConf

GROUP = "yaml"
VARIABLE_RUN_NAME = "${variables.run_name}"


@functools.cache
def our_run_name() -> str:
    """conf/train.yaml's run_name, as written there (an interpolation: the run's name from what it trains)."""
    from common.paths import CONF

    return OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"), resolve=False)["run_name"]


RUN_NAME_PLACEHOLDER = re.compile(r"(?<!\$)\{run_name\}")


def run_name_placeholder(path):
    """composer fills `{run_name}` in save_folder itself (llm-foundry's YAMLs: `./{run_name}/checkpoints`): the same
    folder as `${run_name}`, which every reader of the folder here resolves (resume, finished.json, status);
    a command line's `save_folder=` too (train/config/compose.py)."""
    return RUN_NAME_PLACEHOLDER.sub("${run_name}", path) if isinstance(path, str) else path


def recipe_file(option: str) -> Path:
    """The file an option of the `yaml` group names (absolute after train/config/compose.py; `.yaml` may be left out)."""
    path = Path(option).expanduser()
    if not path.is_file() and path.suffix not in (".yaml", ".yml"):
        path = path.with_name(path.name + ".yaml")
    return path


_READ: dict = {}  # path -> the bytes this process first read there


def read(path: Path) -> bytes:
    """The file's bytes as this process first read them."""
    key = str(path)
    if key not in _READ:
        _READ[key] = path.read_bytes()
    return _READ[key]


def pinned(option: str, folder: Path) -> str:
    """A copy of the recipe `option` names, as this process read it, in folder/<hash>/ under the file's own name
    (a run's name starts with it): the path a job composes from. Written once; an existing copy is those bytes."""
    path = recipe_file(option)
    data = read(path)
    copy = folder / hashlib.sha256(data).hexdigest()[:16] / path.name
    if not copy.is_file():
        from common.files import atomic_write

        copy.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(copy, data)
    return str(copy)


def blank_run_name(cfg) -> bool:
    """run_name missing, empty, or `${variables.run_name}` with that variable blank (llm-foundry's YAMLs)."""
    if "run_name" not in cfg:
        return False
    raw = OmegaConf.to_container(cfg, resolve=False).get("run_name")
    if raw in (None, ""):
        return True
    if raw == VARIABLE_RUN_NAME:
        return OmegaConf.select(cfg, "variables.run_name", default=None, throw_on_missing=False) in (None, "")
    return False


def _option(config_path: str) -> Optional[str]:
    prefix = GROUP + "/"
    return config_path[len(prefix):] if config_path.startswith(prefix) else None


def refused(cfg) -> list:
    """(problem, fix) for each key of a YAML's mapping that llm-foundry would refuse, or that is this command's."""
    found = []
    if "defaults" in cfg:
        found.append(("has a `defaults:` key (Hydra's; llm-foundry's YAMLs have none)",
                      "remove it and name the presets on the command line (cluster=ndv5 storage=amlfs)"))
    for key in (k for k in ("plan", "hydra") if k in cfg):  # `plan: json` would make every run a plan
        found.append((f"has a `{key}:` key, which is not llm-foundry's (it refuses unknown keys) but this command's",
                      "remove it (on the command line: " + ("plan=true)" if key == "plan" else "hydra.<key>=...)")))
    if cfg.get("eval_loader") is not None and cfg.get("eval_loaders") is not None:  # (moving a list would drop one)
        found.append(("has both `eval_loader` and `eval_loaders`, which llm-foundry refuses (\"Config key "
                      "`eval_loaders` should not be set\")", "put every evaluator in one of them"))
    return found


def load_config(source, config_path: str) -> ConfigResult:
    """The config source's answer for `config_path` (`yaml/<path>`): the file, as llm-foundry would read it, with
    the defaults that make it the whole recipe."""
    option = _option(config_path)
    if option is None:
        raise ConfigLoadError(f"Config not found: {config_path}")
    path = recipe_file(option)
    try:
        cfg = OmegaConf.load(io.BytesIO(read(path)))
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigLoadError(f"yaml={option}: no such file") from None
    except Exception as err:  # a YAML syntax error: the file and the line, as the YAML parser says
        raise ConfigLoadError(f"yaml={path}: not a readable YAML file: {err}") from None
    if not OmegaConf.is_dict(cfg):
        raise ConfigLoadError(f"yaml={path}: an llm-foundry YAML is a mapping of keys, not a "
                              f"{type(OmegaConf.to_container(cfg)).__name__}")
    for problem, fix in refused(cfg)[:1]:  # (the checks before Hydra name each: train/checks/gate.py)
        raise ConfigLoadError(f"yaml={path}: {problem}; {fix}")
    if blank_run_name(cfg):
        if OmegaConf.to_container(cfg, resolve=False).get("run_name") == VARIABLE_RUN_NAME:
            # llm-foundry's YAMLs: the variable names the run when it is given (variables.run_name=my-run on
            # the command line, as with llm-foundry), else our name
            cfg.run_name = "${given_or:${oc.select:variables.run_name,null}," + our_run_name() + "}"
        else:
            del cfg["run_name"]
    if isinstance(cfg.get("save_folder"), str):  # `./{run_name}/checkpoints`: composer's placeholder
        cfg.save_folder = run_name_placeholder(cfg.save_folder)
    if OmegaConf.is_list(cfg.get("eval_loader")):
        # several evaluators: llm-foundry moves an eval_loader list to eval_loaders; so does this, since
        # a cluster's eval_loader knobs are a mapping a list cannot be merged onto
        cfg.eval_loaders, cfg.eval_loader = cfg.eval_loader, None
    if "callbacks" in cfg and cfg.callbacks is None:  # `callbacks:` left empty: none of its own, as absent; a
        del cfg["callbacks"]  # null would also drop the run's report callback (the run would crash at its start)
    if "device_train_microbatch_size" not in cfg:  # llm-foundry's TrainConfig default (ours is `???`: refused)
        cfg.device_train_microbatch_size = "auto"
    for section in ("eval_loader", "fsdp_config"):  # absent: llm-foundry's None, not our groups' keys in it
        if section not in cfg:  # (eval_loaders alone: eval_loader None too, as llm-foundry wants it)
            cfg[section] = None
    cfg.defaults = [{"override /recipe": None}, {"override /model": None}, {"override /data": "_recipe"},
                    # without FSDP composer writes one file: checkpoint=sharded would be refused
                    *([{"override /checkpoint": "full"}] if cfg.fsdp_config is None else []), "_self_"]
    return ConfigResult(config=cfg, path=f"{source.scheme()}://{path.parent}", provider=source.provider,
                        header={"package": "_global_"})


def is_group(config_path: str) -> bool:
    return config_path in ("", GROUP)


def is_config(config_path: str) -> bool:
    option = _option(config_path)
    return option is not None and recipe_file(option).is_file()
