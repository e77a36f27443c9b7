"""The `-m` launcher of both apps: checks every point, submits each through submitit (Slurm or this machine), and
either returns at once (Slurm: follow with `python -m train.status` / `python -m data_prep.status`; a summary job
writes the summary when the last point ends) or waits with progress and writes the summary itself (local
sweeps, `cluster.wait=true`, `hydra.launcher.wait=true`).

App-agnostic: what differs between training and data_prep comes from the app's hooks, a module named by the
launcher's `app` (train/sweep_app.py, data_prep/sweep_app.py): the points (composed and checked), each point's
executor (resources), whether to wait, the summary job's executor, the manifest fields and summary columns
(read by sweep_status.py), and what to print at the end. Points with the same resources go as one Slurm job
array (data_prep's parts); training points, each with its own run name, go as one job each.

Built on hydra-submitit-launcher: its job body (recompose the point, run the task, requeue on timeout or
preemption through `checkpoint`) is reused, with the requeue done from the host (common/host_requeue.py).
"""
import importlib
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, setup_globals
from omegaconf import DictConfig

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from hydra_plugins.pretrain_launcher import sweep_status
from hydra_plugins.pretrain_launcher.outcomes import (
    bucket,
    ended,
    failed_ranks,
    kill_local_tasks,
    load_result,
    rank_outcomes,
    split_overrides,
)

# Messages (progress, failures) go through logging, to stderr; stdout holds the answer: one line per submitted
# point and the summary.
log = logging.getLogger("sweep")


@dataclass
class SweepLauncherConf:
    _target_: str = "hydra_plugins.pretrain_launcher.pretrain_launcher.SweepLauncher"
    app: str = "train.sweep_app"  # the app's hooks (see the module docstring)
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    poll_s: float = 2.0  # how often the waiting submitter looks at its jobs


@dataclass
class PartsLauncherConf(SweepLauncherConf):
    """Resources for an app without a `cluster` group (data_prep): one task per point, given here, in
    hydra-submitit-launcher's names (`hydra.launcher.cpus_per_task=64`)."""
    app: str = "data_prep.sweep_app"
    scheduler: str = "local"  # local | slurm
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    timeout_min: int = 60
    max_num_timeout: int = 0  # requeues after a time limit or preemption
    signal_delay_s: int = 120
    array_parallelism: int = 256
    setup: List[str] = field(default_factory=list)  # shell lines before srun
    wait: bool = False  # Slurm: wait for every part (a local sweep always does)
    summary_partition: Optional[str] = None  # where the summary job runs; null: partition


ConfigStore.instance().store(group="hydra/launcher", name="pretrain", node=SweepLauncherConf, provider="pretrain")
for _name, _scheduler in (("data_prep_local", "local"), ("data_prep_slurm", "slurm")):
    ConfigStore.instance().store(group="hydra/launcher", name=_name, provider="pretrain",
                                 node=PartsLauncherConf(scheduler=_scheduler))


