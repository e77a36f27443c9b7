"""The `-m` launcher of both apps, and of any Hydra app: it launches exactly the points a sweeper hands it (Hydra's
basic sweeper with `hydra.sweeper.params`, Optuna, Nevergrad), each through submitit on Slurm or on this machine,
and returns one JobReturn per point whose value is the point's objective.

What differs between apps comes from the app (a `SweepApp`, contract.py, named in `hydra.launcher.app`): each
point's config (composed as its job will compose it, and checked: nothing is submitted if any point of a batch is
refused), its resources, whether to wait, its objective, whether an earlier run of it already finished, and the
summary's columns. Points with equal resources go to Slurm as one job array.

Slurm sweeps either wait (local sweeps, `cluster.wait=true`, `hydra.launcher.wait=true`, and any sweeper that
needs results) or submit and return: a summary job writes the summary when the last point ends; follow with the
app's status command. Built on hydra-submitit-launcher: its job body (recompose the point, run the task, requeue
on timeout or preemption through `checkpoint`) is reused, with the requeue done from the host
(common/host_requeue.py).
"""
import logging
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobReturn, JobStatus, setup_globals

from common.sweep import status
from common.sweep.contract import Point, executor, job_arrays, load_app
from common.sweep.outcomes import (
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


# Sweepers that never read a point's result: with them a Slurm sweep may submit and return.
_RESULTS_UNREAD = ("CheckedSweeper", "BasicSweeper")


def names_this_launcher(target: str) -> bool:
    """Whether a `hydra.launcher._target_` names this launcher: the class it names does this work (Hydra's plugin
    scan has imported every launcher's module already; a target that names no class names none)."""
    import importlib

    module, _, name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 -- not importable: not this launcher (Hydra says why when it instantiates it)
        return False
    return isinstance(cls, type) and issubclass(cls, SweepLaunch)


class PointFailed(RuntimeError):
    """A point that did not complete, as its JobReturn carries it to the sweeper."""


def _job_return(p, status, value) -> JobReturn:
    ret = JobReturn(overrides=p.overrides, cfg=p.cfg, status=status)
    ret.return_value = value
    return ret


class SweepLaunch:
    """The launcher's work. Hydra's plugin class, `SweepLauncher` (the `pretrain` launchers' `_target_`), puts it
    over hydra-submitit-launcher's BaseSubmititLauncher, whose `setup` (config, task), `params` and job body
    (`__call__`) it uses."""

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.app = load_app(params.get("app"))
        self._prepared: dict = {}  # the sweeper's overrides -> (the point's overrides, its checked config)
        self.failed_checks = False  # the app's closing check failed (training: a preflight-only verdict)
        self._points: list = []  # every point launched so far
        # The sweeper launching a batch it did not give first with all its points (Hydra's basic sweeper with
        # max_batch_size, Optuna's trials): the app sees that batch alone (a plan says so). None: every point given.
        self.batch_of: str | None = None

    def __getstate__(self) -> dict:
        """What each job's pickle carries of the launcher (the job body is this object): not every point's
        config, which would make a 128-point sweep write 128 pickles of 128 configs."""
        return {**self.__dict__, "_prepared": {}, "_points": []}

    def __call__(self, *args, **kwargs) -> JobReturn:
        """The job body (every rank). Hydra's run_job catches the task's exception into a FAILED JobReturn,
        so submitit would log "Job completed successfully" and the process would exit 0: srun could not
        tell that a rank failed. Raise it again: the traceback goes to this rank's log, submitit stores it
        as the task's error, and the process exits 1."""
        from common import host_requeue
        from common.compat import hydra_job_return_value
        from common.sweep.outcomes import hold_while_running

        host_requeue.install()
        hold_while_running()  # a local task says it runs, for when its controller is gone (outcomes.local_alive)
        ret = super().__call__(*args, **kwargs)
        if ret.status == JobStatus.FAILED and isinstance(hydra_job_return_value(ret), BaseException):
            raise hydra_job_return_value(ret)
        return ret

    def prepare(self, job_overrides: Sequence[Sequence[str]], first: int = 0) -> list:
        """Each point's config, composed once and checked with all the others given; a refused point prints every
        problem of every point and exits (nothing submitted). A sweeper that knows all its points (ours) calls
        this with all of them before it writes anything; `launch` reuses them."""
        setup_globals()
        keys = [tuple(o) for o in job_overrides]
        if not all(k in self._prepared for k in keys):
            from common.errors import UserError

            try:
                made = self.app.configs(self, [list(o) for o in job_overrides], first)
            except UserError as err:
                self.app.report(err)
                sys.exit(self.app.refused_exit)
            self._prepared.update(zip(keys, made))
        return [self._prepared[k] for k in keys]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """One JobReturn per point given, in order. A point given twice in one batch (Optuna's sampler over a
        small space proposes the same trial twice) is one run: launched once, both get its result (two jobs
        would train one run at once in one folder)."""
        keys = [tuple(o) for o in job_overrides]
        first: dict = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        if len(first) < len(keys):
            log.info(f"[sweep] {len(keys) - len(first)} of this batch's {len(keys)} points repeat another: each "
                     "is launched once and gets its result")
        returns = self._launch([list(k) for k in first], [initial_job_idx + i for i in first.values()])
        if not returns:
            return returns
        by_key = dict(zip(first, returns))
        return [by_key[k] for k in keys]

    def _launch(self, job_overrides: list, nums: list) -> Sequence[JobReturn]:
        if not all(tuple(o) in self._prepared for o in job_overrides):
            self.batch_of = self._sweeper()
        configs = self.prepare(job_overrides, nums[0] if nums else 0)
        points = []
        for num, (overrides, cfg) in zip(nums, configs):
            p = Point(num, overrides, cfg, self.app.spec(cfg, self.params))
            p.finished = self.app.finished(cfg)
            points.append(p)
        if not points:
            return []
        waits = any(p.spec.waits for p in points)
        sweeper = self._sweeper()
        if not waits and self._results_read():
            from common.errors import UserError

            self.app.report(UserError(self.app.wait_key, f"{sweeper} needs each point's result before it chooses "
                                      "the next ones, and this sweep would submit and return",
                                      f"add {self.app.wait_key}=true (this command then waits for every batch)"))
            sys.exit(self.app.refused_exit)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        folder = self.params["submitit_folder"]
        for p in points:
            if p.finished is not None:
                print(f"[sweep] #{p.num} {' '.join(p.overrides) or '(defaults)'}: finished earlier "
                      f"({p.finished.get('where', '')}): nothing to submit", flush=True)
        self._submit([p for p in points if p.finished is None], folder, sweep_dir)
        self._points += points  # a sweeper that launches batches (Optuna) gets one summary of all of them
        shared, own = split_overrides([p.overrides for p in self._points])  # the summary shows what was swept
        records = [{"num": p.num, "overrides": o, "job_id": p.job.job_id if p.job else None,
                    "scheduler": p.resources.scheduler, "folder": folder, "tasks": p.job.num_tasks if p.job else 0,
                    # a local job's id is its controller's pid: it means something on this machine only
                    **({"host": socket.gethostname()} if p.resources.scheduler == "local" else {}),
                    **self.app.record(p)} for p, o in zip(self._points, own)]
        app_path = self.params.get("app") or ""
        # before waiting, or the summary job: a point that fails at once may let that job start within a second
        status.write_manifest(sweep_dir, app_path, records, shared)
        running = [p for p in points if p.job]
        if waits or not running:
            self._wait(running)
            return self._report(points, sweep_dir)
        # Submit and return: a login node may end a long-lived process; the summary job writes the summary
        follow = f"{self.app.status_command} {sweep_dir} --watch"
        try:
            ex = executor(running[0].spec.summary, folder)
            ex.update_parameters(slurm_dependency="afterany:" + ":".join(
                dict.fromkeys(str(p.job.job_id).split("_")[0] for p in running)))  # an array's id covers its parts
            summary_job = ex.submit(status.summarise, str(sweep_dir)).job_id
        except Exception as err:  # the points are submitted and run: say so, and how to get the summary
            log.warning(f"[sweep] the summary job was not submitted ({err}); `{follow}` writes the summary")
            summary_job = None
        status.write_manifest(sweep_dir, app_path, records, shared, summary_job)
        for r in records:  # what the app says of a submitted point (train: where a preflight table will be)
            if r.get("note"):
                print(f"[sweep] #{r['num']} {r['note']}", flush=True)
        print(f"\nsweep: {sweep_dir}\nfollow it: {follow}" + (
            f"\nsummary (written by job {summary_job} once every point has ended): {sweep_dir / 'summary.md'}"
            if summary_job else ""), flush=True)
        return []

    def _sweeper(self) -> str:
        return str(self.config.hydra.sweeper.get("_target_", "")).rsplit(".", 1)[-1]

    def _results_read(self) -> bool:
        """Whether the sweeper reads each point's result (Optuna does; the basic sweeper does not)."""
        return self._sweeper() not in _RESULTS_UNREAD

    def _submit(self, points: list, folder: str, sweep_dir: Path) -> None:
        """Each job of contract.job_arrays: points with equal resources as one job array."""
        # The job body (this launcher) and Hydra's state are the same for every point: each is copied and pickled
        # once per submission, and every point's pickle holds those bytes beside its own overrides
        from hydra.core.singleton import Singleton

        body, state = _PickledOnce(self), _PickledOnce(Singleton.get_state())
        for res, idx in job_arrays([p.resources for p in points]):
            ex = executor(res, folder)
            try:
                with ex.batch():  # (the jobs are submitted as it ends)
                    jobs = [ex.submit(body, self.app.job_overrides(p.overrides, sweep_dir), "hydra.sweep.dir", p.num,
                                      f"job_id_for_{p.num}", state) for p in (points[i] for i in idx)]
            except Exception as err:  # sbatch refused it (or is not there): its words, not submitit's traceback
                self._not_submitted(err, points, res.scheduler)
            for i, job in zip(idx, jobs):
                points[i].job = job
        for p in points:
            print(f"[sweep] #{p.num} {' '.join(p.overrides) or '(defaults)'} -> job {p.job.job_id}, "
                  f"log {p.job.task(0).paths.stderr}", flush=True)

    def _not_submitted(self, err: Exception, points: list, scheduler: str) -> None:
        """Say which points the scheduler refused, in its own last words, and which were submitted (they run), then
        exit 1."""
        from common.errors import UserError

        said = [line.strip() for line in str(err).splitlines() if line.strip()]
        done = [p for p in points if p.job is not None]
        left = ", ".join(f"#{p.num}" for p in points if p.job is None)
        self.app.report(UserError(
            "hydra.launcher", f"{scheduler} did not take the job of point(s) {left}: {said[-1] if said else repr(err)}",
            ("the point(s) " + ", ".join(f"#{p.num} (job {p.job.job_id})" for p in done) + " were submitted and run; "
             if done else "nothing was submitted; ") + "fix what it says, then run the same command again"))
        sys.exit(1)

    def _wait(self, points: list) -> None:
        last, refreshed = None, 0.0
        while points:
            # One forced accounting query (for all jobs at once) every 10 s, so that a cancelled or failed
            # job is seen promptly without calling sacct for every job at every poll.
            force = time.time() - refreshed > 10
            refreshed = time.time() if force else refreshed
            slurm = [p for p in points if p.resources.scheduler == "slurm"]
            if force and slurm:
                # a job's `state` is refreshed on submitit's own schedule (up to half the job's age): ask for
                # every job's state here, or a finished long job would keep the command waiting for minutes
                slurm[0].job.get_info(mode="force")
            done = [ended(p.job, p.resources.scheduler, result_decides=True) for p in points]
            for p, d in zip(points, done):
                failed = [] if d or p.resources.scheduler != "local" else failed_ranks(p.job)
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
        """The summary (the rows the status command writes), the app's closing words, each failed rank's error
        and log tail; one JobReturn per point, its value the point's objective (FAILED where it did not
        complete)."""
        manifest = status.load(sweep_dir)
        jobs = status.jobs(manifest)
        local = all(p.resources.scheduler == "local" for p in points)
        everything = status.rows(manifest, jobs, wait_s=0 if local else 15)  # this batch and earlier ones
        text = status.write_summary(sweep_dir, manifest, everything)
        print(f"\n{text}\nsummary: {sweep_dir / 'summary.md'} and summary.csv", flush=True)
        by_num = {row["point"]: row for row in everything}
        rows = [by_num[p.num] for p in points]
        values, returns = [], []
        for p, row in zip(points, rows):
            if p.finished is not None:
                outcome, value = "success", _job_return(p, JobStatus.COMPLETED, p.finished.get("value"))
            else:
                outcome, value = load_result(p.job.task(0).paths.result_pickle)
            ok = row["state"] == "COMPLETED" and outcome == "success" and value.status == JobStatus.COMPLETED
            values.append(value.return_value if ok else None)
            if ok:
                try:
                    value.return_value = self.app.objective(p.cfg, value.return_value)
                except Exception as err:  # the point ran, but its objective cannot be had: say which and why
                    if self._results_read():  # a sweeper that needs it: the point failed, for it
                        value = _job_return(p, JobStatus.FAILED, PointFailed(f"point #{p.num}: {err}"))
                    else:
                        log.warning(f"[sweep] #{p.num}: no objective ({err})")
                        value.return_value = None
                returns.append(value)
            else:
                returns.append(_job_return(p, JobStatus.FAILED, PointFailed(
                    f"point #{p.num} {row['state']}: {row['error'] or row['log']}")))
        self.failed_checks = self.app.finish(values, rows) or self.failed_checks
        failed = [(p, row) for p, row in zip(points, rows) if row["state"] != "COMPLETED"]
        for p, row in failed:
            log.error(f"[sweep] #{row['point']} {row['state']}: see {row['log']}")
            for r in rank_outcomes(p.job, wait_s=0) if p.job else []:
                if not r.ok:  # the last lines of its log, where the app's errors do not say everything
                    tail = "".join(f"\n    | {line}" for line in r.tail) if self.app.log_tail else ""
                    log.error(f"  rank {r.rank}: {r.error}" + (f"\n    last lines of {r.log}:{tail}" if tail else ""))
        if failed:
            log.error(f"[sweep] {len(failed)} of {len(points)} points did not complete")
        return returns


class _PickledOnce:
    """An object as a job's pickle carries it, pickled here once however many jobs carry it: it unpickles to the
    object itself (the job never sees this wrapper). Pickling the launcher and Hydra's state again for each point
    would make a submit's time grow with its points."""

    def __init__(self, obj) -> None:
        import cloudpickle  # submitit's pickler

        self.data = cloudpickle.dumps(obj)

    def __reduce__(self):
        import pickle

        return pickle.loads, (self.data,)
