"""The checks of a plain run, run where Hydra lets them run before it writes anything.

Hydra makes a plain run's folder (`.hydra/` with every override, the job log) before the task starts; its
callbacks run earlier. So a plain run's checks, and its `plan`, happen here: a refused run, a plan (and `--cfg`,
`--help`, which never reach a callback) write nothing anywhere. A sweep's own settings are checked here as it
starts; its points by the launcher before anything is submitted, and by our sweeper before anything is written
(train/launch/sweep_app.py, common/sweep/sweeper.py). Each asks train.checks.validate, which holds every check.
Hydra's global state is read here, once, into the Context. Before Hydra reads the command line, before_hydra is
the one wrapper over Hydra's own refusals of it.
"""
import functools
import os
import sys

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def context(config: DictConfig, cfg: DictConfig, overrides, sweep: bool):
    from train.checks import Context
    from train.launch.spec import scheduler

    plan = OmegaConf.select(cfg, "plan", default=None)
    mode = "plan" if plan not in (None, False) else "sweep" if sweep else "run"
    if OmegaConf.is_config(overrides):  # as typed: `key=${other}` is text here (resolved, it may name no key)
        overrides = OmegaConf.to_container(overrides, resolve=False)
    return Context(mode=mode, overrides=tuple(overrides), choices=dict(config.hydra.runtime.choices),
                   scheduler=scheduler(cfg))


def _or_stop(method):
    """Hydra turns an exception in a callback into a warning and goes on to run or submit: a check that crashed
    would let an unchecked config through. Stop instead, with the traceback: nothing was started or written."""
    import functools

    @functools.wraps(method)
    def guarded(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception:
            import traceback

            traceback.print_exc()
            print("error: the checks before starting failed (above): nothing was started or written",
                  file=sys.stderr)
            sys.exit(2)

    return guarded


class CheckBeforeWriting(Callback):
    @_or_stop
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        from common.compose import without_hydra
        from train.checks import report, resolved, validate

        HydraConfig.instance().set_config(config)  # as run_job does next: `${run_id:...}` reads the overrides
        cfg = resolved(without_hydra(config, OmegaConf.select(config, "hydra.run.dir")))
        ctx = context(config, cfg, config.hydra.overrides.task, sweep=False)
        problems = _checked(lambda: validate([cfg], [ctx]))
        if not report(problems):
            sys.exit(2)
        if ctx.mode == "plan":
            from train.plan.forecast_report import print_plan

            print_plan(cfg, problems)
            sys.exit(0)
        from train.task.refusal import hold  # before Hydra writes: what a refusing task takes back; the save folder

        if not report(hold(config, cfg)):
            sys.exit(2)

    @_or_stop
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """What the sweeper and the launcher would fail on when they start, before they write anything (the points
        are checked by the launcher, all at once, before anything is submitted)."""
        from train.checks import report, validate

        if not report(validate([], [], sweep=config)):
            sys.exit(2)


def _checked(fn):
    """fn(), with a ConfigError (a value missing or unresolvable where checking could not go on) printed as the
    problems it holds, exit 2."""
    from train.checks import ConfigError, report

    try:
        return fn()
    except ConfigError as err:
        report(err.problems)
        sys.exit(2)


# ---- before Hydra: what Hydra itself would refuse, said the way the checks say it --------------------------------

def _app_shape(config_name: str = "train"):
    """(the app's config groups -> their public presets, the top-level keys of its config), from conf/ alone: the
    primary config's keys and those of the recipe presets (conf/recipe/, which hold llm-foundry's training keys)."""
    from omegaconf import OmegaConf

    from common.paths import CONF

    primary = OmegaConf.to_container(OmegaConf.load(CONF / f"{config_name}.yaml"), resolve=False)
    if config_name == "train":
        for recipe in sorted((CONF / "recipe").glob("*.yaml")):
            primary = {**OmegaConf.to_container(OmegaConf.load(recipe), resolve=False), **primary}
    groups = {}
    for entry in primary.get("defaults") or []:
        if isinstance(entry, dict):
            for group in entry:
                if group == "yaml":  # any file: yaml=PATH (train/config/recipe_yaml.py)
                    groups[group] = []
                elif "@" not in group and not group.startswith("override") and (CONF / group).is_dir():
                    # files starting with `_` are building blocks of the presets, not choices
                    groups[group] = sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.name.startswith("_"))
    return groups, set(primary) - {"defaults"}


