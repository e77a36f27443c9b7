"""What every rule shares: a Problem, the Context a rule sees, and reading a value from the config."""
import contextlib
import copy
import datetime
import difflib
import math
import os
import re
import weakref
from dataclasses import dataclass, field

from omegaconf import ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import InterpolationResolutionError, InterpolationToMissingValueError, MissingMandatoryValue

from common.errors import ERROR, WARNING, Problem, UserError  # noqa: F401  (the rules import them from here)
from train.config.loaders import split_folder  # noqa: F401  (the rules import it from here)


class ConfigError(UserError):
    """Problems of a training config that stop a run: raised where checking cannot go on (a value is missing,
    a save folder is held by another run)."""


@dataclass(frozen=True)
class Context:
    """What a rule may know besides the config, read once at the entry.

    mode: "run" (a plain `python -m train`: trains in this process), "sweep" (`-m`: each point is a job of
    cluster.nodes x cluster.tasks_per_node ranks) or "plan" (describes the job `-m` would submit; the rules about
    this node's files and memory become warnings, since a plan is often made away from the cluster).
    overrides: the command-line overrides (of this sweep point), to tell what the user asked for from defaults.
    choices: the config groups picked (model, data, cluster, ...).
    scheduler: where the config runs under `-m`, "local" or "slurm", as its run spec decides (train/launch/spec.py)."""

    mode: str = "run"
    overrides: tuple = ()
    choices: dict = field(default_factory=dict)
    scheduler: str = "local"

    def world_size(self, cfg) -> int:
        if self.mode == "run":
            return int(os.environ.get("WORLD_SIZE", "1") or 1)
        return value(cfg, "cluster.nodes") * value(cfg, "cluster.tasks_per_node")

    def world_words(self, cfg) -> str:
        ws = self.world_size(cfg)
        if self.mode == "run":
            return f"world size {ws} (a plain run trains in this process; `-m` runs cluster.nodes x tasks_per_node ranks)"
        return f"world size {ws} (cluster.nodes={cfg.cluster.nodes} x cluster.tasks_per_node={cfg.cluster.tasks_per_node})"

    def given(self, key: str) -> str | None:
        """The value the command line gave `key` (`key=v`, `+key=v`, `++key=v`), or None."""
        return next((str(o).partition("=")[2] for o in self.overrides if override_key(o) == key), None)

    @property
    def slurm(self) -> bool:
        return self.scheduler == "slurm"

    def group(self, name: str) -> str:
        return str(self.choices.get(name, "?"))


def override_key(override) -> str:
    """The key a command-line override names: `key=v`, `+key=v`, `++key=v`, `~key`."""
    return str(override).partition("=")[0].lstrip("+~")


def override_values(override, text: bool = False) -> list:
    """The values an override gives (each of a sweep's), as text or as Hydra reads them; none for glob() and
    range(), which Hydra expands itself."""
    try:
        if override.is_sweep_override():
            return list(override.sweep_string_iterator() if text else override.sweep_iterator())
        return [override.get_value_element_as_str() if text else override.value()]
    except Exception:  # glob(), range()
        return []


def no_value(key: str) -> Problem:
    return Problem(key, "has no value", f"pass it on the command line: {key}=<value>")


_MISSING_BEHIND = re.compile(r"Missing mandatory value: ?(\S+)")


def missing_behind(err: InterpolationResolutionError) -> str | None:
    """The `???` key an interpolation refers to, when that is why it does not resolve (`${variables.data_local}`
    with no data_local): the key to name, once, rather than each key that refers to it."""
    found = _MISSING_BEHIND.search(str(err))
    return found.group(1).rstrip(".,") if found and isinstance(err, InterpolationToMissingValueError) else None


# `${a.b}`: a reference to another key (not a resolver such as `${oc.env:X}`, not a relative `${.x}`)
_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def _raw(cfg, key: str):
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return OmegaConf.to_container(node, resolve=False)[int(last) if isinstance(node, ListConfig) else last]


