"""The `-m` launcher: submits every sweep point through submitit (Slurm or this machine), waits with progress,
and writes a summary of every point. The points were checked, and a plan printed, before (train/gate.py).

Built on hydra-submitit-launcher: its job body (recompose the point, run the task, requeue on timeout or
preemption through `checkpoint`) is reused as is. What we add: per-point resources from each point's
`cluster` group (so sweeps over cluster.nodes work), srun arguments for containers (which its PyPI release
lacks), and the summary.
"""
import csv
import io
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, setup_globals
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher


@dataclass
class SweepLauncherConf:
    _target_: str = "hydra_plugins.pretrain_launcher.pretrain_launcher.SweepLauncher"
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    poll_s: float = 2.0  # how often the waiting submitter looks at its jobs


for _name in ("local", "slurm"):
    ConfigStore.instance().store(group="hydra/launcher", name=_name, node=SweepLauncherConf, provider="pretrain")


@dataclass
class Point:
    num: int
    overrides: list
    cfg: DictConfig  # resolved, without the hydra node
    job: Any = None


class SweepLauncher(BaseSubmititLauncher):
    _EXECUTOR = "auto"

    def __call__(self, *args, **kwargs) -> JobReturn:
        """The job body (every rank). Hydra's run_job catches the task's exception into a FAILED JobReturn,
        so submitit would log "Job completed successfully" and the process would exit 0: srun could not
        tell that a rank failed. Raise it again: the traceback goes to this rank's log, submitit stores it
        as the task's error, and the process exits 1."""
        ret = super().__call__(*args, **kwargs)
        if ret.status == JobStatus.FAILED and isinstance(ret._return_value, BaseException):
            raise ret._return_value
        return ret

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # Every point was checked (and a plan printed) before Hydra wrote the sweep folder: train/gate.py.
        setup_globals()
        sweep_dir = Path(self.config.hydra.sweep.dir)
        points = [self._point(initial_job_idx + i, list(o), sweep_dir) for i, o in enumerate(job_overrides)]
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self._submit(points)
        self._wait(points)
        return self._report(points, sweep_dir)

    def _point(self, num: int, overrides: list, sweep_dir: Path) -> Point:
        """Compose and resolve one point exactly as its job will (same Hydra context), without running it."""
        from train.compose import sweep_point

        cfg = sweep_point(self.hydra_context.config_loader, self.config, num, overrides, sweep_dir)
        OmegaConf.resolve(cfg)
        return Point(num, overrides, cfg)

    def _submit(self, points: list) -> None:
        from train.executor import make_executor

        for p in points:
            ex = make_executor(p.cfg, self.params["submitit_folder"])
            p.job = ex.submit(self, p.overrides, "hydra.sweep.dir", p.num, f"job_id_for_{p.num}",
                              _singleton_state())
            print(f"[sweep] #{p.num} {' '.join(p.overrides) or '(defaults)'} -> job {p.job.job_id}", flush=True)

    def _wait(self, points: list) -> None:
        last, refreshed = None, 0.0
        while True:
            # One forced accounting query (for all jobs at once) every 10 s, so that a cancelled or failed
            # job is seen promptly without calling sacct for every job at every poll.
            force = time.time() - refreshed > 10
            refreshed = time.time() if force else refreshed
            done = [p.job.done(force_check=force and i == 0) and _ended(p) for i, p in enumerate(points)]
            for p, d in zip(points, done):
                failed_ranks = [] if d or p.cfg.cluster.name != "local" else _failed_ranks(p.job)
                if failed_ranks:
                    print(f"[sweep] #{p.num}: rank {failed_ranks[0]} failed: ending its other ranks", flush=True)
                    _kill_local_tasks(p.job)
            counts = Counter("done" if d else _bucket(p.job.state) for p, d in zip(points, done))
            line = ", ".join(f"{counts[k]} {k}" for k in ("pending", "running", "done") if counts[k])
            if line != last:
                print(f"[sweep] jobs: {line}", flush=True)
                last = line
            if all(done):
                return
            time.sleep(self.params.get("poll_s", 2.0))

    def _report(self, points: list, sweep_dir: Path) -> list:
        rows, results, failed, bad_ranks = [], [], 0, {}
        for p in points:
            ranks = _rank_outcomes(p.job, wait_s=0 if p.cfg.cluster.name == "local" else 15)
            ret = ranks[0].value if ranks[0].outcome == "success" else None
            if ret is not None:
                results.append(ret)
            bad = [r for r in ranks if not r.ok]
            ok = not bad
            failed += not ok
            metrics = ret.return_value if ok and isinstance(ret.return_value, dict) else {}
            # the rank that failed first: its log, then every failed rank's own error
            first = min(bad, key=lambda r: (r.outcome != "error", r.mtime, r.rank)) if bad else ranks[0]
            bad.sort(key=lambda r: r.rank != first.rank)
            error = "; ".join(f"rank {r.rank}: {r.error}" for r in bad)
            state = "COMPLETED" if ok else _final_state(p.job)
            if not ok and state not in _SLURM_ENDS and any(r.outcome for r in ranks):
                state = "FAILED"  # a rank raised; Slurm's own state is kept where it says more (TIMEOUT, ...)
            report = OmegaConf.select(p.cfg, "callbacks.run_report.folder")  # train/run_report.py writes these
            rows.append({
                "point": p.num,
                "overrides": " ".join(p.overrides),
                "job_id": p.job.job_id,
                "state": state,
                "final_loss": metrics.get("final_train_loss"),
                "eval_loss": (metrics.get("final_eval") or {}).get("eval/LanguageCrossEntropy"),
                "tokens_per_sec": metrics.get("tokens_per_sec"),
                # from the point's config, so that a failed point shows it too
                "world_size": p.cfg.cluster.nodes * p.cfg.cluster.tasks_per_node,
                "checkpoint": p.cfg.save_folder,
                "metrics": _existing(report, "metrics.json"),
                "loss_curve": _existing(report, "loss_curve.png"),
                "log": str(first.log),
                "error": error[:1000],
            })
            bad_ranks[p.num] = bad
        table = _markdown(rows)
        (sweep_dir / "summary.md").write_text(table)
        with open(sweep_dir / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"\n{table}\nsummary: {sweep_dir / 'summary.md'} and summary.csv", flush=True)
        for row in rows:
            if row["state"] != "COMPLETED":
                print(f"[sweep] #{row['point']} {row['state']}: see {row['log']}", file=sys.stderr)
                for r in bad_ranks[row["point"]]:
                    tail = "".join(f"\n    | {line}" for line in r.tail)
                    print(f"  rank {r.rank}: {r.error}\n    last lines of {r.log}:{tail}", file=sys.stderr)
        if failed:
            print(f"[sweep] {failed} of {len(points)} points did not complete", file=sys.stderr)
            sys.exit(1)
        return results