@functools.lru_cache(maxsize=None)  # a refused key asks it of every preset; a sweep's choices, of each
def _added_at_the_top(group: str, choice: str, seen=()) -> frozenset:
    """The top-level keys a chosen preset adds (`# @package _global_`: logger=wandb adds `loggers`), with those of
    the presets it chooses in turn (an experiment's `override /logger: wandb`)."""
    from omegaconf import OmegaConf

    from common.paths import CONF

    path = CONF / group / f"{choice}.yaml"
    if (group, choice) in seen or not path.is_file():
        return frozenset()
    text = path.read_text()
    node = OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
    keys = set(node) - {"defaults"} if "@package _global_" in text.split("\n", 1)[0] else set()
    for entry in node.get("defaults") or []:
        for key, value in (entry.items() if isinstance(entry, dict) else ()):
            if isinstance(value, str):
                keys |= _added_at_the_top(key.removeprefix("override").strip().strip("/"), value,
                                          (*seen, (group, choice)))
    return frozenset(keys)


def _raw_value(arg: str) -> str:
    return arg.split("=", 1)[1] if "=" in arg else ""


def hydra_problems(args: list, config_name: str = "train") -> list:
    """What Hydra would refuse on this command line before composing, each as key / problem / fix: an override its
    grammar cannot read (unquoted unicode, `$(...)`, an unclosed list), a preset that does not exist (with the
    closest one, and only the public presets), a top-level key the config does not have (with the closest key,
    instead of Hydra's advice to add it with `+`). Values are masked where they hold a credential."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from train.checks import Problem
    from train.checks.core import NOT_A_KEY, SEE_THE_KEYS, did_you_mean, nearest, override_key, override_values
    from train.checks.safety import CREDENTIAL, secret_by_name
    from train.checks.values import FOUNDRY_KEYS
    from train.config.compose import FLAGS_WITH_VALUE

    groups, top = _app_shape(config_name)
    # the keys the presets chosen on this command line add at the top (`loggers.mlflow.resume=false` beside
    # logger=mlflow); without its preset such a key stays refused here, masked (Hydra's own error echoes the value)
    for arg in args:
        group, _, choices = arg.lstrip("+").partition("=")
        if group in groups and group != "yaml":
            for choice in choices.split(","):
                top = top | _added_at_the_top(group, choice.strip())
    parser = OverridesParser.create()
    found, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):  # -m, --cfg job, --help, ...: Hydra's own flags
            skip = arg in FLAGS_WITH_VALUE
            continue
        key = override_key(arg)
        try:
            [override] = parser.parse_overrides([arg])
        except HydraException as err:
            # masked where the checks take the key for a credential, and where its name only might be one
            shown = f"{key}=****" if secret_by_name(key) or CREDENTIAL.search(key.rsplit(".", 1)[-1]) else arg
            reason = str(err).splitlines()[0].replace(arg, "").strip(" :") or "cannot be read"
            if "=" not in arg:
                reason = "no `=` (an override is key=value)"
            elif reason.startswith("LexerNoViableAlt"):
                reason = "a character its grammar does not take unquoted"
            fix = f"quote the value for Hydra, and the whole for the shell: '{shown.split('=', 1)[0]}=" \
                  f"\"{_raw_value(shown)}\"'" if "=" in arg else f"write it as key=value: {key}=<value>"
            if key == "run_name" and "=" in arg:  # quoted, it is no folder name either (safety.shell_safety)
                fix = "a plain folder name: letters, digits, - _ and ., e.g. run_name=mpt-30b-c4-v2"
            found.append(Problem(key or arg, f"Hydra cannot read `{shown}`: {reason} (Hydra's override grammar takes "
                                 "letters, digits and _-./:@ unquoted; non-ASCII letters, spaces, $(...), #, = or an "
                                 "unclosed [ need quotes)", fix))
            continue
        found += _listed_twice(override)
        key = override.key_or_group
        if not key or "/" in key or key.startswith("hydra") or override.package is not None:
            continue
        if key == "yaml" and "yaml" in groups and not override.is_delete():
            found += _recipe_problems(override)
            continue
        if key in groups and not override.is_delete():
            for choice in override_values(override, text=True):
                if choice not in groups[key]:
                    close = nearest(choice, groups[key], cutoff=0.5)
                    found.append(Problem(key, f"{choice!r} is not a {key} preset (conf/{key}/)",
                                         (f"did you mean {key}={close}? " if close else "")
                                         + f"{key} presets: {', '.join(groups[key])}"))
            continue
        first = key.split(".")[0]
        if first in _schemas() and "." in key and not override.is_delete():
            found += _schema_problems(override, key)
            continue
        if first in top or first in groups or override.is_add() or override.is_force_add() or override.is_delete():
            continue
        options = sorted(top | set(groups))
        close = nearest(first, options)
        setters = [f"{g}={c}" for g in groups if g not in ("yaml", "experiment") for c in groups[g]
                   if first in _added_at_the_top(g, c)]
        if setters:
            fix = f"choose the preset that sets {first}: {' or '.join(setters)}"
        elif first in FOUNDRY_KEYS:
            fix = f"+{arg} (an llm-foundry key this config does not set yet: add it with +)"
        elif close:
            fix = did_you_mean(close + key[len(first):], _raw_value(arg))
        else:
            fix = SEE_THE_KEYS
        found.append(Problem(key, NOT_A_KEY, fix))
    return found


def _listed_twice(override) -> list:
    """A sweep that lists one value twice (`seed=1,1`, `optimizer.lr=1e-3,0.001`): two points would be one run,
    trained twice at once in one folder."""
    from hydra.core.override_parser.types import ChoiceSweep

    from train.checks import Problem

    if not override.is_sweep_override() or not isinstance(override.value(), ChoiceSweep):
        return []
    seen, twice = set(), []
    for v in override.sweep_iterator():
        same = int(v) if isinstance(v, float) and v.is_integer() else v  # 1e-3 and 0.001, 2 and 2.0: one value
        key = repr(same)
        if key in seen and v not in twice:
            twice.append(v)
        seen.add(key)
    if not twice:
        return []
    name = override.get_key_element().lstrip("+~")  # `seed=1,1` is `++seed` on its way to Hydra
    once = ",".join(dict.fromkeys(str(v) for v in override.sweep_string_iterator()))
    return [Problem(name, f"the sweep lists {', '.join(map(str, twice))} twice: those points would be one run, "
                    "trained twice at once in one folder", f"each value once: {name}={once}")]


def _recipe_problems(override) -> list:
    """yaml=PATH: the file is there and is a YAML mapping, or key / problem / fix before Hydra reads it."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from train.checks import Problem
    from train.checks.core import override_values
    from train.config.recipe_yaml import recipe_file, refused

    found = []
    for option in override_values(override, text=True):
        path = recipe_file(option)
        fix = "yaml=<path of an llm-foundry YAML>, e.g. yaml=scripts/train/yamls/pretrain/mpt-7b.yaml"
        given = Path(option).expanduser()
        if given.is_dir():  # (not `<folder>.yaml`, which recipe_file looked for)
            inside = sorted(p.name for p in [*given.glob("*.yaml"), *given.glob("*.yml")])[:5]
            found.append(Problem("yaml", f"{given} is a folder, not a YAML file", f"yaml={given}/<file>.yaml"
                                 + (f" (it holds {', '.join(inside)})" if inside else "")))
            continue
        if not path.is_file():
            found.append(Problem("yaml", f"{path}: no such file", fix))
            continue
        try:
            loaded = OmegaConf.load(path)
        except Exception as err:
            found.append(Problem("yaml", f"{path} is not readable YAML: {' '.join(str(err).split())}",
                                 "fix the file where the message says"))
            continue
        if not OmegaConf.is_dict(loaded):
            found.append(Problem("yaml", f"{path} is not a mapping of llm-foundry keys", fix))
        else:
            found += [Problem("yaml", f"{path} {problem}", fix) for problem, fix in refused(loaded)]
    return found


