"""One tracking run (MLflow, W&B) per training run, however often it starts: a Composer callback that makes every
start log the same parameters.

A run resumed by the same command (a requeue, a restart after a crash) continues its tracking run (conf/logger/),
and llm-foundry logs the config again at every start. Two parts of that config differ from start to start: the
checkpoint a start resumes from (train/task/main.py writes it into `load_path`, with `load_weights_only` and
`load_ignore_keys`) and, for `-m` runs submitted again, the sweep folder the run report writes to. MLflow refuses a
parameter whose value changes within a run (and drops the metrics batched with it); a resumed W&B run refuses a
changed config value and fails. So the config is logged with the values the user configured for the former (given
by conf/logger/*.yaml, resolved before the resume point is chosen), and without the latter (nor W&B's local folder,
which follows it).

A start may also differ in how it runs: a resume at another world size (composer's and llm-foundry's rank counts,
gradient accumulation, FSDP settings), another microbatch, a continuation's overrides. A resumed W&B run loads
its config from the server and refuses a changed value (composer updates it without allow_val_change), failing
every start; MLflow refuses it with an error. So the values each key was first logged with in this
tracking run are recorded in the save folder (`tracked-parameters.json`, with the tracking run they belong to); a
later start logs those where its own differ (the tracker keeps the first), and says which.

Registered with llm-foundry's callback registry as `tracking`. Parameters logged by anything else pass unchanged.
"""
import json
import logging
from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger

from common.paths import is_remote
from train.task.distributed import decided_on_rank_0

RECORD = "tracked-parameters.json"

# Folders of the submission a start belongs to (`<outputs>/sweeps/<time>/<point>` for `-m`): where it writes its
# report, and W&B's local files unless WANDB_DIR is set.
PER_SUBMISSION = (("callbacks", "run_report", "folder"), ("loggers", "wandb", "init_kwargs", "dir"))
# How a start finds its tracking run, not what the run trains: a start from batch 0 opens one (`resume: false`), the
# starts that resume it continue it (for_this_training); and where this start loaded its state from (its run's own
# checkpoint, or the other run's it continued): each start's own, which a resumed start would say "differs" every time.
PER_START = (("loggers", "mlflow", "resume"), ("variables", "resumed_from"), ("variables", "continued_from"))


class Tracking(Callback):
    def __init__(self, configured: dict, save_folder: str | None = None, tracker: str | None = None,
                 resumes: bool = True):
        self.configured = dict(configured)  # {key: the value the user configured (None: not set)}
        # the record of the values first logged: in a save folder on a file system here (an object store: none), for
        # a tracking run that every start continues (conf/logger/: `tracker` names it)
        local = save_folder and not is_remote(save_folder)
        continued = resumes not in (None, False, "never")  # W&B's init_kwargs.resume: allow, must, auto
        self.record = Path(save_folder) / RECORD if local and tracker and continued else None
        self.tracker = tracker

    def init(self, state: State, logger: Logger) -> None:
        # INIT runs before composer and llm-foundry log any parameter
        log_hyperparameters = logger.log_hyperparameters

        def same_every_start(parameters: dict) -> None:
            log_hyperparameters(self.stable(parameters))

        logger.log_hyperparameters = same_every_start

    def stable(self, parameters: dict) -> dict:
        out = dict(parameters)
        for key, configured in self.configured.items():
            if key in out:
                if configured is None:
                    del out[key]  # not configured: logged by no start
                else:
                    out[key] = configured
        for path in PER_SUBMISSION + PER_START:
            out = _without(out, path)
        return self._as_first_start(out)

    def _as_first_start(self, out: dict) -> dict:
        """`out` with the value this tracking run first logged for each key where this start's differs (said).
        Each key's first value is recorded as it is first logged (composer and llm-foundry log in several calls):
        its text, as MLflow logs a parameter (str), and its JSON, as W&B keeps a config value; the one its tracker
        compares is logged again. A record of another tracking run (tracked apart, another tracker) starts afresh."""
        from composer.utils import dist

        if self.record is None:
            return out
        try:
            record = json.loads(self.record.read_text())
        except (OSError, ValueError):
            record = {}
        ok = isinstance(record, dict) and record.get("tracker") == self.tracker and isinstance(record.get("values"), dict)
        first = record["values"] if ok else {}
        new = {k: {"text": str(v), "json": json.loads(json.dumps(v, default=str))} for k, v in out.items()
               if k not in first}
        if new and dist.get_global_rank() == 0 and self.record.parent.is_dir():
            from common.files import atomic_write

            run_id = (record.get("run_id") if ok else None) or _mlflow_run_id()
            atomic_write(self.record, json.dumps({"tracker": self.tracker, "values": {**first, **new},
                                                  **({"run_id": run_id} if run_id else {})}, indent=1).encode())
        differ = sorted(k for k, v in out.items() if k in first and str(v) != first[k].get("text"))
        if differ and dist.get_global_rank() == 0:
            logging.getLogger(__name__).warning(
                "tracking: this start's parameters differ from those the tracking run first logged in %s (it resumed "
                "at another world size, microbatch or overrides): the first values are logged again, as the tracker "
                "keeps them (%s)", ", ".join(differ), self.record)
        as_logged = "text" if str(self.tracker).startswith("mlflow") else "json"
        return {**out, **{k: first[k].get(as_logged) for k in differ}}


