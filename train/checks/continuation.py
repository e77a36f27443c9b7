"""continue_from=RUN[@ba<N>] (train/config/continuation.py), checked before anything is written: the run and the
checkpoint it names exist, this command is another run than it, and its model can take that checkpoint (the same
shapes and vocabulary: a checkpoint of another shape fails to load, or loads with weights left out); what changes
from the run continued (its learning rate, schedule, batch size, data, duration) is said. Light: no torch.
"""
from pathlib import Path

from common.paths import is_remote
from train.checks.core import WARNING, Problem, batches, batches_in, nearest, value, warmup_end
from train.config.continuation import DATA, KEY, parse


def continues_from(cfg, ctx):
    """Each problem of continue_from=, errors first where one stops the rest."""
    given = value(cfg, KEY)
    if given in (None, ""):
        return
    asked = parse(given)
    if asked is None:
        yield Problem(KEY, f"{given!r} is not a run to continue from", "continue_from=<run name> (its newest "
                      "checkpoint) or continue_from=<run name>@ba<N> (its checkpoint at batch N); a save folder's "
                      "path in place of the name")
        return
    root = value(cfg, "storage.checkpoint_root")
    if asked.is_path and is_remote(asked.where) or not asked.is_path and is_remote(str(root or "")):
        yield Problem(KEY, f"{given}: a checkpoint in an object store cannot be verified here before it is loaded",
                      "copy the run's save folder to a file system this node mounts, and name that folder")
        return
    folder = asked.folder(root)
    save_folder = value(cfg, "save_folder")
    if not save_folder or is_remote(str(save_folder)):
        yield Problem(KEY, f"continues {asked.where} as a run of its own, which records where it came from in its "
                      f"save folder (and resumes from its own checkpoints after that): save_folder is "
                      f"{save_folder!r}", "checkpoint=sharded or checkpoint=full (the default), with a local "
                      "save folder")
        return
    if value(cfg, "load_path"):
        yield Problem("load_path", f"{value(cfg, 'load_path')} and continue_from={given} both name a checkpoint to "
                      "start from", "one of them: continue_from= for a run's checkpoint with its optimizer and "
                      "data position, load_path= (+load_weights_only=true) for weights alone")
        return
    from train.checkpoint.resume import find, holder, run_record

    if Path(str(save_folder)).resolve() == folder.resolve():
        yield Problem(KEY, f"{given} names this run itself ({folder}): a run goes on from its own checkpoints "
                      "without it", f"drop continue_from= to resume {folder.name}; drop run_name=/save_folder= to "
                      "continue it as a new run of its own")
        return
    found = find(folder)
    if not found:
        what = "holds no checkpoint" if folder.is_dir() else "does not exist"
        names = sorted(p.parent.name for p in Path(str(root)).glob("*/identity.json")) if not asked.is_path else []
        near = nearest(asked.where, names) if names else None
        yield Problem(KEY, f"{given}: {folder} {what}", (f"did you mean `{near}`? " if near else "") +
                      "the name of a run under " + f"{root} (its folder's name, as its final lines print it), or a "
                      "save folder's path")
        return
    batches = sorted({c.batch for c in found})
    if asked.batch is not None and asked.batch not in batches:
        yield Problem(KEY, f"{given}: {folder} holds no checkpoint of batch {asked.batch} (it holds batches "
                      f"{', '.join(map(str, batches))})", f"continue_from={asked.where}@ba<one of those>, or "
                      f"continue_from={asked.where} for the newest")
        return
    at, bad, good = _start(asked, folder, batches)
    if at is None:
        yield Problem(KEY, f"{given}: every checkpoint of it (batches {', '.join(map(str, batches))}) was written after "
                      f"its loss began to diverge at batch {bad} (its spike.json): it would go on from diverging "
                      "weights", "train afresh under the changed settings (without continue_from=); or, knowing "
                      f"that, continue_from={asked.where}@ba{batches[-1]}")
        return
    if bad is not None and at >= bad:
        yield Problem(KEY, f"{given}: its checkpoint of batch {at} was written after its loss began to diverge at "
                      f"batch {bad} (its spike.json): the weights it goes on from were diverging",
                      f"continue_from={asked.where}@ba{good[-1]}, its last before then" if good else
                      "train afresh under the changed settings (without continue_from=)", WARNING)
    elif bad is not None and asked.batch is None:
        yield Problem(KEY, f"{given}: continues from batch {at}, its newest checkpoint from before its loss began to "
                      f"diverge at batch {bad} (its spike.json); the later ones ({', '.join(str(b) for b in batches if b >= bad)}) "
                      "hold diverging weights", f"continue_from={asked.where}@ba{at} says so", WARNING)
    record = run_record(folder)
    theirs = record.get("identity")
    if not isinstance(theirs, dict):
        yield Problem(KEY, f"what run {folder} holds cannot be established: no identity.json there and no "
                      "checkpoint manifest carries its record, so what its checkpoints hold (their model, their "
                      "vocabulary) cannot be checked against this run", "put identity.json back from a copy of "
                      "the run's folder; or start from its weights alone: load_path=<a checkpoint> "
                      "+load_weights_only=true")
        return
    from train.checks.checkpoints import other_function, other_shape
    from train.config.identity import identity, spelt_once

    theirs, ours = spelt_once(theirs), identity(cfg)
    shape = other_shape(theirs, ours)
    if shape:
        yield Problem(shape.split("=")[0], f"continue_from={given}: its checkpoints hold a model of another shape "
                      f"than this command's ({shape}): loading them would fail (torch refuses missing or "
                      "differently sized weights) or leave weights out", f"keep {record.get('run_name') or folder.name}'s "
                      "model settings to continue it; or train this model as a new run, without continue_from=")
        return
    if theirs.get("tokenizer.name") not in (None, ours.get("tokenizer.name")):
        yield Problem("tokenizer.name", f"continue_from={given}: its model learned the vocabulary of "
                      f"{theirs['tokenizer.name']!r}, this command reads its data with {ours.get('tokenizer.name')!r}: "
                      "the same token ids would mean other words", f"tokenizer.name={theirs['tokenizer.name']} (data "
                      "tokenized with it)")
        return
    end = batches_in(cfg, value(cfg, "max_duration"))
    if end is not None and end <= at:
        yield Problem("max_duration", f"{value(cfg, 'max_duration')} ({end} batches) is not past batch {at}, where "
                      f"continue_from={given} starts: nothing would be trained",
                      f"a max_duration past it, e.g. max_duration={at + max(1, at // 2)}ba")
        return
    function = other_function(theirs, ours)
    if function:
        yield Problem(function.split("=")[0], f"continue_from={given}: its weights were trained under other model "
                      f"settings ({function}): they load (the same sizes) but compute something else here",
                      "keep the run's model settings to continue what it trained", WARNING)
    who = holder(folder)
    if who and asked.batch is None:
        yield Problem(KEY, f"{folder.name} is training now ({who}): this run starts from the newest checkpoint that "
                      "verifies when it starts, which may be a later one than now", f"continue_from={asked.where}"
                      f"@ba{at} for the one at batch {at}", WARNING)


