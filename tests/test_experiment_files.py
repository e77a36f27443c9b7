"""conf/experiment/: the seeds' runs as reviewed files, each composing, passing the checks and planning with the
figures its header states; and the optional local config (conf/local/) applied before the command line."""
import json
import uuid

import pytest
from helpers import ROOT, run
from hydra.core.hydra_config import HydraConfig

from common.paths import CONF
from train.checks import Context, check, errors
from train.config.compose import compose
from train.launch.spec import scheduler
from train.plan.forecast import build_plan

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
# experiment -> (run name prefix, GPUs, storage root, checkpoint format)
FACTS = {
    "mpt-30b-ndv5-amlfs": ("mpt-30b-", 128, "/data", "sharded"),
    "mpt-30b-ndv5-blob": ("mpt-30b-", 128, "/blob", "sharded"),
    "mpt-7b-p4d-fsx": ("mpt-7b-", 16, "/fsx", "sharded"),
    "mpt-7b-p5-fsx": ("mpt-7b-", 16, "/fsx", "sharded"),
    "gpt-375m-ndv5-check": ("gpt-375m-", 16, None, None),
    "gpt-857m-ndv5-check": ("gpt-857m-", 16, None, None),
    "gpt175b-ndv5-amlfs": ("gpt175b-", 512, "/data", "sharded"),
}


def test_every_experiment_file_is_in_the_table():
    assert EXPERIMENTS == sorted(FACTS)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_each_experiment_composes_passes_the_checks_and_plans(name):
    prefix, gpus, root, fmt = FACTS[name]
    cfg = compose([f"experiment={name}"])
    choices = dict(HydraConfig.get().runtime.choices)
    assert choices["experiment"] == name
    problems = check(cfg, Context(mode="plan", overrides=(f"experiment={name}",), choices=choices,
                                  scheduler=scheduler(cfg)))
    assert not errors(problems), [str(p) for p in errors(problems)]
    assert cfg.run_name.startswith(prefix)
    assert cfg.cluster.nodes * cfg.cluster.tasks_per_node == gpus
    if root:
        assert cfg.storage.root == root and cfg.save_folder.startswith(root)
    if fmt:
        assert cfg.fsdp_config.state_dict_type == fmt
    plan = build_plan(compose([f"experiment={name}", "plan=json"]))
    assert plan["world_size"] == gpus and plan["params"] > 0
    # the cluster's own (account, partition, image) are left to the local config or the command line
    assert cfg.cluster.account is None and cfg.cluster.container.image is None


@pytest.mark.e2e  # starts a Python process of its own
def test_an_experiment_is_a_plan_on_the_command_line_that_writes_nothing(tmp_path):
    out = run("-m", "train", "experiment=mpt-30b-ndv5-amlfs", "cluster.nodes=8", "plan=json", root=tmp_path / "root",
              cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    assert plan["world_size"] == 64 and plan["run_name"].startswith("mpt-30b-")  # the command line over the file
    assert list(tmp_path.iterdir()) == []


def _checked(overrides):
    cfg = compose(overrides)
    return check(cfg, Context(mode="plan", overrides=tuple(overrides), choices=dict(HydraConfig.get().runtime.choices),
                              scheduler=scheduler(cfg)))


@pytest.fixture
def local_option():
    """The example local config as an option of the `local` group under a name of its own (conf/local/default.yaml
    itself would reach every other test composing at the same time, and may be a developer's own file)."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    path = CONF / "local" / f"{name}.yaml"
    path.write_text((CONF / "local" / "default.yaml.example").read_text())
    try:
        yield name
    finally:
        path.unlink()


@pytest.mark.xdist_group("conf")  # it adds a file to conf/local (tests/test_compose.py)
def test_the_local_config_applies_after_the_groups_and_before_the_command_line(local_option):
    cfg = compose(["experiment=mpt-30b-ndv5-amlfs", f"local={local_option}"])
    assert (cfg.cluster.account, cfg.cluster.partition, cfg.cluster.container.image) == \
        ("my-account", "gpu", "/data/images/pretrain.sqsh")
    assert cfg.run_name == compose(["experiment=mpt-30b-ndv5-amlfs"]).run_name  # the cluster's, not the run's
    cli = compose(["experiment=mpt-30b-ndv5-amlfs", f"local={local_option}", "cluster.account=other"])
    assert cli.cluster.account == "other"
    # the cluster's keys alone are said nothing of; a key that decides what trains goes over a YAML's too and renames
    # the run (optimizer.lr there replaced testing.yaml's and the name, no word)
    assert not [p for p in _checked([f"local={local_option}"]) if p.key == "cluster.account"]
    path = CONF / "local" / f"{local_option}.yaml"
    path.write_text(path.read_text() + "optimizer: {lr: 0.05}\n")
    said = [p for p in _checked([f"local={local_option}"]) if p.key == "optimizer.lr"]
    assert said and said[0].level == "warning" and said[0].problem.startswith(
        f"conf/local/{local_option}.yaml sets optimizer.lr, which decides what trains"), said
    assert not [p for p in _checked([f"local={local_option}", "optimizer.lr=0.01"]) if p.key == "optimizer.lr"]
    if not (ROOT / "conf" / "local" / "default.yaml").exists():  # (a developer's own file is theirs)
        assert compose([]).cluster.account is None  # without conf/local/default.yaml: nothing
