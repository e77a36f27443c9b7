"""Inside the task: the start of a run with continue_from= (train/config/continuation.py) that has no checkpoint of
its own yet loads the other run's checkpoint, verified as a resume verifies its own, through composer's own load:
`load_path` (converted first into the format this world size reads, beside the new run's save folder: the run
continued is never written), with `load_ignore_keys`:

- `state/schedulers`: composer's schedulers are functions of the batch count and max_duration; left out, the
  scheduler is this command's (its base learning rate, its warmup, its max_duration) read at the checkpoint's batch;
  loaded, its base learning rates would be the other run's (optimizer.lr=1e-12 would go on at the other run's
  rate);
- `state/dataset_state`, where the training data differs: the other run's position in its data means nothing in
  this data, which is read from its beginning (composer would otherwise read through as many batches of it as the
  other run had trained in its epoch, to get there).

What composer cannot be told: the optimizer's param groups come back with the other run's hyperparameters (torch's
`Optimizer.load_state_dict` takes the saved groups' lr, betas, eps, weight decay). ContinuedFrom, a callback of this
start alone, keeps this command's: it reads them before the load and puts them back after it, with the learning rate
of this command's schedule at the checkpoint's batch; with other data it starts the timestamp's counts within the
epoch again, where the data now starts. The moments (Adam's state), the step counts and the batch, sample and token
counts are the checkpoint's.

Later starts of the new run resume from its own checkpoints, as any run does; its identity.json keeps its lineage.
"""
import logging
import shutil
from pathlib import Path

from composer.core import Callback, State
from composer.loggers import Logger

from common.paths import is_remote

log = logging.getLogger(__name__)

CONVERTED = ".continued-from"  # <save_folder>.continued-from/: the other run's checkpoint in this run's format


def converted_folder(save_folder) -> Path:
    folder = Path(str(save_folder))
    return folder.with_name(folder.name + CONVERTED)


def choose(cfg, save_folder, reads_sharded: bool):
    """(the other run's checkpoint to go on from, its lineage record), on every rank: its newest checkpoint (or the
    one at the batch asked) that is complete and matches its manifest (each rank hashing its share, as a resume
    does), or, without a manifest, the CRCs torch wrote into it. A newer one that does not verify is skipped with a
    warning (it is the other run's: nothing is moved there); the one asked by its batch must verify. A start after
    an earlier one that recorded its lineage (killed before its first checkpoint) goes on from the same batch."""
    from composer.utils import dist
    from omegaconf import OmegaConf

    from train.checkpoint import integrity, resume
    from train.checkpoint.integrity import RunStopped
    from train.config.continuation import KEY, parse, spelt
    from train.task.distributed import decided_on_rank_0
    from train.task.interventions import diverging_from

    text = str(cfg.get(KEY))
    asked = parse(text)
    root = OmegaConf.select(cfg, "storage.checkpoint_root", default=None)
    folder = asked.folder(root)
    batch = asked.batch
    if batch is None:  # pinned by an earlier start of this run, where that checkpoint is still there
        earlier = (resume.run_record(save_folder) or {}).get("continued_from") or {}
        if earlier.get("asked") == spelt(text, root) and any(c.batch == earlier.get("batch")
                                                            for c in resume.find(folder)):
            batch = earlier["batch"]
    # by its name alone: not from a checkpoint written after the run's loss began to diverge (checks/continuation.py)
    bad = diverging_from(folder) if batch is None else None
    skipped = []
    for ckpt in [c for c in decided_on_rank_0(resume.newest_first, folder, reads_sharded)
                 if batch in (None, c.batch) and (bad is None or c.batch < bad)]:
        whys = resume.differs_everywhere(ckpt)
        if whys:
            skipped.append((ckpt.path, whys[0]))
            if dist.get_global_rank() == 0:
                log.warning("continue_from: %s does not verify (%s): not continued from; looking at the one "
                            "before it (the run continued is left as it is)", ckpt.path, whys[0])
            continue
        record = integrity.run_of(ckpt.path) or resume.run_record(folder)
        lineage = {"run": record.get("run_name") or folder.name, "folder": str(folder), "batch": ckpt.batch,
                   "checkpoint": str(ckpt.path), "asked": spelt(text, root)}
        return ckpt, lineage, record
    what = f"its checkpoint of batch {batch}" if batch is not None else "any checkpoint of it"
    raise RunStopped(KEY, f"{text}: {what} in {folder} does not verify (" + "; ".join(
        f"{p.name}: {w}" for p, w in skipped) + "): nothing was trained from it",
                     "an intact copy of that run's folder, or another batch of it: continue_from=" +
                     f"{asked.where}@ba<N>")


