"""A loss spike that does not come down (train/task/divergence.py's rule, run as llm-foundry's `kill_loss_spike`
callback) and what the run does about it: `spike.action` (conf/train.yaml).

- `stop` (the default): the run stops, non-zero, printing the command that continues it from its last good
  checkpoint (train/task/continuation.py: offered).
- `rollback`: the run goes back by itself to its newest verified checkpoint from before the spike began, skips the
  next `spike.skip_batches` batches of data that followed that checkpoint, scales the learning rate by
  `spike.lr_scale` and trains on, in the same process with a fresh trainer (train/task/main.py), at most
  `spike.max_rollbacks` times; past that it stops as `stop` does.

Each intervention is recorded in the save folder (`spike.json`: train/task/interventions.py, written by rank 0 before anything moves), so a start
after a kill or a Slurm requeue in the middle of a rollback finishes it and does not redo or forget it: the
checkpoints written after the rollback point are set aside (never trained on again), and the skip and the learning
rate's scale are applied where the checkpoint of the rollback point is loaded (AFTER_LOAD: `RolledBack`), every
time it is, until the run has a checkpoint past it (whose data position and schedule carry both). Composer writes a
checkpoint's data position from the timestamp's count of samples in the epoch, so the skip moves those counts with
the dataset's position. Rolling back to the same checkpoint again skips the sum of the skips recorded for it, and
scales by the product of their scales.
"""
import json
import logging
import math
import os
import time

from composer.core import Callback, State
from composer.loggers import Logger

from common.paths import is_remote
from train.task.distributed import decided_on_rank_0
from train.task.divergence import Divergence
from train.task.interventions import read, rollbacks
from train.task.interventions import write as _write

log = logging.getLogger(__name__)


