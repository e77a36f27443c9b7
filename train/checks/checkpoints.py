"""Rules about the run's checkpoints: that some are kept, that they land before a time limit, that the ones kept fit
on the storage, and which earlier run this command could be continuing.

A run that resumes "from its newest checkpoint" promises nothing if it keeps none, if its job is requeued at its
time limit before the first one is written (it would start again from batch 0 at every requeue), or if the file
system fills halfway through a month. Light: no torch.
"""
import math
import re
from dataclasses import replace
from pathlib import Path

from common.paths import is_remote
from train.checks.core import (
    ERROR,
    WARNING,
    Problem,
    batches_in,
    is_int,
    is_number,
    per_batch,
    same_or_under,
    time_of,
    value,
    zero_interval,
)
from train.checks.foundry_names import OPTIMIZER_DEFAULTS
from train.config.vocab import MPT_VOCAB
from train.plan import estimate


def _saves_checkpoints(cfg) -> bool:
    return bool(value(cfg, "save_folder"))


def _own_names(cfg, ctx):
    """A run resumes, verifies and continues a requeued job from checkpoints of composer's default names alone
    (train/task/main.py): with names of the user's own, composer's autoresume resumes from its `latest` link, and
    nothing continues a requeued job whose autoresume is false."""
    own = [k for k in ("save_filename", "save_latest_filename") if value(cfg, k) not in (None, "")]
    if not own:
        return
    fix = (f"remove it (~{own[0]}): composer's default names (ep{{epoch}}-ba{{batch}}-rank{{rank}}.pt, "
           "ep{epoch}-ba{batch}/) are those a run verifies and resumes from")
    if ctx.slurm and ctx.mode != "run" and not value(cfg, "autoresume"):
        yield Problem(own[0], "names the checkpoints otherwise than composer's defaults, with autoresume=false: a job "
                      "requeued (its time limit, a preemption) would train from batch 0 again, over them", fix)
    else:
        yield Problem(own[0], "names the checkpoints otherwise than composer's defaults: a restart resumes by "
                      "composer's `latest` link, without verifying the checkpoint against its manifest", fix, WARNING)


def keeps_something(cfg, ctx):
    """checkpoint=sharded|full promises a run that can resume: settings that keep nothing are refused."""
    if not _saves_checkpoints(cfg):
        return
    every = value(cfg, "save_interval")
    if zero_interval(every) == "never":  # (0dur: values.numbers)
        yield Problem("save_interval", f"{every!r} writes no checkpoint (composer's interval never fires), while "
                      f"checkpoint={ctx.group('checkpoint')} promises a run that resumes",
                      "a positive interval, e.g. save_interval=1000ba; or checkpoint=none for a run that keeps "
                      "nothing")
    if value(cfg, "save_weights_only") is True and value(cfg, "autoresume"):
        yield Problem("save_weights_only", "true writes checkpoints without the optimizer, scheduler, data position "
                      "or timestamp, which a run cannot resume from: the first restart (a requeue, a preemption, the "
                      "same command again) starts at batch 0 beside them and fails (composer: FileExistsError "
                      "'... may conflict with a future checkpoint of the current run')",
                      "remove it (export=hf writes the weights alone, in a Hugging Face folder, at the end); or "
                      "autoresume=false for a run that is never restarted")
    yield from _ignored_on_save(cfg)
    yield from _own_names(cfg, ctx)
    keep = value(cfg, "save_num_checkpoints_to_keep")
    if keep == 0 and is_int(keep):
        yield Problem("save_num_checkpoints_to_keep", "0 deletes every checkpoint as soon as it is written "
                      "(composer's rotation keeps none), so nothing can be resumed",
                      "keep some: save_num_checkpoints_to_keep=10 (the default), or -1 for all")
    elif keep == 1 and is_int(keep):
        yield Problem("save_num_checkpoints_to_keep", "1 keeps the newest checkpoint alone: if it is found damaged "
                      "when the run resumes (a flipped block, a file cut short), there is none before it to resume "
                      "from, and the run stops", "save_num_checkpoints_to_keep=2 or more (the default is 10)", WARNING)


def _gpu_cluster(ctx, cfg) -> bool:
    """A cluster preset of GPU nodes (ndv5, p5, ...): not this machine, not the loopback CPU cluster."""
    gpus = value(cfg, "cluster.gpus_per_node")
    return ctx.slurm and is_int(gpus) and gpus > 0


def when_saved(schedule: dict, every) -> str:
    """Where the checkpoints of a save_schedule fall, in words: `at batches 20 and 40 (the end)`."""
    at, end = schedule["at"], schedule["end"]
    if not at:
        return f"at the end of every {every} (not known here: {schedule['unknown']})" if schedule["count"] else ""
    about = "about " if schedule["estimated"] else ""
    if len(at) == 1:
        return f"at batch {end:,} (the end) alone"
    more = ", ..." if schedule["before_end"] > len(at) - 1 else ""
    return f"at {about}batches {', '.join(f'{b:,}' for b in at[:-1])}{more} and {end:,} (the end)"


