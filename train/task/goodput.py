"""Goodput: the share of a run's allocated time that trained, and where the rest went.

Every start of a run (a process that gets to training: the first, each requeue, each rerun of the same command
after a kill or a crash) is a *segment* of its ledger, `<save_folder>/goodput.json` (the report folder where the
run keeps no checkpoints here), written by global rank 0 alone. A segment runs from the start's beginning
(Slurm's job start where Slurm says it, `SLURM_JOB_START_TIME`; else the process's start) to its last record,
and every second of it belongs to one phase:

    startup     before its first batch: imports, checks, hashing shards, choosing and loading the checkpoint,
                building the loaders (after a rollback: going back)
    train       inside training batches (data loading and compute), BEFORE_DATALOADER to BATCH_END
    eval        evaluations, EVAL_BEFORE_ALL to EVAL_AFTER_ALL
    checkpoint  writing a checkpoint: the weights' check, the saver's write and the manifest
    other       the rest: between batches (the other callbacks, loggers), the end of training

The ledger is rewritten at every progress line, evaluation and checkpoint, after any batch that ends HEARTBEAT_S
or more after its last record, and when the process exits: a start killed without warning (SIGKILL, a node
lost) is counted to its last record.
Each checkpoint also records the segment's phases up to its end (a *snapshot*), so that when a later start resumes
from it (or a rollback goes back to it) what came after it in that segment is known to be thrown away.

`account` sums a run's segments. From the newest segment it follows the checkpoints each resumed from back to the
start of the run (batch 0) or to a checkpoint no segment of this ledger wrote (another run's, through load_path or
a continuation: `since_batch` then says where the account begins). What is on that path counts by its phase; what
a segment did after the checkpoint the next one resumed from was thrown away: its batches are `retrained` (trained
twice: the next start trains them again) and the rest of it (evaluations, checkpoints, between batches, and the
start-up of a start that wrote no checkpoint anyone resumed from) `lost_to_requeues`, or `lost_to_rollbacks` where
a rollback inside the same process threw it away. The parts add up to `allocated_s`; goodput = trained / allocated.
Light: the standard library and common/files.py (no torch): the status and the tests read it too.
"""
import atexit
import logging
import os
import time
from pathlib import Path

from common import files

log = logging.getLogger(__name__)

FILE = "goodput.json"
PHASES = ("startup", "train", "eval", "checkpoint", "other")
# metrics.json's goodput_parts: seconds that sum to allocated_s (each explained in docs/resume.md)
PARTS = ("trained_s", "startup_s", "eval_s", "checkpoint_s", "other_s", "retrained_s", "lost_to_requeues_s",
         "lost_to_rollbacks_s")
HEARTBEAT_S = 30.0


def began_at() -> float:
    """When this start's allocation began (seconds since the epoch): Slurm's job start where Slurm exports it
    (23.02 and later) inside a job Slurm runs (a submitit Slurm job or a plain run in an allocation, as
    distributed.in_slurm_job tells), else this process's start."""
    import psutil

    from train.task.distributed import in_slurm_job

    started = psutil.Process().create_time()
    job = os.environ.get("SLURM_JOB_START_TIME") if in_slurm_job() else None
    try:
        return min(started, float(job)) if job else started
    except ValueError:
        return started


_CURRENT: list = []  # this process's newest Clock: a second fit in one process continues from its last record


class Clock:
    """Rank 0's phases of the current segment, and the run's ledger. `now` is injectable for the tests."""

    def __init__(self, path, batch: int, job=None, began: float | None = None, now=time.time,
                 run_name: str | None = None):
        self.path, self.now, self.run_name = Path(path), now, run_name
        before = _CURRENT[-1] if _CURRENT and _CURRENT[-1].path == self.path else None
        self.segments = before.segments if before else _read(self.path, run_name)
        if before:  # the same process fits again: from where its last segment ended; behind it, a rollback
            kind, began = "rollback" if batch < before.segment["batch"] else "start", before.since
        else:
            kind = "start"
            began = began_at() if began is None else began
        if batch == 0 and self.segments and self.segments[-1].get("finished"):
            self.segments = []  # from scratch after a finished run (no checkpoints): another training of the name
        if self.segments:  # never before the last record (a job start shared with an earlier run of the allocation)
            began = max(began, self.segments[-1]["ended"])
        self._open(kind, batch, job, began)
        self._written = None
        if not _CURRENT:
            atexit.register(_at_exit)
        _CURRENT[:] = [self]

    def _open(self, kind: str, batch: int, job, began: float) -> None:
        self.segment = {"kind": kind, "job": job, "from_batch": batch, "batch": batch, "began": began,
                        "ended": began, "finished": False, "parts": dict.fromkeys(PHASES, 0.0), "checkpoints": []}
        self.segments.append(self.segment)
        self.phase, self.since = "startup", began

    def enter(self, phase: str) -> None:
        """The time since the last change goes to the phase it was in; from now, `phase`."""
        self.close()
        self.phase = phase

    def close(self) -> None:
        t = max(self.now(), self.since)
        self.segment["parts"][self.phase] += t - self.since
        self.since = self.segment["ended"] = t

    def trains(self, batch: int) -> None:
        """Before the batch after `batch`: a batch behind the last one trained is a rollback inside this process
        (the state went back to a checkpoint): a new segment from there, its going back as its start-up."""
        if batch < self.segment["batch"]:  # the time since the last change is the new segment's start-up
            self._open("rollback", batch, self.segment["job"], self.since)
        self.enter("train")

    def trained(self, batch: int) -> None:
        self.segment["batch"] = batch
        self.enter("other")

    def checkpoint(self, batch: int, written: bool) -> None:
        """At a checkpoint of `batch`: before its write (written=False: the phase becomes checkpoint), and once it
        is complete (its snapshot then includes its write)."""
        self.close()
        points = [c for c in self.segment["checkpoints"] if c[0] != batch]
        self.segment["checkpoints"] = [*points, [batch, dict(self.segment["parts"])]]
        self.phase = "other" if written else "checkpoint"
        self.write(force=True)

    def finished(self) -> None:
        self.segment["finished"] = True
        self.enter("other")

    def write(self, force: bool = False) -> None:
        """The ledger, replaced whole: at most every HEARTBEAT_S seconds unless forced."""
        self.close()
        if force or self._written is None or self.since - self._written >= HEARTBEAT_S:
            import json

            files.cosmetic_write(self.path, json.dumps({
                **({"run_name": self.run_name} if self.run_name else {}), "segments": self.segments}).encode())
            self._written = self.since

    def account(self) -> dict:
        self.close()
        return account(self.segments)