def unresolved(cfg, key: str, err: InterpolationResolutionError) -> Problem:
    """The one problem behind a value that does not resolve, named where it is: the `???` key it refers to, or,
    following its references (`train_loader.dataset.local: ${variables.data_local}` -> `variables.data_local:
    ${nope}/c4`), the first key whose own value fails. Every key that refers to it gives this same Problem, so it
    is said once."""
    if missing := missing_behind(err):
        return no_value(missing)
    seen = {key}
    while True:
        try:
            raw = _raw(cfg, key)
        except Exception:  # a key inside a value that is not a mapping: name the key as it was read
            break
        for ref in _REFERENCE.findall(str(raw)):
            try:
                OmegaConf.select(cfg, ref, throw_on_missing=True)
            except InterpolationResolutionError as inner:
                if ref not in seen:
                    key, err = ref, inner
                    seen.add(ref)
                    break
            except Exception:
                continue
        else:
            shell = [r for r in _REFERENCE.findall(str(raw)) if "." not in r and OmegaConf.select(cfg, r) is None]
            if key.startswith("cluster.env.") and shell:  # `${SLURM_JOB_ID}`: the shell's spelling, read by OmegaConf
                return Problem(key, f"`{raw}`: ${{{shell[0]}}} is read as a config key here (an OmegaConf "
                               "interpolation), and there is none", f"for the job's environment variable write "
                               f"${shell[0]}, without braces (expanded in the job)")
            return Problem(key, f"`{raw}` cannot be resolved: {' '.join(str(err).splitlines()[0].split())}",
                           "set the key it refers to (under `variables:` in your YAML, or on the command line), "
                           "or give this key a value")
    return Problem(key, f"cannot be resolved: {' '.join(str(err).splitlines()[0].split())}",
                   "set the keys it refers to, or give it a value directly")


def value(cfg, key: str, default=None):
    """The resolved value at a dotted key, turning OmegaConf's errors into ours."""
    held = _PLAIN.get(id(cfg))
    if held is not None and held[0]() is cfg:
        found = _leaf(held[1], key, default) if _DOTTED.fullmatch(key) else _NODE
        if found is not _NODE:
            return found
        nodes = held[2]  # a node read once (the rules read the same mappings again and again)
        if not isinstance(default, (str, int, float, type(None))):
            return _select(cfg, key, default)
        if (key, default) not in nodes:
            nodes[key, default] = _select(cfg, key, default)
        return nodes[key, default]
    return _select(cfg, key, default)


