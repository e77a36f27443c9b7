"""A Composer callback that keeps the loss history, logs the run's progress and writes its report:
`metrics.json` (final losses, tokens/s and MFU over the batches, tokens/s over the wall clock) at the end of fit, `loss_curve.png` at every checkpoint and at the
end, and `progress.json` at every progress line (training and evaluation) and checkpoint, in the run's output folder.

progress.json is what `python -m train.status` reads to follow a running sweep without parsing logs: the latest
step, loss, tokens/s, MFU and ETA, when it was written, the job that wrote it and how many times Slurm had requeued
that job when this start began training (SLURM_RESTART_COUNT), and how many starts got to training in this folder.

Progress: one line per `console_log_interval` on global rank 0, through `logging` (stderr and the run's log file):
step/max, the mean loss since the previous line, tokens/s over that stretch's batches (data loading and compute;
evaluations and checkpoints left out), MFU where the device's peak FLOP/s is known, and the ETA from the rate measured since this process's first batch (evaluations and checkpoints
included, since they recur). conf/train.yaml turns composer's own console logger off, so this is the one line
per interval (composer's prints a table per interval, and its progress bar a line per redraw in a log).

The history travels inside checkpoints (state_dict), so a resumed run still reports its whole curve. It is
kept there as one JSON string: torch's distributed checkpoint flattens nested lists and dicts into one key per
leaf, and a fresh callback offering the nested shape would miss those keys at load (a sharded checkpoint
written after an evaluation would not resume). One string is one key in every format and world size.
Registered with llm-foundry's callback registry as `run_report`, so it is configured like any other callback.
"""
import io
import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

from composer.core import Callback, Event, State, Time, TimeUnit
from composer.loggers import Logger
from composer.utils import dist

from common import files
from train.checkpoint import integrity
from train.task import goodput
from train.task.distributed import job_id, requeues

log = logging.getLogger(__name__)


class Manifests(Callback):
    """Placed after composer's CheckpointSaver (RunReport.fit_start appends it): once a checkpoint is complete on
    every rank, its manifest (train/checkpoint/integrity.py). No state of its own in checkpoints."""

    def __init__(self, saver, saves, written=None):
        """written(state): once a checkpoint is complete on every rank (its manifest written)."""
        self.saver, self.saves, self._seen, self.written = saver, saves, self._newest(saver), written
        self._before = None  # the trainer's counts at the start of the batch now training

    @staticmethod
    def _newest(saver):
        # by the newest path, not the count: composer trims saved_checkpoints to save_num_checkpoints_to_keep, so
        # once it has kept that many (the default keeps 10) the count stops growing and no later one would get its
        # manifest
        return saver.saved_checkpoints[-1] if saver.saved_checkpoints else None

    @staticmethod
    def _counts(state: State) -> dict:
        # epochs done, an epoch's last batch counted as ending it: its batch checkpoint comes before composer moves
        # to the next epoch (ep0-ba64, the final one of a 1ep run of 64 batches)
        t, n = state.timestamp, state.dataloader_len
        ended = n is not None and int(t.batch_in_epoch.value) >= int(n.value) > 0
        return {"batch": int(t.batch.value), "sample": int(t.sample.value), "token": int(t.token.value),
                "epoch": int(t.epoch.value) + ended}

    def batch_start(self, state: State, logger: Logger) -> None:
        self._before = self._counts(state)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._after_save(state, Event.BATCH_CHECKPOINT)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        self._after_save(state, Event.EPOCH_CHECKPOINT)

    def _after_save(self, state: State, event: Event) -> None:
        if not self.saves(state, event):
            return
        ckpt = None
        newest = self._newest(self.saver)
        if dist.get_global_rank() == 0 and newest is not None and newest != self._seen:
            saved = Path(newest)
            ckpt = saved.parent if saved.name.startswith("__") else saved  # a sharded folder, or the one file
        self._seen = newest
        # where it stands in batches, samples and tokens, and where the batch that ended at it began: which
        # max_duration it is the end of, in any unit, whatever the batch size was (train/task/main.py)
        stamp = {**self._counts(state), "before": self._before} if self._before else None
        integrity.manifest_collectively(ckpt, dist.get_world_size(), dist.get_global_rank(), stamp)
        if self.written:
            self.written(state)


