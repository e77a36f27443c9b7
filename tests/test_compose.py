"""A sweep's points composed once per distinct set of group choices (common/compose.py: sweep_points) are the
configs Hydra composes for each point from scratch: same values, same Hydra context (run_name, output folder)."""
import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict, read_write

from common.compose import sweep_points, without_hydra
from common.paths import CONF
from train.config.compose import command_line

LINE = ["-m", "cluster=local,slurm-local", "optimizer.lr=1e-3,2e-3", "checkpoint=full",
        "+variables.tag=a,b", "cluster.env.NCCL_DEBUG=WARN", "max_seq_len=64", "~eval_loader.dataset.shuffle_seed"]


def _points(config) -> list:
    """The command line's points as Hydra's basic sweeper makes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    return [list(p) for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]


def _by_hydra(loader, master, num, overrides, sweep_dir):
    """What Hydra itself makes of one point: its whole composition from the config files."""
    cfg = loader.load_sweep_config(master, overrides)
    with open_dict(cfg.hydra.job), read_write(cfg.hydra):
        cfg.hydra.job.num = num
    return without_hydra(cfg, sweep_dir / str(cfg.hydra.sweep.subdir))


@pytest.fixture
def master(tmp_path):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONF), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration("train", overrides=command_line(LINE)[1:], run_mode=RunMode.MULTIRUN)
        yield loader, config
    GlobalHydra.instance().clear()


def test_each_point_equals_hydras_own_composition(master, tmp_path):
    loader, config = master
    ours = []
    for overrides, cfg in sweep_points(loader, config, tmp_path, _points(config)):
        OmegaConf.resolve(cfg)  # under the point's own Hydra context, as the gate does
        ours.append((overrides, OmegaConf.to_container(cfg)))
    points = _points(config)
    assert len(ours) == len(points) == 8 and [o for o, _ in ours] == points
    names = set()
    for num, overrides in enumerate(points):
        theirs = _by_hydra(loader, config, num, overrides, tmp_path)
        OmegaConf.resolve(theirs)
        assert ours[num][1] == OmegaConf.to_container(theirs), overrides
        names.add(theirs.run_name)
    # one run name per training (train/config/identity.py): only the learning rate differs in what is trained; the
    # cluster, an environment variable and a variable nothing reads do not (the gate names such points apart)
    assert len(names) == 2
    assert {c["cluster"]["name"] for _, c in ours} == {"local", "slurm-local"}
    assert all("shuffle_seed" not in c["eval_loader"]["dataset"] for _, c in ours)  # the deletion applied


def _from_scratch(overrides: list):
    """Hydra's compose API over conf/, the whole composition from the files, as the config and its Hydra context."""
    from hydra import compose as hydra_compose
    from hydra.core.hydra_config import HydraConfig

    from train.config.compose import open_map_override

    with initialize_config_dir(str(CONF), version_base=None):
        cfg = hydra_compose("train", overrides=[open_map_override(o) for o in overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    cfg = without_hydra(cfg, OmegaConf.select(cfg, "hydra.run.dir"))
    return OmegaConf.to_container(cfg, resolve=True), _context()


def _context() -> dict:
    from hydra.core.hydra_config import HydraConfig

    context = OmegaConf.to_container(HydraConfig.get(), resolve=False)
    for key in ("overrides", "runtime", "job"):
        assert context[key], key
    return context


# group choices, value overrides, `+` adds, `~` deletions, an open map, a value that names a group's key
POINTS = [[], ["optimizer.lr=1e-3"], ["model=mpt-125m", "cluster=ndv5", "seed=3"],
          ["cluster=ndv5", "model=mpt-125m", "optimizer.lr=1e-3", "+variables.tag=a"],
          ["cluster=slurm-local", "cluster.env.NCCL_DEBUG=WARN", "~eval_loader.dataset.shuffle_seed"],
          ["checkpoint=full", "save_num_checkpoints_to_keep=3", "max_seq_len=64"], ["optimizer.lr=2e-3"], []]


def test_compose_equals_hydras_own_composition_from_scratch_each_time(tmp_path, monkeypatch):
    """compose() (tests, benchmarks, the status and export commands) composes each set of group choices' defaults
    tree once per process and applies the value overrides to a copy: each config and its Hydra context (the run name
    reads the overrides) equal Hydra's composition from the files, called again and in another order."""
    from train.config.compose import compose, open_map_override

    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path))
    theirs = {}  # Hydra's composition from the files does not depend on what was composed before
    for overrides in [*POINTS, *reversed(POINTS)]:
        ours = OmegaConf.to_container(compose(overrides), resolve=True)
        context = _context()
        key = tuple(overrides)
        theirs[key] = theirs.get(key) or _from_scratch(overrides)
        assert (ours, context) == theirs[key], overrides
        assert context["overrides"]["task"] == [open_map_override(o) for o in overrides]  # as Hydra was given them


