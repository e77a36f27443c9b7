"""Does the model fit? On the cluster: the plan's estimate per GPU at the job's world size. In a plain run: this
machine, before torch is imported (RAM on CPU, the device's memory on GPU). The arithmetic is train/plan/estimate.py's."""
import os
import shutil
import subprocess

from train.checks.core import WARNING, Problem, value
from train.plan import estimate
from train.task.distributed import ranks_on_this_node


def _gib(n) -> str:
    return f"{n / estimate.GiB:.1f}"


def _parts(m) -> str:
    return " + ".join(f"{k} {_gib(m[k])}" for k in ("params", "grads", "optimizer", "gathered", "activations",
                                                      "runtime"))


def cluster_memory(cfg, ctx):
    """A job on the cluster's GPUs (`-m`, or its plan)."""
    if ctx.mode == "run":
        return
    fig = estimate.fit(cfg, ctx.world_size(cfg))
    if fig is None or fig["fits"]:
        return
    m = fig["memory"]
    problem = (f"the model does not fit: ~{_gib(m['total'])} GiB per GPU at {ctx.world_words(cfg)}, of "
               f"{_gib(fig['gpu_memory_bytes'])} GiB per {value(cfg, 'cluster.gpu')} ({_gib(fig['usable_bytes'])} "
               f"usable, {int(estimate.HEADROOM * 100)}% kept free); GiB: {_parts(m)}")
    checkpointing = "" if m["activation_checkpointing"] else ", or fsdp_config.activation_checkpointing=true"
    if fig["min_nodes"] is not None:
        n, nb = fig["min_nodes"], fig["min_nodes_batch"]
        why = ("the smallest node count that fits" if n == nb or nb is None else
               f"{n} nodes fit, {nb} also divide global_train_batch_size={value(cfg, 'global_train_batch_size')}")
        yield Problem("cluster.nodes", problem, f"cluster.nodes={nb or n} ({why}), or a smaller "
                      f"device_train_microbatch_size{checkpointing}")
    else:
        yield Problem("device_train_microbatch_size", problem + "; no node count fits at this microbatch",
                      f"lower device_train_microbatch_size{checkpointing}, or use GPUs with more memory")


def _meminfo() -> tuple[int | None, int | None]:
    """(total, available) bytes of this machine's RAM, None where /proc/meminfo does not say."""
    found = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                found[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return found.get("MemTotal"), found.get("MemAvailable")


def _gpu_bytes() -> int | None:
    """This machine's first GPU's memory, from nvidia-smi (no torch); None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return int(out[0]) * 2**20 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def this_machine(cfg, ctx):
    """A plain run trains here: refuse before torch is imported if this machine surely cannot hold it."""
    if ctx.mode != "run":
        return
    world = ctx.world_size(cfg)
    ranks_here = ranks_on_this_node(world)
    gpus = value(cfg, "cluster.gpus_per_node") or 0
    if gpus:
        gb = value(cfg, "cluster.gpu_memory_gb")
        device = int(gb * estimate.GiB) if gb else _gpu_bytes()
        where = f"{_gib(device)} GiB per GPU" if device else ""
    else:
        total, available = _meminfo()
        device = total // max(ranks_here, 1) if total else None
        where = f"{_gib(total)} GiB of RAM on {os.uname().nodename} ({_gib(available or 0)} GiB available)" \
            if total else ""
    if not device:
        return
    fig = estimate.fit(cfg, world, device_bytes=device)
    m = fig["memory"]
    need = m["total"] * (1 if gpus else ranks_here)
    names = f"model={ctx.group('model')}"
    fix = ("run it on a cluster with -m (e.g. cluster=ndv5 -m; `plan=true` shows how many nodes), or a smaller "
           "model (model=mpt-tiny)")
    if m["total"] > fig["gpu_memory_bytes"]:
        yield Problem("model", f"{names} needs ~{_gib(need)} GiB to train here ({_parts(m)} GiB"
                      + (f", x {ranks_here} ranks" if ranks_here > 1 and not gpus else "") + f"), and this machine "
                      f"has {where}: it would run out of memory", fix)
    elif not gpus and available and need > available:
        yield Problem("model", f"{names} needs ~{_gib(need)} GiB to train here and {where}: it may run out of "
                      "memory", "free memory, or " + fix, WARNING)


# Bytes on the host per token of a batch as llm-foundry's text loader hands it over: int64 input_ids, labels and
# attention_mask.
HOST_BYTES_PER_TOKEN = 3 * 8


def host_batch(cfg, ctx):
    """One batch is built whole in host memory by each rank's loader (the microbatches are cut from it on the
    device), and each worker keeps prefetch_factor more in flight: a global batch far too large is killed for
    memory after the model is built, not refused. The RAM this needs on one node, against what the node has."""
    gbs, seq = value(cfg, "global_train_batch_size"), estimate.trained_seq_len(cfg)
    if not isinstance(gbs, int) or not isinstance(seq, int) or gbs <= 0 or seq <= 0:
        return
    world = ctx.world_size(cfg)
    if ctx.mode == "run":
        ranks = ranks_on_this_node(world)
        total, available = _meminfo()
        where = f"this machine ({os.uname().nodename})"
    else:
        ranks = value(cfg, "cluster.tasks_per_node")
        mem = value(cfg, "cluster.mem_gb")
        total = available = int(mem * estimate.GiB) if mem else None
        where = f"a node of cluster={value(cfg, 'cluster.name')} (cluster.mem_gb={mem})"
    if not total or not isinstance(ranks, int) or ranks <= 0:
        return
    workers = value(cfg, "train_loader.num_workers") or 0
    prefetch = value(cfg, "train_loader.prefetch_factor", default=2) or 0
    in_flight = (workers * prefetch if isinstance(workers, int) and isinstance(prefetch, int) else 0) + 2
    per_rank = -(-gbs // max(world, 1)) * seq * HOST_BYTES_PER_TOKEN * in_flight
    need = per_rank * ranks
    what = (f"global_train_batch_size={gbs} is {-(-gbs // max(world, 1))} samples of {seq} tokens per rank, "
            f"held whole on the host ({in_flight} batches in flight: the one training, the next and "
            f"{workers} worker(s) x prefetch_factor {prefetch}): ~{_gib(need)} GiB on {where}, which has "
            f"{_gib(total)} GiB")
    fix = ("a smaller global_train_batch_size (the published presets use 256 to 2048), or more ranks (-m with more "
           "cluster.nodes)")
    if need > total:
        yield Problem("global_train_batch_size", what + ": the loader would be killed for memory (surely fails)", fix)
    elif available and need > available:
        yield Problem("global_train_batch_size", what + f" ({_gib(available)} GiB available): it may run out of "
                      "memory", fix, WARNING)


RULES = [cluster_memory, this_machine, host_batch]