class RunReport(Callback):
    def __init__(self, folder: str, interval="10ba", peak_flops: float | None = None, save_interval=None,
                 continued_from: str | None = None):
        """interval: console_log_interval (batches or epochs, as composer's console logger takes it);
        peak_flops: the device's dense FLOP/s (cluster.peak_flops), None where unknown (no MFU then);
        save_interval: the checkpoint interval, to redraw the loss curve as each checkpoint is written. A loss that
        spikes and stays up is kill_loss_spike's (train/task/spike.py)."""
        self.folder = Path(folder)
        self.continued_from = continued_from  # `RUN@ba<N>` of a run with continue_from=, else None
        self._saved = []  # the batches of this start's checkpoints (kill_loss_spike names those of a rise)
        self.train = []  # [batch, loss] (loss averaged over ranks)
        self.evals = []  # [batch, {metric: value}]
        self._t0 = self._tok0 = self._done0 = self._s0 = None
        # this process's rates from the end of its first batch (which carries start-up costs): tokens_per_sec
        # over the batches alone (data loading and compute, as the progress lines and composer's
        # throughput/tokens_per_sec count), wall_tokens_per_sec over the wall clock (evaluations and checkpoints in)
        self.tokens_per_sec = self.wall_tokens_per_sec = None
        self.interval = Time.from_input(interval, TimeUnit.EPOCH)
        if self.interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or self.interval.value <= 0:
            raise ValueError(f"console_log_interval must be a positive number of batches or epochs "
                             f"(e.g. 10ba), got {interval}")
        self.peak_flops = float(peak_flops) if peak_flops else None
        self.save_interval = save_interval
        self._saves = None  # composer's own interval rule for checkpoints, when the run writes any
        self._flops_per_token = None
        self._line = None  # (training seconds, tokens, index in self.train) at the previous progress line
        self._train_s = 0.0  # seconds spent in batches (loading and compute), evaluations and checkpoints left out
        self._batch_t = None
        self._status = {}  # progress.json's content (rank 0)
        self._fit_ended = False
        self._clock = None  # rank 0: where this start's time goes, and the run's ledger (train/task/goodput.py)
        self._ledger = None  # rank 0: the run's local save folder, where its interventions are recorded

    def init(self, state: State, logger: Logger) -> None:
        from train.task import shm_registry

        shm_registry.release()  # llm-foundry has built every loader: streaming's registry is written
        _console_tables_to_the_log(logger)

    def fit_start(self, state: State, logger: Logger) -> None:
        from composer.callbacks import CheckpointSaver
        from composer.utils.misc import create_interval_scheduler

        # The same rule composer's CheckpointSaver follows (a separate instance: the rule keeps state), so the
        # curve is redrawn at the batch a checkpoint is written, just before it: a job killed after a checkpoint
        # leaves a picture at least as recent. No saver (checkpoint=none): no redraws until the end.
        savers = [cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)]
        if self.save_interval and savers:
            self._saves = create_interval_scheduler(self.save_interval)  # as the saver: the last batch too
            # after composer's saver (appended last by the trainer): each checkpoint's manifest, once it is complete
            state.callbacks.append(Manifests(savers[0], create_interval_scheduler(self.save_interval),
                                             self._checkpoint_written))
        self._flops_per_token = _flops_per_token(state.model)
        self._started_at = int(state.timestamp.batch)  # where this start resumed (0: from scratch)
        if dist.get_global_rank() == 0:
            before = files.read_json(self.folder / "progress.json")
            # a fresh record: nothing of the previous start's progress line (step, loss, rate, ETA) is shown as this
            # one's. job and requeues say which job wrote it and how many times Slurm had requeued that job when
            # this start began training (SLURM_RESTART_COUNT counts every requeue, also of a start that never got
            # here: one requeued while importing, in its preflight check, loading its checkpoint); the status
            # compares them with Slurm's count now to tell a current record from one a newer start has not
            # replaced yet. starts counts only the starts that got here (in this folder, across jobs).
            ours = before.get("run_name") == state.run_name  # else a folder another run left
            self._status = {"run_name": state.run_name, "starts": (int(before.get("starts", 0)) if ours else 0) + 1,
                            "job": job_id(), "requeues": requeues(),
                            "max_duration": _duration(state.max_duration),
                            **({"continued_from": self.continued_from} if self.continued_from else {})}
            ledger = _ledger_folder(savers, state, self.folder)
            self._ledger = ledger if savers else None  # the run's save folder
            self._clock = goodput.Clock(ledger / goodput.FILE, int(state.timestamp.batch), job_id(),
                                        run_name=state.run_name)
            self._write_status(step=int(state.timestamp.batch), state="training")

    def before_dataloader(self, state: State, logger: Logger) -> None:
        self._batch_t = time.perf_counter()
        if self._clock:
            self._clock.trains(int(state.timestamp.batch))

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._clock:
            self._clock.trained(int(state.timestamp.batch))
        loss = (state.total_loss_dict or {}).get("loss/train/total")
        if loss is not None:
            self.train.append([int(state.timestamp.batch), float(loss)])
            integrity.check_loss(float(loss), _step(state))  # the same all-reduced loss on every rank: all stop
        now, tokens = time.perf_counter(), int(state.timestamp.token)
        if self._batch_t is not None:
            self._train_s += now - self._batch_t
        if self._t0 is None:  # the first batch carries start-up costs; measure from its end
            self._t0, self._tok0, self._done0, self._s0 = now, tokens, _done(state), self._train_s
            # the rate from this batch's end; the mean loss from this start's first batch (its loss included)
            self._line = (self._train_s, tokens, len(self.train) - (loss is not None))
        else:
            if now > self._t0:
                self.wall_tokens_per_sec = (tokens - self._tok0) / (now - self._t0)
            if self._train_s > self._s0:
                self.tokens_per_sec = (tokens - self._tok0) / (self._train_s - self._s0)
        batch = int(state.timestamp.batch)
        at_interval = self.interval.unit == TimeUnit.BATCH and batch % int(self.interval.value) == 0
        if at_interval or _done(state) >= 1.0:
            self._progress(state, now, tokens)
        if self._clock:
            self._clock.write()  # at most every goodput.HEARTBEAT_S between progress lines

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._clock:
            self._clock.enter("other")  # the loader's end ran out of batches
        if self.interval.unit == TimeUnit.EPOCH and int(state.timestamp.epoch) % int(self.interval.value) == 0 \
                and _done(state) < 1.0:  # the last one was logged at its batch
            self._progress(state, time.perf_counter(), int(state.timestamp.token))

    def _progress(self, state: State, now: float, tokens: int) -> None:
        s_line, tok_line, i_line = self._line
        losses = [loss for _, loss in self.train[i_line:]]
        self._line = (self._train_s, tokens, len(self.train))
        if dist.get_global_rank() != 0:
            return
        parts, loss, rate, mfu, eta = [_step(state)], None, None, None, None
        if losses:
            loss = sum(losses) / len(losses)
            parts.append(f"loss {loss:.4f}")
        if self._train_s > s_line:
            rate = (tokens - tok_line) / (self._train_s - s_line)
            parts.append(f"{rate:,.0f} tokens/s")
            mfu = self._mfu(rate)
            if mfu is not None:
                parts.append(f"MFU {100 * mfu:.1f}%")
        done = _done(state)
        if done >= 1.0:
            eta = 0
        elif now > self._t0 and done > self._done0:
            eta = round((1.0 - done) * (now - self._t0) / (done - self._done0))
        if eta is not None:
            parts.append(f"ETA {timedelta(seconds=eta)}")
        log.info("[progress] " + ", ".join(parts))
        self._write_status(step=int(state.timestamp.batch), progress=_step(state), loss=loss, tokens_per_sec=rate,
                           mfu=mfu, eta_s=eta)

    def _mfu(self, tokens_per_sec: float | None) -> float | None:
        """The model FLOPs utilisation of a training rate (all ranks), where the device's peak is known."""
        if not (tokens_per_sec and self.peak_flops and self._flops_per_token):
            return None
        return tokens_per_sec * self._flops_per_token / (self.peak_flops * dist.get_world_size())

    def _write_status(self, **fields) -> None:
        """progress.json (rank 0), replaced whole: the status command never reads half of one."""
        self._status.update({k: v for k, v in fields.items() if v is not None}, updated=time.time())
        if self._clock:  # the run's goodput so far (its ledger written with it)
            self._clock.write(force=True)
            self._status.update(self._clock.account())
        if self._ledger:
            self._status["interventions"] = self._interventions()
        files.cosmetic_write(self.folder / "progress.json", json.dumps(self._status).encode())

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._checkpoint(state, Event.BATCH_CHECKPOINT)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        self._checkpoint(state, Event.EPOCH_CHECKPOINT)

    def _checkpoint(self, state: State, event: Event) -> None:
        """Just before composer's saver writes a checkpoint: weights that are not finite stop the run instead (the
        newest checkpoint stays the last finite one); the loss curve is redrawn."""
        if self._saves is None or not self._saves(state, event):
            return
        integrity.check_weights(state, _step(state))
        self._saved.append(int(state.timestamp.batch))
        if self._clock:
            self._clock.checkpoint(int(state.timestamp.batch), written=False)
        if dist.get_global_rank() == 0:
            self._write_status(step=int(state.timestamp.batch), progress=_step(state))  # a kill after it: this step
            self._plot()
            from train.task.tracking import flush_queued

            flush_queued(_step(state))  # the batches up to this checkpoint in the tracking store before it exists

    def _checkpoint_written(self, state: State) -> None:
        if self._clock:
            self._clock.checkpoint(int(state.timestamp.batch), written=True)

    def eval_before_all(self, state: State, logger: Logger) -> None:
        if self._clock:
            self._clock.enter("eval")

    def eval_after_all(self, state: State, logger: Logger) -> None:
        if self._clock:
            self._clock.enter("other")

    def eval_end(self, state: State, logger: Logger) -> None:
        # composer fires EVAL_END once per evaluator (llm-foundry's eval_loaders, ICL tasks), with the one that just
        # ran as the state's dataloader label; state.eval_metrics also holds the others' metrics, not computed yet
        # in this round (NaN) or left from the one before: only this evaluator's are this evaluation's numbers
        label = state.dataloader_label
        values = {f"{label}/{name}": float(m.compute()) for name, m in state.eval_metrics.get(label, {}).items()}
        self.evals.append([int(state.timestamp.batch), values])
        if dist.get_global_rank() == 0:  # one line per evaluation (composer's console logger is off)
            shown = ", ".join(f"{k} {v:.4f}" for k, v in values.items())
            log.info(f"[progress] eval at {_step(state)}: {shown}")
            self._write_status(step=int(state.timestamp.batch), progress=_step(state))
        if self._fit_ended and dist.get_global_rank() == 0:
            # composer runs the final evaluation after FIT_END: the report's numbers must be the last ones
            self._write_metrics(state)
            self._plot()
        integrity.check_eval(values, _step(state), self._fit_ended, int(state.timestamp.batch))

    def fit_end(self, state: State, logger: Logger) -> None:
        self._fit_ended = True
        if self._clock:
            self._clock.finished()
        if dist.get_global_rank() != 0:
            return
        self._write_metrics(state)
        self._plot()
        self._write_status(state="trained", step=int(state.timestamp.batch), eta_s=0)

    def _write_metrics(self, state: State) -> None:
        """metrics.json (read by summaries and the printed result): written at FIT_END, and again after each
        evaluation composer runs after it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        summary = {
            "run_name": state.run_name,
            # the run this one continued (continue_from=RUN@ba<N>: train/task/continuation.py), where it did
            **({"continued_from": self.continued_from} if self.continued_from else {}),
            "batches": int(state.timestamp.batch),
            "tokens": int(state.timestamp.token),
            "world_size": dist.get_world_size(),
            "final_train_loss": self.train[-1][1] if self.train else None,
            "final_eval": self._final_eval(state),
            "tokens_per_sec": self.tokens_per_sec,  # the batches alone, as the progress lines
            "mfu": self._mfu(self.tokens_per_sec),
            "wall_tokens_per_sec": self.wall_tokens_per_sec,  # evaluations and checkpoints included
            "train_loss": self.train,
            "eval": self.evals,
            "evaluators": _evaluators(state),  # what `python -m train.evaluate RUN` scores
            # ...as this start's evaluations read: those of `eval` past this batch (a start before, at another
            # world size or eval batch size, read other samples)
            "evaluators_since": getattr(self, "_started_at", 0),
            # the share of the run's allocated time that trained, and where the rest went (train/task/goodput.py)
            **(self._clock.account() if self._clock else {}),
            # each loss spike and what was done about it (train/task/spike.py), across the run's starts
            "interventions": self._interventions(),
        }
        files.atomic_write(self.folder / "metrics.json", json.dumps(summary, indent=1).encode())  # read by summaries

    def _interventions(self) -> list:
        from train.task.interventions import shown

        return shown(self._ledger)

    def _final_eval(self, state: State) -> dict:
        """Each of this run's evaluators' last numbers (one evaluator: its last evaluation). An evaluator of an
        earlier start that this run no longer has is history, not a result."""
        labels = {e.label for e in state.evaluators}
        latest = {}
        for _, values in self.evals:
            latest.update(values)
        return {k: v for k, v in latest.items() if k.rsplit("/", 1)[0] in labels}

    def _plot(self) -> None:
        """loss_curve.png, replaced whole: someone looking at a running job's picture never sees half of one."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        if self.train:
            ax.plot(*zip(*self.train), label="train loss")
        curves = {}  # one per evaluator
        for b, m in self.evals:
            for k, v in m.items():
                if k.endswith("LanguageCrossEntropy"):
                    curves.setdefault(k.rsplit("/", 1)[0], []).append((b, v))
        for label, points in curves.items():
            ax.plot(*zip(*points), "o-", label="eval cross-entropy" if len(curves) == 1 else f"{label} cross-entropy")
        ax.set_xlabel("batch")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        files.cosmetic_write(self.folder / "loss_curve.png", png.getvalue())

    def state_dict(self) -> dict:
        return {"history": json.dumps({"train": self.train, "evals": self.evals})}

    def load_state_dict(self, state: dict) -> None:
        history = state["history"]
        history = json.loads(history.decode() if isinstance(history, bytes) else history)
        self.train, self.evals = history["train"], history["evals"]



