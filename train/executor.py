"""A sweep point's config -> the submitit executor that runs it. Light (submitit only), so `plan` can show the
exact sbatch script that would be submitted.

Resources come from each point's own `cluster` group, so `-m cluster.nodes=1,2` really asks for 1 and 2 nodes.
"""
import re
import shlex
import sys

import submitit
from omegaconf import DictConfig

from common import host_requeue
from common.paths import PROJECT
from train.requeue import facts_lines

# The project checkout, mounted into containers so that jobs run this code.


def container_mounts(cfg: DictConfig) -> list[str]:
    paths = [*cfg.storage.mounts, *cfg.cluster.container.mounts, str(PROJECT)]
    return list(dict.fromkeys(p if ":" in p else f"{p}:{p}" for p in paths))


def srun_args(cfg: DictConfig) -> list[str]:
    # A task that exits non-zero (its exception, or a collective timing out on a dead or stuck rank) ends the
    # whole step at once: the other tasks are killed, stopped ones included, instead of holding the job until
    # its time limit. First, so that srun_extra can still override it.
    args = ["--kill-on-bad-exit=1", *cfg.cluster.srun_extra]
    if cfg.cluster.container.image:
        args += [f"--container-image={cfg.cluster.container.image}",
                 f"--container-mounts={','.join(container_mounts(cfg))}",
                 f"--container-workdir={PROJECT}"]
    return args


def env_lines(cfg: DictConfig) -> list[str]:
    """`export` lines for the cluster's environment: visible in the script, inherited by srun and pyxis."""
    return [f"export {k}={shell_value(v)}" for k, v in cfg.cluster.env.items()]


# `$NAME` and `${NAME}` stay expansions (documented: TRITON_CACHE_DIR=/tmp/triton-cache-$SLURM_JOB_ID).
_EXPANSION = re.compile(r"\$(?=\{?[A-Za-z_])")


def shell_value(value) -> str:
    """A value as one double-quoted shell word that stays data: quotes, backslashes, backticks and every `$`
    that does not start a variable (so `$(...)`) are escaped; `$NAME` / `${NAME}` still expand in the job."""
    text = str(value)
    out = []
    for i, ch in enumerate(text):
        if ch in '"\\`' or (ch == "$" and not _EXPANSION.match(text, i)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def preflight_lines(cfg: DictConfig) -> list[str]:
    # what the preflight check needs from Slurm to decide an exclusion, asked on the host (train/requeue.py)
    p = cfg.cluster.preflight
    return facts_lines() if p.enabled and p.on_fail == "requeue" and not p.only else []


def make_executor(cfg: DictConfig, folder: str) -> submitit.AutoExecutor:
    c = cfg.cluster
    if c.name == "local":
        ex = submitit.AutoExecutor(folder=folder, cluster="local")
        ex.update_parameters(nodes=1, tasks_per_node=c.tasks_per_node, gpus_per_node=c.gpus_per_node,
                             cpus_per_task=c.cpus_per_task, timeout_min=c.timeout_min, name=cfg.run_name)
        return ex
    in_container = bool(c.container.image)
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=c.max_num_timeout,
                               slurm_python="python3" if in_container else None)
    extra = {"wait_all_nodes": 1, **c.sbatch_extra}
    if c.gpus_per_node:
        extra["gpus_per_node"] = c.gpus_per_node
    ex.update_parameters(
        name=cfg.run_name, nodes=c.nodes, tasks_per_node=c.tasks_per_node, cpus_per_task=c.cpus_per_task,
        timeout_min=c.timeout_min, mem_gb=c.mem_gb, slurm_partition=c.partition, slurm_account=c.account,
        slurm_qos=c.qos, slurm_constraint=c.constraint, slurm_exclusive=c.exclusive or None,
        slurm_signal_delay_s=c.signal_delay_s, slurm_additional_parameters=extra,
        slurm_setup=[*env_lines(cfg), *([] if in_container else c.setup), *preflight_lines(cfg)],
        slurm_srun_args=srun_args(cfg),
        # the requeue at a time limit or preemption runs here on the host: an image may have no Slurm client
        slurm_teardown=host_requeue.teardown_lines(folder),
    )
    return ex


def sbatch_script(cfg: DictConfig, folder: str = "<sweep dir>/.submitit/%j") -> str | None:
    """The sbatch script a `-m` run of this config submits; None for a local run."""
    if cfg.cluster.name == "local":
        return None
    ex = make_executor(cfg, folder)
    python = "python3" if cfg.cluster.container.image else shlex.quote(sys.executable)
    # the command exactly as submitit writes it when it submits (the folder quoted)
    return ex._executor._make_submission_file_text(
        f"{python} -u -m submitit.core._submit {shlex.quote(folder)}", "plan")
