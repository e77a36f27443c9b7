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