# Tests that add a file to conf/ or list its groups run one after another on one worker: a listing taken beside
# another test's temporary conf/local/test-*.yaml differed from one taken before it (two workers share conf/).
@pytest.mark.xdist_group("conf")
def test_compose_sees_a_config_file_added_or_changed_in_a_group(tmp_path, monkeypatch):
    import uuid

    from train.config.compose import compose

    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path))
    name = f"test-{uuid.uuid4().hex[:8]}"  # an option of its own (conf/local/default.yaml may be a developer's)
    path = CONF / "local" / f"{name}.yaml"
    try:
        path.write_text("# @package _global_\ncluster: {account: first}\n")
        assert compose([f"local={name}"]).cluster.account == "first"
        path.write_text("# @package _global_\ncluster: {account: second, partition: p}\n")
        assert compose([f"local={name}"]).cluster.account == "second"  # changed: composed again
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("overrides", [["optimizer.lr=1e-3,2e-3"], ["nosuch.key=1"], ["model=nosuch"],
                                       ["model=mpt-125m", "optimizer.nosuch=1"]])
def test_compose_refuses_what_hydra_refuses_with_its_message(overrides, tmp_path, monkeypatch):
    from train.config.compose import compose

    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path))
    compose(["model=mpt-125m"])  # a set of group choices already composed
    with pytest.raises(Exception) as ours:
        compose(overrides)
    with pytest.raises(Exception) as theirs:
        _from_scratch(overrides)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def test_an_interpolation_parsed_once_reads_the_same_after_others(tmp_path):
    """Each `${...}` text is parsed once per process (common/compat.py): a tree made earlier, read again
    after the grammar's lexer has gone through other texts, gives what a first parse gives; a text that does
    not parse is refused each time, not remembered as something else."""
    import omegaconf.base
    from omegaconf.errors import GrammarParseError

    cfg = OmegaConf.create({"a": "${b}-x", "b": 1, "c": "${a}/${b}${oc.env:NO_SUCH_VAR_HERE,d}", "e": "${oc.select:b}"})
    first = OmegaConf.to_container(cfg, resolve=True)
    before = omegaconf.base.parse.cache_info()
    OmegaConf.to_container(OmegaConf.create({f"k{i}": f"${{b}}{i}:${{c}}" for i in range(50)}
                                            | {"b": "y", "c": "z"}), resolve=True)
    cfg.b = 2  # the same texts, other values
    again = OmegaConf.to_container(cfg, resolve=True)
    assert first == {"a": "1-x", "b": 1, "c": "1-x/1d", "e": 1}
    assert again == {"a": "2-x", "b": 2, "c": "2-x/2d", "e": 2}
    assert omegaconf.base.parse.cache_info().hits > before.hits  # read from the cache, and still right
    for _ in range(2):
        with pytest.raises(GrammarParseError):
            _ = OmegaConf.create({"bad": "${b"}).bad


