"""Requeue from the host, not from the task: a container image without a Slurm client has no `scontrol`.

On a time limit or preemption (USR2, `cluster.signal_delay_s` ahead) submitit's handler in global rank 0 dumps the
resubmission pickle (with the max_num_timeout countdown) and then calls its environment's `_requeue`, which runs
`scontrol requeue` inside the task. `install()` (every rank, at the start of the job body) replaces that
`_requeue` in this process (common/compat.py: patch_submitit_slurm_requeue) by one that writes a request file,
`<submitit folder of this job>/<job_id>_requeue`, and lets rank 0 exit (255): srun (`--kill-on-bad-exit=1`) then
ends the other ranks and returns, and the batch script's lines after srun (`teardown_lines`) run `scontrol requeue`
on the host, where the Slurm client is.
One path for container and bare-venv jobs. The preflight check's node exclusion goes the same way
(train/launch/requeue.py). Global rank 0 runs on the allocation's first node, where the batch script runs, so the
request is seen at once even on a network filesystem. Light: the standard library and common/files.py, submitit
inside the job only.
"""
import logging
import os
import shlex
import signal
from pathlib import Path

from common import files

log = logging.getLogger(__name__)

# If rank 0 does not end this long after asking (a `finally` waiting on a collective of ranks that are still
# training), SIGALRM's default action ends it: the host must requeue before the limit, signal_delay_s away.
EXIT_WITHIN_S = 10


def job_file(job, kind: str) -> Path:
    """`<its submitit folder>/<its id>_<kind>`, a job's own file beside submitit's (a request to the host, a local
    job's running lock), of submitit's Job or, inside the job, its JobEnvironment. submitit's job_id is `A_a` in
    an array, and its folder's `%j` (`%A`, `%a`) becomes this job's id, exactly as `teardown_lines` computes it
    in bash."""
    return Path(job.paths.folder) / f"{job.job_id}_{kind}"


def request_path(kind: str = "requeue") -> Path:
    """In the job: the request file the batch script looks for."""
    from submitit import JobEnvironment

    return job_file(JobEnvironment(), kind)


def write_request(kind: str, text: str) -> Path:
    """Write a request for the host atomically (a half-written one is never read)."""
    path = request_path(kind)
    files.atomic_write(path, (text.rstrip("\n") + "\n").encode())
    return path


def _request_requeue(self, countdown: int) -> None:
    """Replaces SlurmJobEnvironment._requeue: the same moment, no scontrol. submitit exits with -1 next."""
    path = write_request("requeue", str(countdown))
    log.warning("asked the batch script to requeue job %s from the host (%d remaining timeouts): %s",
                self.job_id, countdown, path)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(EXIT_WITHIN_S)


def _answer_once(handler):
    """submitit's USR2 handler (bound to its SignalHandler), answered once per process. Slurm can deliver USR2
    twice (to the step's tasks and through srun), and a second answer while the first one's exit is under way
    starts a second dump of the resubmission pickle, which the alarm above cuts short: its temporary file then
    fails the next allocation's dump ("A temporary saved file already exists")."""
    answered = []

    def once(signum, frame=None):
        if answered:
            log.warning("signal %s again: already checkpointing and requeueing, ignored", signum)
            return None
        answered.append(signum)
        return handler(signum, frame)

    return once


def install() -> None:
    """In the job body (every rank): submitit's requeue becomes a request to the batch script."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return
    from submitit.core.job_environment import SignalHandler

    from common.compat import patch_submitit_slurm_requeue

    usr2 = patch_submitit_slurm_requeue(_request_requeue)
    # submitit registered its handler (a bound method) for that signal before the job body started
    handler = signal.getsignal(usr2)
    if isinstance(getattr(handler, "__self__", None), SignalHandler):
        signal.signal(usr2, _answer_once(handler))
    if os.environ.get("SLURM_PROCID", "0") == "0":
        # A request left by an allocation that never reached its teardown (killed at the limit, or requeued by
        # Slurm itself) must not requeue this one when it ends.
        for kind in ("requeue", "exclude"):
            request_path(kind).unlink(missing_ok=True)
        # A dump of the resubmission pickle cut short (killed at the limit) leaves submitit's temporary file,
        # and submitit asserts it is absent before its next dump: this allocation's requeue would fail.
        stale_dump()


def stale_dump() -> None:
    """Remove submitit's temporary resubmission pickle left by an earlier allocation."""
    from submitit import JobEnvironment

    pickle = JobEnvironment().paths.submitted_pickle
    tmp = pickle.with_suffix(pickle.suffix + ".save_tmp")
    if tmp.exists():
        log.warning("removed %s, a resubmission pickle an earlier allocation did not finish writing", tmp)
        tmp.unlink(missing_ok=True)


def _id_lines(folder: str) -> list[str]:
    # This job's id as submitit writes it (A_a in an array) and its submitit folder, with %j/%A/%a filled in as
    # JobPaths does; the folder stays data (single-quoted), the patterns are quoted so that bash reads them
    # literally.
    folder = shlex.quote(os.path.expanduser(folder))
    return [
        'host_job="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"',
        'host_job="${host_job:-$SLURM_JOB_ID}"',
        f"host_folder={folder}",
        'host_folder="${host_folder//"%j"/$host_job}"',
        'host_folder="${host_folder//"%A"/${SLURM_ARRAY_JOB_ID:-}}"',
        'host_folder="${host_folder//"%a"/${SLURM_ARRAY_TASK_ID:-}}"',
    ]


def teardown_lines(folder: str) -> list[str]:
    """The batch script's lines after srun: honour the task's request on the host. `folder` is the submitit
    folder as the executor has it (with %j). Two requests: `<job>_exclude` (the preflight check's bad nodes,
    train/launch/requeue.py: requeued held, ExcNodeList updated while it waits, released) and `<job>_requeue` (a time
    limit or preemption). The script still ends with srun's exit status (accounting shows a failed job as
    FAILED), and ignores the SIGTERM its own requeue sends it so that these lines finish (Slurm's SIGKILL
    follows KillWait seconds later: the scontrol calls are quick)."""
    return [
        "host_status=$?",
        "# the task asks for its requeue in a file (common/host_requeue.py): a container may have no scontrol",
        "trap '' TERM",
        *_id_lines(folder),
        'host_request="$host_folder/${host_job}_requeue"',
        'host_exclude="$host_folder/${host_job}_exclude"',
        'if [ -f "$host_exclude" ]; then',
        '  read -r host_nodes < "$host_exclude"',
        '  rm -f "$host_exclude" "$host_request"',
        '  if scontrol requeuehold "$host_job"; then',
        '    scontrol update "JobId=$host_job" "ExcNodeList=$host_nodes"',
        '    scontrol release "$host_job" && echo "requeued job $host_job excluding $host_nodes (from the host)"',
        "  fi",
        'elif [ -f "$host_request" ]; then',
        '  read -r host_left < "$host_request"',
        '  rm -f "$host_request"',
        '  if scontrol requeue "$host_job"; then',
        '    echo "requeued job $host_job (from the host; $host_left remaining timeouts)"',
        "  else",
        '    echo "could not requeue job $host_job from the host" >&2',
        "  fi",
        "fi",
        'exit "$host_status"',
    ]
