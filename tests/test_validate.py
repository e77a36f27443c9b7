"""Checks before anything starts or is submitted: every rule, through the real command line.

A bad input gives `error: <key>: <problem>\n  fix: <fix>` for every problem of the config at once, exit 2, no
traceback, and leaves nothing behind (PRETRAIN_ROOT stays empty; a sweep submits nothing). A legal but likely
mistaken value gives `warning: ...` and the run (or plan) goes on. (Longer than most modules: CASES, the table of
bad inputs, is one list on purpose. The data and tokenizer checks are in test_validate_data.py.)
"""
import json
import subprocess
import zipfile

import pytest
from helpers import CHECKPOINT_KINDS, PYTHON, ROOT, TOKENIZER, checkpoint_kinds, problems_in

from train.checks import ERROR, WARNING, ConfigError, Context, check, resolve_all, validate, values
from train.checks.gate import hydra_problems
from train.config.compose import compose


def mds(folder, splits=("train", "val")):
    for split in splits:
        (folder / split).mkdir(parents=True)
        (folder / split / "index.json").write_text(json.dumps({"version": 2, "shards": []}))
    return folder


OFFLINE = {"HF_HUB_OFFLINE": "1"}
# (id, overrides, key named, words in the message). "{tmp}": the test's scratch folder; "{tok}": the real tokenizer.
CASES = [
    ("rope's default implementation on CPU (llm-foundry's ImportError)", ["+model.attn_config.rope=true"],
     "model.attn_config.rope_impl", "rope_impl=hf"),
    ("warmup in other units than the schedule (composer's refusal)", ["max_duration=40960tok"], "scheduler.t_warmup",
     "scheduler.t_warmup=8192tok"),
    ("mixed precision composer does not know", ["fsdp_config.mixed_precision=PUR"], "fsdp_config.mixed_precision",
     "did you mean `PURE`"),
    ("shuffle algorithm streaming does not know", ["+train_loader.dataset.shuffle_algo=py1x"],
     "train_loader.dataset.shuffle_algo", "did you mean `py1s`"),
    ("unknown top-level key", ["+save_intervl=100ba"], "save_intervl", "did you mean `save_interval`"),
    ("unknown key of a typed group", ["cluster.nodez=2"], "cluster.nodez", "did you mean cluster.nodes?"),
    ("checkpoints of the user's naming, not resumed on a requeue", ["-m", "cluster=slurm-local", "data=mock",
     '+save_filename="ckpt-ba{batch}.pt"', "autoresume=false"], "save_filename",
     "a job requeued (its time limit, a preemption) would train from batch 0 again"),
    ("a Hugging Face model's vocabulary given beside its architecture's", ["model=llama3-8b",
     "data=c4", "model.vocab_size=60000"], "model.vocab_size", "model.config_overrides.vocab_size=128256 (the architecture's)"),
    ("a flag for the preflight's node check command", ["cluster.preflight.enabled=true",
     "cluster.preflight.node_check=true"], "cluster.preflight.node_check", "true is a flag, and node_check is the "
     "command each node runs"),
    # a value of another type than its schema's key, said by that key's type
    ("a number for a typed group's mapping", ["cluster.preflight=3"], "cluster.preflight",
     "3 is not a mapping of its own keys"),
    ("a number for a typed group's list", ["cluster.setup=5"], "cluster.setup", "5 is not a list"),
    ("keys below an open map's value", ["cluster.env.NCCL_DEBUG.level=2"], "cluster.env.NCCL_DEBUG.level",
     "cluster.env.NCCL_DEBUG holds a string (a value of cluster.env), not a mapping"),
    ("a word for a typed group's flag", ["cluster.exclusive=maybe"], "cluster.exclusive",
     "'maybe' is not true or false"),
    ("unknown key of a typed group's nested node", ["cluster.preflight.node_chek=true"], "cluster.preflight.node_chek",
     "did you mean cluster.preflight.node_check?"),
    ("batch not divisible (2 ranks here)", ["-m", "cluster.tasks_per_node=2", "global_train_batch_size=15"],
     "global_train_batch_size", "15 is not divisible by world size 2"),
    ("batch not divisible (3 nodes)", ["model=mpt-30b", "cluster=ndv5", "cluster.nodes=3", "plan=true"],
     "global_train_batch_size", "2048 is not divisible by world size 24"),
    ("model does not fit this machine's GPU", ["model=mpt-70b", "cluster=ndv5", "cluster.nodes=1"], "model",
     "run out of memory"),
    ("model does not fit this machine's RAM", ["model=mpt-30b"], "model", "GiB of RAM on"),
    ("model does not fit (sweep)", ["-m", "model=mpt-30b", "cluster=ndv5", "data=mock", "cluster.nodes=1,2"],
     "cluster.nodes", "cluster.nodes=2 (the smallest node count that fits)"),
    ("data folder missing", ["data=mds", "tokenizer.name={tok}", "variables.data_local={tmp}/nope"],
     "variables.data_local", "does not exist"),
    ("data folder without index.json", ["data=c4", "tokenizer.name={tok}", "variables.data_local={tmp}"],
     "variables.data_local", "has no train/index.json"),
    ("data value missing", ["data=mds", "tokenizer.name={tok}"], "variables.data_local", "has no value"),
    ("tokenizer larger than the model's vocabulary", ["data=c4", "model.vocab_size=50000"], "model.vocab_size",
     "model.vocab_size=50304"),
    ("mock tokenizer larger than vocab", ["model.vocab_size=200"], "model.vocab_size", "257 ids"),
    ("tokenizer folder missing", ["data=c4", "variables.data_local={tmp}", "tokenizer.name={tmp}/no-tokenizer"],
     "tokenizer.name", "does not exist"),
    ("tokenizer folder with a config and no tokenizer.json", ["data=mds", "variables.data_local={tmp}",
                                                              "tokenizer.name={tmp}/half"],
     "tokenizer.name", "tokenizer_config.json but no tokenizer.json"),
    ("hub tokenizer neither cached nor reachable", ["data=c4", "variables.data_local={tmp}"], "tokenizer.name",
     "HF_HUB_OFFLINE is set"),
    ("sharded checkpoint with FSDP off", ["fsdp_config=null"], "checkpoint", "FSDP is off"),
    ("save_interval without a unit", ["save_interval=1000"], "save_interval", "save_interval=1000ba"),
    ("max_duration with a bad unit", ["max_duration=10xx"], "max_duration", "not a duration"),
    ("eval_interval not a duration", ["eval_interval=often"], "eval_interval", "eval_interval=1000ba"),
    ("nodes=0", ["cluster.nodes=0"], "cluster.nodes", "positive whole number"),
    ("code_paths as one string", ["+code_paths=my_code.py"], "code_paths", "is not a list or null"),
    ("tasks_per_node=0", ["cluster=slurm-local", "cluster.tasks_per_node=0"], "cluster.tasks_per_node",
     "positive whole number"),
    ("microbatch 0", ["device_train_microbatch_size=0"], "device_train_microbatch_size", "positive whole number"),
    ("more tasks than GPUs", ["cluster=ndv5", "cluster.tasks_per_node=16"], "cluster.tasks_per_node",
     "share a GPU"),
    ("container image missing", ["-m", "cluster=ndv5", "data=mock", "cluster.container.image={tmp}/nope.sqsh",
                                 "global_train_batch_size=64"], "cluster.container.image", "does not exist"),
    ("storage mount missing", ["storage=amlfs", "storage.root={tmp}", "storage.mounts=[/nonexistent]"],
     "storage.mounts", "does not exist on this node"),
    ("container mount missing", ["-m", "cluster=ndv5", "data=mock", "global_train_batch_size=64",
                                 "cluster.container.mounts=[/nonexistent/topo.xml:/etc/topo.xml]"],
     "cluster.container.mounts", "/nonexistent/topo.xml does not exist"),
    ("max_seq_len above the model's", ["model.max_seq_len=64"], "max_seq_len", "above the model's"),
    ("model.max_seq_len zero", ["model.max_seq_len=0"], "model.max_seq_len", "positive whole number"),
    ("negative learning rate", ["optimizer.lr=-1e-4"], "optimizer.lr", "positive number"),
    ("zero learning rate", ["optimizer.lr=0"], "optimizer.lr", "positive number"),
    ("blob without a local cache", ["storage=blob", "storage.root={tmp}", "storage.data_local_root=null"],
     "storage.data_local_root", "node-local cache"),
    ("blob cache on blob", ["storage=blob", "storage.root={tmp}", "data=c4", "variables.data_local={tmp}/cache"],
     "variables.data_local", "not on the node"),
    ("load_path missing", ["load_path={tmp}/no-ckpt"], "load_path", "does not exist"),
    ("sharded load_path at one rank", ["load_path={tmp}/ep0-ba10"], "load_path", "python -m train.consolidate"),
    ("one-file load_path at sharded ranks", ["-m", "cluster.tasks_per_node=2", "checkpoint=sharded",
                                            "load_path={tmp}/ep0-ba10-rank0.pt"], "load_path", "checkpoint=full"),
    ("sweep points share a save_folder", ["-m", "cluster=slurm-local", "data=mock", "optimizer.lr=1e-4,2e-4",
                                         "save_folder={tmp}/same"], "save_folder", "both write to"),
    ("heads do not divide d_model", ["model.n_heads=3"], "model.n_heads", "does not divide"),
    ("flash attention on CPU", ["model.attn_config.attn_impl=flash"], "model.attn_config.attn_impl",
     "needs a GPU"),
    ("fused loss on CPU", ["model.loss_fn=fused_crossentropy"], "model.loss_fn", "needs flash-attn"),
    ("bf16 on CPU", ["precision=amp_bf16"], "precision", "needs a GPU"),
    ("not a precision", ["precision=bf16"], "precision", "not a composer precision"),
    ("unknown sharding strategy", ["fsdp_config.sharding_strategy=FULL_SHARDED"],
     "fsdp_config.sharding_strategy", "did you mean `FULL_SHARD`"),
    ("unknown state dict type", ["fsdp_config.state_dict_type=local"], "fsdp_config.state_dict_type",
     "not a state dict type"),
    ("autoresume without a folder", ["checkpoint=none", "autoresume=true"], "autoresume", "save_folder"),
    ("checkpoints to keep below -1", ["save_num_checkpoints_to_keep=-5"], "save_num_checkpoints_to_keep",
     "-1 (keep all)"),
    ("unknown AMLFS tier", ["storage=amlfs", "storage.root={tmp}", "storage.tier=AMLFS-100"], "storage.tier",
     "AMLFS-500"),
    ("zero bandwidth", ["storage.write_GBps=0"], "storage.write_GBps", "positive bandwidth"),
    ("MFU as a percentage", ["cluster=ndv5", "cluster.mfu=41.85", "plan=true"], "cluster.mfu", "fraction"),
    ("negative peak FLOP/s", ["cluster=ndv5", "cluster.peak_flops=-1", "plan=true"], "cluster.peak_flops",
     "positive FLOP/s"),
    ("unknown plan form", ["plan=yes"], "plan", "plan=json"),
    ("mock data on a Slurm cluster nobody asked for", ["-m", "cluster=ndv5", "model=mpt-125m"], "data",
     "no data named: cluster=ndv5 is a Slurm cluster"),
    ("a data folder named while data=mock", ["variables.data_local={tmp}/my-c4"], "variables.data_local",
     "data=mds variables.data_local="),
    ("a remote named while data=mock", ["variables.data_remote=s3://bucket/c4"], "variables.data_remote",
     "data=c4"),
    ("a raw JSON folder given as MDS data", ["data=mds", "tokenizer.name={tok}", "variables.data_local={tmp}/raw"],
     "variables.data_local", "out_root={tmp}/raw-mds"),
    ("a split folder given as the MDS root", ["data=mds", "tokenizer.name={tok}",
                                             "variables.data_local={tmp}/mds/train"],
     "variables.data_local", "variables.data_local={tmp}/mds (the folder holding train/"),
    ("a bad credential name", ["cluster.env.HF_TOKEN=x"], "cluster.env.HF_TOKEN", "looks like a credential"),
    ("a path as run_name", ["run_name=../escape"], "run_name", "not a plain folder name"),
]