def _start(asked, folder, batches: list) -> tuple:
    """(the batch continued from, the batch the run's loss began to diverge at or None, its batches before then):
    the one asked by its batch, else the newest from before a recorded divergence (train/task/interventions.py),
    None where every one came after it. batches: the run's checkpoints', oldest first."""
    from train.task.interventions import diverging_from

    bad = diverging_from(folder)
    good = [b for b in batches if bad is None or b < bad]
    return (asked.batch if asked.batch is not None else good[-1] if good else None), bad, good


def lineage(cfg) -> dict | None:
    """What a plan says of continue_from=: the run, the batch it starts at (the newest checkpoint now, for RUN alone),
    and what changes there from that run's settings: {run, folder, batch, newest, changes: [words], data_same,
    schedule: [words]}. None where it is not set or does not check (the checks say why)."""
    asked = parse(value(cfg, KEY))
    if asked is None:
        return None
    from train.checkpoint.resume import find, run_record
    from train.config.identity import identity, spelt_once

    folder = asked.folder(value(cfg, "storage.checkpoint_root"))
    found = find(folder)
    if not found:
        return None
    at, bad, _ = _start(asked, folder, [c.batch for c in found])
    if at is None:
        return None
    record = run_record(folder)
    theirs, ours = spelt_once(record.get("identity") or {}), identity(cfg)
    changed = {k: (theirs.get(k), ours.get(k)) for k in sorted(set(theirs) | set(ours))
               if k != KEY and theirs.get(k) != ours.get(k)}
    return {"run": record.get("run_name") or folder.name, "folder": str(folder), "batch": at,
            "newest": asked.batch is None, "diverging_from": bad, "changes": changed,
            "data_same": not any(k.startswith(DATA) for k in changed),
            "schedule": schedule_words(cfg, theirs, at, changed)}


