"""data_prep's side of the sweep launcher (hydra_plugins/pretrain_launcher/): `python -m data_prep -m
'part=range(0,N)' num_parts=N` sends one job per part, all parts in one Slurm job array (hydra/launcher=htc) or
as processes here (the default, data_prep_local). Resources come from `hydra.launcher.*` (data_prep has no
cluster group). The output does not depend on how the parts ran: the last part to finish merges.
"""
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

STATUS = "python -m data_prep.status"
FAILED_EXIT = 2  # as a plain data_prep run that fails
LOG_TAIL = False  # its errors name the file, the line and the fix: no traceback to read
SHOWN = ("point", "overrides", "job_id", "state", "log", "error")


def points(launcher, job_overrides: list, first: int, sweep_dir: Path) -> list:
    """Every part's config, each checked (the part in range, its settings valid) before any job is submitted;
    the input, tokenizer and out_root were checked once before (data_prep/launch_check.py). Every problem of
    every point is printed at once; then exit 2."""
    from common.compose import sweep_points
    from data_prep.errors import DataPrepError
    from data_prep.settings import settings_from

    out, problems = [], []
    for num, (overrides, cfg) in enumerate(sweep_points(launcher.hydra_context.config_loader, launcher.config,
                                                        sweep_dir)):
        OmegaConf.resolve(cfg)
        try:
            settings_from(cfg)
        except DataPrepError as err:
            problems.append(f"[sweep point #{num}] {err}")
        out.append((overrides, cfg))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(2)
    return out[first:first + len(job_overrides)]


def scheduler(cfg: DictConfig, params) -> str:
    return params["scheduler"]


def waits(cfg: DictConfig, params) -> bool:
    return params["scheduler"] == "local" or bool(params["wait"])


def executor(cfg: DictConfig, params, folder: str):
    import submitit

    from common import host_requeue

    if params["scheduler"] == "local":
        ex = submitit.AutoExecutor(folder=folder, cluster="local")
        ex.update_parameters(name="data_prep", nodes=1, tasks_per_node=1, cpus_per_task=params["cpus_per_task"],
                             timeout_min=params["timeout_min"])
        return ex
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=params["max_num_timeout"])
    ex.update_parameters(
        name="data_prep", nodes=1, tasks_per_node=1, cpus_per_task=params["cpus_per_task"],
        timeout_min=params["timeout_min"], mem_gb=params["mem_gb"], slurm_partition=params["partition"],
        slurm_account=params["account"], slurm_qos=params["qos"], slurm_array_parallelism=params["array_parallelism"],
        slurm_signal_delay_s=params["signal_delay_s"], slurm_setup=list(params["setup"]),
        slurm_srun_args=["--kill-on-bad-exit=1"],
        slurm_teardown=host_requeue.teardown_lines(folder))  # a time-limit requeue, from the host
    return ex


def summary_executor(cfg: DictConfig, params, folder: str):
    import submitit

    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(name="data_prep-summary", nodes=1, tasks_per_node=1, cpus_per_task=1, timeout_min=10,
                         slurm_partition=params["summary_partition"] or params["partition"],
                         slurm_account=params["account"], slurm_qos=params["qos"], slurm_setup=list(params["setup"]))
    return ex


def record(cfg: DictConfig) -> dict:
    from data_prep.settings import settings_from

    return {"split_dir": str(settings_from(cfg).split_dir)}


def columns(point: dict, state: str) -> dict:
    return {}


def heading(manifest: dict) -> str:
    """The dataset: merged (its size), or how many blocks are still missing."""
    import json

    from data_prep.app import missing_blocks
    from data_prep.facts import SUMMARY_FILE

    split_dir = Path(manifest["points"][0]["split_dir"])
    missing = missing_blocks(split_dir)
    if not missing and (split_dir / SUMMARY_FILE).is_file():
        s = json.loads((split_dir / SUMMARY_FILE).read_text())
        return (f"dataset {split_dir}: merged, {s['samples']:,} samples, {s['tokens']:,} tokens from "
                f"{s['docs']:,} documents")
    return (f"dataset {split_dir}: {len(missing)} blocks not complete yet ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''})")


def finish(results: list, rows: list) -> bool:
    """After a waited-for sweep: the merged dataset's summary, as a plain run prints it, or what is missing."""
    import json

    from data_prep.app import missing_blocks
    from data_prep.facts import SUMMARY_FILE
    from data_prep.progress import print_summary

    done = [r.return_value for r in results if r is not None and isinstance(r.return_value, dict)]
    if done:
        split_dir = Path(done[0]["dataset"])
        if not missing_blocks(split_dir):
            print_summary(json.loads((split_dir / SUMMARY_FILE).read_text()))
    elif all(row["state"] == "COMPLETED" for row in rows):
        print("data_prep: every part finished but none merged: run the same command without -m to merge",
              file=sys.stderr)
    return False
