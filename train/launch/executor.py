"""A sweep point's config -> the resources its job needs (common/sweep/contract.py). Light, so
`plan` can show the exact sbatch script that would be submitted.

Resources come from each point's own `cluster` group, so `-m cluster.nodes=1,2` really asks for 1 and 2 nodes.
"""
import re

from omegaconf import DictConfig

from common import host_requeue, image
from common.paths import PROJECT
from common.sweep.contract import Resources
from train.launch.requeue import facts_lines

# The project checkout, mounted into containers so that jobs run this code.


def container_mounts(cfg: DictConfig) -> list[str]:
    paths = [*cfg.storage.mounts, *cfg.cluster.container.mounts, *filter(None, [topology_file(cfg)]), str(PROJECT)]
    return list(dict.fromkeys(p if ":" in p else f"{p}:{p}" for p in paths))


def topology_file(cfg: DictConfig) -> str | None:
    """The host's NCCL topology file (cluster.env.NCCL_TOPO_FILE), mounted at its own path into a container: the
    node's image provides it (Azure HPC images: /opt/microsoft/ndv5-topo.xml), not ours. None: no file, or a
    value that is not one plain absolute path (a `$` expansion, or a `,`/`:` that --container-mounts would split:
    train/checks/node.py warns)."""
    path = str(cfg.cluster.env.get("NCCL_TOPO_FILE") or "")
    return path if path.startswith("/") and not set(path) & set("$,:") else None


def srun_args(cfg: DictConfig) -> list[str]:
    # A task that exits non-zero (its exception, or a collective timing out on a dead or stuck rank) ends the
    # whole step at once: the other tasks are killed, stopped ones included, instead of holding the job until
    # its time limit. First, so that srun_extra can still override it.
    args = ["--kill-on-bad-exit=1", *cfg.cluster.srun_extra]
    if cfg.cluster.container.image:
        args += [f"--container-image={cfg.cluster.container.image}",
                 f"--container-mounts={','.join(container_mounts(cfg))}",
                 f"--container-workdir={PROJECT}",
                 # Last: srun's options end at its command, so this is the command, inside the container, and
                 # submitit's `python3 -u -m submitit.core._submit DIR` its arguments; it checks the image
                 # (Python, the pinned packages, this checkout) and execs them (common/image.py)
                 *image.srun_prefix()]
    return args


def env_lines(cfg: DictConfig) -> list[str]:
    """`export` lines for the cluster's environment: visible in the script, inherited by srun and pyxis."""
    return [f"export {k}={shell_value(v)}" for k, v in cfg.cluster.env.items()]


# `$NAME` and `${NAME}` stay expansions (documented: TRITON_CACHE_DIR=/tmp/triton-cache-$SLURM_JOB_ID), and no
# other form of `${...}`: `${A@P}`, `${X:B}` or `${X[B]}` run commands held in another variable's value. The task
# expands the same two forms where no script runs (train/task/main.py).
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")


def shell_value(value) -> str:
    """A value as one double-quoted shell word that stays data: quotes, backslashes, backticks and every `$`
    that does not start a variable (so `$(...)`) are escaped; `$NAME` / `${NAME}` still expand in the job."""
    text = str(value)
    out = []
    for i, ch in enumerate(text):
        if ch in '"\\`' or (ch == "$" and not VARIABLE.match(text, i)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def sbatch_name(key) -> str:
    """A `cluster.sbatch_extra` key as sbatch reads it: submitit writes `_` as `-` (`wait_all_nodes`)."""
    return str(key).lstrip("-").replace("_", "-")


def preflight_lines(cfg: DictConfig) -> list[str]:
    # what the preflight check needs from Slurm to decide an exclusion, asked on the host (train/launch/requeue.py)
    p = cfg.cluster.preflight
    return facts_lines() if p.enabled and p.on_fail == "requeue" and not p.only else []


def resources(cfg: DictConfig, folder: str, scheduler: str) -> Resources:
    """What a point's job needs, from its own cluster group (read through its run spec: train/launch/spec.py).
    folder: submitit's (with %j), where the host-side requeue looks for the task's request."""
    c = cfg.cluster
    if scheduler == "local":
        return Resources(scheduler="local", name=cfg.run_name, tasks_per_node=c.tasks_per_node,
                         gpus_per_node=c.gpus_per_node, cpus_per_task=c.cpus_per_task, timeout_min=c.timeout_min)
    in_container = bool(c.container.image)
    return Resources(
        scheduler="slurm", name=cfg.run_name, nodes=c.nodes, tasks_per_node=c.tasks_per_node,
        gpus_per_node=c.gpus_per_node, cpus_per_task=c.cpus_per_task, mem_gb=c.mem_gb, timeout_min=c.timeout_min,
        partition=c.partition, account=c.account, qos=c.qos, constraint=c.constraint, exclusive=c.exclusive,
        max_num_timeout=c.max_num_timeout, signal_delay_s=c.signal_delay_s,
        # one spelling per option, submitit's (it writes `_` as `-`): a user's `wait-all-nodes` replaces the default
        sbatch_extra=tuple({"wait_all_nodes": 1, **{sbatch_name(k).replace("-", "_"): v
                                                    for k, v in c.sbatch_extra.items()}}.items()),
        setup=(*env_lines(cfg), *([] if in_container else c.setup), *preflight_lines(cfg)),
        srun_args=tuple(srun_args(cfg)),
        # the requeue at a time limit or preemption runs here on the host: an image may have no Slurm client
        teardown=tuple(host_requeue.teardown_lines(folder)), python="python3" if in_container else None)