def schedule_words(cfg, theirs: dict, at: int, changed: dict) -> list:
    """What happens to the learning-rate schedule at batch `at`, in words, where the scheduler, the learning rate,
    max_duration or the batch size change (composer's schedulers are functions of the batch count and max_duration,
    and the batch count goes on from the checkpoint's)."""
    keys = [k for k in changed if k.startswith(("scheduler.", "optimizer.lr")) or k in
            ("max_duration", "global_train_batch_size")]
    if not keys:
        return []
    out = []
    # composer reads the schedule for the next batch where the batch just trained began: at batch - 1
    here = _lr_at(cfg, at - 1)
    there = _lr_at_record(theirs, at - 1)
    name = value(cfg, "scheduler.name")
    if here is not None:
        was = f" (the run continued was at {there:.4g} there under its own)" if there is not None else ""
        out.append(f"this command's schedule ({name}, to max_duration={value(cfg, 'max_duration')}) read at batch "
                   f"{at}: the learning rate goes on at {here:.4g}{was}; composer's schedulers are functions of the "
                   "batch count, which goes on from the checkpoint's")
    else:
        out.append(f"this command's schedule ({name}) is read at batch {at} (the batch count goes on from the "
                   "checkpoint's, and the schedule is a function of it and max_duration)")
    end = batches_in(cfg, value(cfg, "max_duration"))
    warmup = warmup_end(value(cfg, "scheduler.t_warmup"), end, lambda t: batches_in(cfg, t))
    if warmup is not None and warmup > at:
        out.append(f"scheduler.t_warmup={value(cfg, 'scheduler.t_warmup')} ends after batch {at}: the warmup goes "
                   f"on to batch {warmup} from where it stands at {at}")
    if "global_train_batch_size" in changed:
        before, now = changed["global_train_batch_size"]
        out.append(f"global_train_batch_size {before} -> {now}: batches are counted on from {at} (each of {now} "
                   f"samples now), so a schedule or max_duration in batches reads batch {at} as {at} and goes on; "
                   f"one in tokens or samples reads the tokens and samples trained so far")
    return out


# llm-foundry's schedulers whose multiplier is worked out here: (name) -> f(batch, warmup, end, settings)
def _multiplier(name, t: int, warmup: int, end: int, s: dict) -> float | None:
    import math

    if name not in ("cosine_with_warmup", "linear_decay_with_warmup", "constant_with_warmup"):
        return None
    if t < warmup:
        return t / warmup
    if name == "constant_with_warmup":
        return float(s.get("alpha", 1.0))
    frac = min(1.0, (t - warmup) / max(1, end - warmup))
    if name == "cosine_with_warmup":
        alpha_f = float(s.get("alpha_f", 0.0))
        return alpha_f + (1 - alpha_f) * (1 + math.cos(math.pi * frac)) / 2
    alpha_i, alpha_f = float(s.get("alpha_i", 1.0)), float(s.get("alpha_f", 0.0))
    return alpha_i + (alpha_f - alpha_i) * frac


def _lr(s: dict, lr, end: int | None, at: int, batches_of) -> float | None:
    """The learning rate at batch `at` of a schedule (s: its settings) that ends at batch `end`, where a schedule to
    max_duration (t_max=1dur) is worked out here; batches_of reads a time in batches."""
    warmup = warmup_end(s.get("t_warmup"), end, batches_of)
    if not isinstance(lr, (int, float)) or end is None or warmup is None or s.get("t_max", "1dur") != "1dur":
        return None
    m = _multiplier(s.get("name"), at, warmup, end, s)
    return None if m is None else lr * m


def _lr_at(cfg, at: int) -> float | None:
    from omegaconf import OmegaConf

    sched = value(cfg, "scheduler")
    s = OmegaConf.to_container(sched, resolve=True) if sched is not None else {}
    return _lr(s, value(cfg, "optimizer.lr"), batches_in(cfg, value(cfg, "max_duration")), at,
               lambda t: batches_in(cfg, t))


def _lr_at_record(ident: dict, at: int) -> float | None:
    """The same from a run's identity record, where its durations are in batches."""
    s = {k.split(".", 1)[1]: v for k, v in ident.items() if k.startswith("scheduler.")}
    return _lr(s, ident.get("optimizer.lr"), batches(str(ident.get("max_duration"))), at, lambda t: batches(str(t)))


def words(cfg) -> list:
    """The plan's lines of a continuation (forecast_report), [] without one."""
    lin = lineage(cfg)
    if lin is None:
        return []
    which = "its checkpoint" if not lin["newest"] else "its newest checkpoint now (the newest that verifies when it " \
        "starts)" if lin["diverging_from"] is None else "its newest checkpoint that verifies when it starts from " \
        f"before its loss began to diverge at batch {lin['diverging_from']}"
    out = [f"{lin['run']} at batch {lin['batch']:,} ({which}, in {lin['folder']}): its weights, optimizer state and "
           "batch count; a new run of its own, under this command's settings"]
    shown = [k for k in lin["changes"] if not k.startswith(DATA)]
    if shown:
        out.append("changed: " + "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in
                                           [(k, lin["changes"][k]) for k in shown[:8]])
                   + (f"; and {len(shown) - 8} more" if len(shown) > 8 else ""))
    out.append("data: " + ("the same, from where the run continued stands (its data position)" if lin["data_same"]
                           else "other than the run continued read (" + ", ".join(
                               k for k in lin["changes"] if k.startswith(DATA)) + "): read from its beginning"))
    out.extend(lin["schedule"])
    return out


RULES = [continues_from]