def writes_before_the_end(cfg, ctx):
    """A save_interval that never comes before max_duration (epochs against a run shorter than one, tokens or
    samples beyond the end, `1dur`) keeps the final checkpoint alone: every requeue, preemption or restart begins
    again at batch 0. Refused on a GPU cluster, where that is days of allocations; warned here and on the loopback
    cluster, where short runs are the point."""
    if not _saves_checkpoints(cfg):
        return
    every = value(cfg, "save_interval")
    step_s = estimate.step_seconds(cfg, ctx.world_size(cfg))
    schedule = save_schedule(cfg, step_s)
    if not schedule or schedule["before_end"] != 0 or not schedule["end"]:
        return
    end = schedule["end"]
    epoch = (f"; an epoch is about {schedule['epoch_batches']:,}: {_epoch_batches(cfg)[1]}"
             if schedule["epoch_batches"] else "")
    clock = any((time_of(str(value(cfg, k))) or (0, ""))[1] == "sec" for k in ("save_interval", "max_duration"))
    speed = f" at the plan's {step_s:.3g} s/step" if clock and step_s else ""
    yield Problem("save_interval", f"{every} comes at no batch before max_duration={value(cfg, 'max_duration')} "
                  f"({end:,} batches{epoch}){speed}: the only checkpoint is the final one, so a requeue at a time "
                  "limit, a preemption or the same command after a failure starts again from batch 0",
                  f"a shorter interval, e.g. save_interval={max(1, end // 10)}ba (a checkpoint every tenth of the "
                  "run); or checkpoint=none for a run that keeps nothing",
                  ERROR if _gpu_cluster(ctx, cfg) else WARNING)


def stops_when_it_diverges(cfg, ctx):
    """kill_loss_spike's settings (train/task/divergence.py), which keep a diverged run's weights out of its
    checkpoints, and what a spike does (spike.*, train/task/spike.py): read here, before anything starts, rather than
    when the trainer builds the callback."""
    from train.task.divergence import KEY, problems

    for key, problem, fix in problems(value(cfg, KEY)):
        yield Problem(key, problem, fix)
    spike = value(cfg, "spike") or {}
    action = spike.get("action")
    if action not in ("stop", "rollback"):
        yield Problem("spike.action", f"must be stop or rollback, got {action!r}",
                      "spike.action=stop (exit non-zero, printing the command that continues the run) or "
                      "spike.action=rollback (back to the checkpoint before the spike, skip data, train on)")
    for key, least in (("skip_batches", 0), ("max_rollbacks", 0)):
        v = spike.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            yield Problem(f"spike.{key}", f"must be a whole number, {least} or more, got {v!r}",
                          f"spike.{key}={ {'skip_batches': 200, 'max_rollbacks': 3}[key]} (the default)")
    scale = spike.get("lr_scale")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale <= 1:
        yield Problem("spike.lr_scale", f"must be a number above 0 and at most 1 (the learning rate after a rollback "
                      f"is this times the one before), got {scale!r}", "spike.lr_scale=1.0 (the default) or e.g. 0.5")
    folder = value(cfg, "save_folder")
    if action == "rollback" and value(cfg, KEY) is None:
        yield Problem("spike.action", "is rollback, but callbacks.kill_loss_spike (which finds a spike) is not in "
                      "the run's callbacks", "keep callbacks.kill_loss_spike, or spike.action=stop")
    elif action == "rollback" and not folder:
        yield Problem("spike.action", "is rollback, but the run writes no checkpoints (checkpoint=none) to roll back "
                      "to", "a checkpoint group (checkpoint=sharded), or spike.action=stop")
    elif action == "rollback" and is_remote(folder):
        # a rollback sets aside the checkpoints after its point and records itself beside them (train/task/spike.py):
        # in a folder of this file system; at a spike the run would stop instead
        yield Problem("spike.action", f"is rollback, but save_folder {folder} is in an object "
                      "store: a rollback goes back to a checkpoint in a local (shared) folder",
                      "a save_folder on a file system the nodes share, or spike.action=stop")


# What a resume reads back from a checkpoint (composer's state dict paths): without one, the run goes on from it
# with that part new, a training no uninterrupted run would give.
_RESUMED = ("state/model", "state/optimizers", "state/schedulers", "state/timestamp", "state/dataset_state")
# Paths under each, as composer names them, for patterns written for the leaves (`*exp_avg*` drops Adam's moments)
_LEAVES = {"state/model": ("state/model/model.transformer.wte.weight",),
           "state/optimizers": ("state/optimizers/DecoupledAdamW/state/model.transformer.wte.weight/exp_avg",
                                "state/optimizers/DecoupledAdamW/state/model.transformer.wte.weight/exp_avg_sq",
                                "state/optimizers/DecoupledAdamW/state/model.transformer.wte.weight/step",
                                "state/optimizers/DecoupledAdamW/param_groups/0/lr"),
           "state/schedulers": ("state/schedulers/LambdaLR/base_lrs", "state/schedulers/LambdaLR/last_epoch"),
           "state/timestamp": ("state/timestamp/batch",),
           "state/dataset_state": ("state/dataset_state/train/sample_in_epoch",)}