def _mlflow_run_id() -> str | None:
    """The MLflow run this process logs to (composer's logger started it), or None."""
    import sys

    mlflow = sys.modules.get("mlflow")
    run = mlflow.active_run() if mlflow is not None else None
    return run.info.run_id if run is not None else None


FLUSH_WAIT_S = 30  # what a checkpoint waits for MLflow's queue at the most; the other ranks wait in its save


def flush_queued(step: str = "") -> None:
    """MLflow logs asynchronously (composer's default) and sends its queue every 10 s: a job killed after a
    checkpoint would lose what was queued, batches that its resume, starting at the checkpoint, never trains again,
    so no start would log them (the last steps before the checkpoint missing from the tracker). Called on rank 0
    just before each checkpoint is written (train/task/run_report.py): once a checkpoint exists, its batches are in
    the tracking store. An unreachable server (MLflow retries each request for minutes) costs the checkpoint
    FLUSH_WAIT_S, said, and training goes on: a tracker never stops a training."""
    if _mlflow_run_id() is None:
        return
    import threading

    import mlflow

    sending = threading.Thread(target=mlflow.flush_async_logging, name="mlflow-flush", daemon=True)
    sending.start()
    sending.join(FLUSH_WAIT_S)
    if sending.is_alive():
        logging.getLogger(__name__).warning(
            "tracking: MLflow's queued metrics were not sent within %d s before the checkpoint at %s (is the server "
            "reachable?): training goes on; if this job is killed before they are sent, the batches up to this "
            "checkpoint may be missing from MLflow (metrics.json has them)", FLUSH_WAIT_S, step)


def _without(node: dict, path: tuple) -> dict:
    """`node` less the key at `path`, copied down to it (the dicts given are llm-foundry's logged config)."""
    key, rest = path[0], path[1:]
    if key not in node or (rest and not isinstance(node[key], dict)):
        return node
    out = dict(node)
    if rest:
        out[key] = _without(node[key], rest)
    else:
        del out[key]
    return out


def for_this_training(fcfg, resumed: str | None, cfg=None) -> None:
    """Which tracking run this start logs to. A start that resumes this run's own checkpoint continues the tracking
    run its earlier starts logged to; a start from batch 0 (a new save folder, its checkpoints deleted, killed
    before its first checkpoint) is another training and opens a tracking run of its own. A name alone would give
    both one tracking run: the second training's batches from 1 on logged into the first's history, exit 0, and its
    parameters, where they differ, refused by the tracker.
    - MLflow (`resume: true`): a start from batch 0 opens a new MLflow run of that name; a resumed start continues
      the one whose id its save folder records (tracked-parameters.json, through $MLFLOW_RUN_ID), not composer's
      newest run tagged with the name, which may be another training's (another save folder, $RUN_NAME).
    - W&B (`init_kwargs.id`, `${run_name}` unless set): a start from batch 0 takes the run_name with the time it
      started as its id; a resumed start the id its save folder records.
    The record of the values first logged starts afresh with the training. rank 0 chooses for every rank. Where
    composer's autoresume decides whether a start resumes (a remote save folder), the tracking run is as configured;
    so is one the configuration names (a W&B id set, `init_kwargs.resume: must`, $MLFLOW_RUN_ID), whose record is
    kept."""
    from composer.utils import dist

    wandb_dir = (((fcfg.get("loggers") or {}).get("wandb") or {}).get("init_kwargs") or {}).get("dir")
    if wandb_dir:  # W&B writes a folder it cannot find (WANDB_DIR=/new/folder) to the system's temp folder instead
        Path(wandb_dir).mkdir(parents=True, exist_ok=True)
    if fcfg.get("autoresume") and fcfg.get("save_folder"):
        return  # composer's autoresume decides whether this start resumes (a remote save folder, its own file names)
    save_folder = str(fcfg.get("save_folder") or "")
    record = Path(save_folder) / RECORD if save_folder and not is_remote(save_folder) else None
    load = str(fcfg.get("load_path") or "")
    if not resumed and record is not None and load and not is_remote(load) and not fcfg.get("load_weights_only") \
            and Path(load).resolve().is_relative_to(record.parent.resolve()):
        resumed = load  # its own checkpoint named by hand (autoresume=false load_path=...): this training goes on
    def choose():
        recorded = record if (fcfg.get("callbacks") or {}).get("tracking") is not None else None
        chosen = _choose(fcfg.get("loggers") or {}, resumed, record, recorded, fcfg.get("run_name"),
                         _wandb_id_is_the_run_name(cfg))
        if chosen[1] is not None:  # the MLflow run to continue: one it can continue, or composer's search
            why = _not_continuable(fcfg.loggers.mlflow.get("tracking_uri"), chosen[1])
            if why:
                logging.getLogger(__name__).warning(
                    "tracking: the MLflow run %s this training logged to %s: continuing composer's newest run "
                    "named %s instead (%s)", chosen[1], why, fcfg.get("run_name"), recorded)
                chosen = (chosen[0], None, *chosen[2:])
        return chosen

    mlflow_resume, mlflow_run_id, wandb_id, said = decided_on_rank_0(choose)
    if mlflow_resume is not None:
        fcfg.loggers.mlflow.resume = mlflow_resume
    if mlflow_run_id is not None:
        import os

        os.environ["MLFLOW_RUN_ID"] = mlflow_run_id  # composer's MLflow logger continues exactly that run
        _SET_HERE.append("MLFLOW_RUN_ID")
    if wandb_id is not None:
        fcfg.loggers.wandb.init_kwargs.id = wandb_id
        fcfg.callbacks.tracking.tracker = f"wandb {wandb_id}"
    if said and dist.get_global_rank() == 0:
        logging.getLogger(__name__).info("tracking: %s", said)


