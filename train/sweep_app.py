"""Training's side of the sweep launcher (hydra_plugins/pretrain_launcher/): which points, how each runs, what its
summary row shows. The launcher is the same for data_prep (data_prep/sweep_app.py); these hooks are what differs.

Resources come from each point's own `cluster` group (train/executor.py), so `-m cluster.nodes=1,2` really asks
for 1 and 2 nodes. Light: no torch, no llm-foundry.
"""
from datetime import timedelta
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

STATUS = "python -m train.status"  # how a user follows a sweep of this app
FAILED_EXIT = 1  # a point that did not complete
LOG_TAIL = True  # a failed rank's last log lines beside its error: a training failure may need them
# what a terminal shows (python -m train.status); the summary files hold every column
SHOWN = ("point", "overrides", "job_id", "state", "requeues", "step", "loss", "tokens_per_sec", "mfu", "eta",
         "preflight", "log", "error")


def points(launcher, job_overrides: list, first: int, sweep_dir: Path) -> list:
    """(overrides, resolved config) of each point: the ones the gate composed and checked (train/gate.py), or,
    for a launch the gate did not see, composed here, each resolved while its own Hydra context is set."""
    from common.compose import CHECKED_POINTS, sweep_points

    checked = CHECKED_POINTS.get(str(sweep_dir), [])
    # the gate may have added a point's own run_name (train/identity.py: distinct_names)
    if first == 0 and [o[:len(j)] for (o, _), j in zip(checked, job_overrides)] == job_overrides \
            and len(checked) == len(job_overrides):
        return checked
    out = []
    for overrides, cfg in sweep_points(launcher.hydra_context.config_loader, launcher.config, sweep_dir):
        OmegaConf.resolve(cfg)
        out.append((overrides, cfg))
    return out[first:first + len(job_overrides)]


def scheduler(cfg: DictConfig, params) -> str:
    return "local" if cfg.cluster.name == "local" else "slurm"


def waits(cfg: DictConfig, params) -> bool:
    """A local sweep's tasks are this command's children: it always waits. On Slurm, cluster.wait."""
    return cfg.cluster.name == "local" or bool(cfg.cluster.wait)


def executor(cfg: DictConfig, params, folder: str):
    from train.executor import make_executor

    return make_executor(cfg, folder)


def summary_executor(cfg: DictConfig, params, folder: str):
    """One CPU for a few seconds, in the points' environment (setup lines or container), on
    cluster.summary_partition (default: the points' partition)."""
    import submitit

    from train.executor import env_lines, srun_args

    c = cfg.cluster
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_python="python3" if c.container.image else None)
    ex.update_parameters(
        name=f"{cfg.run_name}-summary", nodes=1, tasks_per_node=1, cpus_per_task=1, timeout_min=10,
        slurm_partition=c.summary_partition or c.partition, slurm_account=c.account, slurm_qos=c.qos,
        slurm_setup=[*env_lines(cfg), *([] if c.container.image else c.setup)], slurm_srun_args=srun_args(cfg))
    return ex


def record(cfg: DictConfig) -> dict:
    """What the status needs of a point besides its job: its shape and folders."""
    c = cfg.cluster
    report = OmegaConf.select(cfg, "callbacks.run_report.folder")
    return {"world_size": c.nodes * c.tasks_per_node, "checkpoint": cfg.save_folder,
            # train/run_report.py writes progress.json, metrics.json and the loss curve there
            "report": report,
            # said once the point is submitted: where what the job is for will be
            **({"note": f"preflight table: {report}/preflight.json (and in its log; `python -m train.status` "
                        "shows the verdict)"} if c.preflight.only else {})}


def columns(point: dict, state: str) -> dict:
    """A point's columns from what its rank 0 wrote (train/run_report.py): progress.json as it trains,
    metrics.json at the end."""
    from common.files import read_json
    from hydra_plugins.pretrain_launcher.outcomes import SLURM_ENDS, existing
    from train.preflight_report import exclusions, latest

    report = Path(point["report"])
    progress, metrics = read_json(report / "progress.json"), read_json(report / "metrics.json")
    done = state == "COMPLETED"
    eta = progress.get("eta_s")
    return {
        "requeues": max(0, int(progress.get("starts", 1)) - 1),  # every start after the first
        "step": progress.get("progress") or ("" if "step" not in progress else f"step {progress['step']}"),
        "loss": progress.get("loss"),  # the mean train loss of the latest progress line
        "final_loss": metrics.get("final_train_loss") if done else None,
        "eval_loss": (metrics.get("final_eval") or {}).get("eval/LanguageCrossEntropy") if done else None,
        "tokens_per_sec": metrics.get("tokens_per_sec") if done else progress.get("tokens_per_sec"),
        "mfu": progress.get("mfu"),
        "eta": "" if eta is None or done or state in SLURM_ENDS else str(timedelta(seconds=int(eta))),
        "world_size": point["world_size"],
        "checkpoint": point["checkpoint"],
        "metrics": existing(report, "metrics.json"),
        "loss_curve": existing(report, "loss_curve.png"),
        # nodes the job's preflight check excluded before it requeued itself (train/preflight.py)
        "excluded": exclusions(str(report)),
        "preflight": latest(str(report)),  # the newest start's verdict and its report file
    }


def heading(manifest: dict) -> str:
    return ""


def finish(results: list, rows: list) -> bool:
    """After a waited-for sweep's summary: the per-node tables of cluster.preflight.only. True if a check failed
    (the command then exits 1)."""
    import sys

    from train.preflight_report import problem_lines, table

    tables = [(f"point #{row['point']} (job {row['job_id']})", r.return_value["preflight"])
              for r, row in zip(results, rows)
              if r is not None and isinstance(r.return_value, dict) and r.return_value.get("preflight")]
    for title, pre in tables:
        print(f"\npreflight, {title}:\n{table(pre)}", flush=True)
    failed = [f"{title}: {line}" for title, pre in tables for line in problem_lines(pre)]
    for line in failed:
        print(f"[preflight] {line}", file=sys.stderr)
    return bool(failed)

