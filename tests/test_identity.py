"""The run's identity (train/config/identity.py): the run name, and so the folders a run resumes from, follows what is
trained and nothing else. The same training under another cluster setting, image, environment variable or
spelling of a number is the same run; anything that changes the training is another."""
import json
import os

import pytest
from helpers import run

import train  # noqa: F401  (registers the resolvers)
from train.config.compose import compose
from train.config.identity import identity, same_model_and_data, same_time

BASE = ["model=mpt-125m", "cluster=ndv5", "data=c4", "optimizer.lr=3e-3"]

# Each of these, added to BASE, is how or where the run goes: the same run.
SAME = [
    ["optimizer.lr=0.003"], ["optimizer.lr=0.0030"], ["optimizer.lr=3.0e-3"],  # one number, three spellings
    ["optimizer.betas=[0.9,0.95]"], ["optimizer.betas=[0.9, 0.95]"], ["optimizer.betas=[0.90,0.950]"],
    ["max_duration=4.8e3ba"], ["max_duration=4800.0ba"], ["scheduler.t_warmup=1e2ba"],  # composer's times, respelt
    ["seed=17"], ["max_seq_len=2048"],  # the preset's own values, spelled out
    ["cluster.env.NCCL_DEBUG=INFO"], ["cluster.container.image=/images/rebuilt.sqsh"], ["cluster.wait=true"],
    ["cluster.preflight.enabled=false"], ["cluster.nodes=4"], ["cluster.partition=other"],
    ["cluster.account=proj"], ["cluster.qos=high"], ["cluster.timeout_min=240"], ["cluster.max_num_timeout=50"],
    ["+cluster.setup=[module load x]"], ["device_train_microbatch_size=4"], ["eval_interval=100ba"],
    ["eval_subset_num_batches=2"], ["console_log_interval=5ba"], ["logger=mlflow"], ["logger=wandb"],
    ["export=hf"], ["save_interval=200ba"], ["save_num_checkpoints_to_keep=3"], ["checkpoint=full"],
    ["fsdp_config.activation_checkpointing=false"], ["dist_timeout=1200"], ["plan=true"],
    ["+variables.note=unused"], ["storage.write_GBps=9"],
    ["storage=amlfs"], ["storage=blob"], ["storage=fsx"],  # the same data, mounted elsewhere (or cached on the node)
]
# Each of these changes what is trained: another run.
OTHER = [
    ["optimizer.lr=1e-3"], ["optimizer.betas=[0.9,0.99]"], ["seed=18"], ["max_duration=1000ba"],
    ["global_train_batch_size=1024"], ["max_seq_len=1024"], ["precision=fp32"], ["scheduler.t_warmup=50ba"],
    ["optimizer.weight_decay=0.1"], ["model.n_layers=6"], ["data=mds", "variables.data_local=/data/other"],
    ["fsdp_config.mixed_precision=DEFAULT"], ["tokenizer.name=gpt2"], ["load_path=/data/pretrained.pt"],
]


@pytest.fixture(autouse=True)
def _root(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path))


def name(extra=()):
    return compose([*BASE, *extra]).run_name


def test_how_and_where_a_run_goes_is_not_what_it_is():
    base = name()
    assert base.startswith("mpt-125m-")
    moved = {" ".join(e): name(e) for e in SAME}
    assert moved == {k: base for k in moved}


def test_what_is_trained_names_another_run():
    base = name()
    names = {" ".join(e): name(e) for e in OTHER}
    assert base not in names.values()
    assert len(set(names.values())) == len(OTHER)  # each change its own run


def test_a_storage_root_moved_is_the_same_run(monkeypatch, tmp_path):
    here = name()
    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path / "elsewhere"))
    assert name() == here


def test_override_order_and_an_explicit_name():
    assert name() == compose(list(reversed(BASE))).run_name
    assert compose([*BASE, "run_name=mine"]).run_name == "mine"
    assert compose([*BASE, "run_name=mine"]).save_folder.endswith("/checkpoints/mine")


def test_identity_names_its_keys_and_leaves_out_the_how():
    ident = identity(compose(BASE))
    assert ident["optimizer.lr"] == 0.003 and ident["optimizer.betas"] == [0.9, 0.95]
    assert ident["max_duration"] and ident["global_train_batch_size"] and ident["precision"] == "amp_bf16"
    assert not [k for k in ident if k.split(".")[0] in ("cluster", "storage", "save_folder", "run_name",
                                                       "device_train_microbatch_size", "eval_interval")]
    assert "model.attn_config.attn_impl" not in ident and "callbacks.speed_monitor.window_size" not in ident


def test_runs_of_the_same_model_and_data_are_found_with_what_differs(tmp_path):
    from train.config.identity import write_record

    a, b = compose(BASE), compose([*BASE, "optimizer.lr=1e-3"])
    other_data = compose([*BASE, "data=mds", "variables.data_local=/data/x"])
    os.makedirs(a.save_folder)
    write_record(a.save_folder, a.run_name, "mpt-125m", identity(a))
    found = same_model_and_data(tmp_path / "checkpoints", b.run_name, "mpt-125m", identity(b))
    assert found == [(a.run_name, {"optimizer.lr": (0.003, 0.001)})]
    assert same_model_and_data(tmp_path / "checkpoints", a.run_name, "mpt-125m", identity(a)) == []
    one = compose([*BASE, "train_loader.dataset.shuffle=1"])  # another name, and the warning says why
    assert one.run_name != a.run_name
    assert same_model_and_data(tmp_path / "checkpoints", one.run_name, "mpt-125m", identity(one)) == [
        (a.run_name, {"train_loader.dataset.shuffle": (True, 1)})]
    assert same_model_and_data(tmp_path / "checkpoints", other_data.run_name, "mpt-125m", identity(other_data)) == []