def _ignored_on_save(cfg):
    """save_ignore_keys (composer's glob patterns of state dict paths left out of every checkpoint) that leave out
    what a resume reads: with state/optimizers left out, a run resumes from its checkpoint with Adam's moments at
    zero and ends at another loss, exit 0."""
    import fnmatch

    patterns = value(cfg, "save_ignore_keys")
    if not patterns or isinstance(patterns, str) or not value(cfg, "autoresume"):
        return
    for pattern in map(str, patterns):
        hit = [p for p in _RESUMED if fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p + "/x", pattern)
               or p.startswith(pattern.rstrip("*/") + "/") or pattern.startswith(p + "/")
               or any(fnmatch.fnmatch(leaf, pattern) for leaf in _LEAVES[p])]
        if hit:
            part = "" if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p + "/x", pattern) for p in hit) \
                else "part of "
            yield Problem("save_ignore_keys", f"{pattern!r} leaves {part}{', '.join(hit)} out of every checkpoint, which "
                          "a run resumes from: each restart (a requeue, a preemption, the same command again) goes "
                          "on with that part new, unlike the uninterrupted run",
                          "remove it (export=hf writes the weights alone at the end); or autoresume=false for a "
                          "run that is never restarted")
        elif pattern.startswith(("state", "rng")) or pattern.startswith("*"):
            yield Problem("save_ignore_keys", f"{pattern!r} leaves part of the state out of every checkpoint: a "
                          "restart goes on without it" + (" (other random draws than the uninterrupted run)"
                                                          if pattern.startswith("rng") else ""),
                          "remove it unless that part is meant to start afresh at every restart", WARNING)


def lands_before_the_time_limit(cfg, ctx):
    """On Slurm a job is requeued at its time limit and resumes from its newest checkpoint: one that has written
    none by then starts again from batch 0, every time."""
    if not (ctx.slurm and _saves_checkpoints(cfg)):
        return
    every, limit = value(cfg, "save_interval"), value(cfg, "cluster.timeout_min")
    time = time_of(every)
    if not (time and time[0] and is_number(limit) and limit > 0):
        return
    if time[1] == "sec":  # a wall-clock interval (save_interval=3h) needs no throughput to compare
        if time[0] > limit * 60:
            yield Problem("save_interval", f"{every} ({time[0] / 3600:.1f} h) is longer than cluster.timeout_min="
                          f"{limit} ({limit / 60:.1f} h): each allocation would end before its first checkpoint, "
                          "and every requeue would start again from the same point",
                          f"save_interval={int(limit * 0.8 * 60)}sec (about 80% of the time limit), or a longer "
                          "cluster.timeout_min", WARNING)
        return
    steps = batches_in(cfg, every)  # 8388608000tok is as many batches as 2000ba
    step_s = estimate.step_seconds(cfg, ctx.world_size(cfg))
    if not steps or not step_s:
        return
    first = steps * step_s
    if first > limit * 60:
        fits = max(1, int(limit * 60 * 0.8 / step_s))
        yield Problem("save_interval", f"{every} ({steps} batches) is about {first / 3600:.1f} h at the plan's "
                      f"{step_s:.1f} s/step, longer than cluster.timeout_min={limit} ({limit / 60:.1f} h): each "
                      "allocation would end before its first checkpoint, and every requeue would start again from "
                      "the same point", f"save_interval={fits}ba (about 80% of the time limit), or a longer "
                      "cluster.timeout_min", WARNING)


def ends_within_its_requeues(cfg, ctx):
    """A job runs cluster.max_num_timeout + 1 allocations of cluster.timeout_min at most (each time limit requeues
    it until then): a run longer than that at the plan's speed stops at its last time limit, its point TIMEOUT,
    with no word before."""
    if not (ctx.slurm and _saves_checkpoints(cfg)):
        return
    limit, requeues = value(cfg, "cluster.timeout_min"), value(cfg, "cluster.max_num_timeout")
    if not (is_number(limit) and limit > 0 and isinstance(requeues, int) and requeues >= 0):
        return
    steps = batches_in(cfg, value(cfg, "max_duration"))
    step_s = estimate.step_seconds(cfg, ctx.world_size(cfg))
    if not steps or not step_s:
        return
    folder = value(cfg, "save_folder")
    if folder and not is_remote(folder):  # a run that resumes has only the rest to train
        from train.checkpoint.resume import find

        done = find(folder)
        steps -= done[-1].batch if done else 0
    need, budget = steps * step_s, (requeues + 1) * limit * 60
    if need > budget:
        enough = math.ceil(need / (limit * 60 * 0.9))  # allocations, each losing some time to starting and saving

        def span(seconds):
            return f"{seconds / 86400:.1f} days" if seconds >= 2 * 86400 else f"{seconds / 3600:.1f} h"

        yield Problem("cluster.max_num_timeout", f"{requeues} requeues after the first allocation: {requeues + 1} x "
                      f"{limit / 60:g} h = {span(budget)}, and the {steps} batches to max_duration take about "
                      f"{span(need)} at the plan's {step_s:.3g} s/step: the job would stop at its last time limit "
                      "before the end (the same command again goes on from its checkpoint)",
                      f"cluster.max_num_timeout={enough - 1}, or more nodes", WARNING)


