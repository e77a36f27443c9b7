"""`plan=true` / `plan=json`: figures against the published ones (/work/shared/CONTEXT.md), the JSON form, sweeps,
and the submit path's promises (no torch / llm-foundry import, fast, nothing written or submitted)."""
import json
import subprocess

import pytest
from helpers import PYTHON, ROOT, command_env

from train.config.compose import compose
from train.plan import estimate
from train.plan.estimate import GiB, TiB
from train.plan.forecast import build_plan
from train.plan.forecast_report import render

REQUIRED = ("params", "flops_per_token", "world_size", "grad_accum", "memory_per_gpu_bytes", "gpu_memory_bytes",
            "fits", "min_nodes", "checkpoint_bytes", "checkpoint_write_seconds", "step_seconds", "train_days",
            "sbatch_script")


def plan(*overrides):
    return build_plan(compose([*overrides, "plan=json"]))


# ------------------------------------------------------------------------------------- published figures


@pytest.mark.parametrize("model,gib", [("mpt-30b", 336), ("mpt-70b", 725)])
def test_checkpoint_size_matches_published(model, gib):
    p = plan(f"model={model}", "cluster=ndv5", "cluster.nodes=16", "storage=amlfs")
    assert p["checkpoint_bytes"] / GiB == pytest.approx(gib, rel=0.05)
    assert p["checkpoint_bytes"] == 12 * p["params"]  # fp32 weights + two Adam moments
    assert p["checkpoint_bytes_per_rank"] == p["checkpoint_bytes"] // 128 and p["checkpoint_files"] == 128


def test_gpt175b_checkpoint_against_megatrons_2_3_tib():
    p = plan("model=gpt175b", "cluster=ndv5", "cluster.nodes=64", "storage=amlfs", "checkpoint=sharded")
    assert p["megatron_checkpoint_bytes"] == 14 * p["params"]  # fp16 weights beside fp32 master weights
    assert p["megatron_checkpoint_bytes"] / TiB == pytest.approx(2.3, rel=0.05)
    assert p["checkpoint_bytes"] / p["megatron_checkpoint_bytes"] == pytest.approx(12 / 14)
    text = render(p)
    assert "14 B/param" in text and "of the ~2.3 TiB its GPT-3 175B recipe writes" in text


@pytest.mark.parametrize("tier,minutes", [("AMLFS-40", 2.04), ("AMLFS-125", 0.61), ("AMLFS-250", 0.31),
                                          ("AMLFS-500", 0.15)])
def test_amlfs_write_time_table(tier, minutes):
    """CONTEXT.md: a 2.3 TiB checkpoint takes 2.04 / 0.61 / 0.31 / 0.15 min by tier."""
    cfg = compose(["storage=amlfs", f"storage.tier={tier}"])
    seconds = estimate.write_seconds(int(2.3 * TiB), sharded=True, ranks=512, write_GBps=cfg.storage.write_GBps,
                                     file_GBps=cfg.storage.file_GBps)
    assert seconds / 60 == pytest.approx(minutes, rel=0.05)
    # one file is capped near 10 GB/s: a full checkpoint does not get the tier's bandwidth
    full = estimate.write_seconds(int(2.3 * TiB), sharded=False, ranks=512, write_GBps=cfg.storage.write_GBps,
                                  file_GBps=cfg.storage.file_GBps)
    assert full / 60 == pytest.approx(2.3 * 1024 / 10 / 60, rel=0.01)


def test_plan_write_time_follows_the_storage_preset_and_overrides():
    base = ("model=gpt175b", "cluster=ndv5", "cluster.nodes=64", "checkpoint=sharded")
    p40 = plan(*base, "storage=amlfs")
    p500 = plan(*base, "storage=amlfs", "storage.tier=AMLFS-500")
    assert p40["checkpoint_write_seconds"] == pytest.approx(p40["checkpoint_bytes"] / (19.2 * GiB))
    assert p40["checkpoint_write_seconds"] / p500["checkpoint_write_seconds"] == pytest.approx(256 / 19.2)
    assert plan(*base, "storage=amlfs", "storage.write_GBps=5")["write_GBps"] == 5
    full = plan(*base, "storage=amlfs", "checkpoint=full")
    assert full["checkpoint_bytes_per_rank"] is None
    assert full["checkpoint_write_seconds"] == pytest.approx(full["checkpoint_bytes"] / (10 * GiB))
    for storage, gbps in (("blob", 5.0), ("fsx", 12.0)):
        assert plan(*base, f"storage={storage}")["write_GBps"] == gbps


