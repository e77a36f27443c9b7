"""A point's run spec: what every later step needs to know of how and where a composed, resolved config runs,
decided here once and read by the checks, the plan, the launcher and the status, which derive none of it again.

Light: no torch, no llm-foundry (the plan and the sweep launcher read it on the login node).
"""
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from common.sweep import contract
from common.sweep.contract import JobSpec

# Where a point's submitit files go when nothing is submitted (the plan's sbatch script names it so).
PLAN_FOLDER = "<sweep dir>/.submitit/%j"


def scheduler(cfg: DictConfig) -> str:
    """"local" (this machine: a plain run trains in this process, `-m` starts processes here) or "slurm": every
    cluster preset but `cluster=local` (its `cluster.name`)."""
    return "local" if OmegaConf.select(cfg, "cluster.name", default=None) == "local" else "slurm"


@dataclass(frozen=True)
class RunSpec(JobSpec):
    """One point: its run, how it is scheduled (the launcher's JobSpec: resources, whether `-m` waits, the summary
    job's resources), and its folders."""
    run_name: str = ""
    scheduler: str = "local"
    save_folder: Optional[str] = None  # the checkpoints (and identity.json, the manifests)
    report_folder: Optional[str] = None  # progress.json, metrics.json, the loss curve (run_report's folder)

    @property
    def slurm(self) -> bool:
        return self.scheduler == "slurm"

    @property
    def world_size(self) -> int:
        """Ranks of its job: every node's tasks."""
        return self.resources.nodes * self.resources.tasks_per_node


def of(cfg: DictConfig, folder: str = PLAN_FOLDER) -> RunSpec:
    """The spec of a resolved config. folder: submitit's (with %j), which the host-side requeue reads."""
    from train.launch.executor import env_lines, resources

    kind, c = scheduler(cfg), cfg.cluster
    res, summary = resources(cfg, folder, kind), None
    if kind == "slurm":  # in the points' environment (setup lines or container), without their preflight
        summary = contract.summary_job(res, c.summary_partition,
                                       setup=(*env_lines(cfg), *([] if c.container.image else c.setup)))
    return RunSpec(
        resources=res,
        waits=contract.sweep_waits(kind, c.wait), summary=summary,
        run_name=str(cfg.run_name), scheduler=kind, save_folder=OmegaConf.select(cfg, "save_folder", default=None),
        report_folder=OmegaConf.select(cfg, "callbacks.run_report.folder", default=None))


def array_scripts(cfgs: list, folder: str) -> list:
    """What each of a sweep's Slurm points is submitted as, as the launcher submits them (contract.job_arrays):
    (its job's script, its index in that job, the indices of the job's points)."""
    out: list = [None] * len(cfgs)
    for job, idx in contract.job_arrays([of(cfg, folder).resources for cfg in cfgs]):
        script = contract.sbatch_script(job, folder, count=len(idx))
        for k, i in enumerate(idx):
            out[i] = (script, k, idx)
    return out


def sbatch_script(cfg: DictConfig, folder: str = PLAN_FOLDER, run=None) -> str | None:
    """The sbatch script a `-m` run of this config submits; None for a local run. run: the config's run spec
    (train/launch/spec.py) where the caller has it."""
    run = run or of(cfg, folder)
    if not run.slurm:
        return None
    return contract.sbatch_script(run.resources, folder)
