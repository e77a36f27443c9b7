"""What runs inside each task (this process for a plain run, one process per device under `-m`):
distributed environment -> data -> llm-foundry's train()."""
import os
import sys
from pathlib import Path

from omegaconf import DictConfig

from train.distributed import export_from_submitit
from train.foundry import foundry_config


def run(cfg: DictConfig) -> dict:
    os.environ.update({k: os.path.expandvars(str(v)) for k, v in cfg.cluster.env.items()})
    export_from_submitit()
    if cfg.data.kind == "mock":
        from train.mock_data import ensure

        ensure(cfg.variables.data_local, cfg.max_seq_len, cfg.data.train_samples, cfg.data.val_samples)

    fcfg = foundry_config(cfg)
    from llmfoundry.command_utils import train

    from train.report import register

    register()
    trainer = train(fcfg)
    report = Path(fcfg.callbacks.run_report.folder)
    metrics = _read(report / "metrics.json")
    trainer.close()
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"\nfinal train loss {metrics.get('final_train_loss')}, "
              f"eval {metrics.get('final_eval')}\n"
              f"checkpoints: {fcfg.save_folder or 'none (checkpoint=none)'}\n"
              f"loss curve:  {report / 'loss_curve.png'}\nmetrics:     {report / 'metrics.json'}",
              file=sys.stderr)
    return metrics


def _read(path: Path) -> dict:
    import json

    return json.loads(path.read_text()) if path.is_file() else {}
