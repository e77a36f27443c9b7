"""Everything checked before a run starts or a sweep is submitted. Light: no torch, no llm-foundry.

Each rule is a small function `rule(cfg, ctx)` yielding Problems (key, problem, fix; an error or a warning), in
modules by what they look at: config values (values.py), credentials and shell safety (safety.py), experiment
tracking (tracking.py), this node's files (node.py), memory fit (fit.py); sweeps add one rule across points
(here). `check` runs them all and returns every problem at once, in a stable order, so a config is fixed in one
round trip.

An error is what llm-foundry, composer, streaming or Slurm would refuse, or what surely fails, and says which;
a warning is legal but likely a mistake: printed, put in the plan, and the run goes on. In a plan, the rules
about this node's files and the memory fit are warnings too (plans are made away from the cluster).
"""
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from train.checks import (
    checkpoints,
    continuation,
    fit,
    foundry_values,
    hf_model,
    node,
    open_maps,
    preflight_rules,
    safety,
    tracking,
    values,
)
from train.checks.core import (  # noqa: F401
    ERROR,
    WARNING,
    ConfigError,
    Context,
    Problem,
    mark_resolved,
    reading,
    resolved,
    value,
)

RULES = [*safety.RULES, *values.RULES, *foundry_values.RULES, *tracking.RULES, *preflight_rules.RULES, *node.RULES, *fit.RULES,
         *checkpoints.RULES, *continuation.RULES, *open_maps.RULES]
# llm-foundry's Hugging Face models (hf_causal_lm) first: the rules after them count the figures of the
# architecture these read
RULES = [*hf_model.RULES, *RULES]
# Warnings in a plan: what only this node can tell, the memory estimate, and mock data on a cluster (a plan is
# asked "does it fit", often before the data exists; it says what a run would refuse).
SOFT_IN_PLAN = {r for r in node.RULES + fit.RULES if r not in node.EVERYWHERE} | {values.mock_data_only_where_asked}


def check(cfg, ctx: Context) -> list:
    """Every problem of one config, errors and warnings, in rule order (each reported once)."""
    cfg = resolved(cfg)
    with reading(cfg):  # the rules' reads, and the credentials looked for in every value, from one plain copy
        unique = []
        for p in _found(cfg, ctx):
            if p not in unique:
                unique.append(p)
        unique = _said_as_followed(cfg, unique)
        secrets = safety.secret_values(cfg) if unique else []
    return [p.masked(secrets) for p in unique]  # never echo a credential


# Keys that follow another by the presets' interpolation (conf/recipe: `${max_seq_len}`, ...): a bad value they
# hold because the key they follow holds it is said once, as that key's.
FOLLOWS = {"model.max_seq_len": "max_seq_len", "tokenizer.kwargs.model_max_length": "max_seq_len",
           "device_eval_batch_size": "device_train_microbatch_size"}


def _said_as_followed(cfg, problems: list) -> list:
    bad = {p.key for p in errors(problems)}

    def followed(p) -> bool:
        try:
            return value(cfg, p.key) == value(cfg, FOLLOWS[p.key])
        except ConfigError:  # one of them does not resolve: each names its own
            return False

    return [p for p in problems if not (p.level == ERROR and FOLLOWS.get(p.key) in bad and followed(p))]


def _found(cfg, ctx: Context) -> list:
    found = []
    for rule in RULES:
        try:
            for p in rule(cfg, ctx) or ():
                found.append(p.as_warning() if ctx.mode == "plan" and rule in SOFT_IN_PLAN else p)
        except ConfigError as err:  # a value the rule reads is missing or does not resolve
            found.extend(err.problems)
        except InterpolationResolutionError as err:  # read unresolved (a config that does not resolve as a whole)
            from train.checks.core import unresolved

            found.append(unresolved(cfg, getattr(err, "full_key", None) or "config", err))
        except (TypeError, ValueError, ZeroDivisionError, AttributeError, KeyError):
            # A rule reading a value an earlier problem already names (nodes=0, a string for a number).
            if not errors(found):
                raise
    return found


def validate(points: list, ctxs: list, *, sweep=None, first: int | None = None, unresolved: dict | None = None,
             checked: dict | None = None) -> list:
    """Every check of a command's config: the one pass, on the login node, before anything is written or submitted.
    A plain run and its plan ask it for their point (train/checks/gate.py, Hydra's callback before it writes the run
    folder); `-m` for the sweep's own settings as the sweep starts (the same callback: what its sweeper and launcher
    would fail on as they start, sweep=the command's Hydra config) and for every point (train/launch/sweep_app.py,
    before anything is submitted). A task checks again only what the allocation alone can see (its devices, mounts,
    shards, the checkpoint it resumes from).

    points: the composed configs, each with its Context in ctxs; a sweep's (first: the number of the first) are
    said as `[sweep point #n] key`, and checked for what no single point shows: two points writing one save_folder
    would resume from, and overwrite, each other's checkpoints. unresolved: {point's index: the problems of
    resolving it} for a point that does not resolve, checked as it is so that its problems name their keys (said
    where checking finds no error of its own). checked: {point's index: its problems} for points checked already
    (one that does not resolve is checked while its own Hydra context is set: its run name reads it)."""
    found = []
    if sweep is not None:
        found += [*values.sweeper_storage(sweep.hydra.sweeper), *values.objective_direction(sweep),
                  *values.foreign_launcher(sweep), *values.launcher_resources(sweep),
                  *safety.launcher_safety(sweep)]
    folders = {}
    for num, (cfg, ctx) in enumerate(zip(points, ctxs)):
        if checked and num in checked:
            found += checked[num]
            continue
        own = check(cfg, ctx)
        if unresolved and num in unresolved and not errors(own):
            own += unresolved[num]
        if first is None:
            found += own
            continue
        found += [p.at_point(first + num) for p in own]
        if unresolved and num in unresolved:
            continue  # its save_folder may be what does not resolve
        folder = cfg.get("save_folder")
        if folder and folder in folders:
            found.append(Problem("save_folder", f"sweep points #{folders[folder]} and #{first + num} both write to "
                                 f"{folder}",
                                 "leave save_folder to the checkpoint group (one folder per run_name), or make it "
                                 "differ per point, e.g. save_folder=/data/ckpt/${run_name}"))
        folders.setdefault(folder, first + num)
    return checkpoints.said_once(found)


def errors(problems: list) -> list:
    return [p for p in problems if p.level == ERROR]


def report(problems: list, stream=None) -> bool:
    """Print every problem (errors first), to stderr; True when none is an error."""
    import sys

    stream = stream or sys.stderr
    bad = errors(problems)
    for p in bad + [p for p in problems if p.level != ERROR]:
        print(p, file=stream)
    if len(bad) > 1:
        print(f"{len(bad)} problems: nothing was started or written", file=stream)
    return not bad


def resolve_all(cfg) -> None:
    """Resolve every interpolation in place, naming the key whose interpolation fails."""
    try:
        OmegaConf.resolve(cfg)
        mark_resolved(cfg)
    except InterpolationResolutionError as err:
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(key, f"cannot be resolved ({err.__cause__ or err})".splitlines()[0],
                          "set the keys it refers to, or give it a value directly") from None
