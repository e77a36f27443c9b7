"""Validation before anything starts or is submitted: every rule, through the real command line.

Each bad input must give one message `error: <key>: <problem>\n  fix: <fix>`, a non-zero exit, no traceback, and
leave nothing behind (PRETRAIN_ROOT stays empty; a sweep submits nothing).
"""
import json
import os
import subprocess

import pytest

from paths import PYTHON, ROOT, TOKENIZER, need_shared
from train.compose import compose
from train.validate import (FIT_RULES, MOCK_TOKENIZER_IDS, NODE_RULES, RULES, ConfigError, check_sweep,
                            plan_warnings, resolve_all, validate, world_size)


def cli(root, *overrides, env=None):
    env = {**os.environ, "PRETRAIN_ROOT": str(root), **(env or {})}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([str(PYTHON), "-m", "train", *overrides], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def mds(folder, splits=("train", "val")):
    for split in splits:
        (folder / split).mkdir(parents=True)
        (folder / split / "index.json").write_text(json.dumps({"version": 2, "shards": []}))
    return folder


# (id, overrides, key named in the message, words in the message). "{tmp}" is the test's scratch folder.
CASES = [
    ("unknown top-level key", ["+save_intervl=100ba"], "save_intervl", "did you mean `save_interval`"),
    ("batch not divisible (plain run)", ["global_train_batch_size=12"], "global_train_batch_size",
     "not divisible by world size 1"),
    ("batch not divisible (3 nodes)", ["model=mpt-30b", "cluster=ndv5", "cluster.nodes=3", "plan=true"],
     "global_train_batch_size", "2048 is not divisible by world size 24"),
    ("model does not fit", ["model=mpt-70b", "cluster=ndv5", "cluster.nodes=1"], "cluster.nodes",
     "cluster.nodes=4 and submit with -m (3 nodes fit, 4 also divide"),
    ("model does not fit (sweep)", ["-m", "model=mpt-30b", "cluster=ndv5", "cluster.nodes=1,2"], "cluster.nodes",
     "cluster.nodes=2 (the smallest node count that fits)"),
    ("data folder missing", ["data=mds", "model.vocab_size=50368", "variables.data_local={tmp}/nope"],
     "variables.data_local", "does not exist"),
    ("data folder without index.json", ["data=c4", "variables.data_local={tmp}"], "variables.data_local",
     "has no train/index.json"),
    ("data value missing", ["data=mds", "model.vocab_size=50368"], "variables.data_local", "has no value"),
    ("tokenizer larger than the model's vocabulary", ["data=c4", "model.vocab_size=50000"], "model.vocab_size",
     "model.vocab_size=50304"),
    ("mock tokenizer larger than vocab", ["model.vocab_size=200"], "model.vocab_size", "257 ids"),
    ("tokenizer folder missing", ["data=c4", "variables.data_local={tmp}", "tokenizer.name={tmp}/no-tokenizer"],
     "tokenizer.name", "not a tokenizer folder"),
    ("sharded checkpoint with FSDP off", ["fsdp_config=null"], "checkpoint", "FSDP is off"),
    ("save_interval without a unit", ["save_interval=1000"], "save_interval", "save_interval=1000ba"),
    ("max_duration with a bad unit", ["max_duration=10xx"], "max_duration", "not a duration"),
    ("nodes=0", ["cluster.nodes=0"], "cluster.nodes", "positive whole number"),
    ("tasks_per_node=0", ["cluster=slurm-local", "cluster.tasks_per_node=0"], "cluster.tasks_per_node",
     "positive whole number"),
    ("more tasks than GPUs", ["cluster=ndv5", "cluster.tasks_per_node=16"], "cluster.tasks_per_node",
     "share a GPU"),
    ("container image missing", ["-m", "cluster=ndv5", "cluster.container.image={tmp}/nope.sqsh",
                                 "global_train_batch_size=64"], "cluster.container.image", "does not exist"),
    ("storage mount missing", ["storage=amlfs", "storage.root={tmp}", "storage.mounts=[/nonexistent]"],
     "storage.mounts", "not mounted on this node"),
    ("max_seq_len above the model's", ["model.max_seq_len=64"], "max_seq_len", "above the model's"),
    ("negative learning rate", ["optimizer.lr=-1e-4"], "optimizer.lr", "positive number"),
    ("zero learning rate", ["optimizer.lr=0"], "optimizer.lr", "positive number"),
    ("blob without a local cache", ["storage=blob", "storage.root={tmp}", "storage.data_local_root=null"],
     "storage.data_local_root", "node-local cache"),
    ("blob cache on blob", ["storage=blob", "storage.root={tmp}", "data=c4", "variables.data_local={tmp}/cache"],
     "variables.data_local", "not on the node"),
    ("load_path missing", ["load_path={tmp}/no-ckpt"], "load_path", "does not exist"),
    ("sweep points share a save_folder", ["-m", "cluster=slurm-local", "optimizer.lr=1e-4,2e-4",
                                         "save_folder={tmp}/same"], "save_folder", "both write to"),
    ("heads do not divide d_model", ["model.n_heads=3"], "model.n_heads", "does not divide"),
    ("flash attention on CPU", ["model.attn_config.attn_impl=flash"], "model.attn_config.attn_impl",
     "needs a GPU"),
    ("bf16 on CPU", ["precision=amp_bf16"], "precision", "needs a GPU"),
    ("unknown sharding strategy", ["fsdp_config.sharding_strategy=FULL_SHARDED"],
     "fsdp_config.sharding_strategy", "did you mean `FULL_SHARD`"),
    ("autoresume without a folder", ["checkpoint=none", "autoresume=true"], "autoresume", "save_folder"),
    ("unknown AMLFS tier", ["storage=amlfs", "storage.root={tmp}", "storage.tier=AMLFS-100"], "storage.tier",
     "AMLFS-500"),
    ("MFU as a percentage", ["cluster=ndv5", "cluster.mfu=41.85", "plan=true"], "cluster.mfu", "fraction"),
    ("warmup longer than training", ["max_duration=2ba"], "scheduler.t_warmup", "longer than max_duration"),
    ("unknown plan form", ["plan=yes"], "plan", "plan=json"),
]


@pytest.mark.parametrize("overrides,key,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_before_anything_starts(tmp_path, overrides, key, words):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    overrides = [o.replace("{tmp}", str(scratch)) for o in overrides]
    proc = cli(root, *overrides)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), err
    assert lines[0].split(": ")[1].endswith(key), err  # `error: <key>:` (a sweep prefixes the point)
    assert words in err, err
    assert list(root.iterdir()) == [], "something was written"
    assert "[sweep] #" not in proc.stdout, "something was submitted"


def test_there_are_at_least_20_distinct_bad_inputs():
    assert len({c[2] + c[3] for c in CASES}) >= 20 and len(RULES) >= 15


def test_unknown_key_names_the_close_match_and_keeps_a_nonzero_exit(tmp_path):
    proc = cli(tmp_path, "save_intervl=100ba")
    assert proc.returncode != 0
    assert "did you mean save_interval? (save_interval=100ba)" in proc.stderr
    proc = cli(tmp_path, "model=mpt-7b", "fsdp_config.sharding_stratgy=FULL_SHARD")
    assert proc.returncode != 0 and "did you mean fsdp_config.sharding_strategy?" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_preset_lists_the_valid_names(tmp_path):
    proc = cli(tmp_path, "model=mpt-31b")
    assert proc.returncode != 0
    assert "Could not find 'model/mpt-31b'" in proc.stderr
    assert "Available options in 'model'" in proc.stderr and "mpt-30b" in proc.stderr
    proc = cli(tmp_path, "cluster=ndv6")
    assert proc.returncode != 0 and "ndv5" in proc.stderr


def test_node_rules_are_warnings_in_a_plan(tmp_path):
    """A plan made away from the cluster: missing mounts, image and load_path are reported, not fatal."""
    proc = cli(tmp_path, "model=mpt-70b", "cluster=ndv5", "cluster.nodes=1", "storage=amlfs",
               f"storage.root={tmp_path}", "storage.mounts=[/nonexistent]", "cluster.container.image=/no.sqsh",
               f"load_path={tmp_path}/nope", "plan=json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    text = "\n".join(plan["warnings"])
    for key in ("storage.mounts", "cluster.container.image", "load_path", "cluster.nodes"):
        assert f"error: {key}:" in text, text
    assert plan["fits"] is False and plan["min_nodes"] == 3
    assert list(tmp_path.iterdir()) == []


def test_default_presets_pass_where_people_run_them():
    """'Does not fit' must not fire for the settings people use: published node counts, and less."""
    for model, nodes in (("mpt-30b", 2), ("mpt-30b", 16), ("mpt-70b", 4), ("mpt-70b", 16), ("gpt175b", 8),
                         ("gpt175b", 64), ("mpt-7b", 1), ("mpt-13b", 1), ("mpt-1b", 1), ("mpt-125m", 1)):
        cfg = compose([f"model={model}", "cluster=ndv5", f"cluster.nodes={nodes}"])
        validate(cfg, multirun=True)
    for cluster in ("ndv4", "p5"):
        validate(compose(["model=mpt-30b", f"cluster={cluster}", "cluster.nodes=16"]), multirun=True)
    validate(compose([]))  # the default CPU run
    validate(compose(["cluster=slurm-local"]), multirun=True)


def test_model_does_not_fit_message_carries_the_plan_numbers():
    with pytest.raises(ConfigError) as err:
        validate(compose(["model=mpt-30b", "cluster=ndv5", "cluster.nodes=1"]), multirun=True)
    msg = str(err.value)
    assert err.value.key == "cluster.nodes" and "cluster.nodes=2" in msg
    for part in ("params", "grads", "optimizer", "activations", "GiB per GPU", "of 80.0 GiB"):
        assert part in msg, msg
    with pytest.raises(ConfigError) as err:  # no node count helps: the microbatch's activations are too big
        validate(compose(["model=mpt-30b", "cluster=ndv5", "fsdp_config.activation_checkpointing=false"]),
                 multirun=True)
    assert err.value.key == "device_train_microbatch_size" and "activation_checkpointing=true" in str(err.value)


def test_world_size_plain_run_sweep_and_plan(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = compose(["cluster=ndv5", "cluster.nodes=4"])
    assert world_size(cfg, multirun=False) == 1
    assert world_size(cfg, multirun=True) == 32
    assert world_size(compose(["cluster=ndv5", "cluster.nodes=4", "plan=true"]), multirun=False) == 32
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert world_size(cfg, multirun=False) == 16


def _resolved(overrides):
    cfg = compose(overrides)
    resolve_all(cfg)  # as the launcher does for each point, while its Hydra context is live
    return cfg


def test_check_sweep_validates_every_point_and_names_it():
    good = _resolved(["cluster=slurm-local"])
    bad = _resolved(["cluster=slurm-local", "optimizer.lr=-1"])
    with pytest.raises(ConfigError) as err:
        check_sweep([good, bad])
    assert err.value.key == "[sweep point #1] optimizer.lr"
    check_sweep([good, _resolved(["cluster=slurm-local", "optimizer.lr=1e-4"])])  # different run_name folders
    with pytest.raises(ConfigError) as err:
        check_sweep([good, _resolved(["cluster=slurm-local", f"run_name={good.run_name}"])])
    assert err.value.key == "save_folder"


def test_rules_are_classified():
    assert set(NODE_RULES + FIT_RULES) <= set(RULES)
    assert plan_warnings(compose(["plan=true"])) == []


def test_tokenizer_size_from_a_real_tokenizer_folder():
    need_shared()
    with pytest.raises(ConfigError) as err:
        validate(compose(["data=mds", f"tokenizer.name={TOKENIZER}", "model.vocab_size=50000",
                          "variables.data_local=/nonexistent"]))
    assert "50277 ids" in str(err.value)


def test_mock_tokenizer_size_matches_mock_data():
    from train import mock_data

    assert MOCK_TOKENIZER_IDS == mock_data.BYTES + 1


def test_good_data_folder_passes(tmp_path):
    validate(compose(["data=c4", f"variables.data_local={mds(tmp_path / 'c4')}"]))
    validate(compose(["storage=blob", f"storage.root={tmp_path}", "storage.mounts=[]", "data=c4"]))


def test_a_run_that_does_not_resume_is_refused_over_existing_checkpoints(tmp_path):
    """composer would refuse full checkpoints only once running, and silently rewrite sharded ones."""
    folder = tmp_path / "ckpts"
    (folder / "ep0-ba10").mkdir(parents=True)
    (folder / "ep0-ba20-rank0.pt").write_bytes(b"")
    root = tmp_path / "root"
    root.mkdir()
    proc = cli(root, "autoresume=false", f"save_folder={folder}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: autoresume: false, but save_folder {folder} already holds 2 checkpoint(s)" in proc.stderr
    assert "overwrite them" in proc.stderr and "fix: autoresume=true continues that run" in proc.stderr
    assert list(root.iterdir()) == []
    assert cli(root, "autoresume=false", f"save_folder={tmp_path / 'fresh'}", "plan=true").returncode == 0