def _schemas() -> dict:
    from train.config.schema import SCHEMAS

    return SCHEMAS


def _schema_problems(override, key: str) -> list:
    """Our typed groups (train/config/schema.py) refuse a value of the wrong type or a key they lack at composition, in
    OmegaConf's words and with exit 1; the same verdict here, as key / problem / fix."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from train.checks import Problem
    from train.checks.core import did_you_mean, nearest, override_values

    group, _, sub = key.partition(".")
    node = OmegaConf.structured(_schemas()[group])
    found = []
    for v in override_values(override):
        if isinstance(v, str) and "${" in v:
            continue  # an interpolation: resolved (and checked) later
        try:
            OmegaConf.update(node, sub, v, merge=True)
        except (ConfigAttributeError, ConfigKeyError):
            if override.is_add() or override.is_force_add():
                return found  # `+cluster.x=`: Hydra refuses it too, in its own words
            # the schema's keys, not those of its open maps (a user's own names)
            options = [f"{group}.{k}" for k in _dotted_keys(OmegaConf.to_container(node), open_maps=OPEN_MAPS)]
            close = nearest(key, options)
            found.append(Problem(key, f"is not a key of {group} (train/config/schema.py)",
                                 did_you_mean(close, v) if close else
                                 f"see the keys with `python -m train --cfg job --package {group}`"))
            return found
        except ValidationError:
            found.append(_wrong_type(group, sub, v))
        except Exception:
            continue
    return found


def _wrong_type(group: str, sub: str, given):
    """The problem of a value of the wrong type for `<group>.<sub>`, said by the schema's own type of that key."""
    import dataclasses
    import typing

    from omegaconf import OmegaConf

    from train.checks import Problem

    def bare(kind):  # Optional[X] is X
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind

    key, kind, parts = f"{group}.{sub}", _schemas()[group], sub.split(".")
    for i, part in enumerate(parts):
        kind = bare(kind)
        if dataclasses.is_dataclass(kind):
            kind = typing.get_type_hints(kind).get(part)
        elif typing.get_origin(kind) is dict:  # an open map (cluster.env): any name, its value's type
            kind = typing.get_args(kind)[1]
        else:  # below an entry of an open map, which holds text
            entry = f"{group}.{'.'.join(parts[:i])}"
            return Problem(key, f"{entry} holds a string (a value of {group}.{'.'.join(parts[:i - 1])}), not a "
                           "mapping", f"{entry}=<value>")
    kind = bare(kind)
    default = OmegaConf.select(OmegaConf.structured(_schemas()[group]), sub, default=None, throw_on_missing=False)
    if dataclasses.is_dataclass(kind) or typing.get_origin(kind) is dict:
        first = dataclasses.fields(kind)[0].name if dataclasses.is_dataclass(kind) else "<name>"
        what, fix = "a mapping of its own keys", f"{key}.{first}=<value> (`python -m train --cfg job --package {key}`)"
    elif typing.get_origin(kind) in (list, tuple) or kind in (list, tuple):
        what, fix = "a list", f"{key}=[<item>, ...]"
    else:
        what, example = {bool: ("true or false", "true"), int: ("a whole number", default),
                         float: ("a number", default), str: ("a string", default)}.get(kind, ("a value of its type", None))
        fix = f"e.g. {key}={example}" if example not in (None, "???") else f"{key}=<{what}>"
    return Problem(key, f"{given!r} is not {what} (the {group} schema, train/config/schema.py, refuses it at "
                   "composition)", fix)


