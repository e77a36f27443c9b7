"""The `-m` launcher: submits every sweep point through submitit (Slurm or this machine), waits with progress,
and writes a summary of every point. The points were checked, and a plan printed, before (train/gate.py).

Built on hydra-submitit-launcher: its job body (recompose the point, run the task, requeue on timeout or
preemption through `checkpoint`) is reused as is. What we add: per-point resources from each point's
`cluster` group (so sweeps over cluster.nodes work), srun arguments for containers (which its PyPI release
lacks), and the summary.
"""
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
    bucket,
    ended,
    failed_ranks,
    kill_local_tasks,
    load_result,
    rank_outcomes,
    split_overrides,
)
from train import status

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
        shared, own = split_overrides([p.overrides for p in points])  # the summary shows what was swept
        manifest = [self._record(p, o) for p, o in zip(points, own)]
        # A local sweep's tasks are this command's children: it always waits. On Slurm the command returns once
        # every point is submitted (cluster.wait=true: it waits, as tests and short sweeps may want).
        if any(p.cfg.cluster.name == "local" or p.cfg.cluster.wait for p in points):
            status.write_manifest(sweep_dir, manifest, shared)
            self._wait(points)
            return self._report(points, sweep_dir, status.load(sweep_dir))
        summary_job = self._submit_summary(points, sweep_dir)
        status.write_manifest(sweep_dir, manifest, shared, summary_job)
        print(f"\nsweep: {sweep_dir}\nfollow it: python -m train.status {sweep_dir} --watch\n"
              f"summary (written by job {summary_job} once every point has ended): {sweep_dir / 'summary.md'}",
              flush=True)
        return []

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
            print(f"[sweep] #{p.num} {' '.join(p.overrides) or '(defaults)'} -> job {p.job.job_id}, "
                  f"log {p.job.task(0).paths.stderr}", flush=True)

    def _record(self, p: Point, own: list) -> dict:
        """What train/status.py needs to follow a point without its config: its job, folders and shape."""
        c = p.cfg.cluster
        return {"num": p.num, "overrides": own, "job_id": p.job.job_id,
                "scheduler": "local" if c.name == "local" else "slurm",
                "folder": self.params["submitit_folder"], "tasks": p.job.num_tasks,
                "world_size": c.nodes * c.tasks_per_node, "checkpoint": p.cfg.save_folder,
                # train/run_report.py writes progress.json, metrics.json and the loss curve there
                "report": OmegaConf.select(p.cfg, "callbacks.run_report.folder")}

    def _submit_summary(self, points: list, sweep_dir: Path) -> str:
        """A one-CPU job that writes summary.md / summary.csv once every point has ended, however it ended
        (afterany: a requeued point holds it back until it ends for good), so the summary exists although
        nobody waits on the login node. Same environment as the points (setup lines or container)."""
        import submitit

        from train.executor import env_lines, srun_args

        cfg = points[0].cfg
        c = cfg.cluster
        ex = submitit.AutoExecutor(folder=self.params["submitit_folder"], cluster="slurm",
                                   slurm_python="python3" if c.container.image else None)
        ex.update_parameters(
            name=f"{cfg.run_name}-summary", nodes=1, tasks_per_node=1, cpus_per_task=1, timeout_min=10,
            slurm_partition=c.summary_partition or c.partition, slurm_account=c.account, slurm_qos=c.qos,
            slurm_dependency="afterany:" + ":".join(str(p.job.job_id) for p in points),
            slurm_setup=[*env_lines(cfg), *([] if c.container.image else c.setup)], slurm_srun_args=srun_args(cfg))
        return ex.submit(status.summarise, str(sweep_dir)).job_id

    def _wait(self, points: list) -> None:
        last, refreshed = None, 0.0
        while True:
            # One forced accounting query (for all jobs at once) every 10 s, so that a cancelled or failed
            # job is seen promptly without calling sacct for every job at every poll.
            force = time.time() - refreshed > 10
            refreshed = time.time() if force else refreshed
            done = [p.job.done(force_check=force and i == 0) and ended(p.job, _scheduler(p))
                    for i, p in enumerate(points)]
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

    def _report(self, points: list, sweep_dir: Path, manifest: dict) -> list:
        """The summary (the same rows `python -m train.status` writes), then each failed rank's error and log
        tail, the preflight tables of cluster.preflight.only, and exit 1 if a point did not complete."""
        from train.preflight_report import problem_lines as preflight_problems
        from train.preflight_report import table as preflight_table

        rows = status.rows(manifest, [p.job for p in points], wait_s=0 if _scheduler(points[0]) == "local" else 15)
        text = status.write_summary(sweep_dir, manifest["shared"], rows)
        print(f"\n{text}\nsummary: {sweep_dir / 'summary.md'} and summary.csv", flush=True)
        results, tables = [], []
        for p in points:
            outcome, value = load_result(p.job.task(0).paths.result_pickle)
            if outcome == "success":
                results.append(value)
                metrics = value.return_value if isinstance(value.return_value, dict) else {}
                if metrics.get("preflight"):  # cluster.preflight.only: the per-node table, exit 1 if one is bad
                    tables.append((f"point #{p.num} (job {p.job.job_id})", metrics["preflight"]))
        for title, pre in tables:
            print(f"\npreflight, {title}:\n{preflight_table(pre)}", flush=True)
        failed_checks = [f"{title}: {line}" for title, pre in tables for line in preflight_problems(pre)]
        for line in failed_checks:
            print(f"[preflight] {line}", file=sys.stderr)
        failed = [(p, row) for p, row in zip(points, rows) if row["state"] != "COMPLETED"]
        for p, row in failed:
            log.error(f"[sweep] #{row['point']} {row['state']}: see {row['log']}")
            for r in rank_outcomes(p.job, wait_s=0):
                if not r.ok:
                    tail = "".join(f"\n    | {line}" for line in r.tail)
                    log.error(f"  rank {r.rank}: {r.error}\n    last lines of {r.log}:{tail}")
        if failed:
            log.error(f"[sweep] {len(failed)} of {len(points)} points did not complete")
            sys.exit(1)
        if failed_checks:
            sys.exit(1)
        return results


def _scheduler(p: Point) -> str:
    return "local" if p.cfg.cluster.name == "local" else "slurm"


def _singleton_state():
    from hydra.core.singleton import Singleton

    return Singleton.get_state()