def _scratch(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "half").mkdir(parents=True)
    (scratch / "half" / "tokenizer_config.json").write_text("{}")
    (scratch / "raw").mkdir()
    (scratch / "raw" / "part-000.json").write_text('{"text": "hello"}\n')
    mds(scratch / "mds")
    (scratch / "ep0-ba10").mkdir()  # a sharded checkpoint and one file, by the structure the checks read
    # torch's Metadata indexing no shard, pickled by hand (no torch here): what the torch-free check reads
    (scratch / "ep0-ba10" / ".metadata").write_bytes(b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)"
                                                     b"\x81}X\x0c\x00\x00\x00storage_data}sb.")
    with zipfile.ZipFile(scratch / "ep0-ba10-rank0.pt", "w") as z:
        z.writestr("archive/data.pkl", b"x")
    return scratch


def _fill(tmp_path, overrides, words):
    scratch = _scratch(tmp_path)
    fill = {"{tmp}": str(scratch), "{tok}": str(TOKENIZER)}
    for k, v in fill.items():
        overrides = [o.replace(k, v) for o in overrides]
        words = words.replace(k, v)
    return overrides, words


@pytest.mark.parametrize("overrides,key,words", [c[1:] for c in CASES if "-m" not in c[1]],
                         ids=[c[0] for c in CASES if "-m" not in c[1]])
def test_bad_input_is_named_with_its_fix(tmp_path, monkeypatch, overrides, key, words):
    """The fast tier: the same cases in this process (compose + check), without the command line around them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    overrides, words = _fill(tmp_path, overrides, words)
    mode = "plan" if any(o.startswith("plan=") for o in overrides) else "run"
    # as the command does: what Hydra would refuse is said before composing (gate.before_hydra), the rest checked
    found = hydra_problems(overrides)
    if not found:
        try:
            found = check(compose(overrides), Context(mode=mode, overrides=tuple(overrides)))
        except ConfigError as err:  # a value missing or unresolvable where checking could not go on
            found = err.problems
    named = [p for p in found if p.level == ERROR and p.key.endswith(key)]
    assert any(words in p.problem + p.fix for p in named), found


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict:
    return checkpoint_kinds(tmp_path_factory.mktemp("kinds"))


@pytest.mark.torch  # makes the checkpoints; the check itself imports no torch
@pytest.mark.parametrize("kind", CHECKPOINT_KINDS)
def test_load_path_is_refused_on_the_login_node_exactly_where_the_task_refuses_it(kind, kinds, monkeypatch):
    """Each kind of checkpoint (test_resume.py: composer loads exactly the ones the task accepts) as load_path, in
    the format the run reads: the login node refuses it exactly where the task's resume.problem does, naming
    load_path, the file and the task's own reason, with a fix."""
    from train.checkpoint import resume

    path = kinds[kind]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WORLD_SIZE", "2" if path.is_dir() else "1")
    overrides = [f"load_path={path}", *(["checkpoint=sharded"] if path.is_dir() else [])]
    found = [p for p in check(compose(overrides), Context(mode="run", overrides=tuple(overrides)))
             if p.key == "load_path" and p.level == ERROR]
    why = resume.problem(resume.Checkpoint(path, 0, 10, sharded=path.is_dir()))
    assert (why is None) == CHECKPOINT_KINDS[kind]
    assert [p.problem for p in found] == ([] if why is None else
                                          [f"{path}: {why}; composer would fail to load it (the task refuses it)"])
    assert all(p.fix for p in found)


