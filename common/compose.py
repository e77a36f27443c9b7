"""Compose a sweep's points as their jobs will (same Hydra context), for any app of this project: the launcher
hands each app the points a sweeper gives it (common/sweep/launch.py), and the app composes and checks
them here (train/launch/sweep_app.py, data_prep/sweep_app.py)."""
import contextlib
import copy
import gc
from pathlib import Path

from omegaconf import DictConfig, open_dict, read_write


def without_hydra(cfg: DictConfig, output_dir, in_place: bool = False) -> DictConfig:
    """The job's config as the task sees it: Hydra's context set (as run_job does), the `hydra` node dropped
    (from a copy, unless `cfg` is the caller's own to change)."""
    from common.compat import hydra_context_moving_its_node

    cfg = cfg if in_place else copy.deepcopy(cfg)
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(output_dir)
    hydra_context_moving_its_node(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


@contextlib.contextmanager
def kept_points():
    """While a sweep's points are composed and kept: Python's cycle collector leaves alone what the command holds
    already (its modules, Hydra's and the app's state) and runs less often. Every point stays alive until it is
    submitted, so each full collection would walk all the points made so far again, for garbage that a config
    rarely leaves; the collector is as it was afterwards."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def sweep_points(loader, config: DictConfig, sweep_dir, points: list, first: int = 0):
    """Every point given (a list of overrides each, numbered from `first`) as (overrides, config): composed
    exactly as its job will compose it (same Hydra context), its hydra node dropped, unresolved; its Hydra
    context is set for each config as it is made, so the caller resolves each point before asking for the next
    (train/launch/sweep_app.py).

    Hydra composes a config in two steps (ConfigLoaderImpl._load_configuration_impl in the pinned Hydra): the
    defaults tree from the config group choices (most of the cost: every YAML file read and merged), then the
    value overrides applied on top. A sweep's points mostly share their group choices, so the first step runs
    once per distinct set of them and the second, Hydra's own function, runs on a copy for each point.
    tests/test_compose.py checks the result against Hydra composing each point from scratch."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from common.compat import hydra_caching_repo, hydra_with_value_overrides

    parser = OverridesParser.create()
    # the repository as Hydra composes with it: with the primary config's `hydra.searchpath` (yaml=PATH's source)
    repo = hydra_caching_repo(loader, config.hydra.job.config_name)
    bases, seen = {}, {}  # an override's text parsed once: a grid's points repeat each value many times
    for num, overrides in enumerate(points, start=first):
        parsed = [seen[o] if o in seen else seen.setdefault(o, parser.parse_overrides([o])[0]) for o in overrides]
        values, groups = split(repo, parsed)
        if groups not in bases:
            bases[groups] = loader.load_sweep_config(config, list(groups))
        cfg = hydra_with_value_overrides(bases[groups], parsed, values)
        with open_dict(cfg.hydra), read_write(cfg.hydra):
            cfg.hydra.job.num = num
        yield list(overrides), without_hydra(cfg, Path(sweep_dir) / str(cfg.hydra.sweep.subdir), in_place=True)


def split(repo, parsed: list) -> tuple[list, tuple]:
    """(value overrides, group choices' input lines) of parsed overrides, by Hydra's own test for a value override
    (hydra/_internal/defaults_list.py: Overrides): a dict value, or a key that names no config group."""
    is_value = [isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group) for o in parsed]
    return ([o for o, v in zip(parsed, is_value) if v],
            tuple(o.input_line for o, v in zip(parsed, is_value) if not v))
