"""What runs inside each task (this process for a plain run, one process per device under `-m`):
distributed environment -> data -> llm-foundry's train()."""
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from train.distributed import export_from_submitit
from train.foundry import foundry_config


def run(cfg: DictConfig) -> dict:
    os.environ.update({k: os.path.expandvars(str(v)) for k, v in cfg.cluster.env.items()})
    dist_env = export_from_submitit()
    if dist_env:
        _leave_signals_to_the_task()
    if cfg.data.kind == "mock":
        from train.mock_data import ensure

        ensure(cfg.variables.data_local, cfg.max_seq_len, cfg.data.train_samples, cfg.data.val_samples)

    fcfg = foundry_config(cfg)
    if dist_env:
        _node_local_cwd(fcfg, dist_env)
    from llmfoundry.command_utils import train

    from train.report import register

    register()
    report = Path(fcfg.callbacks.run_report.folder)
    try:
        train(fcfg).close()
    except ValueError as err:
        if "No training would occur" not in str(err):
            raise
        # the same command again after the run finished: autoresume found the final checkpoint
        print(f"\n{fcfg.run_name} already trained to max_duration={fcfg.max_duration}: nothing to do. "
              f"To train longer raise max_duration (the LR schedule changes with it); to start afresh pass "
              f"another run_name.", file=sys.stderr)
    metrics = _read(report / "metrics.json")
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"\nfinal train loss {metrics.get('final_train_loss')}, "
              f"eval {metrics.get('final_eval')}\n"
              f"checkpoints: {fcfg.save_folder or 'none (checkpoint=none)'}\n"
              f"loss curve:  {report / 'loss_curve.png'}\nmetrics:     {report / 'metrics.json'}",
              file=sys.stderr)
    return metrics


def _leave_signals_to_the_task() -> None:
    """Slurm signals every process of a job step, dataloader workers included. Forked workers inherit
    submitit's USR2 handler and would checkpoint-and-requeue the job a second time, racing the task itself:
    only the task answers."""
    def reset():
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    os.register_at_fork(after_in_child=reset)


def _node_local_cwd(fcfg, env: dict) -> None:
    """composer and llm-foundry sync the ranks of a node through signal files in the working directory,
    named alike on every node: in a directory shared by several nodes they collide. Give each node its own,
    after making the config's relative paths absolute."""
    for key in ("save_folder", "load_path", "variables.data_local", "train_loader.dataset.local",
                "eval_loader.dataset.local", "tokenizer.name"):
        value = OmegaConf.select(fcfg, key)
        relative = isinstance(value, str) and "://" not in value and not os.path.isabs(value)
        if relative and (key != "tokenizer.name" or os.path.exists(value)):  # else a hub name
            OmegaConf.update(fcfg, key, os.path.abspath(value))
    scratch = Path(tempfile.gettempdir()) / f"pretrain-{env['MASTER_PORT']}-node{env['NODE_RANK']}"
    scratch.mkdir(parents=True, exist_ok=True)
    os.chdir(scratch)


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