@pytest.mark.parametrize("model,cluster,mfu,tokens", [("mpt-30b", "ndv5", None, 2199),
                                                      ("mpt-70b", "ndv5", 0.4336, 1058),
                                                      ("mpt-30b", "ndv4", None, 916)])
def test_tokens_per_second_per_gpu_at_published_mfu(model, cluster, mfu, tokens):
    extra = [f"cluster.mfu={mfu}"] if mfu else []
    p = plan(f"model={model}", f"cluster={cluster}", "cluster.nodes=16", *extra)
    assert p["tokens_per_second_per_gpu"] == pytest.approx(tokens, rel=0.02)
    assert p["step_seconds"] == pytest.approx(p["tokens_per_step"] / (p["tokens_per_second_per_gpu"] * 128))
    assert p["train_days"] == pytest.approx(p["steps"] * p["step_seconds"] / 86400)


def test_flops_per_token_is_6n_plus_attention():
    p = plan("model=mpt-30b")
    assert p["flops_per_token"] == 6 * p["params"] + 12 * 48 * 2048 * 7168
    assert p["params"] / 1e9 == pytest.approx(29.9, rel=0.01)


def test_batch_steps_and_tokens():
    p = plan("model=mpt-30b", "cluster=ndv5", "cluster.nodes=16")
    assert (p["world_size"], p["per_device_batch"], p["grad_accum"]) == (128, 16, 2)
    assert p["tokens_per_step"] == 2048 * 2048
    assert p["steps"] == 143100 and p["tokens"] / 1e9 == pytest.approx(600, rel=0.01)  # ~600B tokens
    assert plan("model=mpt-30b", "max_duration=1000000000tok")["steps"] == 239
    assert plan("model=mpt-30b", "max_duration=4096sp")["steps"] == 2
    assert plan("model=mpt-30b", "max_duration=1ep")["steps"] is None


# ----------------------------------------------------------------------------------------------- memory


def test_memory_model_shards_16_bytes_per_param_over_the_world():
    p = plan("model=mpt-70b", "cluster=ndv5", "cluster.nodes=16")
    b = p["memory_breakdown_bytes"]
    assert b["params"] + b["grads"] + b["optimizer"] == pytest.approx(16 * p["params"] / 128, rel=1e-6)
    assert p["memory_per_gpu_bytes"] == sum(b.values())
    assert p["gpu_memory_bytes"] == 80 * GiB and p["fits"] is True
    assert p["activation_checkpointing"] is True
    assert b["activations"] == p["activation_bytes_with_checkpointing"]
    assert p["activation_bytes_without_checkpointing"] > 5 * p["activation_bytes_with_checkpointing"]
    # the rule of thumb (16 x params in GB of total GPU memory) is a floor the estimate stays above
    assert p["memory_per_gpu_bytes"] * 128 > 16 * p["params"]


@pytest.mark.parametrize("model,cluster,min_nodes", [("mpt-30b", "ndv5", 2), ("mpt-70b", "ndv5", 3),
                                                     ("gpt175b", "ndv5", 7), ("mpt-7b", "ndv5", 1),
                                                     ("mpt-30b", "p4d", 8)])
def test_min_nodes(model, cluster, min_nodes):
    p = plan(f"model={model}", f"cluster={cluster}", "cluster.nodes=1")
    assert p["min_nodes"] == min_nodes
    assert p["fits"] is (min_nodes == 1)
    at = plan(f"model={model}", f"cluster={cluster}", f"cluster.nodes={min_nodes}")
    assert at["fits"] is True
    if min_nodes > 1:
        assert plan(f"model={model}", f"cluster={cluster}", f"cluster.nodes={min_nodes - 1}")["fits"] is False


def test_the_smallest_node_count_is_the_same_from_any_node_count():
    """llm-foundry cuts the microbatch to a rank's share of the global batch, which is larger on fewer nodes: the
    smallest node count was found at the share of the nodes asked for (measured: 1 said from 16 nodes, where 1
    node trains a microbatch of 16 and does not fit)."""
    args = ("model=mpt-30b", "cluster=ndv5", "global_train_batch_size=128", "device_train_microbatch_size=16")
    found = {nodes: plan(*args, f"cluster.nodes={nodes}") for nodes in (1, 2, 16)}
    assert {p["min_nodes"] for p in found.values()} == {2}
    assert found[1]["fits"] is False and found[2]["fits"] is True
    # and where one node's microbatch is too large for any count's sharding alone: more nodes shrink it too
    # (measured: "no node count fits" for mpt-7b at a microbatch of 64, which fits at 4 nodes)
    wide = plan("model=mpt-7b", "cluster=ndv5", "device_train_microbatch_size=64", "cluster.nodes=4")
    assert wide["fits"] is True and wide["min_nodes"] == 4
    assert plan("model=mpt-7b", "cluster=ndv5", "device_train_microbatch_size=64", "cluster.nodes=3")["fits"] is False