@pytest.mark.e2e  # one process per case
@pytest.mark.parametrize("overrides,key,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_before_anything_starts(tmp_path, overrides, key, words, cli):
    overrides, words = _fill(tmp_path, overrides, words)
    root = tmp_path / "root"
    root.mkdir()
    proc = cli("train", *overrides, env=OFFLINE, root=root)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    found = problems_in(proc.stderr)
    assert found and all(fix.startswith("  fix: ") for *_, fix in found), proc.stderr
    named = [(line, fix) for level, k, line, fix in found if level == ERROR and k.endswith(key)]
    assert named, proc.stderr  # `error: <key>:` (a sweep prefixes the point)
    assert any(words in line + fix for line, fix in named), proc.stderr
    assert list(root.iterdir()) == [], "something was written"
    assert "[sweep] #" not in proc.stdout, "something was submitted"


def test_two_of_hydras_commands_are_refused_by_key_before_hydra_raises(tmp_path, cli):
    """Hydra raises a ValueError with a traceback for two of its commands; the one rule (common/help.py) says it for
    training as for data_prep (tests/test_data_prep.py), naming both."""
    proc = cli("train", "-m", "--cfg", "job", "--info")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: -m --cfg --info: Hydra does one of -m, --run, --cfg, --info and "
                                  "--shell-completion at a time\n  fix: `--cfg job` without -m"), proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_problem_of_a_config_is_reported_at_once_in_a_stable_order(tmp_path, cli):
    args = ("optimizer.lr=-0.1", "save_interval=1000", "cluster.nodes=0")
    proc = cli("train", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    keys = [k for level, k, *_ in problems_in(proc.stderr) if level == ERROR]
    assert keys == ["cluster.nodes", "save_interval", "optimizer.lr"], proc.stderr
    assert proc.stderr.strip().endswith("3 problems: nothing was started or written")
    again = cli("train", *reversed(args))
    assert again.stderr == proc.stderr  # the order is the rules', not the command line's
    assert list(tmp_path.iterdir()) == []


def test_a_missing_value_is_reported_with_the_other_problems(tmp_path, cli):
    proc = cli("train", "data=mds", f"tokenizer.name={TOKENIZER}", "optimizer.lr=-1", "model.n_heads=3")
    keys = {k for level, k, *_ in problems_in(proc.stderr) if level == ERROR}
    assert {"variables.data_local", "optimizer.lr", "model.n_heads"} <= keys, proc.stderr
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------- right refusals only


@pytest.mark.train
def test_the_smoke_test_users_run_today_runs(tmp_path, cli):
    """The scripts' `max_duration=3ba eval_interval=0` (composer never evaluates with an interval of 0) runs, said
    (`max_duration=3ba eval_loader=null` says it plainly, without a word); a warmup longer than training is legal
    (a warning, not a refusal)."""
    proc = cli("train", "max_duration=3ba", "eval_interval=0", "checkpoint=none", "progress_bar=false")
    assert proc.returncode == 0 and "warning: eval_interval: 0 never evaluates" in proc.stderr, proc.stderr[-3000:]
    assert "fix: to train without evaluating: eval_loader=null" in proc.stderr
    [metrics] = list(tmp_path.glob("outputs/*/metrics.json"))
    report = json.loads(metrics.read_text())
    assert report["eval"] == [] and report["batches"] == 3, report
    plain = tmp_path / "plain"
    proc = cli("train", "max_duration=3ba", "eval_loader=null", "checkpoint=none", "progress_bar=false", root=plain)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [(k, line) for level, k, line, _ in problems_in(proc.stderr) if level == WARNING]
    assert [k for k, _ in warnings] == ["scheduler.t_warmup"], proc.stderr[-3000:]
    [metrics] = list(plain.glob("outputs/*/metrics.json"))
    assert json.loads(metrics.read_text())["eval"] == []


def test_warnings_are_in_the_plan_and_do_not_stop_it(tmp_path, cli):
    proc = cli("train", "max_duration=2ba", "plan=json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert any(w.startswith("warning: scheduler.t_warmup: 4ba of warmup (4 batches) is longer") for w in plan["warnings"])
    assert "warning: scheduler.t_warmup" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_node_rules_are_warnings_in_a_plan(tmp_path, cli):
    """A plan made away from the cluster: missing mounts, image and load_path are reported, not fatal."""
    proc = cli("train", "model=mpt-70b", "cluster=ndv5", "cluster.nodes=1", "storage=amlfs",
               f"storage.root={tmp_path}/data", f"storage.mounts=[{tmp_path}/data]",
               "cluster.container.image=/no.sqsh", f"load_path={tmp_path}/nope", "plan=json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    text = "\n".join(plan["warnings"])
    for key in ("storage.mounts", "cluster.container.image", "load_path", "cluster.nodes", "data"):
        assert f"warning: {key}:" in text, text
    assert plan["fits"] is False and plan["min_nodes"] == 3
    assert list(tmp_path.iterdir()) == []


def test_container_file_mounts_are_accepted(tmp_path):
    topo = tmp_path / "ndv5-topo.xml"
    topo.write_text("<system/>")
    cfg = compose(["cluster=ndv5", f"cluster.container.mounts=[{topo}:/etc/ndv5-topo.xml]"])
    assert not [p for p in check(cfg, Context(mode="sweep")) if "mounts" in p.key]


def _but_room(problems: list) -> list:
    """Less the storage budget: this machine's disk (storage=local) holds no ten mpt-30b checkpoints, which is
    right to refuse (tests/test_checkpoint_rules.py); these tests are about the rest."""
    return [p for p in problems if p.key != "save_num_checkpoints_to_keep"]


def test_default_presets_pass_where_people_run_them():
    """'Does not fit' must not fire for the settings people use: published node counts, and less."""
    sweep = Context(mode="sweep")
    for model, nodes in (("mpt-30b", 2), ("mpt-30b", 16), ("mpt-70b", 4), ("mpt-70b", 16), ("gpt175b", 8),
                         ("gpt175b", 64), ("mpt-7b", 1), ("mpt-13b", 1), ("mpt-1b", 1), ("mpt-125m", 1)):
        assert _but_room(check(compose([f"model={model}", "cluster=ndv5", f"cluster.nodes={nodes}"]), sweep)) == []
    for cluster in ("ndv4", "p5"):
        assert _but_room(check(compose(["model=mpt-30b", f"cluster={cluster}", "cluster.nodes=16"]), sweep)) == []
    assert check(compose([]), Context()) == []  # the default CPU run
    assert check(compose(["cluster=slurm-local"]), sweep) == []


def test_model_does_not_fit_message_carries_the_plan_numbers():
    sweep = Context(mode="sweep")
    [p] = _but_room(check(compose(["model=mpt-30b", "cluster=ndv5", "cluster.nodes=1"]), sweep))
    assert p.key == "cluster.nodes" and "cluster.nodes=2" in p.fix
    for part in ("params", "grads", "optimizer", "activations", "GiB per GPU", "of 80.0 GiB"):
        assert part in p.problem, p
    [p] = _but_room(check(compose(["model=mpt-30b", "cluster=ndv5", "fsdp_config.activation_checkpointing=false"]),
                          sweep))
    # without activation checkpointing only a microbatch of 1 (2048 over 1032 ranks) fits: that many nodes, or
    # checkpointing (the smallest count tries each count at its own microbatch)
    assert p.key == "cluster.nodes" and "cluster.nodes=256 (129 nodes fit" in p.fix
    assert "activation_checkpointing=true" in p.fix


def test_world_size_plain_run_sweep_and_plan(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = compose(["cluster=ndv5", "cluster.nodes=4"])
    assert Context(mode="run").world_size(cfg) == 1
    assert Context(mode="sweep").world_size(cfg) == 32
    assert Context(mode="plan").world_size(cfg) == 32
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert Context(mode="run").world_size(cfg) == 16


@pytest.mark.parametrize("gbs,mb,ranks,want", [
    (16, 8, 2, None),  # 8 each, one microbatch
    (15, 8, 2, ("global_train_batch_size", ERROR, "15 is not divisible by world size 2")),  # llm-foundry's ValueError
    (8, 8, 2, ("device_train_microbatch_size", WARNING, "llm-foundry reduces it to 4")),  # its warning
    (24, 8, 2, ("device_train_microbatch_size", WARNING, "ends with a microbatch of 4")),  # composer: 8 + 4
    (12, 8, 1, ("device_train_microbatch_size", WARNING, "ends with a microbatch of 4")),
])
def test_the_batch_is_refused_only_where_llm_foundry_refuses_it(gbs, mb, ranks, want):
    """llm-foundry splits the global batch evenly across ranks (else ValueError), then reduces a microbatch larger
    than a rank's share; composer trains an uneven last microbatch (both trained here: 12 at 1 rank, 8 at 2 ranks
    with microbatch 8). Its own mpt-125m.yaml (256, microbatch 16) on 64 GPUs was refused."""
    cfg = compose([f"global_train_batch_size={gbs}", f"device_train_microbatch_size={mb}",
                   f"cluster.tasks_per_node={ranks}"])
    found = [(p.key, p.level, p.problem) for p in values.batch(cfg, Context(mode="sweep"))]
    if want is None:
        assert found == []
    else:
        [(key, level, problem)] = found
        assert (key, level) == want[:2] and want[2] in problem, found


@pytest.mark.parametrize("override", ["eval_interval=0.5dur", "save_interval=0.25dur", "eval_interval=2iter",
                                      "save_interval=600sec", "max_duration=1e3ba", "save_interval=3e4tok",
                                      "scheduler.t_warmup=0.1dur", "save_interval=1h", "eval_interval=1h30m"])
def test_a_time_composer_takes_passes(override):
    """composer's Time strings: intervals take a fraction of max_duration (dur), seconds and iterations, and any
    count may be written 3e4 (`0.5dur` was refused as "not a duration with a unit")."""
    found = check(compose([override]), Context())
    assert not [p for p in found if p.level == ERROR], found


def test_a_dataset_key_llm_foundry_drops_is_warned_with_the_one_meant():
    """llm-foundry's text loader passes StreamingTextDataset/StreamingDataset only their parameters and drops any
    other key silently: `shuffle_sed` trained with the default seed, exit 0 (names in foundry_names.py, checked
    against the pinned libraries by test_foundry_names.py)."""
    [p] = [p for p in check(compose(["+train_loader.dataset.shuffle_sed=3"]), Context()) if ".dataset." in p.key]
    assert (p.key, p.level) == ("train_loader.dataset.shuffle_sed", WARNING) and "shuffle_seed" in p.fix, p
    assert not [p for p in check(compose(["+train_loader.dataset.predownload=8"]), Context()) if ".dataset." in p.key]


def test_an_mpt_model_key_nothing_reads_is_warned_with_the_one_meant():
    """MPTConfig (a transformers PretrainedConfig) keeps any key and nothing reads one it does not know:
    `n_layer=24` trained model.n_layers (2) layers, exit 0."""
    [p] = [p for p in check(compose(["+model.n_layer=24"]), Context()) if p.key.startswith("model.")]
    assert (p.key, p.level) == ("model.n_layer", WARNING) and "n_layers" in p.fix, p
    for fine in ("+model.use_cache=true", "+model.master_weights_dtype=bf16"):  # PretrainedConfig's; llm-foundry's
        assert not [p for p in check(compose([fine]), Context()) if p.key.startswith("model.")], fine


@pytest.mark.parametrize("overrides, key, level, said", [
    (["+model.attn_config.qk_lnorm=true"], "model.attn_config.qk_lnorm", ERROR, "qk_ln"),
    (["+model.attn_config.kv_n_heads=1"], "model.attn_config.kv_n_heads", ERROR, "TypeError"),  # multihead's
    (["+model.attn_config.attn_type=grouped_query_attention"], "model.attn_config.kv_n_heads", ERROR, "divisor"),
    (["+model.ffn_config.expansion=2"], "model.ffn_config.expansion", ERROR, "expansion_ratio"),
    (["+model.init_config.init_std=0.02"], "model.init_config.init_std", WARNING, "init_config.name=baseline_"),
    (["+model.init_config.fan_mod=fan_in"], "model.init_config.fan_mod", WARNING, "fan_mode"),
    (["+model.init_config.name=kaiming"], "model.init_config.name", ERROR, "kaiming_normal_"),
])
def test_a_key_an_mpt_block_cannot_take_is_refused_and_one_its_initialization_ignores_is_warned(overrides, key, level,
                                                                                                  said):
    """The attention class and FFN builder take attn_config/ffn_config as keyword arguments: another key was a
    TypeError when the model was built, after the queue (`qk_lnorm`). The initialization takes any key and reads
    its own: `init_std` beside MPT's default kaiming_normal_ trained with kaiming's init, exit 0."""
    found = [p for p in check(compose(overrides), Context()) if p.key.startswith("model.")]
    assert [(p.key, p.level) for p in found] == [(key, level)] and said in str(found[0]), found


@pytest.mark.parametrize("fine", [["+model.attn_config.qk_ln=true", "+model.attn_config.rope=true",
                                   "+model.attn_config.rope_impl=hf"],
                                  ["+model.attn_config.attn_type=grouped_query_attention",
                                   "+model.attn_config.kv_n_heads=2"],
                                  ["+model.init_config.name=baseline_", "+model.init_config.init_std=0.02"],
                                  ["+model.ffn_config.ffn_type=mptglu", "+model.ffn_config.ffn_hidden_size=64"]])
def test_what_an_mpt_block_and_its_initialization_read_passes(fine):
    assert not [p for p in check(compose(fine), Context()) if p.key.startswith("model.")], fine


def test_an_fsdp_setting_composer_does_not_read_is_warned_and_a_device_mesh_refused():
    """composer's FSDPConfig (GPU clusters) keeps any key and reads its own: `sharding_strateg=SHARD_GRAD_OP`
    trained FULL_SHARD, exit 0. FSDP2 (the CPU clusters) drops it with a warning in the log. FSDPConfig refuses
    device_mesh (a ValueError when the trainer was built, after the queue)."""
    def fsdp(overrides):
        return [(p.key, p.level) for p in check(compose(overrides), Context()) if p.key.startswith("fsdp_config.")]

    typo = "+fsdp_config.sharding_strateg=SHARD_GRAD_OP"
    assert fsdp(["cluster=ndv5", "data=c4", typo]) == [("fsdp_config.sharding_strateg", WARNING)]
    assert fsdp([typo]) == [("fsdp_config.sharding_strateg", WARNING)]  # cluster=local: FSDP_VERSION=2
    assert fsdp(["cluster=ndv5", "data=c4", "+fsdp_config.reshard_after_forward=false"]) == \
        [("fsdp_config.reshard_after_forward", WARNING)]  # FSDP2's, read by nothing under FSDP1
    assert fsdp(["cluster=ndv5", "data=c4", "+fsdp_config.device_mesh=null"]) == [("fsdp_config.device_mesh", ERROR)]
    assert fsdp(["+fsdp_config.reshard_after_forward=false", "fsdp_config.limit_all_gathers=false"]) == []



def test_a_tensor_parallel_setting_llm_foundry_or_composer_refuses_is_named_and_one_rank_warned():
    """llm-foundry reads tp_config as the model and the trainer are built, on every rank after the queue: a
    missing strategy or degree is its ValueError, an unknown strategy its registry's error, another key composer's
    TPConfig's TypeError, tensor parallelism without FSDP composer's ValueError. At one rank llm-foundry drops it."""
    def tp(overrides, mode="sweep"):
        found = check(compose(["cluster.tasks_per_node=2", *overrides]), Context(mode=mode))
        return sorted((p.key, p.level) for p in found if p.key.startswith("tp_config") or "use_orig" in p.key)

    good = ["+tp_config.strategy=ffn", "+tp_config.tensor_parallel_degree=2"]
    assert tp(good) == []
    assert tp(["+tp_config.strategy=ffnn", "+tp_config.tensor_parallel_degre=2"]) == [
        ("tp_config.strategy", ERROR), ("tp_config.tensor_parallel_degre", ERROR),
        ("tp_config.tensor_parallel_degree", ERROR)]
    assert tp([*good, "+tp_config.layer_plan=x"]) == [("tp_config.layer_plan", ERROR)]  # llm-foundry passes its own
    assert tp([*good, "fsdp_config=null", "checkpoint=full"]) == [("tp_config", ERROR)]
    assert tp([*good, "+fsdp_config.use_orig_params=false"]) == [("fsdp_config.use_orig_params", ERROR)]
    assert tp(["+tp_config.strategy=ffn", "+tp_config.tensor_parallel_degree=1"]) == \
        [("tp_config.tensor_parallel_degree", WARNING)]
    assert tp(["+tp_config.strategy=ffn", "+tp_config.tensor_parallel_degree=0"]) == \
        [("tp_config.tensor_parallel_degree", ERROR)]
    assert tp(["+tp_config.strategy=ffnn"], mode="run") == [("tp_config", WARNING)]  # a plain run: one rank



def test_an_icl_task_llm_foundry_cannot_build_is_named_inline_or_in_its_file(tmp_path):
    """llm-foundry builds the ICL evaluators as the trainer is built, on every rank after the queue: a task without
    its required keys (an AssertionError), of an unknown type, with a key its dataset does not take (a TypeError),
    a shot count that is not a list, a task file or a local dataset file that is not there."""
    task_file = tmp_path / "lambada.jsonl"
    task_file.write_text('{"context": "a", "continuation": "b"}\n')

    def icl(overrides):
        found = check(compose(overrides), Context())
        return sorted((p.key, p.level) for p in found if p.key.startswith("icl_tasks"))

    good = f"{{label: lambada, dataset_uri: {task_file}, icl_task_type: language_modeling, num_fewshot: [0, 1]}}"
    assert icl([f"+icl_tasks=[{good}]"]) == []
    bad = ("{label: x, dataset_uri: /nowhere/x.jsonl, icl_task_type: language_modeling, num_fewshot: 0, "
           "continuation_delimiterr: ' '}")
    assert icl([f"+icl_tasks=[{good}, {bad}, {{label: y, icl_task_type: language_modelling, num_fewshot: [0]}}]"]) == [
        ("icl_tasks[1].continuation_delimiterr", ERROR), ("icl_tasks[1].dataset_uri", ERROR),
        ("icl_tasks[1].num_fewshot", ERROR), ("icl_tasks[2].dataset_uri", ERROR),
        ("icl_tasks[2].icl_task_type", ERROR)]
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(f"icl_tasks:\n- {good}\n- {{label: z, dataset_uri: {task_file}, icl_task_type: schema, "
                     "num_fewshot: [0], num_beams: 4}\n")
    # ...and the schema task reads a file of language-modeling lines (no context_options, gold)
    assert icl([f"+icl_tasks={tasks}"]) == [(f"icl_tasks ({tasks})[1].dataset_uri", ERROR),
                                            (f"icl_tasks ({tasks})[1].num_beams", ERROR)]
    # each line of a task file, read as llm-foundry reads it (it failed as the trainer was built, no line named)
    mc = tmp_path / "mc.jsonl"
    mc.write_text('{"query": "q", "choices": ["a", "b"], "gold": 1}\n\n{"query": "q", "choices": ["a"], "gold": 1}\n'
                  '{"query": "q", "gold": 0}\n{"query": \n[1]\n' + '{"query": "q", "choices": ["a"], "gold": 0}\n' * 3)
    [lines] = [p for p in check(compose([f"+icl_tasks=[{{label: m, dataset_uri: {mc}, icl_task_type: "
                                          "multiple_choice, num_fewshot: [0]}]"]), Context())
               if p.key == "icl_tasks[0].dataset_uri"]
    assert lines.level == ERROR and "line 3: gold 1 is not an index of its choices; line 4: no choices; line 5: not " \
        "JSON" in str(lines) and "and 1 more" in str(lines) and "line 7" not in str(lines), str(lines)
    # what llm-foundry reads too is not refused: the task's own key names, one JSON list of records (Hugging Face's
    # JSON reader takes it), a byte-order mark; a null field is missing (llm-foundry fails on it)
    named = tmp_path / "named.json"
    named.write_text('\ufeff[{"question": "q", "options": ["a", "b"], "gold": 0},\n {"question": "q", "options": ["a"],'
                     ' "gold": 0}]', encoding="utf-8")

    def mc(path, keys=""):
        return [str(p) for p in check(compose([f"+icl_tasks=[{{label: m, dataset_uri: {path}, icl_task_type: "
                                                f"multiple_choice, num_fewshot: [0]{keys}}}]"]), Context())
                if p.key == "icl_tasks[0].dataset_uri"]

    assert mc(named, ", context_key: question, choices_key: options") == []
    [wrong] = mc(named)  # the default names, which these records do not have
    assert "record 0: no query, choices; record 1: no query, choices" in wrong, wrong
    nulls = tmp_path / "nulls.jsonl"
    nulls.write_text('{"query": null, "choices": ["a"], "gold": 0}\n')
    [null] = mc(nulls)
    assert "line 1: no query" in null, null
    assert icl([f"+icl_tasks={tmp_path / 'none.yaml'}"]) == [("icl_tasks", ERROR)]
    # llm-foundry opens a string icl_tasks with open(): a URI there fails as the trainer is built
    [uri] = [p for p in check(compose(["+icl_tasks=s3://bucket/tasks.yaml"]), Context()) if p.key == "icl_tasks"]
    assert uri.level == ERROR and "open()" in str(uri)

    def gauntlet(path):
        return [p for p in check(compose([f"+icl_tasks={tasks}", f"+eval_gauntlet={path}"]), Context())
                if p.key == "eval_gauntlet"]

    [missing] = gauntlet(tmp_path / "g.yaml")  # llm-foundry opens it as a local file
    assert missing.level == ERROR and "is not a file" in str(missing)
    (tmp_path / "g.yaml").write_text("eval_gauntlet: {weighting: EQUAL, subtract_random_baseline: true}\n")
    assert gauntlet(tmp_path / "g.yaml") == []  # a path is what llm-foundry takes as well as the mapping

@pytest.mark.parametrize("override, key, meant", [
    ("+callbacks.speed_monitor.window_sze=10", "callbacks.speed_monitor.window_sze", "window_size"),
    ("+algorithms.gradient_clipping.clipping_threshhold=0.5", "algorithms.gradient_clipping.clipping_threshhold",
     "clipping_threshold"),
    ("+loggers.wandb.projct=x", "loggers.wandb.projct", "project"),
    ("+callbacks.scheduled_gc.gen_1_batch_interval=10", "callbacks.scheduled_gc.batch_interval", "needs it"),
])
def test_an_argument_a_callback_logger_or_algorithm_does_not_take_is_refused(override, key, meant):
    """llm-foundry builds each from its registry with the keys given as keyword arguments: another key (or a
    missing required one) was a TypeError when the trainer was built, after the queue."""
    found = [p for p in check(compose([override]), Context()) if p.key.split(".")[0] in
             ("callbacks", "algorithms", "loggers")]
    assert [(p.key, p.level) for p in found] == [(key, ERROR)] and meant in str(found[0]), found
    assert not [p for p in check(compose(["callbacks.speed_monitor.window_size=10", "logger=wandb"]), Context())
                if p.key.split(".")[0] in ("callbacks", "loggers")]


def test_a_loader_key_the_text_loader_does_not_take_is_refused():
    """llm-foundry passes a text loader's keys to build_text_dataloader: `num_worker=4` was a TypeError when the
    run started, after the queue; so was a `label` on a lone eval_loader (only a list of evaluators has it popped)."""
    found = [(p.key, p.level) for p in check(compose(["+train_loader.num_worker=4", "+eval_loader.label=c4"]),
                                             Context()) if "_loader" in p.key]
    assert found == [("train_loader.num_worker", ERROR), ("eval_loader.label", ERROR)], found
    fine = ["train_loader.num_workers=1", "+train_loader.timeout=60", "+train_loader.pin_memory=false"]
    assert not [p for p in check(compose(fine), Context()) if "_loader" in p.key]


def _resolved(overrides):
    cfg = compose(overrides)
    resolve_all(cfg)  # as the launcher does for each point, while its Hydra context is live
    return cfg


def test_sweep_checks_every_point_and_names_it():
    good = _resolved(["cluster=slurm-local"])
    bad = _resolved(["cluster=slurm-local", "optimizer.lr=-1"])
    sweep = [Context(mode="sweep")] * 2
    [p] = validate([good, bad], sweep, first=0)
    assert p.key == "[sweep point #1] optimizer.lr"
    assert validate([good, _resolved(["cluster=slurm-local", "optimizer.lr=1e-4"])], sweep, first=0) == []
    [p] = validate([good, _resolved(["cluster=slurm-local", f"run_name={good.run_name}"])], sweep, first=0)
    assert p.key == "save_folder"


def test_a_run_that_does_not_resume_is_refused_over_existing_checkpoints(tmp_path, cli):
    """composer would refuse full checkpoints only once running, and silently rewrite sharded ones."""
    folder = tmp_path / "ckpts"
    (folder / "ep0-ba10").mkdir(parents=True)
    (folder / "ep0-ba20-rank0.pt").write_bytes(b"")
    root = tmp_path / "root"
    root.mkdir()
    proc = cli("train", "autoresume=false", f"save_folder={folder}", root=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"error: autoresume: false, but save_folder {folder} already holds 2 checkpoint(s)" in proc.stderr
    assert "overwrite them" in proc.stderr and "fix: autoresume=true continues that run" in proc.stderr
    assert list(root.iterdir()) == []
    assert cli("train", "autoresume=false", f"save_folder={tmp_path / 'fresh'}", "plan=true", root=root).returncode == 0


def test_a_run_that_does_not_resume_over_existing_checkpoints_with_save_overwrite_is_said_and_on_slurm_refused(
        tmp_path, cli, monkeypatch):
    """llm-foundry's own examples set autoresume: false beside save_overwrite: true: a rerun trained from batch 0
    over the run's checkpoints without a word. Said locally (the command goes on); refused on Slurm unless the
    command line asks for it (save_overwrite=true there, not only in a YAML), before anything is written."""
    from train.checks import ERROR, WARNING, Context, check
    from train.config.compose import compose

    folder = tmp_path / "ckpts"
    (folder / "ep0-ba10").mkdir(parents=True)
    (folder / "ep0-ba20").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    base = ["autoresume=false", f"save_folder={folder}", "save_overwrite=true"]
    said = f"autoresume: false with save_overwrite=true, and save_folder {folder} already holds 2 checkpoint(s)"
    local = cli("train", *base, "plan=true", root=root)
    assert local.returncode == 0 and f"warning: {said}" in local.stderr, local.stderr[-2000:]
    assert "trains from batch 0 and overwrites them as it goes" in local.stderr and list(root.iterdir()) == []

    monkeypatch.setenv("PRETRAIN_ROOT", str(root))
    slurm = ["cluster=slurm-local", *base]

    def level(overrides):  # as a point of `-m` sees it; `given`: what the command line said
        ctx = Context(mode="sweep", overrides=tuple(overrides), choices={"model": "mpt-tiny", "cluster": "slurm-local"}, scheduler="slurm")
        return [p.level for p in check(compose(slurm), ctx) if p.key == "autoresume"]

    assert level(slurm) == [WARNING]  # asked on the command line
    assert level(["cluster=slurm-local"]) == [ERROR]  # set elsewhere (a YAML, an experiment): refused
    [p] = [p for p in check(compose(slurm), Context(mode="sweep", choices={"cluster": "slurm-local"}, scheduler="slurm"))
           if p.key == "autoresume"]
    assert "save_overwrite=true on the command line starts over them on purpose" in p.fix


# -------------------------------------------------------------------------------------- a look writes nothing


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else None


@pytest.mark.e2e  # ten whole commands
def test_plans_cfg_help_and_refused_runs_write_nothing_anywhere(tmp_path, cli):
    """The storage root (/data for storage=amlfs) is not created, no runs/ or Hydra folder appears, and the
    mount check does not pass because a look created the folder it checks."""
    data = tmp_path / "data"  # the storage root, absent, as /data on a laptop
    root = tmp_path / "root"
    root.mkdir()
    amlfs = ["model=mpt-30b", "cluster=ndv5", "storage=amlfs", f"storage.root={data}", f"storage.mounts=[{data}]"]
    repo_before = _tree(ROOT / "runs"), _tree(ROOT / "outputs"), _tree(ROOT / "multirun")
    looks = [
        ([*amlfs, "plan=json"], 0), ([*amlfs, "plan=true"], 0), ([*amlfs, "data=c4", "-m", "plan=true"], 0),
        ([*amlfs, "--cfg", "job"], 0), (["--help"], 0), ([*amlfs, "-m", "cluster.nodes=2,4", "plan=json"], 0),
        ([*amlfs, "data=c4", "-m"], 2),          # refused: /data is not mounted here, the tokenizer is offline
        ([*amlfs, "cluster.nodes=0"], 2), (["optimizer.lr=0"], 2), (["-m", "optimizer.lr=0,1"], 2),
    ]
    for args, code in looks:
        proc = cli("train", *args, env=OFFLINE, root=root)
        assert proc.returncode == code and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert not data.exists(), f"{args} created the storage root"
        assert list(root.iterdir()) == [], f"{args} wrote under PRETRAIN_ROOT"
    assert (_tree(ROOT / "runs"), _tree(ROOT / "outputs"), _tree(ROOT / "multirun")) == repo_before
    proc = cli("train", *amlfs, "data=c4", "-m", "plan=json", env=OFFLINE, root=root)
    assert "warning: [sweep point #0] storage.mounts:" in proc.stderr  # still missing after every look


def test_m_may_stand_anywhere_on_the_line(tmp_path, cli):
    proc = cli("train", "model=mpt-30b", "cluster=ndv5", "data=c4", "-m", "plan=json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert isinstance(json.loads(proc.stdout), list)  # a sweep's plan: one object per point


def test_open_maps_take_new_keys_without_a_plus(tmp_path, cli):
    cfg = compose(["cluster=ndv5", "cluster.env.NCCL_IB_PCI_RELAXED_ORDERING=1",
                   "cluster.sbatch_extra={reservation: big}", "cluster.sbatch_extra.mail-type=END"])
    # the schema types the environment as strings, as the shell holds it
    assert cfg.cluster.env.NCCL_IB_PCI_RELAXED_ORDERING == "1" and cfg.cluster.env.NCCL_PXN_DISABLE == "1"
    assert dict(cfg.cluster.sbatch_extra) == {"reservation": "big", "mail-type": "END"}
    proc = cli("train", "-m", "model=mpt-125m", "cluster=ndv5", "data=c4", "cluster.env.NCCL_IB_TIMEOUT=23",
               "cluster.sbatch_extra.reservation=big", "plan=json")
    script = json.loads(proc.stdout)[0]["sbatch_script"]
    assert "#SBATCH --reservation=big" in script and 'export NCCL_IB_TIMEOUT="23"' in script


def test_the_plan_follows_fsdp_config_state_dict_type(tmp_path):
    from train.plan.forecast import build_plan

    def plan(*args):
        return build_plan(compose(["model=mpt-30b", "cluster=ndv5", "cluster.nodes=2", *args, "plan=json"]))

    assert plan()["checkpoint_files"] == 16
    full = plan("fsdp_config.state_dict_type=full")
    assert full["checkpoint"] == "full" and full["checkpoint_files"] == 1 and "rank 0" in full["checkpoint_layout"]
    assert plan("checkpoint=full", "fsdp_config.state_dict_type=sharded")["checkpoint_files"] == 16


def test_unknown_key_names_the_close_match_and_keeps_a_nonzero_exit(tmp_path, cli):
    proc = cli("train", "save_intervl=100ba")
    assert proc.returncode != 0
    assert "did you mean save_interval? (save_interval=100ba)" in proc.stderr
    proc = cli("train", "model=mpt-7b", "fsdp_config.sharding_stratgy=FULL_SHARD")
    assert proc.returncode != 0 and "did you mean fsdp_config.sharding_strategy?" in proc.stderr
    # an llm-foundry key the preset does not set, under one it does: added with +, not "did you mean" its parent
    proc = cli("train", "model.attn_config.alibi=true")
    assert proc.returncode != 0 and "fix: +model.attn_config.alibi=true (a key model.attn_config does not set yet" \
        in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_unknown_preset_names_the_closest_and_lists_the_public_presets(tmp_path, cli):
    proc = cli("train", "model=mpt-31b")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: model: 'mpt-31b' is not a model preset" in proc.stderr
    assert "fix: did you mean model=mpt-3" in proc.stderr and "model presets: gpt-375m, gpt-857m," in proc.stderr
    proc = cli("train", "cluster=ndv6")
    assert proc.returncode == 2 and "did you mean cluster=ndv5?" in proc.stderr
    assert "_cpu" not in proc.stderr and "_slurm" not in proc.stderr and "_preflight" not in proc.stderr
    proc = cli("train", "-m", "checkpoint=sharded,shard")  # each choice of a sweep
    assert proc.returncode == 2 and "did you mean checkpoint=sharded?" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_hydra_parse_errors_and_unknown_top_level_keys_get_a_key_and_a_fix(tmp_path, cli):
    """Hydra's own refusals, before Hydra: our key / problem / fix line, exit 2, not Hydra's advice to add the
    key with `+`."""
    proc = cli("train", "tokenizer.name=модель")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "LexerNoViableAltException" not in proc.stderr
    assert "error: tokenizer.name: Hydra cannot read" in proc.stderr
    assert """fix: quote the value for Hydra, and the whole for the shell: 'tokenizer.name="модель"'""" in proc.stderr
    proc = cli("train", "modle=mpt-125m")
    assert proc.returncode == 2 and "+modle" not in proc.stderr
    assert "error: modle: is not a key of this config\n  fix: did you mean model? (model=mpt-125m)" in proc.stderr
    proc = cli("train", "save_weights_only=true")  # llm-foundry's key, not in this config: added with +
    assert proc.returncode == 2 and "fix: +save_weights_only=true" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_each_sweep_point_is_checked_under_its_own_name(tmp_path, cli):
    """run_name (and so save_folder) follows each point's overrides: points are resolved as they are composed."""
    proc = cli("train", "-m", "cluster=slurm-local", "data=mock", "optimizer.lr=1e-4,2e-4", "plan=json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = [p["run_name"] for p in json.loads(proc.stdout)]
    assert len(set(names)) == 2, names
    bad = cli("train", "-m", "storage.tier=AMLFS-1", "storage=amlfs", f"storage.root={tmp_path}/data",
              "storage.mounts=[/]", "optimizer.lr=1e-3,-1")
    keys = [k for level, k, *_ in problems_in(bad.stderr) if level == ERROR]
    assert keys == ["[sweep point #0] storage.tier", "[sweep point #1] optimizer.lr", "[sweep point #1] storage.tier"]


def test_help_lists_each_apps_own_groups(tmp_path, cli):
    """Training's --help offers its groups and their real choices only; data_prep's offers its `dataset`."""
    train_help = cli("train", "--help").stdout
    groups = train_help.split("== Config groups ==")[1].split("== Config ==")[0]
    assert "cluster: local, ndv4, ndv5, p4d, p5, slurm-local\n" in groups
    assert "model: " in groups and "checkpoint: full, none, sharded" in groups
    for foreign in ("dataset", "schema", "_cpu", "_slurm"):
        assert foreign not in groups
    prep = subprocess.run([str(PYTHON), "-m", "data_prep", "--help"], cwd=ROOT, capture_output=True, text=True)
    groups = prep.stdout.split("== Config groups ==")[1].split("== Config ==")[0]
    assert groups.strip() == "dataset: c4, jsonl, slimpajama"


@pytest.mark.parametrize("key", ["save_filename", "save_latest_filename"])
def test_checkpoints_of_the_users_naming_are_warned_and_refused_where_a_requeue_would_start_over(key):
    """A run verifies and resumes checkpoints of composer's default names alone: with names of the user's own a
    restart is composer's autoresume, unverified (a warning), and a requeued Slurm job with autoresume=false would
    train from batch 0 (refused); a plain run is never requeued."""
    named = [f"+{key}='mine-{{batch}}.pt'"]
    [p] = [p for p in check(compose(named), Context()) if p.key == key]
    assert p.level == WARNING and "without verifying the checkpoint against its manifest" in p.problem, p
    slurm = compose(["cluster=slurm-local", *named, "autoresume=false"])
    [p] = [p for p in check(slurm, Context(mode="sweep", scheduler="slurm")) if p.key == key]
    assert p.level == ERROR and "would train from batch 0 again" in p.problem and p.fix.startswith(f"remove it (~{key})")
    assert [p.level for p in check(slurm, Context(mode="run", scheduler="slurm")) if p.key == key] == [WARNING]
    assert not [p for p in check(compose(["cluster=slurm-local"]), Context(mode="sweep", scheduler="slurm"))
                if p.key == key]


def test_cluster_wait_false_on_this_machine_is_a_warning():
    [p] = check(compose(["cluster.wait=false"]), Context(mode="sweep"))
    assert (p.key, p.level) == ("cluster.wait", WARNING) and "children" in p.problem
    assert check(compose(["cluster=slurm-local", "cluster.wait=false"]), Context(mode="sweep")) == []


def test_fewer_tasks_than_gpus_per_node_is_a_warning_naming_the_idle_gpus():
    """Each rank takes its local rank's GPU: `cluster.tasks_per_node=1` on 8-GPU nodes held 8 and trained on 1, and
    the plan's world size and speed treated it as normal."""
    found = [p for p in check(compose(["cluster=ndv5", "cluster.tasks_per_node=2"]), Context(mode="plan"))
             if p.key == "cluster.tasks_per_node"]
    assert [(p.level, p.problem, p.fix) for p in found] == [
        (WARNING, "2 tasks on 8 GPUs per node: 6 GPUs of each node would sit idle (one rank per GPU; the job still "
         "holds them all)", "cluster.tasks_per_node=8, or cluster.gpus_per_node=2")]
    assert not [p for p in check(compose(["cluster=ndv5"]), Context(mode="plan")) if p.key == "cluster.tasks_per_node"]


def test_setup_lines_beside_a_container_image_are_warned_as_not_run():
    """With an image the job runs no setup lines (the image is the environment): they were dropped without a word."""
    def found(*overrides):
        return [(p.level, p.problem) for p in check(compose(list(overrides)), Context(
            mode="sweep", overrides=overrides, choices={"cluster": "ndv5"}, scheduler="slurm")) if p.key == "cluster.setup"]

    image = ["cluster=ndv5", "data=mock", 'cluster.container.image="nvcr.io#nvidia/pytorch:24.05-py3"']
    assert found(*image, "cluster.setup=[module load nccl,'export FOO=1']") == [
        (WARNING, "2 line(s) are not run with cluster.container.image set: the image is the tasks' environment (bare "
         "mode alone runs setup lines before srun)")]
    assert found(*image) == [] and found("cluster=ndv5", "data=mock", "cluster.setup=[module load nccl]") == []


@pytest.mark.parametrize("sweep", [False, True])
def test_a_shell_variable_in_braces_in_cluster_env_is_refused_by_key_not_a_traceback(tmp_path, cli, sweep):
    """`cluster.env.X=/tmp/${SLURM_JOB_ID}` is an OmegaConf interpolation of a key there is none of: the checks
    read it unresolved and stopped with OmegaConf's traceback (a plan and a sweep alike)."""
    proc = cli("train", *(["-m"] if sweep else []), "cluster=ndv5", "data=mock", "cluster.env.X=/tmp/${SLURM_JOB_ID}",
               "plan=true", check=2)
    at = "[sweep point #0] " if sweep else ""
    assert f"error: {at}cluster.env.X: `/tmp/${{SLURM_JOB_ID}}`: ${{SLURM_JOB_ID}} is read as a config key here " \
        "(an OmegaConf interpolation), and there is none\n  fix: for the job's environment variable write " \
        "$SLURM_JOB_ID, without braces (expanded in the job)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and (not tmp_path.exists() or not any(tmp_path.iterdir()))


def test_a_run_longer_than_its_allocations_is_warned_with_the_requeues_it_needs(tmp_path):
    """A job runs cluster.max_num_timeout + 1 allocations of cluster.timeout_min at most: mpt-30b on 2 nodes plans
    197.5 days, and 21 allocations of 48 h are 42 days; it would end TIMEOUT before max_duration, unsaid."""
    def found(*overrides):
        cfg = compose(["model=mpt-30b", "cluster=ndv5", "data=mock", f"storage.root={tmp_path}", *overrides])
        return [(p.level, p.problem, p.fix) for p in check(cfg, Context(mode="plan", overrides=overrides, choices={
            "cluster": "ndv5"}, scheduler="slurm")) if p.key == "cluster.max_num_timeout"]

    [(level, problem, fix)] = found("cluster.nodes=2")
    assert level == WARNING and problem == (
        "20 requeues after the first allocation: 21 x 48 h = 42.0 days, and the 143100 batches to max_duration take "
        "about 197.5 days at the plan's 119 s/step: the job would stop at its last time limit before the end (the "
        "same command again goes on from its checkpoint)")
    assert fix == "cluster.max_num_timeout=109, or more nodes"
    assert found("cluster.nodes=2", "cluster.max_num_timeout=109") == [] and found("cluster.nodes=16") == []


def test_callbacks_null_is_refused_naming_how_to_leave_one_out():
    """It dropped the run report with llm-foundry's callbacks: the plan passed, the run stopped at its start."""
    for given, key in (("callbacks=null", "callbacks"), ("~callbacks", "callbacks"),
                       ("~callbacks.run_report", "callbacks.run_report")):
        [p] = [p for p in check(compose([given]), Context(mode="plan")) if p.key.startswith("callbacks")]
        assert (p.key, p.level) == (key, ERROR) and "~callbacks.lr_monitor" in p.fix, given
    assert not [p for p in check(compose(["~callbacks.lr_monitor"]), Context(mode="plan")) if p.key.startswith("callbacks")]


def test_attention_dropout_with_torch_attention_is_refused_where_llm_foundry_fails_at_the_first_backward():
    """gpt-375m keeps Megatron's 0.1 attention dropout: fine with flash attention on a GPU cluster; with the torch
    attention of a CPU run llm-foundry 0.22 fails at the first backward (an in-place dropout autograd needs)."""
    def found(*overrides):
        cfg = compose(list(overrides))
        return [(p.key, p.level) for p in check(cfg, Context(mode="run", overrides=overrides,
                                                                choices={"cluster": "local"}))]

    assert ("model.attn_config.attn_pdrop", ERROR) in found("model=gpt-375m")
    assert ("model.attn_config.attn_pdrop", ERROR) not in found("model=gpt-375m", "model.attn_config.attn_pdrop=0")
    assert "model.attn_config.attn_pdrop" not in {k for k, _ in found("model=gpt-375m", "cluster=ndv5")}


def test_an_evaluation_on_the_training_split_is_a_warning_naming_both_loaders():
    """Legal in llm-foundry, but the eval loss the summary and an Optuna objective read as held-out would follow
    the train loss."""
    def found(*overrides):
        return [(p.key, p.level, p.problem) for p in check(compose(list(overrides)), Context(mode="plan"))]

    [(key, level, problem)] = found("eval_loader.dataset.split=train")
    assert (key, level) == ("eval_loader.dataset.split", WARNING)
    assert "both read split 'train' of " in problem and problem.split(" of ")[1].startswith(
        str(compose([]).variables.data_local))
    assert found() == [] and found("eval_loader=null") == []
    # other data (a folder that is not there: named as such, not as the training split)
    assert [k for k, _, _ in found("eval_loader.dataset.local=/elsewhere", "eval_loader.dataset.split=train")] == \
        ["eval_loader.dataset.local"]


def test_mds_data_without_shard_hashes_is_warned_once_and_data_with_them_is_not(tmp_path, cli):
    """A folder written by streaming's writer without hashes= (or llm-foundry's converter) trained with no word
    that its shards could not be checked before training, as data_prep's are: one warning for both splits."""
    import numpy as np

    from data_prep.mds import ShardWriter, write_index

    for hashes, folder in (((), tmp_path / "theirs"), (("sha256",), tmp_path / "ours")):
        for split in ("train", "val"):
            writer = ShardWriter(folder / split, 128, None, 1 << 20, hashes=hashes)
            (folder / split).mkdir(parents=True)
            writer.add(np.arange(128 * 8, dtype=np.int32).reshape(8, 128) % 1000)
            write_index(folder / split, writer.finish())
    args = ("data=mds", f"tokenizer.name={TOKENIZER}", "plan=true")
    proc = cli("train", *args, f"variables.data_local={tmp_path / 'theirs'}", root=tmp_path / "root", env=OFFLINE)
    said = [line for line in proc.stderr.splitlines() if line.startswith("warning: variables.data_local:")]
    assert proc.returncode == 0 and len(said) == 1, proc.stderr[-2000:]
    assert f"{tmp_path / 'theirs' / 'train'} and {tmp_path / 'theirs' / 'val'}: index.json records no hash" in said[0]
    proc = cli("train", *args, f"variables.data_local={tmp_path / 'ours'}", root=tmp_path / "root", env=OFFLINE)
    assert proc.returncode == 0 and "records no hash" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "root").exists()


def test_the_storage_root_a_near_miss_under_a_group_and_a_yaml_folder_are_named_for_what_they_are(tmp_path, cli):
    """PRETRAIN_ROOT a file: a traceback as the outputs folder was made; under /proc, "no room". A misspelt key
    under a group: Hydra's advice to add it with + came first, exit 1. yaml=<a folder>: "<folder>.yaml: no such
    file". Each now exit 2 with our line first, nothing written."""
    readme = tmp_path / "README.md"
    readme.write_text("# notes\n")
    for root, said in ((readme, f"error: storage.root: PRETRAIN_ROOT={readme}: no run folder can be made there "
                        f"({readme} is a file, not a folder)"),
                       ("/proc/pretrain", "error: storage.root: PRETRAIN_ROOT=/proc/pretrain: no run folder can be "
                        "made there (/proc is on the kernel's proc file system")):
        proc = cli("train", root=root)
        assert proc.returncode == 2 and proc.stderr.startswith(said), proc.stderr[-2000:]
        assert "free for them" not in proc.stderr and "Traceback" not in proc.stderr
    for args, said in ((["model.d_modle=128"], "error: model.d_modle: is not a key of this config\n  fix: did you "
                        "mean model.d_model? (model.d_model=128)"),
                       (["-m", "scheduler.t_warmpu=10ba"], "error: scheduler.t_warmpu: is not a key of this config"
                        "\n  fix: did you mean scheduler.t_warmup? (scheduler.t_warmup=10ba)"),
                       (["+seed=3"], "error: seed: is set already, and + adds a key the config does not have\n  fix: "
                        "seed=3 (without +)"),
                       ([f"yaml={tmp_path}"], f"error: yaml: {tmp_path} is a folder, not a YAML file")):
        proc = cli("train", *args, root=tmp_path / "root")
        assert proc.returncode == 2 and proc.stderr.startswith(said), proc.stderr[-2000:]
        assert "To append" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


@pytest.mark.parametrize("hub, transformers, offline", [
    ("1", None, True), ("yes", None, True), ("no", None, False), (None, "1", True), ("0", "1", False),
    ("", "on", True), (None, None, False)])
def test_the_hub_is_offline_where_huggingface_hub_reads_it(monkeypatch, hub, transformers, offline):
    """"The hub is switched off" (HF_HUB_OFFLINE, then TRANSFORMERS_OFFLINE, as huggingface_hub.constants reads
    them), as the tokenizer rule and data_prep's hub input read it: HF_HUB_OFFLINE=0 beside TRANSFORMERS_OFFLINE=1
    is online there, and HF_HUB_OFFLINE=no (data_prep read it as off)."""
    import os

    from common.paths import hub_switched_off_by

    for name, given in (("HF_HUB_OFFLINE", hub), ("TRANSFORMERS_OFFLINE", transformers)):
        monkeypatch.delenv(name, raising=False) if given is None else monkeypatch.setenv(name, given)
    # off or on, and the messages name the variable that switched it off
    assert hub_switched_off_by() == (("HF_HUB_OFFLINE" if hub else "TRANSFORMERS_OFFLINE") if offline else None)
    hubs = subprocess.run([str(PYTHON), "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE)"],
                          env=dict(os.environ), capture_output=True, text=True, check=True).stdout.strip()
    assert hubs == str(offline)


@pytest.mark.parametrize("override", ["max_seq_len=abc", "global_train_batch_size=2.5", "device_eval_batch_size=x",
                                      "device_train_microbatch_size=big",
                                      "save_interval=true", "eval_interval=true", "save_num_checkpoints_to_keep=few",
                                      "eval_interval=null", "max_duration=null", "save_interval=null",
                                      "device_eval_batch_size=null", "max_seq_len=null", "max_seq_len=0",
                                      "variables.max_seq_len=0", "model.max_seq_len=0"])
def test_a_value_of_another_type_is_one_error_of_its_key(override):
    """A key's type is refused by one rule, in its words (a TrainConfig type, or the key's own rule where that
    refuses every other type), not once by each; and once, as max_seq_len's, where the keys that follow it
    (model.max_seq_len, the tokenizer's model_max_length) hold the same value."""
    key = override.split("=")[0].removeprefix("variables.")
    [p] = [p for p in check(compose([override]), Context()) if p.level == ERROR]
    assert p.key == key, p


def test_a_key_that_follows_another_is_named_where_its_bad_value_is_its_own():
    """model.max_seq_len follows max_seq_len: given a bad value of its own, each key's is said."""
    bad = [p.key for p in check(compose(["max_seq_len=0", "model.max_seq_len=-5"]), Context()) if p.level == ERROR]
    assert bad == ["max_seq_len", "model.max_seq_len"]