def _at_exit() -> None:
    if _CURRENT:
        _CURRENT[-1].write(force=True)


def _read(path: Path, run_name: str | None = None) -> list:
    """The ledger's segments; [] where there is none, or where it is another run's (a folder that run left, as a
    sweep point's report folder reused with checkpoint=none). One that cannot be read is said, and the account
    begins with this start (its since_batch says from where)."""
    if not path.exists():
        return []
    body = files.read_json(path)
    if isinstance(body, dict) and run_name and body.get("run_name") not in (None, run_name):
        log.info("%s is the ledger of another run (%s): goodput counts from this start on", path, body["run_name"])
        return []
    segments = body.get("segments") if isinstance(body, dict) else None
    if not isinstance(segments, list) or not all(isinstance(s, dict) and _SEGMENT <= set(s) for s in segments):
        log.warning("%s cannot be read as this run's time ledger: goodput counts from this start on", path)
        return []
    return segments


_SEGMENT = {"kind", "from_batch", "batch", "began", "ended", "parts", "checkpoints"}


def _snapshot(segment: dict, batch: int) -> dict | None:
    return next((parts for b, parts in reversed(segment["checkpoints"]) if b == batch), None)


def account(segments: list) -> dict:
    """{goodput, goodput_parts} of a run's ledger (module docstring): goodput the share of allocated_s that
    trained (None before any time is counted); goodput_parts the seconds of each part (PARTS, summing to
    allocated_s), allocated_s, the starts and rollbacks counted, the batches trained twice, and since_batch (the
    batch the account begins at: 0 unless the run began from a checkpoint of another run, or its ledger)."""
    if not segments:
        return {}
    newest = len(segments) - 1
    kept: dict = {}  # segment index -> (phases kept, the batch they reach)
    i, upto = newest, None
    while True:
        seg = segments[i]
        # a start that finished, continued from its final checkpoint: all it did was kept (its end came after it)
        whole = upto is None or (seg.get("finished") and upto == seg["batch"])
        kept[i] = (seg["parts"], seg["batch"]) if whole else (_snapshot(seg, upto), upto)
        start = seg["from_batch"]
        j = next((j for j in range(i - 1, -1, -1) if _snapshot(segments[j], start) is not None), None) \
            if start else None
        if j is None:
            break
        i, upto = j, start
    first, since = i, segments[i]["from_batch"]
    if since == 0:  # from scratch: the starts before it since the run last finished trained nothing that lasted
        while first > 0 and not segments[first - 1].get("finished"):
            first -= 1
    parts = dict.fromkeys(PARTS, 0.0)
    retrained_batches = 0
    for s in range(first, newest + 1):
        seg = segments[s]
        phases, reach = kept.get(s, (dict.fromkeys(PHASES, 0.0), seg["from_batch"]))
        for phase in PHASES:
            parts["trained_s" if phase == "train" else f"{phase}_s"] += phases[phase]
        thrown = {p: seg["parts"][p] - phases[p] for p in PHASES}
        cause = "rollbacks" if s < newest and segments[s + 1]["kind"] == "rollback" else "requeues"
        parts["retrained_s"] += thrown["train"]
        parts[f"lost_to_{cause}_s"] += sum(v for p, v in thrown.items() if p != "train")
        retrained_batches += max(0, seg["batch"] - reach)
    allocated = sum(parts.values())
    counted = segments[first:]
    return {"goodput": parts["trained_s"] / allocated if allocated > 0 else None,
            "goodput_parts": {"allocated_s": allocated, **parts,
                              "starts": sum(s["kind"] == "start" for s in counted),
                              "rollbacks": sum(s["kind"] == "rollback" for s in counted),
                              "retrained_batches": retrained_batches, "since_batch": since}}


def said(parts: dict) -> str:
    """goodput_parts in one line of a table: the allocated time, then each part's share that is not 0."""
    from datetime import timedelta

    allocated = parts.get("allocated_s") or 0
    if allocated <= 0:
        return ""
    shares = [f"{name[:-2].replace('_', ' ')} {100 * parts[name] / allocated:.1f}%" for name in PARTS
              if parts.get(name)]
    extra = [f"{parts[k]} {k.replace('_', ' ')}" for k in ("retrained_batches", "rollbacks") if parts.get(k)]
    if parts.get("since_batch"):
        extra.append(f"since batch {parts['since_batch']}")
    return (f"allocated {timedelta(seconds=round(allocated))}: " + ", ".join(shares) +
            (f" ({', '.join(extra)})" if extra else ""))