def test_microbatch_auto_is_counted_at_one_sample_not_none():
    """composer's 'auto' halves the microbatch on each out-of-memory, down to 1: the run needs one sample's
    activations to fit. They were counted as none (measured: mpt-70b on 2 nodes "fits" at 67.7 GiB, with 4
    samples 84.3 GiB)."""
    auto = plan("model=mpt-70b", "cluster=ndv5", "cluster.nodes=2", "device_train_microbatch_size=auto")
    one = plan("model=mpt-70b", "cluster=ndv5", "cluster.nodes=2", "device_train_microbatch_size=1")
    assert auto["memory_breakdown_bytes"]["activations"] == one["memory_breakdown_bytes"]["activations"] > 0
    assert auto["memory_per_gpu_bytes"] == one["memory_per_gpu_bytes"]
    assert "activations per sample (microbatch auto: it needs 1 to fit)" in render(auto)


def test_the_script_is_in_the_launchers_submitit_folder():
    """The plan wrote `<sweep>/.submitit/%j` whatever hydra.launcher.submitit_folder said, which `-m` uses."""
    assert "#SBATCH --error=/data/jobs/%j/%j_0_log.err" in plan(
        "cluster=ndv5", "hydra.launcher.submitit_folder=/data/jobs/%j")["sbatch_script"]
    script = plan("cluster=ndv5")["sbatch_script"]
    assert "/.submitit/%j/%j_0_log.err" in script and "<sweep dir>" not in script


def test_local_cpu_plan_has_no_gpu_figures():
    p = plan()
    assert p["fits"] is None and p["gpu_memory_bytes"] is None and p["min_nodes"] is None
    assert p["step_seconds"] is None and p["train_days"] is None and p["sbatch_script"] is None
    assert p["world_size"] == 1 and p["grad_accum"] == 2
    assert p["sweep_waits"] is True  # a local sweep's tasks are the command's children


@pytest.mark.parametrize("extra, waits, shown", [
    ((), False, "-m          submits and returns; follow with `python -m train.status <sweep> --watch`; a summary "
                "job on partition gpu writes"),
    (("cluster.summary_partition=cpu",), False, "a summary job on partition cpu"),
    (("cluster.wait=true",), True, "-m          waits for every job, then prints and writes the summary"),
])
def test_the_plan_says_whether_a_slurm_sweep_returns_or_waits(extra, waits, shown):
    p = plan("cluster=ndv5", *extra)
    assert p["sweep_waits"] is waits
    assert shown in render(p)


# ------------------------------------------------------------------------------------- the command line


