"""One validation pass: every check of a config goes through train.checks.validate, on the login node; one suggester
of a name for a misspelt one; one list of Hydra's flags that take a value. Scans of the product's modules (ast), and
the gate's reading of a command line in-process."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [p for folder in ("train", "common") for p in sorted((ROOT / folder).rglob("*.py"))]


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def _where(found) -> list:
    return sorted({str(p.relative_to(ROOT)) for p in found})


def test_one_suggester_of_a_name_for_a_misspelt_one():
    """difflib is asked in one place (train/checks/core.py: nearest); every "did you mean" goes through it."""
    importing = [p for p in PRODUCT for node in ast.walk(_tree(p))
                 if isinstance(node, ast.Import) and any(a.name == "difflib" for a in node.names)
                 or isinstance(node, ast.ImportFrom) and node.module == "difflib"]
    assert _where(importing) == ["train/checks/core.py"]
    from train.checks.core import nearest

    assert nearest("save_intervl", ["save_interval", "seed"]) == "save_interval"
    assert nearest("mpt-3", ["gpt-375m", "mpt-125m", "mpt-30b"], cutoff=0.5) == "mpt-30b"
    assert nearest("zzz", ["save_interval"]) is None


def test_one_list_of_hydras_flags_that_take_a_value():
    """FLAGS_WITH_VALUE is defined once (train/config/compose.py), with --info and -i: the gate read the word after
    `-i` as an override and refused `python -m train -i config` as one without `=`."""
    defining = [p for p in PRODUCT for node in ast.walk(_tree(p)) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name) and t.id.lstrip("_") == "FLAGS_WITH_VALUE"]
    assert _where(defining) == ["train/config/compose.py"]
    from train.checks.gate import hydra_problems
    from train.config.compose import FLAGS_WITH_VALUE

    assert {"--info", "-i", "--cfg", "-c", "--package", "-p", "--config-name", "-cn"} <= FLAGS_WITH_VALUE
    assert hydra_problems(["-i", "config"]) == []
    assert hydra_problems(["--info", "defaults"]) == []
    [problem] = hydra_problems(["--cfg", "job", "save_intervl=100ba"])
    assert (problem.key, problem.fix) == ("save_intervl", "did you mean save_interval? (save_interval=100ba)")


def _calls(path: Path, name: str) -> list:
    """The functions (by name) of path that call `name` (a bare name or an attribute)."""
    found = []
    for fn in ast.walk(_tree(path)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == name
                                                   or getattr(node.func, "attr", None) == name):
                    found.append(fn.name)
    return found


def test_validate_is_the_one_entry_of_the_checks():
    """The rules are run by validate alone: the plain run's and the sweep's Hydra callbacks and the sweep app ask
    it; nothing else runs a point's rules (check) or the sweep's own (its sweeper's and launcher's), and no task
    checks the config again (only what its allocation sees: mounts, shards, devices, the checkpoint)."""
    rules = {"train.checks": ("check", "check_points"),
             "train.checks.values": ("sweeper_storage", "objective_direction", "foreign_launcher", "launcher_resources")}
    imported = {(str(p.relative_to(ROOT)), a.name) for p in PRODUCT for node in ast.walk(_tree(p))
                if isinstance(node, ast.ImportFrom) and node.module in rules for a in node.names
                if a.name in rules[node.module]}
    assert imported == set(), imported
    outside = {(str(p.relative_to(ROOT)), fn, name) for p in PRODUCT if p != ROOT / "train/checks/__init__.py"
               for name in rules["train.checks.values"] for fn in _calls(p, name)}
    assert outside == set(), outside
    assert set(_calls(ROOT / "train/checks/__init__.py", "check")) == {"validate"}
    assert {"on_run_start", "on_multirun_start"} <= set(_calls(ROOT / "train/checks/gate.py", "validate"))
    assert "configs" in _calls(ROOT / "train/launch/sweep_app.py", "validate")
    task = [p for p in (ROOT / "train/task").rglob("*.py") if _calls(p, "validate")]
    assert task == []


def test_a_sweeps_points_are_numbered_and_a_plain_runs_point_is_not():
    from train.checks import Context, validate
    from train.config.compose import compose

    cfg = compose(["cluster=slurm-local", "optimizer.lr=-1"])
    [plain] = [p for p in validate([cfg], [Context(mode="run")]) if p.key.endswith("optimizer.lr")]
    assert plain.key == "optimizer.lr"
    [point] = [p for p in validate([cfg], [Context(mode="sweep")], first=3) if p.key.endswith("optimizer.lr")]
    assert point.key == "[sweep point #3] optimizer.lr"


def _paths(node, prefix=""):
    """Every dotted key of a plain config, containers and leaves, and a key below each that is not there."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        key = f"{prefix}{k}"
        yield key
        yield f"{key}.not_a_key"
        yield from _paths(v, key + ".")


@pytest.mark.parametrize("overrides", [[], ["model=mpt-30b", "cluster=ndv5", "data=c4"], ["model=llama3-8b"],
                                       ["checkpoint=none", "model.n_layers=???"]])
def test_a_resolved_configs_values_read_from_its_plain_copy_are_omegaconfs(overrides):
    """While the rules run (train/checks/core.py: reading), value() reads a resolved config's plain copy: every key
    of real configs, each list item, each key that is not there, and a value left missing (`???`) read as
    OmegaConf.select reads them; a mapping or a list is OmegaConf's own node."""
    from omegaconf import OmegaConf

    from train.checks.core import ConfigError, mapping, reading, resolved, value
    from train.config.compose import compose

    cfg = resolved(compose(overrides))
    keys = ["not_there", "model.not_there.deeper", "train_loader.dataset.0", *_paths(OmegaConf.to_container(cfg))]

    def read(key):
        try:
            got = value(cfg, key, default="DEFAULT")
        except ConfigError as err:
            return ("error", [(p.key, p.problem) for p in err.problems])
        except Exception as err:  # noqa: BLE001 -- OmegaConf's own (a word for a list's index): the same either way
            return ("raised", type(err).__name__, str(err))
        return got if not OmegaConf.is_config(got) else ("node", OmegaConf.to_container(got))

    def as_mapping(key):  # mapping(): a plain dict where reading holds a copy, the same values as value()'s node
        try:
            got = mapping(cfg, key)
        except Exception as err:  # noqa: BLE001 -- as value() raises it
            return ("raised", type(err).__name__)
        return OmegaConf.to_container(got) if OmegaConf.is_config(got) else got

    maps = [k for k in keys if isinstance(read(k), tuple) and read(k)[0] == "node" and isinstance(read(k)[1], dict)]
    slow, slow_maps = [read(k) for k in keys], [as_mapping(k) for k in maps]
    with reading(cfg):
        fast, fast_maps = [read(k) for k in keys], [as_mapping(k) for k in maps]
        assert id(cfg) in __import__("train.checks.core", fromlist=["_PLAIN"])._PLAIN
        plain = [k for k in maps if type(mapping(cfg, k)) is dict]
    assert fast == slow and len(keys) > 300
    assert fast_maps == slow_maps and "tokenizer.kwargs" in maps
    # every mapping is read plain but one holding a missing value, which value() names
    assert set(maps) - set(plain) == ({"model"} if "model.n_layers=???" in overrides else set())
    if "model.n_layers=???" in overrides:
        assert read("model.n_layers")[0] == "error"
