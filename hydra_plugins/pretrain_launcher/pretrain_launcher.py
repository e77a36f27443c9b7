"""The `-m` launcher: submits every sweep point through submitit (Slurm or this machine), waits with progress,
and writes a summary of every point. The points were checked, and a plan printed, before (train/gate.py).

Built on hydra-submitit-launcher: its job body (recompose the point, run the task, requeue on timeout or
preemption through `checkpoint`) is reused as is. What we add: per-point resources from each point's
`cluster` group (so sweeps over cluster.nodes work), srun arguments for containers (which its PyPI release
lacks), and the summary.
"""
import csv
import logging
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
from hydra_plugins.pretrain_launcher.outcomes import (
    SLURM_ENDS,
    bucket,
    ended,
    existing,
    failed_ranks,
    final_state,
    kill_local_tasks,
    markdown,
    rank_outcomes,
    split_overrides,
)

# Messages (progress, failures) go through logging, to stderr; stdout holds the answer: one line per submitted
# point and the summary.
log = logging.getLogger("sweep")


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
        from common import host_requeue

        host_requeue.install()
        ret = super().__call__(*args, **kwargs)
        if ret.status == JobStatus.FAILED and isinstance(ret._return_value, BaseException):
            raise ret._return_value
        return ret

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # Every point was checked (and a plan printed) before Hydra wrote the sweep folder: train/gate.py.
        setup_globals()
        sweep_dir = Path(self.config.hydra.sweep.dir)
        points = self._points([list(o) for o in job_overrides], initial_job_idx, sweep_dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self._submit(points)
        self._wait(points)
        return self._report(points, sweep_dir)

    def _points(self, job_overrides: list, first: int, sweep_dir: Path) -> list:
        """Each point composed and resolved exactly as its job will (same Hydra context), without running it:
        the ones the gate composed and checked (train/gate.py), or, for a launch the gate did not see, composed
        here."""
        from train.compose import CHECKED_POINTS, sweep_points

        checked = CHECKED_POINTS.get(str(sweep_dir), [])
        if first == 0 and [o for o, _ in checked] == job_overrides:
            return [Point(num, o, cfg) for num, (o, cfg) in enumerate(checked)]
        points = []
        for num, (overrides, cfg) in enumerate(sweep_points(self.hydra_context.config_loader, self.config,
                                                            sweep_dir)):
            OmegaConf.resolve(cfg)  # while the point's Hydra context is set
            points.append(Point(num, overrides, cfg))
        return [p for p in points if first <= p.num < first + len(job_overrides)]

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
            done = [p.job.done(force_check=force and i == 0) and ended(p) for i, p in enumerate(points)]
            for p, d in zip(points, done):
                failed = [] if d or p.cfg.cluster.name != "local" else failed_ranks(p.job)
                if failed:
                    log.warning(f"[sweep] #{p.num}: rank {failed[0]} failed: ending its other ranks")
                    kill_local_tasks(p.job)
            counts = Counter("done" if d else bucket(p.job.state) for p, d in zip(points, done))
            line = ", ".join(f"{counts[k]} {k}" for k in ("pending", "running", "done") if counts[k])
            if line != last:
                log.info(f"[sweep] jobs: {line}")
                last = line
            if all(done):
                return
            time.sleep(self.params.get("poll_s", 2.0))

    def _report(self, points: list, sweep_dir: Path) -> list:
        from train.preflight_report import exclusions
        from train.preflight_report import problem_lines as preflight_problems
        from train.preflight_report import table as preflight_table

        rows, results, failed, bad_ranks, tables = [], [], 0, {}, []
        shared, own = split_overrides([p.overrides for p in points])  # the column shows what was swept
        for p, own_overrides in zip(points, own):
            ranks = rank_outcomes(p.job, wait_s=0 if p.cfg.cluster.name == "local" else 15)
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
            state = "COMPLETED" if ok else final_state(p.job)
            if not ok and state not in SLURM_ENDS and any(r.outcome for r in ranks):
                state = "FAILED"  # a rank raised; Slurm's own state is kept where it says more (TIMEOUT, ...)
            report = OmegaConf.select(p.cfg, "callbacks.run_report.folder")  # train/run_report.py writes these
            rows.append({
                "point": p.num,
                "overrides": " ".join(own_overrides),
                "job_id": p.job.job_id,
                "state": state,
                "final_loss": metrics.get("final_train_loss"),
                "eval_loss": (metrics.get("final_eval") or {}).get("eval/LanguageCrossEntropy"),
                "tokens_per_sec": metrics.get("tokens_per_sec"),
                # from the point's config, so that a failed point shows it too
                "world_size": p.cfg.cluster.nodes * p.cfg.cluster.tasks_per_node,
                "checkpoint": p.cfg.save_folder,
                "metrics": existing(report, "metrics.json"),
                "loss_curve": existing(report, "loss_curve.png"),
                "log": str(first.log),
                "error": error[:1000],
                # nodes the job's preflight check excluded before it requeued itself (train/preflight.py)
                "excluded": exclusions(report),
            })
            if metrics.get("preflight"):  # cluster.preflight.only: the per-node table, and exit 1 if one is bad
                tables.append((f"point #{p.num} (job {p.job.job_id})", metrics["preflight"]))
            bad_ranks[p.num] = bad
        table = markdown(rows)
        common = f"shared by every point: {' '.join(shared)}\n\n" if shared else ""
        (sweep_dir / "summary.md").write_text(common + table)
        with open(sweep_dir / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"\n{common}{table}\nsummary: {sweep_dir / 'summary.md'} and summary.csv", flush=True)
        for title, pre in tables:
            print(f"\npreflight, {title}:\n{preflight_table(pre)}", flush=True)
        failed_checks = [f"{title}: {line}" for title, pre in tables for line in preflight_problems(pre)]
        for line in failed_checks:
            print(f"[preflight] {line}", file=sys.stderr)
        for row in rows:
            if row["state"] != "COMPLETED":
                log.error(f"[sweep] #{row['point']} {row['state']}: see {row['log']}")
                for r in bad_ranks[row["point"]]:
                    tail = "".join(f"\n    | {line}" for line in r.tail)
                    log.error(f"  rank {r.rank}: {r.error}\n    last lines of {r.log}:{tail}")
        if failed:
            log.error(f"[sweep] {failed} of {len(points)} points did not complete")
            sys.exit(1)
        if failed_checks:
            sys.exit(1)
        return results


def _singleton_state():
    from hydra.core.singleton import Singleton

    return Singleton.get_state()