def test_plan_json_prints_only_json_with_every_key(tmp_path, cli):
    proc = cli("train", "model=gpt175b", "cluster=ndv5", "cluster.nodes=64", "storage=amlfs",
               f"storage.root={tmp_path}", "storage.mounts=[]", "checkpoint=sharded", "plan=json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert set(REQUIRED) <= set(p)
    assert p["world_size"] == 512 and p["grad_accum"] == 3 and p["fits"] is True and p["min_nodes"] == 7
    assert "#SBATCH --nodes=64" in p["sbatch_script"] and "#SBATCH --gpus-per-node=8" in p["sbatch_script"]
    assert "NCCL_TOPO_FILE" in p["sbatch_script"]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_plan_local_json_has_null_sbatch(tmp_path, cli):
    proc = cli("train", "plan=json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert p["sbatch_script"] is None and p["fits"] is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("every", ["1ep", "99999tok", "1000sp"])
def test_a_save_policy_with_no_checkpoint_before_the_end_is_counted_warned_here_and_refused_on_a_gpu_cluster(
        tmp_path, cli, every):
    """Measured before: the plan of save_interval=1ep on the 40-batch default printed no checkpoint count and no
    word, and the run kept ep0-ba40 alone."""
    here = cli("train", f"save_interval={every}", "plan=json")
    assert here.returncode == 0, here.stderr
    p = json.loads(here.stdout)
    assert p["checkpoints_to_max_duration"] == 1 and p["checkpoints_before_end"] == 0
    assert p["checkpoint_batches"] == [40]
    assert f"warning: save_interval: {every} comes at no batch before max_duration=40ba" in here.stderr
    assert here.stderr.split(f"warning: save_interval: {every}")[1].splitlines()[1].startswith("  fix: ")
    gpu = cli("train", "cluster=ndv5", f"save_interval={every}", "plan=true")
    assert gpu.returncode == 2 and gpu.stdout == ""
    said = gpu.stderr.splitlines()
    [at] = [i for i, line in enumerate(said) if line.startswith(f"error: save_interval: {every} comes at no batch")]
    assert said[at + 1].startswith("  fix: a shorter interval, e.g. save_interval=4ba"), said[at:at + 2]
    fine = cli("train", "cluster=ndv5", "save_interval=10ba", "plan=true")
    assert fine.returncode == 0, fine.stderr
    assert "every 10ba: 4 checkpoints to max_duration, at batches 10, 20, 30 and 40 (the end)" in fine.stdout
    assert list(tmp_path.iterdir()) == []


def test_plan_true_report(tmp_path, cli):
    proc = cli("train", "model=mpt-30b", "cluster=ndv5", "cluster.nodes=16", "storage=amlfs",
               f"storage.root={tmp_path}", "storage.mounts=[]", "plan=true")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for words in ("29.9", "GFLOP per token", "world size 128", "16 per device", "2 gradient accumulation",
                  "143,100 steps", "fits", "smallest node count that fits: 2", "with activation checkpointing",
                  "sharded", "per rank", "AMLFS-40", "tokens/s/GPU", "to max_duration", "#SBATCH --nodes=16"):
        assert words in out, (words, out)
    assert list(tmp_path.iterdir()) == []


def test_plan_shows_the_exported_models_size(tmp_path, cli):
    """The Hugging Face folder's weights: parameters x the export's bytes per weight (bf16 on a GPU preset, fp32 on
    the CPU); checked against a real exported folder in tests/test_export.py."""
    gpu = plan("model=mpt-7b", "cluster=ndv5", "data=c4", "export=hf")
    assert gpu["export"] == "hf" and gpu["export_precision"] == "bfloat16"
    assert gpu["export_bytes"] == 2 * gpu["params"]
    assert gpu["export_folder"].endswith(f"/outputs/{gpu['run_name']}/huggingface/ba{{B}}")
    # hf_checkpointer's own keys set directly: the folder it writes, not export.folder's
    moved = plan("export=hf", "callbacks.hf_checkpointer.save_folder=/data/hf",
                 'callbacks.hf_checkpointer.huggingface_folder_name="step{batch}"')
    assert moved["export_folder"] == "/data/hf/huggingface/step{B}"
    # the fields composer fills in it as hf_checkpointer writes: the batch's and the run's name (tests/test_train_runs.py
    # checks that folder against the one a training writes); others stay as written
    named = plan("export=hf", "run_name=r", 'callbacks.hf_checkpointer.huggingface_folder_name="{run_name}/b{batch:03d}-{epoch}"')
    assert named["export_folder"].endswith("/outputs/r/huggingface/r/b{B}-{epoch}")
    # ...and said: sample, evaluate and a spike's rollback find a run's exports by ba{batch}
    from train.checks import WARNING, Context, check

    key = "callbacks.hf_checkpointer.huggingface_folder_name"

    def said(name):
        cfg = compose(["export=hf", f'{key}="{name}"'])
        return [(p.level, p.problem.split(":")[0]) for p in check(cfg, Context(mode="run", overrides=())) if p.key == key]

    assert said("step{batch}") == [(WARNING, "'step{batch}'")] and said("ba{batch}") == []
    cpu = plan("export=hf")
    assert cpu["export_precision"] == "float32" and cpu["export_bytes"] == 4 * cpu["params"]
    none = plan()
    assert none["export"] == "none" and none["export_bytes"] == 4 * none["params"] and none["export_folder"] is None
    proc = cli("train", "model=mpt-7b", "cluster=ndv5", "data=c4", "export=hf", "plan=true")
    assert proc.returncode == 0, proc.stderr
    assert "export      hf: 12.4 GiB of bfloat16 weights" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_sweep_plan_is_a_json_list_one_object_per_point(tmp_path, cli):
    proc = cli("train", "-m", "model=mpt-30b", "cluster=ndv5", "cluster.nodes=16,32", "plan=json")
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)
    assert [p["world_size"] for p in plans] == [128, 256]
    assert [p["grad_accum"] for p in plans] == [2, 1]
    assert all(set(REQUIRED) <= set(p) for p in plans)
    assert "[sweep] #" not in proc.stdout  # nothing submitted
    assert list(tmp_path.iterdir()) == []  # not even the sweep folder


def test_sweep_plan_report_has_a_summary(tmp_path, cli):
    proc = cli("train", "-m", "model=mpt-70b", "cluster=ndv5", "cluster.nodes=4,16", "plan=true")
    assert proc.returncode == 0, proc.stderr
    assert "=== sweep point #0 ===" in proc.stdout and "=== sweep point #1 ===" in proc.stdout
    assert "sweep of 2 points" in proc.stdout
    assert list(tmp_path.iterdir()) == []


PROBE = ("import atexit, runpy, sys\n"
         "atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch', 'llmfoundry', 'composer', "
         "'streaming') if m in sys.modules), file=sys.stderr))\n"
         "sys.argv = ['train'] + sys.argv[1:]\n"
         "runpy.run_module('train', run_name='__main__')\n")


@pytest.mark.parametrize("args", [
    ["model=gpt175b", "cluster=ndv5", "cluster.nodes=64", "storage=amlfs", "plan=true"],
    ["model=mpt-30b", "cluster=ndv5", "plan=json"],
    ["-m", "model=mpt-30b", "cluster=ndv5", "cluster.nodes=16,32", "plan=json"],
    ["optimizer.lr=0"],                                       # validation error
    ["-m", "cluster=slurm-local", "optimizer.lr=-1,1e-4"],    # validation error in a sweep
    ["save_intervl=100ba"],                                   # unknown key and its suggestion
], ids=["plan", "json", "sweep-plan", "invalid", "invalid-sweep", "unknown-key"])
@pytest.mark.e2e  # starts a Python process of its own
def test_submit_path_does_not_import_torch_or_llm_foundry(tmp_path, args):
    env = command_env(tmp_path)
    out = subprocess.run([str(PYTHON), "-c", PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "HEAVY []" in out.stderr, out.stderr[-2000:]


def test_the_plan_says_what_checkpoint_sharded_means_at_one_rank():
    one = plan("checkpoint=sharded")  # a plain run: one process, llm-foundry drops FSDP
    assert one["checkpoint_files"] == 1 and "world size 1" in one["checkpoint_layout"]
    assert "converted into shards" in one["checkpoint_layout"]
    assert "world size 1" in render(one)
    two = plan("checkpoint=sharded", "cluster=slurm-local")
    assert two["checkpoint_files"] == 2 and "consolidated" in two["checkpoint_layout"]
    assert plan("checkpoint=none")["checkpoint_layout"] is None


def test_the_plan_says_the_checkpoint_format_composer_writes_not_the_groups():
    """An fsdp_config without state_dict_type: composer's FSDPConfig (and llm-foundry's train) read it as full,
    whatever the checkpoint group says, as the task does when it loads one (the plan said sharded files)."""
    p = plan("checkpoint=sharded", "cluster=slurm-local", "~fsdp_config.state_dict_type")
    assert p["checkpoint"] == "full" and p["checkpoint_files"] == 1 and "written by rank 0" in p["checkpoint_layout"]
    assert plan("checkpoint=sharded", "cluster=slurm-local")["checkpoint"] == "sharded"


def test_plan_lists_the_preflight_settings_and_their_cost():
    p = plan("model=mpt-70b", "cluster=ndv5", "cluster.nodes=16")
    s = p["preflight"]
    assert s["enabled"] and s["on_fail"] == "requeue" and s["expected_busbw_GBps"] == {"intra": 460.0, "inter": 375.0}
    assert s["pair_rounds"] == 2
    # 1 GiB x (10 + 1) at 460 GB/s within 8 GPUs, at 375 GB/s over two rounds of 16 and once over 128
    gib, n = 2**30, 11
    expected = n * gib * (2 * 7 / 8 / 460e9 + 2 * 2 * 15 / 16 / 375e9 + 2 * 127 / 128 / 375e9)
    assert s["estimated_allreduce_seconds"] == pytest.approx(expected)
    text = render(p)
    assert "preflight   on: devices, node check (none), all-reduce of 1.0 GiB x 10" in text
    assert "expected busbw intra 460.0 / inter 375.0 GB/s" in text and "cost: ~0.23 s" in text
    assert plan()["preflight"]["estimated_allreduce_seconds"] is None  # cluster=local: off
    assert "preflight   off" in render(plan())
