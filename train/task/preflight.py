"""The preflight check, inside every job, before the trainer is built (docs/cluster-run.md, "Before a big run").

Every rank checks its device; local rank 0 of each node runs the node check command once; then timed
all-reduces within each node, between pairs of nodes and over the whole job give bus bandwidths to compare with
the preset's expected figures. Every rank sees every result (one all_gather) and reaches the same verdict. On a
failure global rank 0 writes the report and either has the job requeued without the bad nodes (train/launch/requeue.py:
the task asks, the batch script runs scontrol on the host after srun) or the job fails with the report
(on_fail=stop). Runs inside the task only: imports torch.
"""
import datetime
import logging
import os
import shlex
import subprocess
import time

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from train.task import preflight_report as pr
from train.task.distributed import decided_on_rank_0, in_slurm_job, job_id, node_name, ranks_on_this_node, requeues

log = logging.getLogger(__name__)


class PreflightFailed(RuntimeError):
    """The check failed and the job cannot (or may not) route around it: the message is the report."""


def _device_problems(gpus_per_node: int, local_rank: int, local_world: int, min_free: float) -> tuple:
    if not gpus_per_node:
        return "cpu", []
    if not torch.cuda.is_available():
        return "none", ["no GPU visible (CUDA unavailable)"]
    problems, count = [], torch.cuda.device_count()
    if count < local_world:
        problems.append(f"{count} GPUs visible for {local_world} tasks on this node")
        return f"{count} GPUs", problems
    if torch.cuda.current_device() != local_rank:
        problems.append(f"local rank {local_rank} uses cuda:{torch.cuda.current_device()}")
    free, total = torch.cuda.mem_get_info(local_rank)
    if free < min_free * total:
        problems.append(f"cuda:{local_rank} has {free / 2**30:.1f} of {total / 2**30:.1f} GiB free "
                        f"(another process holds memory)")
    return f"cuda:{local_rank} {torch.cuda.get_device_name(local_rank)}", problems


def _node_check(command: str | None, timeout_s: float) -> dict | None:
    if not command:
        return None
    start = time.time()
    try:
        proc = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=timeout_s)
        out, why = (proc.stdout + proc.stderr)[-4000:], f"exit {proc.returncode}"
        ok = proc.returncode == 0
    except subprocess.TimeoutExpired as err:
        out, why, ok = str(err.output or "")[-4000:], f"timed out after {timeout_s:g} s", False
    except OSError as err:
        out, why, ok = str(err), "could not run", False
    return {"ok": ok, "why": why, "output": out, "seconds": round(time.time() - start, 3)}


def _timed_allreduce(group, ranks: int, nbytes: int, iters: int, device) -> dict:
    """busbw of `iters` all-reduces of nbytes over `group` (one untimed first: it sets up the communicator)."""
    try:
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dist.all_reduce(buf, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - start) / iters
        return {"GBps": pr.busbw_GBps(buf.numel() * 4, ranks, seconds), "seconds": seconds, "ranks": ranks}
    except Exception as err:  # a broken link shows here: reported against its group, judged below
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", "ranks": ranks}