def _select(cfg, key: str, default):
    try:
        return OmegaConf.select(cfg, key, default=default, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(problems=[no_value(key)]) from None
    except InterpolationResolutionError as err:
        raise ConfigError(problems=[unresolved(cfg, key, err)]) from None


def resolved(cfg):
    """The config with every interpolation resolved once, flags kept. The rules and the plan read hundreds of
    values, and OmegaConf would parse an interpolation again at every read. A config
    that does not resolve as a whole is returned as it is, so each rule still names the key it cannot read; one
    resolved already (here, or in place by resolve_all) is returned as it is."""
    if is_resolved(cfg):
        return cfg
    try:
        # The run's name once: every folder of the run interpolates it, and each read would compute its identity
        # (train/config/identity.py) again, the most expensive value here.
        src = cfg
        if OmegaConf.is_interpolation(cfg, "run_name"):
            src = copy.deepcopy(cfg)
            with open_dict(src), read_write(src):
                src.run_name = cfg.run_name
        out = OmegaConf.create(OmegaConf.to_container(src, resolve=True))
    except Exception:  # noqa: BLE001 -- any value that does not resolve: the rules report it by key
        return cfg
    OmegaConf.set_struct(out, bool(OmegaConf.is_struct(cfg)))
    OmegaConf.set_readonly(out, bool(OmegaConf.is_readonly(cfg)))
    mark_resolved(out)
    return out


# Configs that hold no interpolation: made by resolved(), or resolved in place (train/checks/__init__.py's
# resolve_all). Known by their id while they live.
_RESOLVED: dict = {}


def mark_resolved(cfg) -> None:
    key = id(cfg)
    _RESOLVED[key] = weakref.ref(cfg, lambda _, key=key: _RESOLVED.pop(key, None))


def is_resolved(cfg) -> bool:
    """Whether cfg is known to hold no interpolation (made by resolved(), or resolved in place by resolve_all)."""
    ref = _RESOLVED.get(id(cfg))
    return ref is not None and ref() is cfg


# While the rules read a resolved config (`reading`), its values as plain Python: a read is a few dict lookups,
# where OmegaConf.select would walk its nodes (a sweep's checks read tens of thousands of values).
_PLAIN: dict = {}
_DOTTED = re.compile(r"[\w-]+(\.[\w-]+)*")
_NODE = object()  # a value that is itself a mapping or a list: read as OmegaConf gives it (a config node)


@contextlib.contextmanager
def reading(cfg):
    """Reads of a config resolved as a whole through value() come from its plain values within this block; it
    must not change meanwhile (the rules only read)."""
    if not is_resolved(cfg) or id(cfg) in _PLAIN:
        yield
        return
    _PLAIN[id(cfg)] = (weakref.ref(cfg), OmegaConf.to_container(cfg), {})
    try:
        yield
    finally:
        _PLAIN.pop(id(cfg), None)


def plain(cfg):
    """A config's values as plain Python, resolved (unresolved where a value does not resolve, for the rules that
    look at every text): the copy `reading` holds, or made now."""
    held = _PLAIN.get(id(cfg))
    if held is not None and held[0]() is cfg:
        return held[1]
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # noqa: BLE001 -- a value that does not resolve is another rule's problem
        return OmegaConf.to_container(cfg, resolve=False)


def mapping(cfg, key: str):
    """The mapping at a dotted key as a plain dict, read from the copy `reading` holds, for a rule that asks it for
    many keys it mostly lacks (a struct DictConfig raises and catches an error for each); as value() gives it
    where there is no such copy, or where one of its values is missing."""
    held = _PLAIN.get(id(cfg))
    if held is not None and held[0]() is cfg:
        found = _leaf(held[1], key, _NODE, mappings=True)
        if isinstance(found, dict):
            return found
    return value(cfg, key)


def _leaf(plain, key: str, default, mappings: bool = False):
    """The value at key in plain values, default where a mapping lacks it, _NODE where OmegaConf itself must say
    (a mapping or list as a node, a list's index, a key below a value). mappings: a mapping none of whose values is
    missing as it is."""
    node = plain
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif not isinstance(node, dict):
            return _NODE
        elif part in node:
            node = node[part]
        else:
            return default
    if mappings and isinstance(node, dict) and "???" not in node.values():
        return node
    if isinstance(node, (dict, list)):
        return _NODE
    if node == "???":
        raise ConfigError(problems=[no_value(key)])
    return node


def nearest(word, options, cutoff: float = 0.6) -> str | None:
    """The one suggester of a name for a misspelt one (a key, a preset, a metric, a setting): the closest of
    options, or None. Every "did you mean" of the project asks it."""
    found = difflib.get_close_matches(str(word), sorted(options), n=1, cutoff=cutoff)
    return found[0] if found else None


def close_match(word: str, options) -> str:
    found = nearest(word, options)
    return f"did you mean `{found}`?" if found else ""


def close_or_all(word, options) -> str:
    """The fix of a name not among options: the closest one, and all of them."""
    close = close_match(str(word), options)
    return (close + " " if close else "") + f"one of: {', '.join(sorted(options))}"


# An override of a key the config does not have, as the gate says it before Hydra composes and as it answers
# Hydra's own refusal while composing (train/checks/gate.py).
NOT_A_KEY = "is not a key of this config"
SEE_THE_KEYS = "see the keys with `python -m train --cfg job`; `+variables.<name>=...` adds a value of your own"


def did_you_mean(key: str, value) -> str:
    """The fix of a misspelt key on the command line: the key meant, and the override with it."""
    return f"did you mean {key}? ({key}={value})"


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_int(cfg, key: str, example=8):
    """The rule of a count: a whole number above 0."""
    v = value(cfg, key)
    if not is_int(v) or v <= 0:
        yield Problem(key, f"must be a positive whole number, got {v!r}", f"e.g. {key}={example}")


TIME_UNITS = "ba (batches), ep (epochs), tok (tokens) or sp (samples), e.g. 1000ba"
# composer's Time.from_timestring: a number (3e4 too), then a unit; a whole number but for dur (a fraction)
_TIME = re.compile(r"(.+?)(ba|ep|tok|sp|dur|sec|iter)", re.IGNORECASE)


def time_of(text) -> tuple | None:
    """(value, unit) of a time as composer reads it ("100ba", "3e4tok", "0.5dur", "1h30m" -> (5400, "sec")), None
    where it would refuse it."""
    seconds = _wall_clock(text) if isinstance(text, str) else None
    if seconds is not None:
        return seconds, "sec"
    found = _TIME.fullmatch(text) if isinstance(text, str) else None
    try:
        number = float(found.group(1))
    except (AttributeError, ValueError):
        return None
    unit = found.group(2).lower()
    if unit == "dur":
        return number, unit
    return (int(number), unit) if number.is_integer() else None


def _wall_clock(text: str) -> int | None:
    """Seconds of a wall-clock time, which composer reads first (Time.from_timedelta): its verify_wct fills in the
    missing parts ("45m" -> "0h45m0s") and strptime reads "%Hh%Mm%Ss", so hours stop at 23 and minutes at 59."""
    if not text.strip():
        return None  # composer reads "" as 0 seconds; here it is a value left empty, refused with the key named
    filled = text if "h" in text else "0h" + text
    filled = filled if "m" in filled else filled.replace("h", "h0m")
    filled = filled if "s" in filled else filled + "0s"
    if not re.fullmatch(r"(\d+h)?(\d+m)?(\d+s)?", filled):
        return None
    try:
        t = datetime.datetime.strptime(filled, "%Hh%Mm%Ss")
    except ValueError:
        return None
    return t.hour * 3600 + t.minute * 60 + t.second


def zero_interval(v) -> str | None:
    """What composer's interval scheduler (create_interval_scheduler: save_interval, eval_interval, hf_checkpointer's
    interval) does with an interval of 0: "never" for 0 of a unit (`0`, `0ba`, `0ep`: it never fires, not even at
    the end), "dur" for `0dur` (its check divides by it at the first batch); None for any other value."""
    time = None if isinstance(v, bool) else (0, "ep") if is_number(v) and v == 0 else time_of(str(v).strip())
    if time is None or time[0] != 0:
        return None
    return "dur" if time[1] == "dur" else "never"


def zero_dur(key: str, v) -> Problem:
    """The problem of a `0dur` interval (zero_interval)."""
    return Problem(key, f"{v!r} fails the run at its first batch: composer's interval check divides by it (a "
                   "ZeroDivisionError)", f"a positive interval, e.g. {key}=1000ba or {key}=0.1dur")


def batches(duration) -> int | None:
    time = time_of(duration)
    return time[0] if time and time[1] == "ba" else None


def per_batch(cfg, unit: str) -> int | None:
    """How many of `unit` one batch is: 1 ba, global_train_batch_size samples, that many samples of the train
    loader's length in tokens. None for other units, or where the config does not say."""
    from train.plan.estimate import trained_seq_len

    gbs, seq = value(cfg, "global_train_batch_size"), trained_seq_len(cfg)
    per = {"ba": 1, "sp": gbs, "tok": gbs * seq if is_int(gbs) and is_int(seq) else None}.get(unit)
    return per if is_int(per) and per > 0 else None


def batches_in(cfg, duration) -> int | None:
    """The batch a duration ends at in this config, as composer counts: `ba` as written; `sp` and `tok` at
    global_train_batch_size samples of the train loader's length a batch (a part batch counts whole: composer stops
    at the first batch that reaches the count); `dur` as that fraction of max_duration. None for epochs and
    wall-clock times (the data set's size, the speed decide) and where the config does not say."""
    time = time_of(duration)
    if time is None:
        return None
    n, unit = time
    per = per_batch(cfg, unit)
    if per:
        return math.ceil(n / per)
    if unit == "dur" and str(duration).strip() != str(value(cfg, "max_duration")).strip():
        total = batches_in(cfg, value(cfg, "max_duration"))
        return math.ceil(n * total) if total else None
    return None


def warmup_end(t_warmup, end: int | None, batches_of) -> int | None:
    """The batch a scheduler's warmup ends at, as composer's schedulers read it (_convert_time): a `dur` is that
    fraction of max_duration's `end` batches, whole batches down; another time in batches by batches_of; none: 0."""
    time = time_of(str(t_warmup)) if t_warmup else None
    if time and time[1] == "dur":
        return int(time[0] * end) if end is not None else None
    return batches_of(t_warmup) if t_warmup else 0


def same_or_under(path, root) -> bool:
    path, root = str(path).rstrip("/"), str(root).rstrip("/")
    return bool(root) and (path == root or path.startswith(root + "/"))
