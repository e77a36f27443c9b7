"""What the launcher knows about its jobs: pending / running / ended, each rank's outcome (its result, or its
error and the last lines of its log), the final state a summary shows, and the summary table itself.

Kept apart from the launcher so that it can be tested with stand-in jobs (tests/test_launcher_outcomes.py): a
job here is anything with submitit's Job surface (`state`, `job_id`, `num_tasks`, `task(k).paths`).
"""
import io
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus

from common.compat import hydra_job_return_value, submitit_local_controller
from common.host_requeue import job_file

# A job's states, Slurm's (squeue(1): JOB STATE CODES) and submitit's, that it has not ended in: it waits for its
# (next) run, or runs, also while suspended, stopped or resized (Slurm resumes it). Any other state is an end.
# UNKNOWN: not in Slurm's accounting yet (a job just submitted); QUEUED, READY: submitit's.
WAITING = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING", "UNKNOWN", "QUEUED",
           "READY")
RUNNING = ("RUNNING", "COMPLETING", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")


def ended(job, scheduler: str, result_decides: bool = False) -> bool:
    """submitit calls a job done once its rank-0 result file exists. A rank that fails while Slurm tears the
    step down for a requeue (its dataloader workers get SIGTERM) writes one too, yet the job comes back: on
    Slurm, done also needs a state Slurm will not resume from. Not submitit's done() either: that counts a job
    PREEMPTED and not requeued (PreemptMode=CANCEL), which Slurm never resumes, as coming back, so a waiting
    sweep would wait forever. Where Slurm cannot be asked: ended (its result file, if any, tells how), or with
    result_decides (the launcher's wait) only once its result file is in. A local job has ended once its
    controller process has (local_alive: also from another process, e.g. `python -m train.status` beside a
    running sweep)."""
    if scheduler == "local":
        return local_alive(job) is False
    try:
        return job.state.upper() not in (*WAITING, *RUNNING)
    except Exception:  # noqa: BLE001 -- no answer from Slurm
        return job.paths.result_pickle.exists() if result_decides else True


LOCAL_CONTROLLER = "submitit.local._local"  # the module submitit's local controller runs as (its job id is its pid)


def local_alive(job) -> bool | None:
    """Whether a local job still runs: its controller process (submitit's, which waits for the job's tasks), or,
    where the controller was killed alone, a task it started (they train on, orphaned: without them the point
    would read FAILED while its step still rises). The launcher that started the controller holds its process
    handle; any other process (the status command) has only its pid, which counts only if it is still submitit's
    controller of this job's folder, not a process that took the pid since. None: cannot be told here (the process
    is not ours to inspect)."""
    alive = _controller_alive(job)
    return True if alive is False and _tasks_alive(job) else alive


RUNNING_LOCK = "running"  # host_requeue.job_file's kind: locked by each of a local job's tasks while it runs
_held = None  # this task's open lock file: the lock lasts as long as the process (and what it forks) holds it


def hold_while_running() -> None:
    """In a task of a local job (the job body, every rank): a shared lock on the job's RUNNING_LOCK for as long as
    the task runs, which `_tasks_alive` asks for. The kernel lets it go when the task ends, however it ends (also
    by SIGKILL); the processes the task forks (data loader workers) hold it with it. Nothing on Slurm, which knows
    its own jobs."""
    import fcntl
    import os

    global _held
    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or _held is not None:
        return
    from submitit import JobEnvironment

    held = open(job_file(JobEnvironment(), RUNNING_LOCK), "a")
    try:
        fcntl.flock(held, fcntl.LOCK_SH)
    except OSError as err:  # a file system without flock: the controller alone tells that the job runs
        held.close()
        logging.getLogger(__name__).debug("%s not locked (%s)", held.name, err)
        return
    _held = held


def _tasks_alive(job) -> bool:
    """A task of this local job runs: one holds the job's RUNNING_LOCK (hold_while_running), which an exclusive
    lock, asked for without waiting, is refused. (A task is seen once its job body has begun, its imports done.)"""
    import fcntl

    try:
        with open(job_file(job, RUNNING_LOCK), "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the file closes
    except BlockingIOError:
        return True
    except OSError:  # no task got that far
        return False
    return False


def _controller_alive(job) -> bool | None:
    import psutil

    process = submitit_local_controller(job)
    if process is not None:  # ours: poll() also reaps it
        return process.poll() is None
    try:
        proc = psutil.Process(int(job.job_id))
        if proc.status() == psutil.STATUS_ZOMBIE:  # ended, not yet reaped by its launcher
            return False
        cmd = proc.cmdline()
        for _ in range(50):  # empty for a moment while a process just started is still exec'ing (Popen returns then)
            if cmd:
                break
            time.sleep(0.02)
            cmd = proc.cmdline()
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, ValueError):
        return None
    # the controller is started with the executor's folder before its pid is known: `%j` unreplaced
    return LOCAL_CONTROLLER in cmd and Path(cmd[-1].replace("%j", str(job.job_id))).resolve() == \
        Path(job.paths.folder).resolve()


def slurm_requeues(job_ids: list) -> dict:
    """{job id: how many times Slurm requeued it} for the jobs Slurm's accounting knows, in one sacct call: with
    --duplicates every run of a job is a record of its own, oldest first (the runs before each requeue), so a
    job's records less one are its requeues, whatever ended each run (time limit, preemption, `scontrol requeue`)
    and whenever (also a run requeued before it began training); one more while the newest record is itself
    REQUEUED (Slurm writes the next run's record when that run starts). {} where sacct cannot be asked (a
    container without a Slurm client) or fails."""
    import subprocess

    if not job_ids:
        return {}
    try:
        out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j",
                              ",".join(map(str, job_ids))], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    runs: dict = {}
    for line in out.stdout.splitlines():
        if "|" in line:
            job, state = line.split("|", 1)
            runs.setdefault(job, []).append(state.strip())
    return {str(j): len(runs[str(j)]) - 1 + (runs[str(j)][-1] == "REQUEUED") for j in job_ids if runs.get(str(j))}