def measure(cfg) -> dict:
    """Every rank: run the checks; return the judged report (the same on every rank)."""
    s = OmegaConf.to_container(cfg.cluster.preflight, resolve=True)
    start = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = ranks_on_this_node(world)
    node_rank = int(os.environ.get("NODE_RANK", 0))
    device = torch.device(f"cuda:{local_rank}") if cfg.cluster.gpus_per_node and torch.cuda.is_available() \
        else torch.device("cpu")
    what, problems = _device_problems(cfg.cluster.gpus_per_node, local_rank, local_world,
                                      s["min_free_memory_fraction"])
    mine = {"rank": rank, "node_rank": node_rank, "node": node_name(), "device": what, "problems": problems,
            "node_check": _node_check(s["node_check"], s["node_check_timeout_s"]) if local_rank == 0 else None}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    names = {r["node_rank"]: r["node"] for r in everyone}
    nodes = [names[i] for i in sorted(names)]
    ranks_of = {i: [r["rank"] for r in everyone if r["node_rank"] == i] for i in sorted(names)}
    timeout = datetime.timedelta(seconds=float(cfg.dist_timeout))

    measured = {"intra": None, "pairs": [], "job": None}
    if local_world > 1:
        group, _ = dist.new_subgroups_by_enumeration(list(ranks_of.values()), timeout=timeout)
        result = _timed_allreduce(group, local_world, s["bytes"], s["iters"], device)
        measured["intra"] = result if local_rank == 0 else None
    for pairs in pr.pair_rounds(len(nodes)):
        group, _ = dist.new_subgroups_by_enumeration([ranks_of[a] + ranks_of[b] for a, b in pairs], timeout=timeout)
        mine_pair = [(a, b) for a, b in pairs if node_rank in (a, b)]
        if group is not None and mine_pair:
            result = _timed_allreduce(group, 2 * local_world, s["bytes"], s["iters"], device)
            if rank == ranks_of[mine_pair[0][0]][0]:  # the pair's first rank reports it
                measured["pairs"].append({"nodes": [names[mine_pair[0][0]], names[mine_pair[0][1]]], **result})
    if world > 1:
        measured["job"] = _timed_allreduce(None, world, s["bytes"], s["iters"], device)
    gathered = [None] * world
    dist.all_gather_object(gathered, measured)

    devices = {}
    for r in everyone:
        devices.setdefault(r["node"], []).extend(f"rank {r['rank']}: {p}" for p in r["problems"])
    report = pr.judge(
        nodes, devices, {r["node"]: r["node_check"] for r in everyone if r["node_check"]},
        {everyone[i]["node"]: m["intra"] for i, m in enumerate(gathered) if m["intra"]},
        [p for m in gathered for p in m["pairs"]], gathered[0]["job"], s)
    report["devices_seen"] = {r["node"]: r["device"] for r in everyone}
    report["node_check_output"] = {r["node"]: r["node_check"]["output"] for r in everyone
                                   if r["node_check"] and not r["node_check"]["ok"]}
    report["seconds"] = time.time() - start
    report["settings"] = s
    return report


def run(cfg, folder) -> dict:
    """The in-job check. Returns the report when all is well (or in preflight-only mode, whatever it found);
    otherwise requeues the job without the bad nodes and ends this process, or raises PreflightFailed."""
    s = cfg.cluster.preflight
    report = measure(cfg)
    job = report.get("job") or {}
    log.info("preflight: %d node(s), %s ranks, %s in %.1f s (all-reduce %d bytes x %d; whole-job busbw %s GB/s)",
             len(report["rows"]), job.get("ranks", 1), "ok" if report["ok"] else "FAILED", report["seconds"],
             s.bytes, s.iters, pr._cell(job.get("GBps")))
    for row in report["rows"] if dist.get_rank() == 0 else ():
        log.info("preflight: %s: devices %s, node check %s, intra %s GB/s, inter %s GB/s: %s", row["node"],
                 row["devices"], row["node_check"], pr._cell(row["intra_GBps"]), pr._cell(row["inter_GBps"]),
                 row["verdict"])
    rank0 = dist.get_rank() == 0
    if rank0:  # the job as submitit and the status name it (`A_a` for a task of an array)
        report["job_id"], report["restart"] = job_id(), requeues()
    if report["ok"] or s.only:
        if rank0:  # a healthy start too: the baseline a bad day is compared with
            log.info("preflight: report %s", pr.append_report(folder, report))
        return report

    def requeue_or_not() -> tuple:
        requeued, why = False, "cluster.preflight.on_fail=stop"
        if s.on_fail == "requeue" and not report["bad"]:
            why = "the failure is not attributed to any node, so excluding nodes would not help"
        elif s.on_fail == "requeue" and not in_slurm_job():
            why = "not a Slurm job: nothing to requeue"
        elif s.on_fail == "requeue":
            from train.launch.requeue import requeue_excluding

            try:
                requeued, why = requeue_excluding(list(report["bad"]), int(s.max_exclusions))
            except (OSError, RuntimeError) as err:  # no facts from the batch script, or no request written
                why = f"the requeue failed: {err}"
        if requeued:
            report["excluded"] = report["bad"]
            report["excluded_now"] = why
        return requeued, why, str(pr.append_report(folder, report))

    # the others wait until rank 0 has asked for the requeue (or given up)
    requeued, why, path = decided_on_rank_0(requeue_or_not)
    lines = pr.problem_lines(report)
    if requeued:
        log.warning("preflight: excluding %s and requeuing job %s from the host (excluded now: %s); report: %s",
                    ", ".join(report["bad"]), job_id(), ", ".join(why), path)
        # Every rank ends (exit 0, no result) so that srun returns; then the batch script requeues the job on the
        # host, and it starts again on other nodes in the same folder.
        raise SystemExit(0)
    raise PreflightFailed(f"preflight failed: {'; '.join(lines)}\nnot requeued: {why}\nreport: {path}\n"
                          + pr.table(report))