def _ledger_folder(savers, state: State, report: Path) -> Path:
    """Where the run's time ledger is kept: its local save folder, the one folder all its starts share (a
    requeue, or the same command again under -m, writes its outputs elsewhere); else its report folder."""
    from composer.utils import format_name_with_dist

    local = [s for s in savers if s.remote_uploader is None]
    return Path(format_name_with_dist(local[0].folder, state.run_name)) if local else report


def _duration(total) -> str | None:
    return None if total is None else f"{int(total.value)}{total.unit.value}"  # as written in a config: 60ba


def _done(state: State) -> float:
    """The fraction of max_duration trained, in whatever unit it is given (epochs counted in batches where the
    loader's length is known, so that the ETA moves within an epoch)."""
    total = state.max_duration
    if total is not None and total.unit == TimeUnit.EPOCH and state.dataloader_len:
        return int(state.timestamp.batch) / (int(total.value) * int(state.dataloader_len))
    done = state.get_elapsed_duration()
    return float(done.value) if done is not None else 0.0


def _evaluators(state: State) -> dict:
    """{label: what that evaluator reads and how streaming deals it to the ranks} for each evaluator on a streaming
    dataset (ICL tasks are not). Each rank evaluates its first `batches` batches of its own partition of the split,
    and streaming partitions a split by node (each node its own stretch of it): on two nodes the samples evaluated
    are not the first batches of the split. With these, `python -m train.evaluate RUN` rebuilds the partition with
    streaming's own code and scores exactly the samples this run evaluated, at this world size."""
    from streaming import StreamingDataset

    ranks_per_node = dist.get_local_world_size()
    found = {}
    for evaluator in state.evaluators:
        loader = evaluator.dataloader.dataloader
        ds = getattr(loader, "dataset", None)
        if not isinstance(ds, StreamingDataset):
            continue
        found[evaluator.label] = {
            # a local folder whole: a relative one was read against this run's folder, not evaluate's
            "streams": [{"local": s.local if s.remote else os.path.abspath(s.local), "remote": s.remote,
                         "split": s.split} for s in ds.streams],
            "max_seq_len": getattr(ds, "max_seq_len", None), "batch_size": ds.batch_size,
            "token_encoding_type": getattr(ds, "token_encoding_type", None),  # llm-foundry's text dataset
            "batches": -1 if evaluator.subset_num_batches is None else int(evaluator.subset_num_batches),
            "drop_last": bool(getattr(loader, "drop_last", False)),
            # the epoch streaming drew (epoch_size, a stream's choose, repeat or proportion, by sampling_method)
            # against the split's samples: the same where nothing resampled it
            "epoch_size": int(ds.epoch_size), "samples": int(ds.num_samples),
            "workers": getattr(loader, "num_workers", 0), "nodes": dist.get_world_size() // ranks_per_node,
            "ranks_per_node": ranks_per_node, "num_canonical_nodes": ds.num_canonical_nodes,
            "partition_algo": ds.partition_algo, "batching_method": ds.batching_method, "shuffle": ds.shuffle,
            "shuffle_algo": ds.shuffle_algo, "replication": ds.replication,
            "sequence_id": _sequence_id(loader.collate_fn)}
    return found