def _plan(*args, root):
    out = run("-m", "train", *args, "plan=json", root=root, check=True, timeout=120)
    return json.loads(out.stdout)


@pytest.mark.e2e
def test_the_plan_names_the_run_that_m_submits_and_scaling_points_are_runs_of_their_own(tmp_path):
    line = ["model=mpt-7b", "cluster=ndv5", "data=c4", "optimizer.lr=3e-3"]
    plain = _plan(*line, root=tmp_path)["run_name"]
    swept = _plan("-m", *line, root=tmp_path)  # Hydra's sweeper spells 3e-3 as 0.003: still one run
    assert [p["run_name"] for p in swept] == [plain]
    scaling = ["-m", "cluster=slurm-local", "data=mock", "device_train_microbatch_size=4", "cluster.nodes=1,2"]
    plans = _plan(*scaling, root=tmp_path)
    names = [p["run_name"] for p in plans]
    # each point composed once, then named: what interpolates the name holds the point's own
    assert all(p["save_folder"].endswith(f"/{p['run_name']}") and f"--job-name={p['run_name']}\n" in p["sbatch_script"]
               for p in plans)
    base = _plan(*scaling[1:-1], root=tmp_path)["run_name"]
    assert len(set(names)) == 2 and all(n.startswith(base + "-") and len(n) == len(base) + 7 for n in names)
    assert [p["run_name"] for p in _plan(*scaling, root=tmp_path)] == names  # the same line, the same names
    assert not any(tmp_path.iterdir())  # a look writes nothing


def test_one_folder_spelt_three_ways_is_one_run_and_a_loader_of_weights_is_what_is_trained():
    """/data/x/, /data//x and /data/./x (and the tokenizer's folder likewise) were each another run from step 0,
    unwarned (the data differed by its text); composer's load_checkpoint callback was taken for a monitor, so a run
    warm-started from other weights and one from scratch were one run."""
    line = ["data=mds", "tokenizer.name=/data/tok"]
    one = name([*line, "variables.data_local=/data/x"])
    assert {name([*line, f"variables.data_local={p}"]) for p in ("/data/x/", "/data//x", "/data/./x")} == {one}
    assert name(["data=mds", "variables.data_local=/data/x", "tokenizer.name=/data//tok/"]) == one
    assert name([*line, "variables.data_local=/data/y"]) != one
    assert name(["+callbacks.load_checkpoint.load_path=/data/pretrained.pt"]) != name()
    assert name(["+callbacks.run_timeout.timeout=7200"]) == name()  # it ends a start, which resumes
    assert name(["max_duration=4800 ba"]) == name() and name(["fsdp_config.mixed_precision=pure"]) == name()


def test_scaling_points_keep_their_names_when_every_point_gets_one_more_override(tmp_path):
    """`-m cluster.tasks_per_node=1,2` run again with cluster.env.NCCL_DEBUG=INFO added: each point's name hashed
    every override, so both trained again from step 0, unwarned. A point is named by its overrides but those that
    never make another run, whatever the other points."""
    from train.config.identity import distinct_names

    points = [["cluster.tasks_per_node=1", "data=mock"], ["cluster.tasks_per_node=2", "data=mock"]]
    names = distinct_names(points, ["m-1"] * 2)
    assert len(set(names)) == 2 and all(n.startswith("m-1-") for n in names)
    more = [[*p, "cluster.env.NCCL_DEBUG=INFO", "plan=true", "cluster.timeout_min=30"] for p in points]
    assert distinct_names(more, ["m-1"] * 2) == names
    wider = [*points, ["cluster.tasks_per_node=4", "data=mock"]]  # a point added: the others keep their names
    assert distinct_names(wider, ["m-1"] * 3)[:2] == names
    # a point named by the user, one that does not resolve and one of another run keep theirs
    assert distinct_names([*points, ["run_name=m-1"], ["optimizer.lr=1"], ["x=1"]],
                          ["m-1", "m-1", "m-1", None, "m-2"])[2:] == [None, None, None]




def test_a_composer_time_is_read_as_composer_reads_it_and_a_wall_clock_is_kept_as_written():
    """The run's identity spells a time as composer reads it (train/checks/core.py: time_of, the one parser):
    spaces around it too (they were another time); a wall-clock time is not respelt."""
    assert same_time("20ba", "2e1ba") and same_time("20ba", " 2e1ba ") and same_time("20ba", "20.0ba")
    assert same_time("0.5dur", "0.50dur") and same_time("1e2tok", "100tok") and same_time("10BA", "10ba")
    assert not same_time("20ba", "21ba") and not same_time("20ba", "20ep") and not same_time("1h30m", "5400sec")