def _singleton_state():
    from hydra.core.singleton import Singleton

    return Singleton.get_state()


def _ended(p: Point) -> bool:
    """submitit calls a job done once its rank-0 result file exists. A rank that fails while Slurm tears the
    step down for a requeue (its dataloader workers get SIGTERM) writes one too, yet the job comes back: on
    Slurm, done also needs a state Slurm will not resume from."""
    if p.cfg.cluster.name == "local":
        return True
    try:
        return _bucket(p.job.state) != "pending" and p.job.state.upper() not in ("RUNNING", "COMPLETING")
    except Exception:
        return True


def _bucket(state: str) -> str:
    state = state.upper()
    if state in ("PENDING", "REQUEUED", "CONFIGURING", "UNKNOWN", "QUEUED", "READY"):
        return "pending"
    return "running"


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


def _kill_local_tasks(job) -> None:
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


def _failed_ranks(job) -> list:
    """Ranks of a running job that have already stored an error."""
    return [k for k in range(job.num_tasks) if _load(job.task(k).paths.result_pickle)[0] == "error"]


def _load(path: Path):
    from submitit.core.utils import pickle_load

    try:
        return pickle_load(path) if path.exists() else (None, None)
    except Exception:  # written at this moment
        return (None, None)


def _rank_outcomes(job, wait_s: float = 15.0) -> list:
    """What each task of an ended job left: its result, or its error and the last lines of its log."""
    tasks = [job.task(k) for k in range(job.num_tasks)]
    deadline = time.time() + wait_s  # results on a network filesystem may show up late
    while not all(t.paths.result_pickle.exists() for t in tasks) and time.time() < deadline:
        time.sleep(1)
    out = []
    for k, t in enumerate(tasks):
        outcome, value = _load(t.paths.result_pickle)
        log = Path(str(t.paths.stderr))
        r = RankOutcome(k, outcome, value, log, t.paths.result_pickle.stat().st_mtime if outcome else time.time(),
                        _tail(log))
        if outcome == "success" and getattr(value, "status", None) != JobStatus.FAILED:
            r.ok = True
        elif outcome == "success":  # a job started before tasks re-raised their exceptions
            r.error = f"{type(value._return_value).__name__}: {value._return_value}"
        elif outcome == "error":
            r.error = _exception(str(value)) or "error"
            if "UncompletedJobError" in r.error.split(":")[0]:
                # raised by submitit in the task when it ran out of time (or was preempted) and will not be
                # requeued: its message says why; its type, internal to submitit, says nothing
                r.error = r.error.split(": ", 1)[-1]
        else:
            # a rank that died of an error without storing it (its log ends with the traceback), or was killed
            r.error = f"no result (killed, or stopped responding; job {_final_state(job)}); " + \
                      (_exception("\n".join(r.tail)) or "last log line: " + (r.tail[-1] if r.tail else "(empty log)"))
        out.append(r)
    return out


_SLURM_ENDS = ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL")


def _exception(text: str, n: int = 4) -> str:
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


def _existing(folder, name: str) -> str:
    return str(Path(folder) / name) if folder and (Path(folder) / name).is_file() else ""


def _tail(path: Path, n: int = 8) -> list:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    own = ("submitit ", "[submitit]")  # submitit's lines about signals and exits: not the rank's own
    return [line.rstrip() for line in lines if line.strip() and not line.startswith(own[0]) and own[1] not in line][-n:]


def _final_state(job) -> str:
    try:
        state = job.state.upper()
    except Exception:
        return "UNKNOWN"
    if state.startswith("CANCELLED"):
        return "CANCELLED"
    return "FAILED" if state in ("COMPLETED", "FINISHED", "DONE") else state


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


def _markdown(rows: list) -> str:
    cols = list(rows[0])  # every column of summary.csv
    out = io.StringIO()
    out.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
    for r in rows:  # a | or a line break in a value (an error message) would end its cell or row
        out.write("| " + " | ".join(" ".join(_fmt(r[c]).replace("|", "\\|").split("\n")) for c in cols) + " |\n")
    return out.getvalue()
