"""Compose a sweep's points as their jobs will (same Hydra context), for any app of this project: the launcher
hands each app the points a sweeper gives it (common/sweep/launch.py), and the app composes and checks
them here (train/launch/sweep_app.py, data_prep/sweep_app.py)."""
import copy
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict, read_write


def without_hydra(cfg: DictConfig, output_dir, in_place: bool = False) -> DictConfig:
    """The job's config as the task sees it: Hydra's context set (as run_job does), the `hydra` node dropped
    (from a copy, unless `cfg` is the caller's own to change)."""
    cfg = cfg if in_place else copy.deepcopy(cfg)
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def sweep_points(loader, config: DictConfig, sweep_dir, points: list, first: int = 0):
    """Every point given (a list of overrides each, numbered from `first`) as (overrides, config): composed
    exactly as its job will compose it (same Hydra context), its hydra node dropped, unresolved; its Hydra
    context is set for each config as it is made, so the caller resolves each point before asking for the next
    (train/launch/sweep_app.py).

    Hydra composes a config in two steps (ConfigLoaderImpl._load_configuration_impl in the pinned Hydra): the
    defaults tree from the config group choices (most of the cost: every YAML file read and merged), then the
    value overrides applied on top. A sweep's points mostly share their group choices, so the first step runs
    once per distinct set of them and the second, Hydra's own function, runs on a copy for each point: a
    128-point sweep is composed in seconds. tests/test_compose.py checks the result against Hydra composing
    each point from scratch."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    # the repository as Hydra composes with it: with the primary config's `hydra.searchpath` (yaml=PATH's source)
    _, repo = loader._parse_overrides_and_create_caching_repo(config.hydra.job.config_name, [])
    bases = {}
    for num, overrides in enumerate(points, start=first):
        parsed = parser.parse_overrides(overrides)
        values, groups = split(repo, parsed)
        if groups not in bases:
            bases[groups] = loader.load_sweep_config(config, list(groups))
        cfg = with_values(bases[groups], parsed, values)
        with open_dict(cfg.hydra), read_write(cfg.hydra):
            cfg.hydra.job.num = num
        yield list(overrides), without_hydra(cfg, Path(sweep_dir) / str(cfg.hydra.sweep.subdir), in_place=True)


def split(repo, parsed: list) -> tuple[list, tuple]:
    """(value overrides, group choices' input lines) of parsed overrides, by Hydra's own test for a value override
    (hydra/_internal/defaults_list.py: Overrides): a dict value, or a key that names no config group."""
    is_value = [isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group) for o in parsed]
    return ([o for o, v in zip(parsed, is_value) if v],
            tuple(o.input_line for o, v in zip(parsed, is_value) if not v))


def with_values(base: DictConfig, parsed: list, values: list) -> DictConfig:
    """A copy of `base` (Hydra's composition of the group choices among `parsed`) with the value overrides applied
    by Hydra's own function, and Hydra's record of all the overrides, in the order given: what Hydra composes from
    scratch for `parsed` (ConfigLoaderImpl._load_configuration_impl's second step)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname

    cfg = copy.deepcopy(base)
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    job = cfg.hydra.job
    with open_dict(cfg.hydra), read_write(cfg.hydra):
        cfg.hydra.overrides.task = [o.input_line for o in parsed]
        job.override_dirname = get_overrides_dirname(
            overrides=parsed, kv_sep=job.config.override_dirname.kv_sep,
            item_sep=job.config.override_dirname.item_sep,
            exclude_keys=job.config.override_dirname.exclude_keys)
    return cfg


def compose_once_per_command(args: list):
    """Make a command's Hydra compose its config once, not twice (`args`: the command line Hydra reads, -m and all).
    Hydra's main composes the whole config to read `hydra.mode` (Hydra.get_mode: in MULTIRUN mode, the overrides
    unchecked), then composes it again to run or sweep: a third of a refused, planned or submitted command's time
    (~0.25 s of ~0.8 s). Here get_mode composes in the mode the command runs in (RUN without -m), and that
    composition is the next one asked for with the same config name, overrides and mode (and the `hydra.mode=<mode>`
    Hydra adds to them when the config sets none), after Hydra's own check of the overrides for that mode. The
    config is the one Hydra would compose: RUN and MULTIRUN differ only where a group choice is `???` (MULTIRUN
    leaves it out, RUN refuses it); where RUN refuses, Hydra's own get_mode answers and nothing is kept. A kept
    composition is handed out once: a process that composes many configs keeps nothing between its own calls.
    Returns the undo (tests)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra.core.object_type import ObjectType
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    mode = RunMode.MULTIRUN if {"-m", "--multirun"} & set(args) else RunMode.RUN
    kept = {}
    hydras_get_mode, hydras_load = Hydra.get_mode, ConfigLoaderImpl.load_configuration

    def get_mode(self, config_name, overrides):
        try:
            cfg = hydras_load(self.config_loader, config_name=config_name, overrides=overrides, run_mode=mode,
                              validate_sweep_overrides=False)  # unchecked, as Hydra's get_mode
        except Exception:  # noqa: BLE001 -- Hydra's own answer, and its own error when it runs
            return hydras_get_mode(self, config_name, overrides)
        kept[(config_name, tuple(overrides), mode)] = cfg
        return cfg.hydra.mode

    def load_configuration(self, config_name, overrides, run_mode, from_shell=True, validate_sweep_overrides=True):
        given, added = list(overrides), []
        cfg = kept.pop((config_name, tuple(given), run_mode), None)
        if cfg is None and given[-1:] == [f"hydra.mode={run_mode.name}"]:
            # where the config sets no hydra.mode, Hydra's main adds `hydra.mode=<mode>` after get_mode
            added = given[-1:]
            cfg = kept.pop((config_name, tuple(given[:-1]), run_mode), None)
        if cfg is None:
            return hydras_load(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
        parser = OverridesParser.create()
        if validate_sweep_overrides:  # what _load_configuration_impl checks before it composes
            self.validate_sweep_overrides_legal(parser.parse_overrides(given), run_mode=run_mode, from_shell=from_shell)
        if added:  # a value override, applied last and recorded last, as _load_configuration_impl does
            ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(added), cfg)
            cfg.hydra.overrides.hydra.append(added[0])
        return cfg

    # `--help` lists each config group's options: Hydra makes a copy of the whole config repository for each of
    # the ~130 questions it asks (ConfigLoaderImpl.get_group_options), 3 of the command's 4 s. One copy answers all.
    hydras_options, repos = ConfigLoaderImpl.get_group_options, {}

    def get_group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None, overrides=None):
        key = (config_name, tuple(overrides or ()))
        if key not in repos:
            repos[key] = self._parse_overrides_and_create_caching_repo(config_name, list(key[1]))[1]
        return repos[key].get_group_options(group_name, results_filter)

    Hydra.get_mode, ConfigLoaderImpl.load_configuration = get_mode, load_configuration
    ConfigLoaderImpl.get_group_options = get_group_options

    def undo():
        Hydra.get_mode, ConfigLoaderImpl.load_configuration = hydras_get_mode, hydras_load
        ConfigLoaderImpl.get_group_options = hydras_options

    return undo