def _sequence_id(collate) -> dict:
    """{eos_token_id: N} or {bos_token_id: N} (the loader's dataset keys) when the evaluator's batches carry
    sequence ids (llm-foundry's ConcatenatedSequenceCollatorWrapper, under its token-counting wrapper), else {}: a
    model with attn_uses_sequence_id attends within each document of a sample only with them, so the same samples
    score otherwise without."""
    while collate is not None:
        if hasattr(collate, "split_token_id"):
            return {"bos_token_id" if collate.bos_mode else "eos_token_id": int(collate.split_token_id)}
        collate = getattr(collate, "base_collator", None)
    return {}


def _step(state: State) -> str:
    batch, total = int(state.timestamp.batch), state.max_duration
    if total is not None and total.unit == TimeUnit.BATCH:
        return f"step {batch}/{int(total.value)}"
    if total is not None:  # max_duration in epochs, tokens or samples: that count too
        unit = total.unit.name.lower()
        return f"step {batch}, {unit} {int(state.timestamp.get(total.unit))}/{int(total.value)}"
    return f"step {batch}"


def _flops_per_token(model) -> float | None:
    """Training FLOPs per token of the model being trained, by the formula the plans use (train/plan/estimate.py), so
    the MFU logged here compares with the MFU a plan assumed (cluster.mfu). Read from the built model's config
    (llm-foundry's MPT); None for a model that formula does not describe (no MFU is logged then)."""
    from train.plan.estimate import flops_per_token

    model = getattr(model, "module", model)  # DistributedDataParallel wraps composer's model
    config = getattr(getattr(model, "model", None), "config", None)
    try:
        return float(flops_per_token(config.to_dict()))
    except (AttributeError, KeyError, TypeError):
        return None


def register() -> None:
    from llmfoundry.registry import callbacks

    if "run_report" not in callbacks:
        callbacks.register("run_report", func=RunReport)


def _console_tables_to_the_log(logger: Logger) -> None:
    """composer's console logger (`log_to_console: true`, which llm-foundry's YAMLs set) prints the whole config
    and a table of every metric at each interval, which the progress lines already say: its lines go to the run's
    log file through the logger `composer.console`, shown on the console as the libraries' messages are
    (common/console.py: python_log_level=info, hydra.verbose=[composer]), unless the command line itself asked for
    log_to_console."""
    from composer.loggers import ConsoleLogger

    from common.console import printed_to_the_log

    if any(str(o).lstrip("+~").startswith("log_to_console=") for o in _command_line()):
        return
    for dest in logger.destinations:
        if isinstance(dest, ConsoleLogger):
            dest.stream = printed_to_the_log("composer.console")


def _command_line() -> list:
    """The run's command-line overrides (its sweep point's, in a job); [] outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:  # no Hydra context: a trainer built by a test or another program
        return []
