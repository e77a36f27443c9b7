"""What the launcher and an app agree on: the resources a job needs (one typed record, mapped to submitit in one
place) and what an app provides (`SweepApp`, whose defaults are the generic app: any Hydra task function).

The launcher knows no app: training (train/launch/sweep_app.py) and data_prep (data_prep/sweep_app.py) subclass
`SweepApp` and are named by class in `hydra.launcher.app`. Light: dataclasses, Hydra, submitit.
"""
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig


@dataclass(frozen=True)
class Resources:
    """One job's needs. Points whose Resources are equal go to Slurm as one job array."""
    scheduler: str = "local"  # local (processes on this machine) | slurm
    name: str = "sweep"  # the Slurm job name
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    mem_gb: Optional[int] = None
    timeout_min: int = 60
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    exclusive: bool = False
    max_num_timeout: int = 0  # requeues after a time limit or preemption
    signal_delay_s: int = 120  # USR2 this long before the limit
    array_parallelism: int = 256
    sbatch_extra: tuple = ()  # (flag, value) pairs, in the order given
    setup: tuple = ()  # shell lines before srun
    srun_args: tuple = ()
    teardown: tuple = ()  # shell lines after srun (the host-side requeue)
    python: Optional[str] = None  # the job's interpreter; None: this one (a container: "python3")


@dataclass(frozen=True)
class JobSpec:
    """How one point is scheduled, decided once when its config is made (an app's `spec`) and read by the launcher,
    the status and the plan: its job's resources, whether a sweep of it waits for its job, and the resources of
    the summary job that follows a sweep that does not (None where there is none: the points run here)."""
    resources: Resources = Resources()
    waits: bool = True
    summary: Optional[Resources] = None


def executor(res: Resources, folder: str):
    """The one mapping of Resources to submitit."""
    import submitit

    if res.scheduler == "local":
        ex = submitit.AutoExecutor(folder=folder, cluster="local")
        ex.update_parameters(name=res.name, nodes=1, tasks_per_node=res.tasks_per_node,
                             gpus_per_node=res.gpus_per_node, cpus_per_task=res.cpus_per_task,
                             timeout_min=res.timeout_min)
        return ex
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=res.max_num_timeout,
                               slurm_python=res.python)
    extra = dict(res.sbatch_extra)
    if res.gpus_per_node:
        extra["gpus_per_node"] = res.gpus_per_node
    ex.update_parameters(
        name=res.name, nodes=res.nodes, tasks_per_node=res.tasks_per_node, cpus_per_task=res.cpus_per_task,
        timeout_min=res.timeout_min, mem_gb=res.mem_gb, slurm_partition=res.partition, slurm_account=res.account,
        slurm_qos=res.qos, slurm_constraint=res.constraint, slurm_exclusive=res.exclusive or None,
        slurm_signal_delay_s=res.signal_delay_s, slurm_array_parallelism=res.array_parallelism,
        slurm_additional_parameters=extra, slurm_setup=list(res.setup), slurm_srun_args=list(res.srun_args),
        slurm_teardown=list(res.teardown))
    return ex


def interpreter(res: Resources) -> str:
    """The command a Slurm job of `res` runs Python with: res.python where it names one (a container's "python3"),
    else this interpreter, as submitit's Slurm executor does for slurm_python=None."""
    import shlex
    import sys

    return res.python or shlex.quote(sys.executable)


def sbatch_script(res: Resources, folder: str, count: int = 1) -> str:
    """The sbatch script submitit writes for one job of `res`, or for a job array of `count` (what `plan` shows),
    pinned by tests/test_security.py and tests/test_slurm_sweeps.py (the script submitted equals the plan's)."""
    import shlex

    from common.compat import submitit_sbatch_script

    return submitit_sbatch_script(executor(res, folder),
                                  f"{interpreter(res)} -u -m submitit.core._submit {shlex.quote(folder)}", count)


def job_arrays(resources: list) -> list:
    """Points with equal resources as one job array (submitit's batch: one sbatch, one entry in a site's job
    limits), each other point as its own job: [(the job's resources, the indices of its points)]. An array is
    named by what its points' names share (training: the model); the summary and status name each point's run."""
    import os
    from dataclasses import replace

    groups: dict = {}
    for i, res in enumerate(resources):
        groups.setdefault(replace(res, name=""), []).append(i)
    out = []
    for res, idx in groups.items():
        names = [resources[i].name for i in idx]
        name = names[0] if len(set(names)) == 1 else os.path.commonprefix(names).rstrip("-_.") or "sweep"
        out.append((replace(res, name=name), idx))
    return out


@dataclass
class Point:
    """One job of a sweep: the overrides it runs with, its config (None where the app does not need one), its
    resources, and once launched its submitit job or, for a run that had already finished, what it left."""
    num: int
    overrides: list
    cfg: Optional[DictConfig]
    spec: JobSpec
    job: Any = None
    finished: Optional[dict] = None  # the app's record of an earlier, finished run of this point: nothing to submit

    @property
    def resources(self) -> Resources:
        return self.spec.resources