def bucket(state: str) -> str:
    return "pending" if state.upper() in WAITING else "running"


@dataclass
class RankOutcome:
    rank: int
    outcome: str | None  # "success" / "error" (submitit's result pickle), None: the task left no result
    value: Any           # JobReturn, or the traceback text
    log: Path            # the task's own stderr
    mtime: float         # when it ended (its result), for "which rank failed first"
    tail: list           # last lines of its log
    ok: bool = False
    error: str = ""
    verdict: bool = False  # error is submitit's own word on why the job ended (not requeued): the cause, led with


def kill_local_tasks(job) -> None:
    """srun's --kill-on-bad-exit for submitit's local controller, which otherwise waits for every task until
    its time limit. SIGKILL, as srun ends with: it also ends a stopped task. (The controller's own cancel is a
    SIGINT, which a launcher started in the background passes on ignored.) The controller then sees its tasks
    gone and exits."""
    import psutil

    try:
        tasks = psutil.Process(int(job.job_id)).children(recursive=True)
    except psutil.Error:
        return
    for task in tasks:
        try:
            task.kill()
        except psutil.Error:
            pass


def failed_ranks(job) -> list:
    """Ranks of a running job that have already stored an error."""
    return [k for k in range(job.num_tasks) if load_result(job.task(k).paths.result_pickle)[0] == "error"]


def load_result(path: Path):
    from submitit.core.utils import pickle_load

    try:
        return pickle_load(path) if path.exists() else (None, None)
    except Exception:  # written at this moment
        return (None, None)


UNCOMPLETED = re.compile(r"^(?:\[rank\d+\]: ?)?(?:submitit\.core\.utils\.)?UncompletedJobError: (.+)$", re.M)
# submitit logs its verdict (to the task's stdout) before it raises it: what is left of it when the rank was ended
# before its result was stored (Slurm's time limit came first)
LOGGED_VERDICT = re.compile(r"^submitit INFO \([^)]*\) - (Job not requeued because: .+)$", re.M)


def rank_outcomes(job, wait_s: float = 15.0) -> list:
    """What each task of an ended job left: its result, or its error and the last lines of its log."""
    tasks = [job.task(k) for k in range(job.num_tasks)]
    deadline = time.time() + wait_s  # results on a network filesystem may show up late
    while not all(t.paths.result_pickle.exists() for t in tasks) and time.time() < deadline:
        time.sleep(1)
    out = []
    for k, t in enumerate(tasks):
        outcome, value = load_result(t.paths.result_pickle)
        log = Path(str(t.paths.stderr))
        r = RankOutcome(k, outcome, value, log, t.paths.result_pickle.stat().st_mtime if outcome else time.time(),
                        log_tail(log))
        if outcome == "success" and getattr(value, "status", None) != JobStatus.FAILED:
            r.ok = True
        elif outcome == "success":  # a job started before tasks re-raised their exceptions
            error = hydra_job_return_value(value)
            r.error = f"{type(error).__name__}: {error}"
        elif outcome == "error":
            # submitit raises UncompletedJobError in the task when it ran out of time (or was preempted) and will
            # not be requeued, in whatever the task was doing then: a library that was importing wraps it in its
            # own error (transformers: "Failed to import ..."). Its message says why the job ended; its type,
            # internal to submitit, says nothing.
            why = UNCOMPLETED.findall(str(value))
            r.error, r.verdict = (why[-1].strip(), True) if why else (last_exception(str(value)) or "error", False)
        else:
            # a rank that died of an error without storing it (its log ends with the traceback), or was killed
            why = LOGGED_VERDICT.findall(_end_of(Path(str(t.paths.stdout))))  # its last lines: said at the end
            r.error = f"no result (killed, or stopped responding; job {final_state(job)}); " + \
                      (last_exception("\n".join(r.tail)) or "last log line: " + (r.tail[-1] if r.tail else "(empty log)"))
            if why:  # submitit had decided, then the rank was killed before it could store it
                r.error, r.verdict = f"{why[-1].strip()} ({r.error})", True
        out.append(r)
    return out