@dataclass
class Point:
    num: int
    overrides: list
    cfg: DictConfig  # resolved, without the hydra node
    scheduler: str  # local | slurm (the app's hook says which)
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
        setup_globals()
        app = importlib.import_module(self.params["app"])
        sweep_dir = Path(self.config.hydra.sweep.dir)
        points = [Point(initial_job_idx + i, o, cfg, app.scheduler(cfg, self.params)) for i, (o, cfg) in
                  enumerate(app.points(self, [list(o) for o in job_overrides], initial_job_idx, sweep_dir))]
        sweep_dir.mkdir(parents=True, exist_ok=True)
        folder = self.params["submitit_folder"]
        self._submit(app, points, folder)
        shared, own = split_overrides([p.overrides for p in points])  # the summary shows what was swept
        records = [{"num": p.num, "overrides": o, "job_id": p.job.job_id,
                    "scheduler": p.scheduler, "folder": folder, "tasks": p.job.num_tasks,
                    **app.record(p.cfg)} for p, o in zip(points, own)]
        # before waiting, or the summary job: a point that fails at once may let that job start within a second
        sweep_status.write_manifest(sweep_dir, app.__name__, records, shared)
        if any(app.waits(p.cfg, self.params) for p in points):
            self._wait(points)
            return self._report(app, points, sweep_dir)
        # Submit and return: a login node may end a long-lived process; the summary job writes the summary
        follow = f"{app.STATUS} {sweep_dir} --watch"
        try:
            ex = app.summary_executor(points[0].cfg, self.params, folder)
            ex.update_parameters(slurm_dependency="afterany:" + ":".join(
                dict.fromkeys(str(p.job.job_id).split("_")[0] for p in points)))  # an array's id covers its parts
            summary_job = ex.submit(sweep_status.summarise, str(sweep_dir)).job_id
        except Exception as err:  # the points are submitted and run: say so, and how to get the summary
            log.warning(f"[sweep] the summary job was not submitted ({err}); `{follow}` writes the summary")
            summary_job = None
        sweep_status.write_manifest(sweep_dir, app.__name__, records, shared, summary_job)
        for r in records:  # what the app says of a submitted point (train: where a preflight table will be)
            if r.get("note"):
                print(f"[sweep] #{r['num']} {r['note']}", flush=True)
        print(f"\nsweep: {sweep_dir}\nfollow it: {follow}" + (
            f"\nsummary (written by job {summary_job} once every point has ended): {sweep_dir / 'summary.md'}"
            if summary_job else ""), flush=True)
        return []

    def _submit(self, app, points: list, folder: str) -> None:
        """Points with the same resources as one job array (data_prep's parts), each other point as its own job."""
        groups = {}
        for p in points:
            ex = app.executor(p.cfg, self.params, folder)
            # the parameters submitit will write into the script (its executor's own dict: no public accessor)
            key = (ex.cluster, json.dumps(ex._executor.parameters, sort_keys=True, default=str))
            groups.setdefault(key, (ex, []))[1].append(p)
        for ex, group in groups.values():
            with ex.batch():
                for p in group:
                    p.job = ex.submit(self, p.overrides, "hydra.sweep.dir", p.num, f"job_id_for_{p.num}",
                                      _singleton_state())
        for p in points:
            print(f"[sweep] #{p.num} {' '.join(p.overrides) or '(defaults)'} -> job {p.job.job_id}, "
                  f"log {p.job.task(0).paths.stderr}", flush=True)

    def _wait(self, points: list) -> None:
        last, refreshed = None, 0.0
        while True:
            # One forced accounting query (for all jobs at once) every 10 s, so that a cancelled or failed
            # job is seen promptly without calling sacct for every job at every poll.
            force = time.time() - refreshed > 10
            refreshed = time.time() if force else refreshed
            slurm = [p for p in points if p.scheduler == "slurm"]
            if force and slurm:
                # done() returns early once a result file exists, and `state` is refreshed on submitit's own
                # schedule (up to half the job's age): ask for every job's state here, or a finished long job
                # would keep the command waiting for minutes
                slurm[0].job.get_info(mode="force")
            done = [p.job.done() and ended(p.job, p.scheduler) for p in points]
            for p, d in zip(points, done):
                failed = [] if d or p.scheduler != "local" else failed_ranks(p.job)
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

    def _report(self, app, points: list, sweep_dir: Path) -> list:
        """The summary (the rows `python -m train.status` writes), the app's closing words, each failed rank's
        error and log tail; exit non-zero if a point did not complete."""
        manifest = sweep_status.load(sweep_dir)
        rows = sweep_status.rows(manifest, [p.job for p in points],
                                 wait_s=0 if points[0].scheduler == "local" else 15)
        text = sweep_status.write_summary(sweep_dir, manifest, rows)
        print(f"\n{text}\nsummary: {sweep_dir / 'summary.md'} and summary.csv", flush=True)
        results = []
        for p in points:
            outcome, value = load_result(p.job.task(0).paths.result_pickle)
            results.append(value if outcome == "success" else None)
        failed_checks = app.finish(results, rows)
        failed = [(p, row) for p, row in zip(points, rows) if row["state"] != "COMPLETED"]
        for p, row in failed:
            log.error(f"[sweep] #{row['point']} {row['state']}: see {row['log']}")
            for r in rank_outcomes(p.job, wait_s=0):
                if not r.ok:  # the last lines of its log, where the app's errors do not say everything
                    tail = "".join(f"\n    | {line}" for line in r.tail) if app.LOG_TAIL else ""
                    log.error(f"  rank {r.rank}: {r.error}" + (f"\n    last lines of {r.log}:{tail}" if tail else ""))
        if failed:
            log.error(f"[sweep] {len(failed)} of {len(points)} points did not complete")
            sys.exit(app.FAILED_EXIT)
        if failed_checks:
            sys.exit(1)
        return [r for r in results if r is not None]


def _singleton_state():
    from hydra.core.singleton import Singleton

    return Singleton.get_state()
