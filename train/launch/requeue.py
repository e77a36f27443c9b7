"""Requeue the running Slurm job with more nodes excluded: how a job routes around the bad nodes its preflight
check found. Light (standard library only).

No Slurm command runs inside the task: a container image may have no Slurm client. The batch script tells the
task, before srun, which nodes the job excludes already and which nodes its partition has (`facts_lines`); the
task decides (`requeue_excluding`) and leaves the new exclusion list in a request file; after srun, on the host,
the batch script requeues the job held, updates its ExcNodeList while it waits and releases it
(common/host_requeue.py `teardown_lines`): Slurm refuses to change a running job's excluded nodes ("Job is no
longer pending execution").
"""
import os

from common import host_requeue

EXCLUDED = "PRETRAIN_EXCLUDED_NODES"  # the job's ExcNodeList, one name per comma
PARTITION_NODES = "PRETRAIN_PARTITION_NODES"  # the nodes of the job's partition


def facts_lines() -> list[str]:
    """The batch script's lines before srun that export the facts for the task (on the host, every start: an
    earlier exclusion shows in the next start's ExcNodeList). Hostlists are expanded by Slurm's own parser. If
    Slurm does not answer, nothing is exported and the task stops with the report instead of guessing."""
    return [
        "# for the preflight check's node exclusion (train/launch/requeue.py): what the job excludes, its partition's nodes",
        'if host_excluded="$(squeue -h -j "$SLURM_JOB_ID" -o %x)" \\',
        '    && host_partition="$(sinfo -h -N -p "$SLURM_JOB_PARTITION" -o %N)"; then',
        '  [ "$host_excluded" = "(null)" ] && host_excluded=',
        f'  export {EXCLUDED}="${{host_excluded:+$(scontrol show hostnames "$host_excluded" | paste -sd, -)}}"',
        f'  export {PARTITION_NODES}="$(printf \'%s\\n\' "$host_partition" | sort -u | paste -sd, -)"',
        "fi",
    ]


def _fact(name: str) -> list:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"{name} is not set: the batch script of `python -m train ... -m` sets it "
                           "(train/launch/executor.py)")
    return [n for n in value.split(",") if n]


def excluded_nodes() -> list:
    return _fact(EXCLUDED)


def requeue_excluding(bad: list, max_exclusions: int) -> tuple:
    """Ask the batch script to exclude `bad` (node names) from this job on top of what it excludes already and
    requeue it. Returns (True, all excluded nodes) once asked, or (False, why not) when that would exceed
    max_exclusions or leave the partition too few nodes for the job (it would stay pending forever)."""
    before = excluded_nodes()
    after = list(dict.fromkeys([*before, *bad]))
    if len(after) > max_exclusions:
        return False, (f"excluding {', '.join(bad)} would make {len(after)} excluded nodes, more than "
                       f"cluster.preflight.max_exclusions={max_exclusions} (already excluded: "
                       f"{', '.join(before) or 'none'})")
    partition = os.environ.get("SLURM_JOB_PARTITION", "?")
    wanted = int(os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    listed = _fact(PARTITION_NODES)
    left = [n for n in listed if n not in after]
    if listed and len(left) < wanted:
        return False, (f"excluding {', '.join(after)} leaves {len(left)} nodes in partition {partition} for a "
                       f"{wanted}-node job")
    host_requeue.write_request("exclude", ",".join(after))
    return True, after