def outlives_the_node(cfg, ctx):
    """A Slurm job is requeued (at its time limit, on preemption, by the host-side requeue) onto whichever nodes
    are free, and resumes from the checkpoints in save_folder: under a folder each node has its own of (/tmp),
    the new nodes find none, and the run trains again from batch 0 as if it were new."""
    if not (ctx.slurm and _saves_checkpoints(cfg)):
        return
    folder = str(value(cfg, "save_folder"))
    local = [str(p) for p in value(cfg, "cluster.node_local") or ()]
    under = next((p for p in local if same_or_under(folder, p)), None) if not is_remote(folder) else None
    if under:
        yield Problem("save_folder", f"{folder} is under {under}, which each node of cluster={ctx.group('cluster')} "
                      "has its own of (cluster.node_local): a requeued job on other nodes would find no checkpoint "
                      "and train again from batch 0" + (", and each node would keep only its own ranks' shards"
                      if value(cfg, "cluster.nodes") != 1 else ""),
                      "a storage preset on a shared file system (storage=amlfs, fsx, blob), or storage.checkpoint_root="
                      "<a folder every node mounts>", WARNING)


def _epoch_batches(cfg) -> tuple[int | None, str]:
    """(batches in one epoch of the train split, what that comes from), or (None, why it cannot be told here). The
    loader deals whole global batches (drop_last, as llm-foundry's recipes) or one part batch more at the end."""
    gbs = value(cfg, "global_train_batch_size")
    if not is_int(gbs) or gbs <= 0:
        return None, "global_train_batch_size is not a number"
    if value(cfg, "data.kind") == "mock":
        samples, source = value(cfg, "data.train_samples"), "data.train_samples"
    else:
        from data_prep.facts import samples_in
        from train.config.loaders import mds_sources

        sources = [s for s in mds_sources(cfg) if s.loader == "train_loader"]
        if len(sources) != 1 or not sources[0].local or is_remote(sources[0].local):
            return None, "an epoch's batches: the train split is not in one local folder (train_loader.dataset.local)"
        folder = sources[0].folder
        samples, source = samples_in(folder), f"{folder}/index.json"
        if samples is None:
            return None, f"an epoch's batches: no readable {folder}/index.json here"
    if not is_int(samples) or samples <= 0:
        return None, f"an epoch's batches: {source} is {samples!r}"
    whole = value(cfg, "train_loader.drop_last") is not False
    batches = samples // gbs if whole else -(-samples // gbs)
    return batches, f"{source}={samples} samples / global_train_batch_size={gbs}" if source == "data.train_samples" \
        else f"{samples} samples in {source} / global_train_batch_size={gbs}"


_NO_SPEED = "a wall-clock time's batches: the speed (no cluster.peak_flops and cluster.mfu)"