def first_failure(bad: list):
    """The rank whose error the summary leads with: submitit's verdict on the job (out of time and not
    requeued), which the other ranks' errors follow from (srun ends them, their dataloader workers die of the
    SIGTERM); else the first rank that stored an error; else the first to end."""
    return min(bad, key=lambda r: (not r.verdict, r.outcome != "error", r.mtime, r.rank))


def rank_errors(bad: list, first) -> str:
    """Each failed rank's error in one cell: the first to fail first, then the others, ranks with the same
    error together (`ranks 0-6,8-127: ...`), so that a 128-rank job that failed one way is one short line."""
    groups: dict = {}
    for r in sorted(bad, key=lambda r: r.rank):
        if r.rank != first.rank:
            groups.setdefault(r.error, []).append(r.rank)
    parts = [f"rank {first.rank}: {first.error}"] if first in bad else []
    for error, ranks in groups.items():
        parts.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {_spans(ranks)}: {error}")
    return "; ".join(parts)


def _spans(ranks: list) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur != prev + 1 if cur is not None else True:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)


def pending_reasons(job_ids: list) -> dict:
    """Slurm's reason for each pending job ({job id: reason}: Resources, Priority, PartitionConfig, ...), in one
    squeue call; {} where Slurm cannot be asked (a container without a Slurm client)."""
    import subprocess

    if not job_ids:
        return {}
    try:
        # -r: one line per array task (`A_1`), not one for the array's pending rest (`A_[1-3]`)
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%r", "-j", ",".join(map(str, job_ids))],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


SLURM_ENDS = ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL")


def last_exception(text: str, n: int = 4) -> str:
    """The last exception of a traceback, as printed under its last frame (type and message, up to n lines,
    joined to fit one table cell), without the frames; "" if `text` holds none. Log lines may carry torch's
    `[rankN]:` prefix."""
    lines = [re.sub(r"^\[rank\d+\]: ?", "", line).rstrip() for line in text.splitlines()]
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not frames:
        return ""
    rest = lines[frames[-1] + 1:]
    while rest and rest[0].startswith("    "):  # the frame's source line and its ^^^ markers
        rest.pop(0)
    return " / ".join([line.strip() for line in rest if line.strip()][:n])


def existing(folder, name: str) -> str:
    return str(Path(folder) / name) if folder and (Path(folder) / name).is_file() else ""


def _end_of(path: Path, size: int = 16384) -> str:
    """The last `size` bytes of a log (a month-long run's may be large); "" if it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, n: int = 8) -> list:
    own = ("submitit ", "[submitit]")  # submitit's lines about signals and exits: not the rank's own
    return [line.rstrip() for line in _end_of(path).splitlines()
            if line.strip() and not line.startswith(own[0]) and own[1] not in line][-n:]


def final_state(job) -> str:
    try:
        state = job.state.upper()
    except Exception:
        return "UNKNOWN"
    if state.startswith("CANCELLED"):
        return "CANCELLED"
    # submitit's local states say nothing of why a job failed (NO PROCESS AND NO RESULT: the status of a job whose
    # process handle this process does not hold; INTERRUPTED: its controller died of a signal): FAILED
    return "FAILED" if state in ("COMPLETED", "FINISHED", "DONE", "NO PROCESS AND NO RESULT", "INTERRUPTED") \
        else state


def split_overrides(points: list) -> tuple:
    """(shared, own): the overrides every point of a sweep has alike, and each point's list of the others, which
    are what the sweep varies. The summary shows each point's own and the shared ones once. One point has only
    its own: there is nothing to compare it with, and its row should say how it was run."""
    points = [list(p) for p in points]
    if len(points) < 2:
        return [], points
    shared = [o for o in dict.fromkeys(points[0]) if all(o in p for p in points[1:])]
    return shared, [[o for o in p if o not in shared] for p in points]


def cell(v):
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


def markdown(rows: list) -> str:
    cols = list(rows[0])  # every column of summary.csv
    out = io.StringIO()
    out.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
    for r in rows:  # a | or a line break in a value (an error message) would end its cell or row
        out.write("| " + " | ".join(" ".join(cell(r[c]).replace("|", "\\|").split("\n")) for c in cols) + " |\n")
    return out.getvalue()