class SweepApp:
    """What an app tells the launcher. These defaults are the generic app: any Hydra task function, its jobs
    composed by Hydra, resources from the launcher's own settings (`hydra.launcher.*`), the task's return value
    returned as is. Training and data_prep override what they know better."""
    status_command: Optional[str] = None  # how a user follows a submitted sweep; None: the launcher always waits
    failed_exit = 1  # the command's exit status when a point did not complete
    refused_exit = 2  # ... when a point's config was refused
    wait_key = "hydra.launcher.wait"  # the setting that makes a Slurm sweep wait for its points
    log_tail = True  # show a failed rank's last log lines beside its error
    shown = ("point", "overrides", "job_id", "state", "log", "error")  # what a terminal shows of a summary
    shown_where_set = ("error",)  # of those, shown only where a point has one

    def configs(self, launcher, job_overrides: list, first: int) -> list:
        """(overrides, config) of each point, checked: raise common.errors.UserError with every problem of every
        point (nothing is submitted). The overrides may gain what the app adds (training: a run name)."""
        return [(list(o), None) for o in job_overrides]

    def job_overrides(self, overrides: list, sweep_dir) -> list:
        """The overrides a point's job composes its config from (its pickle holds them; a requeue composes again):
        as checked. Training pins a file read from outside conf/ (its `yaml=` recipe) to the bytes checked."""
        return overrides

    def report(self, err) -> None:
        """Print a refusal (a UserError holding every problem)."""
        import sys

        print(err, file=sys.stderr)

    def spec(self, cfg, params) -> JobSpec:
        """How the point is scheduled: resources from the launcher's own settings. A local sweep's tasks are this
        command's children: it always waits; on Slurm, as `hydra.launcher.wait` says; an app without a status
        command to follow it by always waits."""
        return params_spec(params, name="sweep", waits=self.status_command is None)

    def finished(self, cfg) -> Optional[dict]:
        """An earlier run of this point that already reached its end: its record, and the launcher submits
        nothing for it. None: run it."""
        return None

    def objective(self, cfg, value):
        """What the sweeper gets as the point's result (Optuna minimises or maximises it)."""
        return value

    def record(self, point: Point) -> dict:
        """What the status needs of a point besides its job."""
        return {}

    def columns(self, point: dict, state: str) -> dict:
        return {}

    def heading(self, manifest: dict) -> str:
        return ""

    def finish(self, results: list, rows: list) -> bool:
        """After a waited-for sweep's summary: the app's closing words. True: exit non-zero."""
        return False


def params_spec(params, name: str, waits: bool = False) -> JobSpec:
    """A point's spec from the launcher's own settings (the generic app, data_prep). waits: whatever
    `hydra.launcher.wait` says."""
    from common import host_requeue

    folder = params["submitit_folder"]
    slurm = params.get("scheduler", "local") == "slurm"
    res = Resources(
        scheduler=params.get("scheduler", "local"), name=name, tasks_per_node=1,
        cpus_per_task=params.get("cpus_per_task", 1), mem_gb=params.get("mem_gb"),
        timeout_min=params.get("timeout_min", 60), partition=params.get("partition"),
        account=params.get("account"), qos=params.get("qos"), max_num_timeout=params.get("max_num_timeout", 0),
        signal_delay_s=params.get("signal_delay_s", 120), array_parallelism=params.get("array_parallelism", 256),
        setup=tuple(params.get("setup") or ()), srun_args=("--kill-on-bad-exit=1",) if slurm else (),
        teardown=tuple(host_requeue.teardown_lines(folder)) if slurm else ())
    summary = summary_job(res, params.get("summary_partition")) if slurm else None
    return JobSpec(resources=res, waits=waits or sweep_waits(res.scheduler, params.get("wait")), summary=summary)


def sweep_waits(scheduler: str, wait) -> bool:
    """Whether `-m` waits for its points: a local sweep's tasks are the command's children, so it always does; on
    Slurm, as `wait` asks."""
    return scheduler != "slurm" or bool(wait)


def summary_job(points: Resources, partition: Optional[str] = None, setup: Optional[tuple] = None) -> Resources:
    """The Slurm job that writes a sweep's summary after its points (`points`: theirs): one CPU for a few seconds,
    in the points' environment (`setup`: their setup lines where the points' own hold more, e.g. a preflight), on
    `partition`, else theirs."""
    return Resources(scheduler="slurm", name=f"{points.name}-summary", timeout_min=10,
                     partition=partition or points.partition, account=points.account, qos=points.qos,
                     setup=points.setup if setup is None else setup, srun_args=points.srun_args, python=points.python)


def load_app(path: Optional[str]) -> SweepApp:
    """The app named by class (`train.launch.sweep_app.TrainApp`); None: the generic app."""
    if not path:
        return SweepApp()
    from hydra.utils import get_class

    cls = get_class(path)
    if not (isinstance(cls, type) and issubclass(cls, SweepApp)):
        raise TypeError(f"hydra.launcher.app={path}: not a SweepApp (common/sweep/contract.py)")
    return cls()
