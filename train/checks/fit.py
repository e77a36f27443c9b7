"""Does the model fit? On the cluster: the plan's estimate per GPU at the job's world size. In a plain run: this
machine, before torch is imported (RAM on CPU, the device's memory on GPU). The arithmetic is train/estimate.py's."""
import os
import shutil
import subprocess

from train import estimate
from train.checks.core import WARNING, Problem, value


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


def _meminfo() -> dict:
    found = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                found[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return found


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
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
    gpus = value(cfg, "cluster.gpus_per_node") or 0
    if gpus:
        gb = value(cfg, "cluster.gpu_memory_gb")
        device = int(gb * estimate.GiB) if gb else _gpu_bytes()
        where = f"{_gib(device)} GiB per GPU" if device else ""
    else:
        info = _meminfo()
        total, available = info.get("MemTotal"), info.get("MemAvailable")
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


RULES = [cluster_memory, this_machine]