_SET_HERE = []  # the environment variables for_this_training set for this start's trainer


def after_the_trainer() -> None:
    """Unset what for_this_training set for this start: the next run in this process (a sweep's next point under
    Hydra's basic launcher) must not continue this one's MLflow run."""
    import os

    while _SET_HERE:
        os.environ.pop(_SET_HERE.pop(), None)


def _not_continuable(tracking_uri, run_id: str) -> str | None:
    """Why MLflow would refuse to continue `run_id` in this store (composer's start_run would raise on rank 0
    alone, the other ranks waiting), or None."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        run = MlflowClient(tracking_uri=tracking_uri).get_run(run_id)
    except MlflowException:
        return "is not in this tracking store (deleted for good, or the store is another)"
    if run.info.lifecycle_stage != "active":
        return f"is {run.info.lifecycle_stage} in MLflow"
    return None


def _wandb_id_is_the_run_name(cfg) -> bool:
    """Whether W&B's id is conf/logger/wandb.yaml's `${run_name}` (an id the user set, even one equal to the
    run_name, is theirs). Without the composed config: judged by the value."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, "loggers.wandb.init_kwargs", default=None) if cfg is not None else None
    if node is None:
        return cfg is None
    return OmegaConf.to_container(node, resolve=False).get("id") == "${run_name}"


def _choose(loggers, resumed, record: Path | None, recorded: Path | None, run_name, wandb_default: bool = True) -> tuple:
    """(MLflow's resume, MLflow's run id, W&B's id, what to say) for this start; None: as configured. `recorded`: the
    record where the Tracking callback keeps the tracking run's name (a W&B id chosen here is found again only
    there); wandb_default: W&B's id is the run_name as conf/logger/wandb.yaml gives it."""
    import os
    import time

    wandb = ((loggers.get("wandb") or {}).get("init_kwargs") or {}) if "wandb" in loggers else None
    by_run_name = (wandb is not None and recorded is not None and wandb_default and wandb.get("id") == run_name
                   and wandb.get("resume") in ("allow", "auto", True))
    new_mlflow_run = ("mlflow" in loggers and bool((loggers.get("mlflow") or {}).get("resume"))
                      and not os.environ.get("MLFLOW_RUN_ID"))
    named = (wandb is not None and not by_run_name) or ("mlflow" in loggers and os.environ.get("MLFLOW_RUN_ID"))
    if not resumed:
        if record is not None and record.exists() and not named:
            record.unlink()  # the values an earlier training's tracking run first logged
        wandb_id = f"{run_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}" if by_run_name else None
        said = [w for w, new in (("a new MLflow run", new_mlflow_run), (f"a new W&B run, id {wandb_id}", wandb_id))
                if new]
        return (False if new_mlflow_run else None), None, wandb_id, (
            f"this start trains from batch 0: {' and '.join(said)}" if said else None)
    try:
        kept = json.loads(recorded.read_text()) if recorded is not None else {}
    except (OSError, ValueError):
        kept = {}
    tracker = kept.get("tracker") if isinstance(kept, dict) else None
    tracker = tracker if isinstance(tracker, str) else ""
    if new_mlflow_run and tracker.startswith("mlflow") and isinstance(kept.get("run_id"), str):
        return None, kept["run_id"], None, f"continuing the MLflow run {kept['run_id']} of this training ({recorded})"
    if by_run_name and tracker.startswith("wandb "):
        wandb_id = tracker.partition(" ")[2]
        return None, None, wandb_id, f"continuing the W&B run {wandb_id} of this training ({recorded})"
    return None, None, None, None


def register() -> None:
    from llmfoundry.registry import callbacks

    if "tracking" not in callbacks:
        callbacks.register("tracking", func=Tracking)
