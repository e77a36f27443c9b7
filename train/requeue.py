"""Requeue the running Slurm job with more nodes excluded: how a job routes around the bad nodes its preflight
check found. Light (subprocess and scontrol only).

Slurm refuses to change a running job's excluded nodes ("Job is no longer pending execution"), so the job is
requeued held, its ExcNodeList updated while it waits, then released. Requeueing sends SIGTERM to the job's
processes and SIGKILL KillWait seconds later: each scontrol ignores SIGTERM so that the three quick calls finish
inside that window (a job left held would wait forever).
"""
import signal
import subprocess


def _scontrol(*args: str) -> str:
    proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    if proc.returncode:
        raise RuntimeError(f"scontrol {' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def _job_field(job_id: str, name: str) -> str:
    for word in _scontrol("show", "job", "-o", str(job_id)).split():
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return ""


def _hostnames(hostlist: str) -> list:
    if not hostlist or hostlist == "(null)":
        return []
    return _scontrol("show", "hostnames", hostlist).split()


def excluded_nodes(job_id: str) -> list:
    return _hostnames(_job_field(job_id, "ExcNodeList"))


def requeue_excluding(job_id: str, bad: list, max_exclusions: int) -> tuple:
    """Exclude `bad` (node names) from job `job_id` on top of what it excludes already, and requeue it.
    Returns (True, all excluded nodes) once requeued, or (False, why not) when that would exceed
    max_exclusions or leave the partition too few nodes for the job (it would stay pending forever)."""
    before = excluded_nodes(job_id)
    after = list(dict.fromkeys([*before, *bad]))
    if len(after) > max_exclusions:
        return False, (f"excluding {', '.join(bad)} would make {len(after)} excluded nodes, more than "
                       f"cluster.preflight.max_exclusions={max_exclusions} (already excluded: "
                       f"{', '.join(before) or 'none'})")
    partition, wanted = _job_field(job_id, "Partition"), int(_job_field(job_id, "NumNodes").split("-")[0] or 1)
    listed = subprocess.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"], capture_output=True, text=True,
                            timeout=60).stdout.split()
    left = [n for n in dict.fromkeys(listed) if n not in after]
    if listed and len(left) < wanted:
        return False, (f"excluding {', '.join(after)} leaves {len(left)} nodes in partition {partition} for a "
                       f"{wanted}-node job")
    _scontrol("requeuehold", str(job_id))
    try:
        _scontrol("update", f"JobId={job_id}", f"ExcNodeList={','.join(after)}")
    finally:
        _scontrol("release", str(job_id))
    return True, after