def _as_hydras_main(overrides: list, multirun: bool):
    """What Hydra's main does with a command line (hydra/_internal/utils.py, _run_hydra and _run_app): the mode
    from get_mode, then the composition it runs or sweeps, `hydra.mode=<mode>` added where the config sets none."""
    hydra = GlobalHydra.instance().hydra
    overrides = list(overrides)
    mode = hydra.get_mode(config_name="train", overrides=overrides)
    if mode is None:
        mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        overrides.append(f"hydra.mode={mode.name}")
    return hydra.compose_config("train", overrides, run_mode=mode, with_log_configuration=False)


@pytest.mark.parametrize("line", [["seed=abc"], ["model=mpt-125m", "optimizer.lr=2e-3", "plan=true"],
                                  ["-m", "cluster=local,slurm-local", "optimizer.lr=1e-3,2e-3"],
                                  ["-m", "checkpoint=full", "hydra.mode=MULTIRUN"], ["optimizer.lr=1e-3,2e-3"],
                                  ["model=nosuch"], ["-m", "hydra.launcher.nosuch=1,2"]])
def test_a_command_composes_once_what_hydra_composes_twice(line, tmp_path, monkeypatch):
    """Hydra's main composes a command's config twice (get_mode reads hydra.mode from a whole composition); a
    command composes it once (common/compat.py: patch_hydra_compose_once_per_command) and gets the same config, or Hydra's
    same error: a sweep override without -m, a preset that does not exist, a sweep over Hydra's own settings."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from common.compat import patch_hydra_compose_once_per_command

    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path))
    multirun = line[0] == "-m"
    overrides = command_line(line)[multirun:]
    hydras = ConfigLoaderImpl._load_configuration_impl
    composed = []
    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl",
                        lambda self, *a, **k: composed.append(1) or hydras(self, *a, **k))
    results = []
    for once in (False, True):
        undo = patch_hydra_compose_once_per_command(line) if once else (lambda: None)
        composed.clear()
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(str(CONF), version_base=None):
                cfg = _as_hydras_main(overrides, multirun)
                results.append(("config", OmegaConf.to_container(cfg, resolve=False), len(composed)))
        except Exception as err:  # noqa: BLE001 -- Hydra's error, compared below
            results.append(("error", (type(err), str(err)), None))
        finally:
            undo()
            GlobalHydra.instance().clear()
    (kind, hydras_result, hydras_count), (ours_kind, ours, count) = results
    assert (ours_kind, ours) == (kind, hydras_result)
    if kind == "config":
        assert (hydras_count, count) == (2, 1)
        assert ours["hydra"]["mode"] == (RunMode.MULTIRUN if multirun else RunMode.RUN)


@pytest.mark.xdist_group("conf")  # (see above)
def test_a_commands_help_lists_what_hydras_lists_from_one_copy_of_the_repository(monkeypatch):
    """`--help` lists every config group's options: Hydra copies the whole config repository for each question it
    asks; a command (patch_hydra_compose_once_per_command) asks one copy, and lists the same."""
    from hydra._internal.config_repository import CachingConfigRepository

    from common.compat import patch_hydra_compose_once_per_command

    copies = []
    hydras = CachingConfigRepository.__init__
    monkeypatch.setattr(CachingConfigRepository, "__init__", lambda self, d: copies.append(1) or hydras(self, d))
    listed = []
    for once in (False, True):
        undo = patch_hydra_compose_once_per_command([]) if once else (lambda: None)
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(str(CONF), version_base=None):
                hydra = GlobalHydra.instance().hydra
                copies.clear()
                ours = [hydra.format_config_groups(lambda g, h=h: g.startswith("hydra") == h) for h in (False, True)]
                listed.append((ours, len(copies)))
        finally:
            undo()
            GlobalHydra.instance().clear()
    (hydras_list, hydras_copies), (ours, our_copies) = listed
    assert ours == hydras_list and "model: " in ours[0] and "hydra/launcher: " in ours[1]
    assert hydras_copies > 50 and our_copies == 1