OPEN_MAPS = ("env", "sbatch_extra", "tiers", "dtype_of")


def _dotted_keys(node, prefix="", open_maps=()) -> set:
    keys = set()
    if isinstance(node, dict):
        for k, v in node.items():
            full = f"{prefix}{k}"
            keys.add(full)
            if k not in open_maps:
                keys |= _dotted_keys(v, full + ".", open_maps)
    return keys


def suggest_keys(args: list) -> list:
    """For overrides of keys the config does not have (Hydra's "Key 'x' is not in struct"): the closest keys."""
    from hydra.core.global_hydra import GlobalHydra

    from common.paths import CONF
    from train.checks import ConfigError
    from train.checks.core import NOT_A_KEY, SEE_THE_KEYS, did_you_mean, nearest
    from train.config.compose import compose

    groups = {p.name for p in CONF.iterdir() if p.is_dir()}
    pairs = [a.split("=", 1) for a in args if "=" in a and not a.startswith("-")]
    choices = [f"{k}={v}" for k, v in pairs if k in groups]
    unknown = [(k.lstrip("~"), v) for k, v in pairs
               if not k.startswith("+") and "/" not in k and k not in groups | {"yaml"} and not k.startswith("hydra")]
    if not unknown:
        return []
    GlobalHydra.instance().clear()
    try:
        cfg = compose(choices)
    except Exception:
        return []
    finally:
        GlobalHydra.instance().clear()
    keys = _dotted_keys(OmegaConf.to_container(cfg, resolve=False))
    found = []
    for key, val in unknown:
        if key in keys:
            continue
        # a misspelt key is close to one beside it (not to its parent: model.attn_config.alibi is no typo of
        # model.attn_config, it is an llm-foundry key the preset does not set)
        parent, _, name = key.rpartition(".")
        beside = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
        match = nearest(name, beside)
        if match:
            fix = did_you_mean(beside[match], val)
        elif parent and isinstance(OmegaConf.select(cfg, parent), DictConfig):
            fix = f"+{key}={val} (a key {parent} does not set yet: Hydra adds one with +)"
        else:
            fix = SEE_THE_KEYS
        found.append(ConfigError(key, NOT_A_KEY, fix))
    return found