def save_schedule(cfg, step_s: float | None = None) -> dict | None:
    """When composer's CheckpointSaver writes this run's checkpoints, in batches, whatever save_interval's unit:
    at each batch that carries the count (batches, samples, tokens; wall-clock seconds at step_s a batch, an
    estimate) past a multiple of the interval, at each interval's epoch end, at each multiple of the fraction of
    max_duration (`dur`), and once more at the end of training (composer's include_end_of_training). None without a
    save folder. Otherwise {"count" (to max_duration, the end's included), "before_end", "end" (max_duration's
    batch), "at" (the first few checkpoints' batches and the end's), "every_batches", "epoch_batches", "estimated",
    "unknown" (why the batches cannot be told here, else None)}; a figure not known is None."""
    if not _saves_checkpoints(cfg):
        return None
    every, duration = value(cfg, "save_interval"), value(cfg, "max_duration")
    out = {"count": None, "before_end": None, "end": None, "at": None, "every_batches": None, "epoch_batches": None,
           "estimated": False, "unknown": None}
    save, total = time_of(str(every)) if every is not None else None, time_of(str(duration))
    if save is None or total is None or save[1] not in ("ba", "sp", "tok", "ep", "dur", "sec") \
            or total[1] not in ("ba", "sp", "tok", "ep", "sec"):
        out["unknown"] = f"save_interval={every} or max_duration={duration} is not a time read here"
        return out
    if save[0] <= 0:
        return out  # keeps_something refuses it
    epoch = why_epoch = None
    if "ep" in (save[1], total[1]):
        epoch, why_epoch = _epoch_batches(cfg)
        out["epoch_batches"], out["estimated"] = epoch, epoch is not None
    if save[1] == total[1] == "ep" and epoch is None:  # counted in epochs: the batches need the data set's size
        n, k = total[0], save[0]
        out.update(count=n // k + (n % k != 0), before_end=(n - 1) // k, unknown=why_epoch)
        return out
    # max_duration's batch, as composer stops: the first batch that reaches it
    if total[1] == "ep":
        end = total[0] * epoch if epoch else None
    elif total[1] == "sec":
        end = math.ceil(total[0] / step_s) if step_s else None
        out["estimated"] = True
    else:
        end = batches_in(cfg, duration)
    if not end:
        out["unknown"] = (why_epoch if total[1] == "ep" else _NO_SPEED if total[1] == "sec"
                          else f"max_duration={duration} in batches")
        return out
    # the interval as (its amount, the same unit's amount a batch adds), as composer compares counts
    n, unit = save
    if unit == "dur":  # a fraction of max_duration, counted in max_duration's unit (batches for epochs)
        if total[1] in ("ba", "ep", "sec"):
            interval, per = math.ceil(n * end), 1
        else:
            interval, per = math.ceil(n * total[0]), per_batch(cfg, total[1])
    elif unit == "ep":
        interval, per = (n * epoch, 1) if epoch else (None, None)
        if not epoch:
            out["unknown"] = why_epoch
    elif unit == "sec":
        interval, per = n, step_s
        out["estimated"] = True
        if not step_s:
            out["unknown"] = _NO_SPEED
    else:
        interval, per = n, per_batch(cfg, unit)
        if not per:
            out["unknown"] = f"how many {unit} a batch holds"
    out["end"] = end
    if not interval or not per:
        return out
    fired = end if interval <= per else math.floor(end * per / interval)  # at batches 1..end
    at_end = math.floor(end * per / interval) != math.floor((end - 1) * per / interval)
    before = fired - at_end
    first = [j if interval <= per else math.ceil(j * interval / per) for j in range(1, min(3, before) + 1)]
    out.update(count=before + 1, before_end=before, at=[*first, end], every_batches=round(interval / per, 2))
    return out


def checkpoints_kept(cfg, peak: bool = False, step_s: float | None = None) -> tuple[int | None, int | None]:
    """(how many checkpoints stay on disk at max_duration, their bytes), or None where it cannot be told. peak:
    at the worst moment instead: composer writes a new checkpoint before it deletes the oldest one kept. step_s:
    seconds a batch, for a wall-clock save_interval."""
    from omegaconf import OmegaConf

    if not _saves_checkpoints(cfg):
        return 0, 0
    written = save_schedule(cfg, step_s)["count"]  # the last one at max_duration too
    keep = value(cfg, "save_num_checkpoints_to_keep")
    if not written or not is_int(keep):
        return None, None
    kept = written if keep < 0 else min(keep + (1 if peak else 0), written)
    params = estimate.param_count(OmegaConf.to_container(value(cfg, "model"), resolve=True))
    return kept, kept * estimate.checkpoint_bytes(params)


def free_bytes(cfg) -> tuple[str | None, int | None]:
    """(the storage root, its free bytes) where it is on this node; (root, None) where it is not."""
    from common.files import free_bytes as free_on

    root = value(cfg, "storage.root")
    if not root:
        return None, None
    if value(cfg, "storage.mounts") and not Path(str(root)).exists():
        return str(root), None  # a mounted storage, not on this node
    from common.paths import unwritable

    if unwritable(root):
        return str(root), None  # no folder can be made there (a file, /proc): values.storage_root says so
    return str(root), free_on(root)  # a local root is made on the first run: its parent's file system counts


def _bytes_in(folder) -> int:
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def fits_on_the_storage(cfg, ctx):
    """The checkpoints kept to max_duration must fit in what is free (plus what this run's own folder already
    holds: it prunes its oldest as it goes). A full file system stops a run at a checkpoint, days in."""
    folder = value(cfg, "save_folder")
    if not folder or is_remote(folder):
        return
    try:
        kept, need = checkpoints_kept(cfg, peak=True)
    except (TypeError, ValueError, KeyError):
        return
    root, free = free_bytes(cfg)
    if not need or free is None:
        return
    have = free + _bytes_in(folder)
    if need > have:
        keep = value(cfg, "save_num_checkpoints_to_keep")
        # room for `fewer` kept plus the next one written; under 1 none can be kept (-1 would keep every one)
        fewer = int(have // (need // kept)) - 1 if kept else 0
        fix = (f"keep fewer (save_num_checkpoints_to_keep={fewer}, now {keep}), a longer save_interval, or "
               if fewer >= 1 else "not one checkpoint fits beside the next: ") + "a storage with room (storage.root=...)"
        yield Problem("save_num_checkpoints_to_keep",
                      f"{kept} checkpoints on disk at once (save_num_checkpoints_to_keep={keep}, and the next "
                      f"one written before the oldest is deleted) need {estimate.size_words(need)}, and {root} has {estimate.size_words(have)} "
                      f"free for them: the run would stop when the file system fills", fix,
                      WARNING if ctx.mode == "plan" else ERROR)


def earlier_runs(cfg, ctx):
    """A command whose run is new, beside a run of the same model on the same data: say which, what differs, and
    how to continue it (a changed setting would otherwise start a new run from step 0 beside weeks of work)."""
    folder, root = value(cfg, "save_folder"), value(cfg, "storage.checkpoint_root")
    from train.config.identity import label

    model = label(ctx.choices) if ctx.choices.get("model") or ctx.choices.get("yaml") else None
    if not folder or not root or not model or is_remote(folder) or ctx.given("run_name") \
            or value(cfg, "continue_from"):  # a continuation says what it starts from (train/checks/continuation.py)
        return
    from train.checkpoint.resume import find
    from train.config.identity import identity, same_model_and_data

    if find(folder):
        return  # this run resumes
    name = str(value(cfg, "run_name"))
    near = []
    # the same training under another name first (a sweep point named apart from another that trained the same
    # thing: train/config/identity.py, distinct_names), then the nearest
    found = sorted(same_model_and_data(root, name, model, identity(cfg)), key=lambda f: bool(f[1]))
    for other, differs in found[:3]:
        newest = find(Path(root) / other)
        where = f"checkpoints up to batch {newest[-1].batch}" if newest else "no checkpoint yet"
        if not differs:
            near.append((other, f"{other} trains the same ({where}: named apart by a sweep of points that train "
                                "the same thing)"))
            continue
        shown = "; ".join(f"{k}: {theirs!r} there, {ours!r} here" for k, (theirs, ours) in list(differs.items())[:4])
        more = f" (and {len(differs) - 4} more)" if len(differs) > 4 else ""
        near.append((other, f"{other} trains {model} on the same data ({where}) and differs in {shown}{more}"))
    if near:
        start = f"from {value(cfg, 'load_path')}" if value(cfg, "load_path") else "from step 0"
        yield Problem("run_name", f"{name} {NEW_RUN} ({start}), but " + "; and ".join(said for _, said in near),
                      f"to continue {near[0][0]} under this command's settings instead, add run_name={near[0][0]}; "
                      "to start afresh, nothing to do", WARNING)


NEW_RUN = "is a new run"  # earlier_runs' words: said once per command (train.checks.validate)


def said_once(problems: list) -> list:
    """earlier_runs' warnings of a command's points as one: the first point's, naming the others (a 2-point sweep
    beside two earlier runs would say four), and none where the command is refused (an error is what to read then)."""
    near = [p for p in problems if p.level == WARNING and p.key.endswith("run_name") and f" {NEW_RUN} (" in p.problem]
    if not near or (len(near) == 1 and not any(p.level == ERROR for p in problems)):
        return problems
    rest = [p for p in problems if p not in near]
    if any(p.level == ERROR for p in rest):
        return rest
    points = [p.key.split("]")[0].lstrip("[") for p in near[1:] if p.key.startswith("[")]
    also = f" (so are {', '.join(points)}: the same model on the same data)" if points else ""
    return [*rest, replace(near[0], problem=near[0].problem + also)]


# Settings that change the shapes or names of a model's weights: a checkpoint of one does not load into the other
# (torch refuses missing or differently sized weights, and leaves out without a word those the model lacks:
# `+model.no_bias=true` on a run with biases resumes and trains on, exit 0). Checked against llm-foundry's MPT in
# tests/test_foundry_names.py.
SHAPE_KEYS = ("model.name", "model.d_model", "model.n_layers", "model.vocab_size", "model.expansion_ratio",
              "model.no_bias", "model.learned_pos_emb", "model.tie_word_embeddings", "model.ffn_config.ffn_type",
              "model.ffn_config.ffn_hidden_size", "model.attn_config.attn_type", "model.attn_config.qk_ln",
              "model.attn_config.qk_gn", "model.attn_config.fused_qkv", "model.norm_type",
              "model.attn_config.kv_n_heads")


# What an MPT takes for a shape key its config leaves out (llm-foundry's MPTConfig and its attn_config and
# ffn_config defaults; tests/test_foundry_names.py compares them): a run that never named no_bias trains biases.
# ffn_hidden_size has none (expansion_ratio x d_model): a record that lacks it is compared by those two.
MPT_SHAPE_DEFAULTS = {"model.d_model": 2048, "model.n_layers": 24, "model.vocab_size": MPT_VOCAB,
                      "model.expansion_ratio": 4, "model.no_bias": False, "model.learned_pos_emb": True,
                      "model.tie_word_embeddings": True, "model.ffn_config.ffn_type": "mptmlp",
                      "model.attn_config.attn_type": "multihead_attention", "model.attn_config.qk_ln": False,
                      "model.attn_config.qk_gn": False, "model.attn_config.fused_qkv": True,
                      "model.n_heads": 16, "model.norm_type": "low_precision_layernorm"}
_UNSET = object()  # a key neither named nor defaulted: not compared


def other_shape(theirs: dict, ours: dict) -> str:
    """The model settings of two identities that make their weights of other shapes, as `key=a there, b here`;
    "" when none does. A key one of them leaves out is MPT's default for both MPTs (a record holds every model key
    its run's config had: `+model.no_bias=true` on a run that left it out is a change); otherwise only keys
    both name are compared."""
    mpt = theirs.get("model.name") == ours.get("model.name") == "mpt_causal_lm"
    defaults = MPT_SHAPE_DEFAULTS if mpt else {}
    theirs, ours = (_as_built(i, defaults) if mpt else i for i in (theirs, ours))
    from train.config.hf_arch import shape_keys  # a Hugging Face architecture's: its config_overrides that size it

    return _differing((*SHAPE_KEYS, *shape_keys(theirs, ours)), theirs, ours, defaults)


def _differing(keys, theirs: dict, ours: dict, defaults: dict, unknown=_UNSET) -> str:
    """`key=a there, b here` for each of keys the two identities hold other values of, a key one leaves out taken
    at its default (where it has none: `unknown`, not compared by default)."""
    changed = []
    for k in keys:
        there, here = theirs.get(k, defaults.get(k, unknown)), ours.get(k, defaults.get(k, unknown))
        if there is not _UNSET and here is not _UNSET and there != here:
            changed.append(f"{k}={there!r} there, {here!r} here" + _WHY.get(k, ""))
    return "; ".join(changed)


_WHY = {"model.learned_pos_emb": " (MPT drops its position embeddings where attn_config.alibi or rope is on)",
        "model.attn_config.kv_n_heads": " (kv_n_heads heads of d_model/n_heads each: n_heads of them with "
                                        "multihead_attention, 1 with multiquery)"}

# Settings that keep every weight's size but change what the weights compute: a checkpoint loads into a model of
# other values without a word and trains on from another function (model.n_heads=8 on a run trained with 4 heads
# of multihead attention splits the same weights into twice the heads).
FUNCTION_KEYS = ("model.n_heads", "model.ffn_config.ffn_act_fn.name", "model.attn_config.softmax_scale",
                 "model.attn_config.rope_theta", "model.attn_config.alibi_bias_max", "model.logit_scale")
# what MPT takes for those it leaves out (its FFN's activation when ffn_act_fn is not given: llm-foundry's ffn.py)
FUNCTION_DEFAULTS = {"model.ffn_config.ffn_act_fn.name": "gelu"}
# read only where the position scheme they tune is on
_ONLY_WITH = {"model.attn_config.rope_theta": "model.attn_config.rope",
              "model.attn_config.alibi_bias_max": "model.attn_config.alibi"}


def other_function(theirs: dict, ours: dict) -> str:
    """The settings of two identities of one shape under which the same weights compute something else, as
    other_shape says them ("" when none differs); a key one of them leaves out is MPT's default where it has one."""
    mpt = theirs.get("model.name") == ours.get("model.name") == "mpt_causal_lm"
    defaults = {**MPT_SHAPE_DEFAULTS, **FUNCTION_DEFAULTS} if mpt else {}
    keys = [k for k in FUNCTION_KEYS if k not in _ONLY_WITH or theirs.get(_ONLY_WITH[k]) or ours.get(_ONLY_WITH[k])]
    return _differing(keys, theirs, ours, defaults)


def _as_built(ident: dict, defaults: dict) -> dict:
    """An MPT identity's shape keys as MPTConfig builds them, where it derives one from others: alibi=true
    on a run with learned position embeddings would resume without them (those weights dropped, exit 0), and
    norm_type=rmsnorm without the norms' biases. A norm is compared by its weights: the layer norms have a bias
    (unless no_bias), the RMS norms none."""
    get = lambda k: ident.get(k, defaults.get(k))  # noqa: E731
    # what train/plan/estimate.py reads of a model config, from the identity's keys
    model = {k: get(f"model.{k}") for k in ("n_heads", "learned_pos_emb", "norm_type")}
    model["attn_config"] = {k: get(f"model.attn_config.{k}") for k in ("attn_type", "kv_n_heads", "alibi", "rope")}
    built = dict(ident)
    built["model.learned_pos_emb"] = estimate.learned_positions(model)
    biased = not get("model.no_bias") and estimate.norm_bias(model)
    built["model.norm_type"] = "a norm with weights and biases" if biased else "a norm with weights alone"
    heads, width, kv = get("model.n_heads"), get("model.d_model"), estimate.kv_heads(model)
    # the attention's weights are n_heads query heads and kv key/value heads of head_dim each (d_model/n_heads
    # unless model.head_dim says): with multihead attention and no head_dim, d_model wide whatever n_heads is
    # (another n_heads splits the same weights otherwise: other_function); qk_gn's norms are head_dim wide
    sized = all(isinstance(x, int) and x > 0 for x in (kv, heads, width)) and width % heads == 0
    head = ident.get("model.head_dim") or (width // heads if sized else None)
    if sized and isinstance(head, int):
        built["model.attn_config.kv_n_heads"] = (f"queries {heads * head} wide, keys and values {kv * head} wide"
                                                 + (f", q/k norms {head} wide" if get("model.attn_config.qk_gn")
                                                    else ""))
    else:
        built["model.attn_config.kv_n_heads"] = kv
    return built


def named(cfg, ctx) -> bool:
    """The run's name is the user's: run_name= on the command line, or set in a YAML (`run_name: my-run`,
    `variables.run_name: my-run`, as llm-foundry's YAMLs name runs), not the one made from what it trains
    (`<model or yaml stem>-<8 hex>`, train/config/identity.py)."""
    from train.config.identity import label

    made = re.escape(label(ctx.choices)) + r"-[0-9a-f]{8}"
    return bool(ctx.given("run_name")) or not re.fullmatch(made, str(value(cfg, "run_name")))


def continued_run(cfg, ctx):
    """run_name=<a run with checkpoints> (or its save_folder, given here or fixed in a YAML) continues it from its
    newest checkpoint under this command's settings, as asked (earlier_runs suggests it) and as composer's
    autoresume does: but a model of another shape cannot load it (a KeyError traceback after the queue, having
    rewritten the run's record). A save_folder fixed in a YAML (not asked for on the command line) is shared by
    every variant of it: one would continue another's run without a word; other settings are said there, key by key."""
    folder = value(cfg, "save_folder")
    fixed = folder != value(cfg, "checkpoint.folder")  # not the checkpoint group's folder of this run's name
    if not folder or not (named(cfg, ctx) or fixed) or is_remote(folder):
        return
    from train.checkpoint.resume import find, run_record
    from train.config.identity import identity, spelt_once

    found, theirs = find(folder), run_record(folder).get("identity")
    if not found or not isinstance(theirs, dict):
        return
    theirs = spelt_once(theirs)  # as this rule spells it: a record of an earlier one differs by no spelling
    ours = identity(cfg)
    shape = other_shape(theirs, ours)
    given = "run_name" if named(cfg, ctx) else "save_folder"
    if shape:
        yield Problem(shape.split("=")[0], f"the checkpoints this command continues ({given}=), in {folder} (up to "
                      f"batch {found[-1].batch}), hold a model of another shape: {shape}; loading them would fail "
                      "(torch refuses missing or differently sized weights) or leave weights out", "keep the run's model "
                      f"settings to continue it, or drop {given}= to train this model as a new run")
        return
    function = other_function(theirs, ours)
    if function:  # asked or not, not the training it continues
        yield Problem(function.split("=")[0], f"the checkpoints this command continues ({given}=), in {folder} (up to "
                      f"batch {found[-1].batch}), hold weights trained under other model settings: {function}; they "
                      "load (the same sizes) but compute something else here, so the run does not continue what it "
                      "trained", f"keep the run's model settings to continue it, or drop {given}= to train this "
                      "model as a new run", WARNING)
    restored = other_optimizer(theirs, ours)
    if restored:
        # composer loads the optimizer's state with its param groups, whose lr, betas, eps and weight decay replace
        # the new ones, and the scheduler's base_lrs (optimizer.lr=1e-12 goes on at the checkpoint's rate while the
        # run records 1e-12). The schedule's shape (t_warmup, alpha_f) is rebuilt from this command.
        yield Problem(restored.split("=")[0], f"the checkpoints this command continues ({given}=), in {folder} "
                      f"(up to batch {found[-1].batch}), hold the optimizer's own settings, which a resume restores "
                      f"over this command's: {restored}; it would go on under the first and record the "
                      "second", "keep the run's optimizer settings to continue it; to go on from its weights under "
                      f"these, start a new run from them (drop {given}=, add load_path=<its newest checkpoint> "
                      "+load_weights_only=true: the optimizer, the schedule's step and warmup and the data position start "
                      "afresh)")
        return
    # a key one side leaves out is a change too (a setting dropped from a YAML), said after those both name;
    # max_duration: a longer run is what run_name= is for
    keys = sorted((k for k in {*theirs, *ours} if theirs.get(k) != ours.get(k) and k != "max_duration"
                   and not k.startswith("optimizer.")), key=lambda k: (k not in theirs or k not in ours, k))
    other = [f"{k}={theirs.get(k, 'unset')!r} there, {ours.get(k, 'unset')!r} here" for k in keys]
    asked = ctx.given("run_name") or ctx.given("save_folder") or ctx.given("variables.run_name")
    if other and not asked:  # asked on the command line: as asked; fixed in a YAML, every variant of it shares it
        fix = ("leave save_folder to the checkpoint group or put ${run_name} in it" if fixed else
               "give it another name (run_name=... on the command line), or leave the YAML's run_name out")
        yield Problem("save_folder" if fixed else "run_name", f"continues the run in {folder} (up to batch "
                      f"{found[-1].batch}) under other settings: " + "; ".join(other[:6])
                      + (f"; and {len(other) - 6} more" if len(other) > 6 else ""),
                      f"composer's autoresume does the same; to train these settings as a run of their own, {fix}",
                      WARNING)


def other_optimizer(theirs: dict, ours: dict) -> str:
    """The optimizer settings of two identities that differ, as other_shape says them, a key one leaves out taken
    at the optimizer's default ('its default' where none is kept here: not the same for sure)."""
    name = theirs.get("optimizer.name")
    kept = OPTIMIZER_DEFAULTS.get(name, {}) if name == ours.get("optimizer.name") else {}
    keys = sorted(k for k in {*theirs, *ours} if k.startswith("optimizer."))
    return _differing(keys, theirs, ours, {f"optimizer.{k}": v for k, v in kept.items()}, unknown="its default")


RULES = [keeps_something, writes_before_the_end, stops_when_it_diverges, outlives_the_node,
         lands_before_the_time_limit, ends_within_its_requeues, fits_on_the_storage, earlier_runs, continued_run]