def in_format(ckpt, reads_sharded: bool, save_folder) -> str:
    """The path to load (rank 0): the checkpoint itself, or its conversion into the format this world size reads,
    written beside this run's save folder (<save_folder>.continued-from/, replaced whole each time)."""
    from train.checkpoint import resume

    if ckpt.sharded == reads_sharded:
        return str(ckpt.path)
    into = converted_folder(save_folder)
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    return resume.in_format(ckpt, reads_sharded, into=into)


def tidy(save_folder) -> None:
    """The conversion, once this run has a checkpoint of its own (rank 0): no later start reads it."""
    into = converted_folder(save_folder)
    if into.is_dir():
        shutil.rmtree(into, ignore_errors=True)


def load_from(fcfg, path: str, lineage: dict, same_data: bool) -> None:
    """The trainer's settings for this start: composer loads `path` whole but the scheduler (and the data position
    where the data differs), ContinuedFrom keeps this command's optimizer settings."""
    from omegaconf import OmegaConf

    from train.checkpoint.integrity import stands_at

    # where the batch that ended at the checkpoint began, as its manifest records it
    before = {key: at[0] for unit, key in (("ba", "batch"), ("sp", "sample"), ("tok", "token"))
              if (at := stands_at(lineage["checkpoint"], unit))}
    fcfg.load_path, fcfg.load_weights_only = path, False
    fcfg.load_ignore_keys = ["state/schedulers"] + ([] if same_data else ["state/dataset_state"])
    OmegaConf.update(fcfg, "callbacks.continued_from", {
        "run": lineage["run"], "batch": lineage["batch"], "same_data": same_data, "before": before or None,
        "converted": path if Path(path).parent.name.endswith(CONVERTED) else None}, merge=False, force_add=True)
    OmegaConf.update(fcfg, "variables.continued_from", path, force_add=True)  # what is logged is what happened
    log.info("continuing %s from batch %d: %s%s", lineage["run"], lineage["batch"], path,
             "" if same_data else " (other data: read from its beginning)")