def composition_problems(args: list, err) -> list:
    """Hydra's refusal of an override as it composes (its ConfigCompositionException), as key / problem / fix: a
    misspelt key under a group, said as "did you mean" where Hydra advised adding it with +; a key added with + that
    the config has; a value that cannot take a mapping's place. [] where there is nothing more to say than Hydra."""
    import re

    from train.checks import Problem

    text = str(err)
    if found := re.match(r"Could not override '([^']+)'", text):
        return [p for p in suggest_keys(args) if p.key == found.group(1)]
    if found := re.match(r"Could not append to config\. An item is already at '([^']+)'", text):
        key = found.group(1)
        given = [a.split("=", 1)[1] for a in args if "=" in a and a.split("=", 1)[0].lstrip("+") == key]
        return [Problem(key, "is set already, and + adds a key the config does not have",
                        f"{key}={given[-1] if given else '<value>'} (without +)")]
    if found := re.match(r"Error merging override ([^=\s]+)=(.*)", text):
        key, why = found.group(1).lstrip("+~"), " ".join(str(err.__cause__ or "").splitlines()[:1])
        return [Problem(key, f"`{found.group(2)}` cannot take its place" + (f" ({why})" if why else ""),
                        f"a value of the kind it holds (`python -m train --cfg job` shows it); a mapping's keys are "
                        f"set one by one: {key}.<name>=<value>")]
    return []


def before_hydra(args: list):
    """The one wrapper over Hydra's own errors of a command line, said as key / problem / fix, exit 2, nothing
    written: what Hydra would refuse before composing (its grammar, a preset or key that does not exist, two of its
    commands), refused here before Hydra reads the command line; what it refuses as it composes (a misspelt key
    under a group, for which it advises `+`), answered when it refuses it. Anything else is left to Hydra and the
    checks (validate). Returns the undo of the answer's patch of Hydra."""
    from common.compat import patch_hydra_composition_errors_answered_first
    from common.help import one_command
    from train.checks import report
    from train.checks.safety import command_line_secrets, masked

    # a credential by its shape, refused before Hydra's own errors can print it; masked in every other message
    secrets, masks = command_line_secrets(args)
    problems = one_command(args, "`--cfg job` without -m shows one point's config; `-m ... plan=true` plans every "
                           "point of a sweep") + secrets + hydra_problems(args)
    if problems and not report([masked(p, masks) for p in problems]):
        sys.exit(2)
    if "--resolve" in args:
        _mask_what_hydra_prints()

    def answer(err) -> None:
        problems = composition_problems(args, err)
        if problems:
            for problem in problems:
                print(problem, file=sys.stderr)
            sys.exit(2)

    return patch_hydra_composition_errors_answered_first(answer)


def _mask_what_hydra_prints() -> None:
    """A look with --resolve prints values taken from the environment (`${oc.env:HF_TOKEN}`, a password in
    MLFLOW_TRACKING_URI), which Hydra prints itself: what reaches stdout has the values of the environment's
    credential variables, and anything of a credential's shape, masked."""
    from train.checks.safety import CREDENTIAL, mask_shapes

    held = sorted((v for k, v in os.environ.items() if CREDENTIAL.search(k) and len(v) >= 4), key=len, reverse=True)
    real = sys.stdout

    class Masked:
        def write(self, text: str) -> int:
            for value in held:
                text = text.replace(value, "****")
            return real.write(mask_shapes(text))

        def __getattr__(self, name):
            return getattr(real, name)

    sys.stdout = Masked()