class SpikeRule(Callback):
    """kill_loss_spike's behaviour here (common/compat.py builds llm-foundry's class over this one): the rule of
    train/task/divergence.py fed composer's all-reduced training loss at each batch's end, on every rank, with its
    state kept in checkpoints. A spike raises integrity.diverged (marked `spike`), before that batch's checkpoint."""

    def __init__(self, log_only: bool = False, patience: int = 10, outlier_multiplier: float = 3.0,
                 window_size: int = 10, loss_cap: float | None = None):
        Callback.__init__(self)
        self.rule = Divergence({"log_only": log_only, "patience": patience, "outlier_multiplier": outlier_multiplier,
                                "window_size": window_size, "loss_cap": loss_cap})

    def batch_end(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        from train.checkpoint import integrity
        from train.task.run_report import _step

        loss = (state.total_loss_dict or {}).get("loss/train/total")
        if loss is None or not self.rule.feed(int(state.timestamp.batch), float(loss)):
            return
        report = next((cb for cb in state.callbacks if type(cb).__name__ == "RunReport"), None)
        rising = [b for b in getattr(report, "_saved", ()) if b >= self.rule.since]
        if self.rule.log_only:
            if dist.get_global_rank() == 0:
                self.rule.warn_once(_step(state), rising)
            return
        err = integrity.diverged(*self.rule.words(_step(state), rising), bad_from=self.rule.since,
                                 also=self.rule.expected())
        err.spike = {"batch": int(state.timestamp.batch), "loss": float(loss), "window_mean": self.rule.reference,
                     "since": self.rule.since}
        raise err

    def state_dict(self) -> dict:
        return {"rule": json.dumps(self.rule.state())}  # one string: one key in every checkpoint format

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("rule")
        if saved:
            self.rule.restore(json.loads(saved.decode() if isinstance(saved, bytes) else saved))


def roll_back(err, cfg, fcfg) -> bool:
    """After a spike's stop (err, on every rank alike): record it, and, under spike.action=rollback within
    spike.max_rollbacks with a verified checkpoint from before the spike, set aside the checkpoints after that one so
    the next start (a fresh trainer here, or a requeued job) resumes from it. True: train again; False: stop (err's
    words then say why the run did not roll back)."""
    from composer.utils import dist

    from train.checkpoint import resume

    spike = getattr(err, "spike", None)
    if spike is None:
        return False
    folder = fcfg.get("save_folder")
    action, most = str(cfg.spike.action), int(cfg.spike.max_rollbacks)
    local = bool(folder) and not is_remote(folder)
    done = len(rollbacks(read(folder)))  # none where the folder is not local
    point, why = None, None
    if action != "rollback":
        pass
    elif not local:
        why = "spike.action=rollback needs a local save_folder (its checkpoints and spike.json): none here"
    elif done >= most:
        why = f"it rolled back {done} time{'s' * (done != 1)} already (spike.max_rollbacks={most})"
    else:
        before = [c for c in decided_on_rank_0(resume.newest_first, folder) if c.batch < spike["since"]]
        point = next((c for c in before if not resume.differs_everywhere(c)), None)
        if point is None:
            why = f"no verified checkpoint of it comes before the spike began (batch {spike['since']})"
    entry = {**spike, "action": "rollback" if point else "stop", "time": time.time()}
    if point:
        entry.update(checkpoint=str(point.path), resumed_from=point.batch,
                     skip_batches=int(cfg.spike.skip_batches), lr_scale=float(cfg.spike.lr_scale), pending=True)
        hf = (fcfg.get("callbacks") or {}).get("hf_checkpointer")
        if hf and hf.get("save_folder") and not is_remote(str(hf.save_folder)):  # its exports go aside too
            entry["exports"] = os.path.abspath(str(hf.save_folder))
    if dist.get_global_rank() == 0:
        log.warning("loss spike at batch %d (loss %.6g, %.3g times the window mean %.4g, since batch %d): %s",
                    spike["batch"], spike["loss"], spike["loss"] / spike["window_mean"], spike["window_mean"],
                    spike["since"], f"rolling back to {point.path} (batch {point.batch}), skipping the next "
                    f"{cfg.spike.skip_batches} batches of data, learning rate x{cfg.spike.lr_scale:g} (rollback "
                    f"{done + 1} of at most {most})" if point else f"stopping ({why or 'spike.action=stop'})")
        if local:  # recorded before anything moves: a start after a kill here finishes it (finish_pending)
            _write(folder, read(folder) + [entry])
            if point:
                finish_pending(folder)
    dist.barrier()
    if why:
        err.problem += f"; it did not roll back: {why}"
    return point is not None


def finish_pending(folder) -> None:
    """Rank 0, before a start chooses its checkpoint: a rollback recorded but not yet carried out (a kill between
    its record and its moves) sets aside every checkpoint after its point, and every export after it (export=hf:
    sample and evaluate would take the newest, of the training gone back), then is marked done."""
    from pathlib import Path

    from train.checkpoint import resume
    from train.config.storage_args import HF_SUBFOLDER, export_batch

    if not folder or is_remote(folder):
        return
    found = read(folder)
    pending = [i for i in found if i.get("pending")]
    if not pending:
        return
    for entry in pending:
        why = (f"written after batch {entry['resumed_from']}, where the run rolled back to over the loss spike at "
               f"batch {entry['batch']}")
        for ckpt in resume.find(folder):
            if ckpt.batch > entry["resumed_from"]:
                resume.set_aside(ckpt, why)
        for export in sorted(Path(entry["exports"], HF_SUBFOLDER).glob("*")) if entry.get("exports") else ():
            if (export_batch(export) or 0) > entry["resumed_from"]:
                resume.set_aside(resume.Checkpoint(export, 0, export_batch(export), True), why, what="export")
        entry["pending"] = False
    _write(folder, found)


class RolledBack(Callback):
    """Every start: where the checkpoint loaded is a rollback point of the run's record, skip the data recorded for
    it and scale the learning rate, on every rank alike; then log it (the run's log, composer's loggers: MLflow,
    W&B) and record what was skipped and the learning rate now."""

    def __init__(self, folder: str, global_batch_size: int):
        self.folder, self.global_batch_size = folder, int(global_batch_size)

    def after_load(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        found = decided_on_rank_0(read, self.folder)
        at = int(state.timestamp.batch)
        here = [i for i in rollbacks(found) if i.get("resumed_from") == at]
        if not here:
            return
        skip = sum(int(i["skip_batches"]) for i in here)
        scale = math.prod(float(i["lr_scale"]) for i in here)
        t = state.timestamp
        samples = skip * self.global_batch_size
        per_sample = int(t.token_in_epoch) / int(t.sample_in_epoch) if int(t.sample_in_epoch) else 0
        start = int(t.sample_in_epoch)
        dataset = getattr(getattr(state.train_dataloader, "dataset", None), "state_dict", None)
        if dataset is not None:  # a StreamingDataset: its position, as composer would write it
            ds = state.train_dataloader.dataset
            ds.load_state_dict(ds.state_dict(start + samples, True))
        # else composer spins the loader through batch_in_epoch batches itself
        state.timestamp = t.copy(batch_in_epoch=int(t.batch_in_epoch) + skip, sample_in_epoch=start + samples,
                                 token_in_epoch=int(t.token_in_epoch) + round(samples * per_sample))
        lrs, peaks = [], []
        for sched in state.schedulers:
            sched.base_lrs = [b * scale for b in sched.base_lrs]
            peaks += sched.base_lrs
        for opt in state.optimizers:
            for group in opt.param_groups:
                group["lr"] *= scale
                if "initial_lr" in group:
                    group["initial_lr"] *= scale
                lrs.append(group["lr"])
        last = here[-1]
        # base_lr: the rate the schedule now scales (optimizer.lr times the scales): a stop's offered command
        # lowers the rate the run last trained at, not the configured one (train/task/continuation.py)
        last.update(skipped_samples=[start, start + samples], lr=lrs[0] if lrs else None,
                    base_lr=peaks[0] if peaks else None)
        if dist.get_global_rank() == 0:
            _write(self.folder, found)
            log.warning("rolled back to batch %d (%s): skipped %d batches of data (samples %d to %d of the epoch), "
                        "learning rate %s", at, last["checkpoint"], skip, start, start + samples - 1,
                        ", ".join(f"{lr:.6g}" for lr in lrs) or "as loaded")
        logger.log_metrics({"spike/rollbacks": len(rollbacks(found)),
                            "spike/batch": last["batch"], "spike/loss": last["loss"],
                            "spike/window_mean": last["window_mean"], "spike/resumed_from": at,
                            "spike/skip_batches": skip, **({"spike/lr": lrs[0]} if lrs else {})})


def before_the_next_start(fcfg, cfg) -> None:
    """After a rollback, before the fresh trainer: the trackers' runs of the trainer that stopped are ended here (its
    loggers were not closed: it raised), and the choice of tracking run is made again as a start that resumes this
    run's own checkpoint makes it (train/task/tracking.py: the same MLflow run, the same W&B run)."""
    import sys

    from omegaconf import OmegaConf, open_dict

    from train.task import tracking

    if "mlflow" in sys.modules and sys.modules["mlflow"].active_run() is not None:
        sys.modules["mlflow"].end_run()
    if "wandb" in sys.modules and getattr(sys.modules["wandb"], "run", None) is not None:
        sys.modules["wandb"].finish()
    tracking.after_the_trainer()
    configured = OmegaConf.select(cfg, "loggers.mlflow.resume", default=None)
    if OmegaConf.select(fcfg, "loggers.mlflow") is not None and configured is not None:
        with open_dict(fcfg):
            fcfg.loggers.mlflow.resume = configured


def follows(fcfg) -> None:
    """RolledBack on every start of a run with a local save folder (a requeue in the middle of a rollback finds it
    in the record)."""
    from omegaconf import OmegaConf

    folder = fcfg.get("save_folder")
    if not folder or is_remote(folder):
        return
    OmegaConf.update(fcfg, "callbacks.spike_rollback", {"folder": str(folder), "global_batch_size": int(
        fcfg.global_train_batch_size)}, merge=False, force_add=True)


def register() -> None:
    from llmfoundry.registry import callbacks

    if "spike_rollback" not in callbacks:
        callbacks.register("spike_rollback", func=RolledBack)