class ContinuedFrom(Callback):
    """This start only: this command's optimizer settings over the loaded ones (torch's load takes the saved param
    groups'), the learning rate of this command's schedule at the checkpoint's batch, and, with other data, the
    counts within the epoch started again where the new data starts."""

    def __init__(self, run: str, batch: int, same_data: bool = True, before: dict | None = None,
                 converted: str | None = None):
        """before: where the batch that ended at the checkpoint began (its manifest's record), at which composer
        read the schedule for the batch after it; converted: the conversion loaded, removed once the run ends."""
        self.run, self.batch, self.same_data, self.before = run, int(batch), bool(same_data), dict(before or {})
        self.converted = converted
        self._groups = None

    def before_load(self, state: State, logger: Logger) -> None:
        self._groups = [[{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                        for opt in state.optimizers]

    def after_load(self, state: State, logger: Logger) -> None:
        from train.checkpoint.integrity import RunStopped

        at = int(state.timestamp.batch)
        if at != self.batch:
            raise RunStopped("continue_from", f"the checkpoint loaded stands at batch {at}, not at {self.batch} as "
                             f"{self.run}'s was chosen", "run the same command again")
        for opt, groups in zip(state.optimizers, self._groups or ()):
            for group, ours in zip(opt.param_groups, groups):
                group.update(ours)
        # composer steps its schedulers before it counts the batch just trained: the next batch trains at the
        # schedule read where that batch began, so it is read there (the same settings give the other run's own
        # learning rate, and its numbers)
        now = state.timestamp
        state.timestamp = now.copy(batch=self.before.get("batch", at - 1),
                                   sample=self.before.get("sample", int(now.sample) - int(now.sample) // max(1, at)),
                                   token=self.before.get("token", int(now.token) - int(now.token) // max(1, at)))
        lrs = []
        try:
            for sched in state.schedulers:  # this command's, not loaded: its base learning rates are this command's
                for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
                    group["lr"] = base * fn(sched.last_epoch)  # composer's lambdas read the state's timestamp
                    lrs.append(group["lr"])
        finally:
            state.timestamp = now
        if not self.same_data:
            t = state.timestamp
            state.timestamp = t.copy(batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0)
        log.info("continued %s at batch %d: learning rate %s (this command's schedule there)%s", self.run, at,
                 ", ".join(f"{lr:.6g}" for lr in lrs) or "as loaded",
                 "" if self.same_data else "; the data from its beginning")


    def fit_end(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        if self.converted and dist.get_global_rank() == 0:  # the run's own checkpoints are what a start reads now
            shutil.rmtree(Path(self.converted).parent, ignore_errors=True)


def register() -> None:
    from llmfoundry.registry import callbacks

    if "continued_from" not in callbacks:
        callbacks.register("continued_from", func=ContinuedFrom)


# The learning rate the command a stop offers continues under: half the one that went bad (as the logbooks of long
# runs do: lower it, and restart from an earlier checkpoint)
LOWER = 0.5
# Overrides the offered command leaves out: its own name and folder come from its settings, it starts from the
# checkpoint it names, and its learning rate is the lowered one
_DROPPED = ("run_name", "save_folder", "continue_from", "load_path", "load_weights_only", "load_strict_model_weights",
            "load_ignore_keys", "variables.run_name", "optimizer.lr")


def offered(err, cfg, fcfg):
    """A stop whose numbers went bad (integrity.diverged), its fix the exact command that continues the run from its
    last good checkpoint under half the learning rate, as a new run (continue_from=): the command line this run was
    started with (its sweep point's, under -m), the same way. Where it has no good checkpoint (none written before
    the numbers went bad, and none of a run it continued), the command starts afresh under half the learning rate.
    err itself where the command line cannot be told."""
    import shlex

    from omegaconf import OmegaConf

    from train.checkpoint.integrity import diverged

    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra = HydraConfig.get()
        overrides, multirun = list(hydra.overrides.task), hydra.mode == RunMode.MULTIRUN
    except Exception:  # no Hydra context (not started by python -m train)
        return err
    lr = _trained_at(fcfg, OmegaConf.select(fcfg, "optimizer.lr"))
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        return err
    good = last_good(cfg, fcfg, err.bad_from)
    args = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in _DROPPED]
    if good:
        args.append(f"continue_from={good}")
    args.append(f"optimizer.lr={float(f'{lr * LOWER:.4g}'):g}")
    command = " ".join(["python -m train", *(["-m"] if multirun else []), *map(shlex.quote, args)])
    where = (f"from its last good checkpoint ({good})" if good else
             "afresh (no checkpoint was written before its numbers went bad)")
    also = f"{err.also}; " if err.also else ""
    fix = (f"{also}to continue it {where} under half the learning rate it trained at ({lr:.4g} -> {lr * LOWER:.4g}; "
           f"or change the command: a longer scheduler.t_warmup, other data from there), as a new run of its own: "
           f"{command}")
    return diverged(err.key, err.problem, fix, bad_from=err.bad_from, also=err.also)


def _trained_at(fcfg, lr):
    """The learning rate the run last trained at: optimizer.lr, scaled by its rollbacks' spike.lr_scale where it
    rolled back (the newest rollback's rate, train/task/spike.py), so that the offered rate is below what failed."""
    from train.task import interventions

    rates = [i["base_lr"] for i in interventions.rollbacks(interventions.read(fcfg.get("save_folder")))
             if isinstance(i.get("base_lr"), (int, float))]
    return rates[-1] if rates else lr


def last_good(cfg, fcfg, bad_from: int | None) -> str | None:
    """`RUN@ba<N>` of the newest complete checkpoint of this run from before `bad_from` (any, where None), else of
    the checkpoint a run with continue_from= started from; RUN as continue_from= takes it: the name where the folder
    is under the storage's checkpoint root, else the folder's path."""
    from omegaconf import OmegaConf

    from train.checkpoint import resume

    root = OmegaConf.select(cfg, "storage.checkpoint_root", default=None)

    def named(folder: Path) -> str:
        return folder.name if root and folder.parent.resolve() == Path(str(root)).resolve() else str(folder)

    def newest_good(folder) -> str | None:
        for ckpt in resume.newest_first(folder):
            if (bad_from is None or ckpt.batch < bad_from) and resume.problem(ckpt) is None:
                return f"{named(Path(str(folder)))}@ba{ckpt.batch}"
        return None

    folder = fcfg.get("save_folder")
    if not folder or is_remote(folder):
        return None
    own = newest_good(folder)
    lineage = (resume.run_record(folder) or {}).get("continued_from") or {}
    if own or not lineage.get("folder") or lineage.get("batch") is None:
        return own
    # it began from another run's checkpoint: that one, or, where it came after the numbers went bad (the spike
    # began in the run continued), that run's newest from before then
    if bad_from is None or lineage["batch"] < bad_from:
        return f"{named(Path(lineage['folder']))}@ba{lineage['batch']}"
    return newest_good(lineage["folder"])
