"""Rules about the config's values alone: what llm-foundry, composer or Slurm would refuse, or what surely fails
(errors), and what is legal but likely a mistake (warnings). Each rule yields every problem it finds."""
import functools
import io
import os
import re

from omegaconf import OmegaConf

from common.paths import is_remote
from common.sweep.launch import names_this_launcher
from train.checks import foundry_names as names
from train.checks.core import (
    ERROR,
    TIME_UNITS,
    WARNING,
    Problem,
    batches_in,
    close_match,
    is_int,
    is_number,
    is_resolved,
    nearest,
    override_key,
    per_batch,
    positive_int,
    same_or_under,
    time_of,
    unresolved,
    value,
    warmup_end,
    zero_dur,
    zero_interval,
)
from train.config.loaders import eval_keys, loader_keys
from train.config.schema import SCHEMAS
from train.launch.spec import scheduler
from train.plan import estimate

# Ours: our typed groups and `plan`; removed before llm-foundry sees the config (train/task/foundry.py).
PRODUCT_KEYS = frozenset({*SCHEMAS, "plan", "objective", "continue_from"})
# llm-foundry 0.22's TrainConfig fields: those whose types foundry_names keeps (tests/test_config.py checks them
# against the library).
FOUNDRY_KEYS = frozenset(names.TRAIN_CONFIG)

PRECISIONS = ("fp32", "amp_bf16", "amp_fp16", "amp_fp8")
STATE_DICT_TYPES = ("full", "sharded")


def plan_form(cfg, ctx):
    v = value(cfg, "plan")
    if v not in (None, False, True, "json"):
        yield Problem("plan", f"{v!r} is not a plan form", "plan=true for the report, plan=json for JSON, or leave "
                      "it out to run")


def known_keys(cfg, ctx):
    for key in cfg:
        if key not in FOUNDRY_KEYS | PRODUCT_KEYS:
            yield Problem(key, "is not a key llm-foundry or this tool knows (llm-foundry refuses unknown keys)",
                          close_match(key, FOUNDRY_KEYS | PRODUCT_KEYS)
                          or "remove it, or put your own values under `variables.`")


def resolves(cfg, ctx):
    """Every interpolation resolves (a `${variables.x}` with no x, in a user's YAML or on the command line): llm-foundry
    resolves the whole config when the run starts and would stop there."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    if is_resolved(cfg):
        return

    def walk(node, prefix):
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for k in keys:
            full = f"{prefix}.{k}" if prefix else str(k)
            if prefix == "" and (k == "hydra" or k in PRODUCT_KEYS):
                continue  # ours: their own rules name what is wrong in them (storage.tier for the figures it picks)
            try:
                child = node[k]
            except MissingMandatoryValue:
                continue  # `???`: the rule that reads it says "has no value"
            except InterpolationResolutionError as err:
                yield unresolved(cfg, full, err)  # named where it fails, once for every key that refers to it
                continue
            if isinstance(child, (DictConfig, ListConfig)):
                yield from walk(child, full)

    yield from walk(cfg, "")


def keeps_the_run_report(cfg, ctx):
    """`callbacks=null` (or `~callbacks`) drops this tool's callbacks with llm-foundry's: the run report (progress, loss curve,
    metrics.json, which status, resume and export read) and tracking; the run would stop at its start (an
    AttributeError after the imports), though its plan passes."""
    if value(cfg, "callbacks.run_report") is None:  # `callbacks=null`, `~callbacks`, `~callbacks.run_report`
        key = "callbacks" if value(cfg, "callbacks") is None else "callbacks.run_report"
        what = "is gone, and with it this tool's run report" if key == "callbacks" else "is gone: this tool's run report"
        yield Problem(key, f"{what} (the run would stop at its start: the report's progress, metrics.json and loss "
                      "curve are what status, resume and export read)",
                      "leave out llm-foundry's callbacks one by one with ~callbacks.<name> (e.g. ~callbacks.lr_monitor)")


def mock_data_only_where_asked(cfg, ctx):
    """Synthetic tokens only where nobody asked for real data: never silently on a real cluster, and never
    written into a folder the user named for their own data."""
    if value(cfg, "data.kind") != "mock" or value(cfg, "cluster.preflight.only"):
        return  # (a preflight-only job reads no data)
    for key in ("variables.data_local", "variables.data_remote"):
        if ctx.given(key) not in (None, "null"):
            yield Problem(key, "names your data, but data=mock (the default) would write synthetic tokens there "
                          "and train on them", "name the data group: data=c4 (C4 made by data_prep) or data=mds "
                          f"(any MDS folder), e.g. data=mds {key}={ctx.given(key)}")
    theirs = _recipe_value(ctx, "variables.data_local")
    if theirs is not None and not ctx.given("variables.data_local"):
        # the synthetic shards would land in the YAML's folder, and the same command without data=mock would then
        # train on them, with no word
        yield Problem("data", f"data=mock with your YAML would write synthetic tokens into its variables.data_local "
                      f"({theirs}) and train on them; a later run of the YAML would train on them too",
                      "leave data=mock out (the YAML's data trains), or add variables.data_local=<a folder of its own> "
                      "for a smoke test on synthetic tokens")
    if ctx.slurm and ctx.given("data") != "mock":
        yield Problem("data", f"no data named: cluster={ctx.group('cluster')} is a Slurm cluster and data=mock (the "
                      "default) would spend it on synthetic tokens", "data=c4, or data=mds "
                      "variables.data_local=<MDS folder>; write data=mock on the command line for a smoke test on "
                      "synthetic tokens")


def _duration(cfg, key, interval=True):
    """A time with a unit, as composer reads it. An interval also takes dur (a fraction of max_duration), sec and
    iter; max_duration does not (composer: "TimeUnit.DURATION is not allowed", "Wall clock time not an allowed
    time unit")."""
    v = value(cfg, key)
    time = time_of(v)
    if is_int(v) and v > 0:
        yield Problem(key, f"{v} has no unit (composer would read a bare number as epochs)",
                      f"add one: {key}={v}ba for batches, or {TIME_UNITS}")
    elif interval and time is not None and time[0] < 0 and time[1] == "dur":
        # composer takes it: math.ceil of the negative interval rounds it toward zero (-0.33dur of 10ba fires every
        # 3 batches, 0.33dur every 4), and one that rounds to 0 divides by zero at the first batch (as 0dur does)
        yield Problem(key, f"{v!r} is negative: composer takes it without a word, rounds it otherwise than "
                      f"{-time[0]:g}dur, and divides by zero at the first batch where it rounds to 0",
                      f"{key}={-time[0]:g}dur")
    elif is_number(v) and v < 0 or time is not None and time[0] < 0:
        # composer takes it: an interval that never comes (its check is `<= 0`), a duration that trains nothing
        yield Problem(key, f"{v!r} is negative: " + ("composer's interval never fires" if interval else
                      "nothing would be trained"), f"a positive time, e.g. {key}=1000ba")
    elif interval and zero_interval(v) == "dur":
        yield zero_dur(key, v)
    elif time is None or (not interval and time[1] in ("dur", "sec")):  # (0: rules of its own)
        yield Problem(key, f"{v!r} is not a {'time' if interval else 'duration'} composer takes here (a number "
                      "and a unit" + ("" if interval else "; not dur or sec, which composer refuses for "
                                             "max_duration") + ")",
                      f"use {TIME_UNITS}" + (", or 0.1dur (a fraction of max_duration)" if interval else "")
                      + f": {key}=1000ba")


def eval_interval(cfg, ctx):
    """eval_interval=0 is composer's "never evaluate" (a common smoke test: `max_duration=3ba eval_interval=0`):
    legal, but it trains without one evaluation, without a word, while the run builds its evaluators and checks
    their data, and its summary and an Optuna objective then read no eval loss. Said; what says "no evaluation"
    plainly is no evaluator."""
    v = value(cfg, "eval_interval")
    if v is None:
        return  # absent (a YAML's choice): llm-foundry's default, every epoch
    if zero_interval(v) != "never":
        yield from _duration(cfg, "eval_interval")
    elif (eval_keys(cfg) or value(cfg, "icl_tasks")) and value(cfg, "eval_first") is not True:
        yield Problem("eval_interval", f"{v!r} never evaluates (composer's interval never fires), while the run "
                      f"builds its evaluators ({', '.join(eval_keys(cfg)) or 'icl_tasks'}) and reads their data: "
                      "no eval loss for its summary, metrics.json or a sweep's objective",
                      "to train without evaluating: eval_loader=null (and icl_tasks=null); else a positive interval, "
                      "e.g. eval_interval=1000ba", WARNING)


def numbers(cfg, ctx):
    yield from positive_int(cfg, "cluster.nodes", 1)
    yield from positive_int(cfg, "cluster.tasks_per_node", 8)
    mpt = value(cfg, "model.name") == "mpt_causal_lm"
    if not mpt and value(cfg, "model.name") in names.MODELS and value(cfg, "model.name") != "hf_causal_lm":
        yield Problem("model.name", f"{value(cfg, 'model.name')!r}: this tool plans, checks, resumes and exports "
                      "llm-foundry's MPT (mpt_causal_lm) and Hugging Face causal LMs (hf_causal_lm) only: the memory "
                      "and FLOP figures, the checkpoint shape checks and the Hugging Face export are theirs",
                      "model.name=mpt_causal_lm with MPT's keys (d_model, n_heads, n_layers), or hf_causal_lm (see "
                      "docs/config.md), or train this model with llm-foundry's own scripts")
    for key in ("max_seq_len", "global_train_batch_size", "model.d_model", "model.n_heads", "model.n_layers",
                "model.vocab_size", "device_eval_batch_size"):
        if key.startswith("model.") and not mpt:
            continue
        if key == "model.vocab_size" and value(cfg, key) is None:
            continue  # left out (a YAML's choice): MPTConfig's default (train/checks/checkpoints.py)
        yield from positive_int(cfg, key)
    if value(cfg, "device_train_microbatch_size") != "auto":
        yield from positive_int(cfg, "device_train_microbatch_size")
    yield from _duration(cfg, "max_duration", interval=False)
    yield from _duration(cfg, "save_interval")
    lr = value(cfg, "optimizer.lr")
    if not is_number(lr) or lr <= 0:
        yield Problem("optimizer.lr", f"must be a positive number, got {lr!r}", "e.g. optimizer.lr=6.0e-4")
    d, h = value(cfg, "model.d_model"), value(cfg, "model.n_heads")
    if is_int(d) and is_int(h) and h > 0 and d % h:
        yield Problem("model.n_heads", f"{h} does not divide model.d_model={d} (MPT's attention refuses it)",
                      "pick a head count that divides d_model (head size 128 suits flash attention)")


# composer's schedulers that check their warmup against t_max (_raise_if_warmup_and_max_incompatible), by the
# names llm-foundry registers them under
_WARMUP_CHECKED = ("constant_with_warmup", "cosine_with_warmup", "linear_decay_with_warmup")


def schedule(cfg, ctx):
    given, duration = value(cfg, "scheduler.t_warmup"), value(cfg, "max_duration")
    total = batches_in(cfg, duration)
    warmup = warmup_end(given, total, lambda t: batches_in(cfg, t))
    if warmup is not None and total and total > 0 and warmup > total:  # (0 or less: refused on its own)
        yield Problem("scheduler.t_warmup", f"{given} of warmup ({warmup} batches) is longer than max_duration="
                      f"{duration} ({total} batches): the learning rate never reaches optimizer.lr (composer runs it; "
                      "fine for a smoke test)", f"shorten it, e.g. scheduler.t_warmup={_tenth(duration)}, or "
                      "train longer", WARNING)
    yield from _warmup_units(cfg, given, duration, warmup)


def _tenth(duration) -> str:
    """A tenth of a duration, in its own unit (a warmup in another one may be refused: _warmup_units)."""
    n, unit = time_of(duration)
    return f"{max(1, int(n) // 10)}{unit}" if unit != "dur" else f"{n / 10:g}dur"


def _warmup_units(cfg, given, duration, warmup):
    """composer reads a `dur` as max_duration's unit and an epoch as batches, then refuses a warmup in another unit
    than the schedule's t_max ("t_warmup and t_max must use the same units") when training starts, after the queue
    (max_duration=40960tok with the presets' t_warmup=4ba)."""
    if value(cfg, "scheduler.name") not in _WARMUP_CHECKED:
        return
    t_max = value(cfg, "scheduler.t_max") or "1dur"
    times = [time_of(t) for t in (given, t_max, duration)]
    if None in times or "sec" in [t[1] for t in times]:
        return
    (_, w), (_, m), (_, d) = times

    def read(unit):
        unit = d if unit == "dur" else unit
        return "ba" if unit == "ep" else unit

    if read(w) == read(m):
        return
    per = per_batch(cfg, read(m))
    same = f"{warmup * per}{read(m)}" if warmup and per else f"<a time in {read(m)}>"
    yield Problem("scheduler.t_warmup", f"{given} is in {read(w)} and the schedule's t_max ({t_max}, with "
                  f"max_duration={duration}) in {read(m)}: composer refuses the pair when training starts (\"t_warmup "
                  "and t_max must use the same units\")", f"scheduler.t_warmup={same}")


def seq_len(cfg, ctx):
    if ctx.choices.get("yaml") and _recipe_value(ctx, "max_seq_len") is None and ctx.given("max_seq_len") is None:
        # else conf/train.yaml's would fill it (2048, or the YAML's variables.max_seq_len), unlike what it trains
        yield Problem("max_seq_len", "your YAML sets no top-level max_seq_len, which llm-foundry's TrainConfig requires "
                      "(it refuses such a YAML)", "add `max_seq_len: ${variables.max_seq_len}` (or the length its "
                      "loaders use) to the YAML, or max_seq_len=<n> on the command line")
        return
    if value(cfg, "model.name") != "mpt_causal_lm":
        return  # refused as a model this tool does not plan (numbers)
    model_len = value(cfg, "model.max_seq_len")
    if not is_int(model_len) or model_len <= 0:
        yield Problem("model.max_seq_len", f"must be a positive whole number, got {model_len!r}",
                      "leave it to follow max_seq_len")
        return
    for key in ("max_seq_len", *(f"{loader}.dataset.max_seq_len" for loader in loader_keys(cfg))):
        seq = value(cfg, key)
        if is_int(seq) and seq > model_len:
            yield Problem(key, f"{seq} is above the model's model.max_seq_len={model_len} (MPT refuses longer "
                          "sequences)", f"use {key}={model_len} or less, or raise model.max_seq_len (it follows "
                          "max_seq_len unless set)")
    top, cut = value(cfg, "max_seq_len"), value(cfg, "train_loader.dataset.max_seq_len")
    if is_int(top) and is_int(cut) and top != cut:
        # llm-foundry trains samples of the loader's length; the top-level one sizes the ICL evaluations. A YAML
        # interpolates variables.max_seq_len into both, so a top-level max_seq_len= reaches only the second.
        yield Problem("max_seq_len", f"{top} is not the length trained: the train loader cuts samples to "
                      f"train_loader.dataset.max_seq_len={cut} (what the plan counts)",
                      f"variables.max_seq_len={top} (every key that reads it follows), or "
                      f"train_loader.dataset.max_seq_len={top}", WARNING)


def eval_loader_shape(cfg, ctx):
    """What llm-foundry refuses of the evaluation loaders when the run starts, after the queue: an eval_loader beside
    eval_loaders (its forbid_config_key: "Config key eval_loaders should not be set"), and an eval_loader without a
    name (KeyError: 'name'). `eval_loader.num_workers=1` (docs/config.md's CPU line) makes either on a YAML whose
    evaluators are a list, or that has none."""
    one, many = value(cfg, "eval_loader"), value(cfg, "eval_loaders")
    if not OmegaConf.is_dict(one):
        return
    given = {k: v for k, v in one.items() if k != "name"}
    if OmegaConf.is_list(many) and len(many):
        yield Problem("eval_loader", f"{', '.join(f'eval_loader.{k}' for k in given) or 'a loader'} beside eval_loaders "
                      "(your YAML's list of evaluators): llm-foundry refuses both (\"Config key eval_loaders should "
                      "not be set\")", "set it in each evaluator: " + " ".join(
                          f"eval_loaders.{i}.{k}={v}" for i in range(len(many)) for k, v in given.items()))
    elif "name" not in one:
        yield Problem("eval_loader", f"has no name, only {', '.join(given)}: llm-foundry builds no loader from it "
                      "(KeyError: 'name' when the run starts); your YAML has no eval_loader",
                      "leave out the eval_loader.* overrides (no evaluation, as the YAML says), or give the whole "
                      "eval_loader (name, dataset)")


def held_out(cfg, ctx):
    """An evaluation on the very data the run trains on: llm-foundry runs it as asked, and its eval loss then follows
    the train loss, saying nothing of held-out text, while the summary, metrics.json and an Optuna objective read it
    as the held-out loss. A warning: the data and split may be meant (a memorisation check)."""
    def read(loader):
        return [value(cfg, f"{loader}.dataset.{k}") for k in ("remote", "local", "split")]

    remote, local, split = read("train_loader")
    for loader in eval_keys(cfg):
        other = read(loader)
        # the same split of the same local folder (streaming's cache of a remote, or the data itself) or remote
        same = [where for where, theirs in ((local, other[1]), (remote, other[0])) if where and where == theirs]
        if same and split == other[2]:
            yield Problem(f"{loader}.dataset.split", f"evaluates on what it trains on: {loader} and train_loader both "
                          f"read split {split!r} of {same[0]}; the eval loss then follows the train loss and measures "
                          "no held-out text", f"{loader}.dataset.split=val (data_prep makes it from the data set's "
                          "validation files: split=val)", WARNING)


def device(cfg, ctx):
    gpus = value(cfg, "cluster.gpus_per_node") or 0
    name = value(cfg, "cluster.name")
    precision = value(cfg, "precision")
    if not gpus:
        if precision in PRECISIONS and precision != "fp32":
            yield Problem("precision", f"{precision} needs a GPU and cluster={name} has none (cluster.gpus_per_node=0)",
                          "precision=fp32 on CPU, or a GPU cluster")
        if value(cfg, "model.attn_config.attn_impl") == "flash":
            yield Problem("model.attn_config.attn_impl", f"flash attention needs a GPU and cluster={name} has none",
                          "model.attn_config.attn_impl=torch on CPU")
        if value(cfg, "model.loss_fn") == "fused_crossentropy":
            yield Problem("model.loss_fn", f"fused_crossentropy needs flash-attn on a GPU; cluster={name} has none",
                          "model.loss_fn=torch_crossentropy")
        if value(cfg, "model.attn_config.rope") and (value(cfg, "model.attn_config.rope_impl") or "dail") == "dail":
            # llm-foundry's ImportError when the model is built, after the queue, and an empty run folder left
            yield Problem("model.attn_config.rope_impl", f"rope's dail implementation (MPT's default) needs flash-attn "
                          f"on a GPU; cluster={name} has none", "model.attn_config.rope_impl=hf")
    else:
        tasks = value(cfg, "cluster.tasks_per_node")
        if is_int(tasks) and tasks > gpus:
            yield Problem("cluster.tasks_per_node", f"{tasks} tasks on {gpus} GPUs per node: ranks would share a GPU "
                          "(NCCL refuses two ranks on one device)", f"cluster.tasks_per_node={gpus} (one task per GPU)")
        elif is_int(tasks) and 0 < tasks < gpus:  # each rank takes its local rank's GPU: the others sit idle
            yield Problem("cluster.tasks_per_node", f"{tasks} tasks on {gpus} GPUs per node: {gpus - tasks} GPUs of "
                          "each node would sit idle (one rank per GPU; the job still holds them all)",
                          f"cluster.tasks_per_node={gpus}, or cluster.gpus_per_node={tasks}", WARNING)
    if precision not in PRECISIONS:
        yield Problem("precision", f"{precision!r} is not a composer precision",
                      close_match(str(precision), PRECISIONS) or f"one of {', '.join(PRECISIONS)}")


def fsdp(cfg, ctx):
    config = value(cfg, "fsdp_config")
    if not config:
        if value(cfg, "checkpoint.state_dict_type") == "sharded":
            yield Problem("checkpoint", "checkpoint=sharded writes FSDP shards, but FSDP is off (fsdp_config is null)",
                          "use checkpoint=full, or keep fsdp_config (e.g. fsdp_config.sharding_strategy=FULL_SHARD)")
        return
    # composer's FSDPConfig sets any key it is given and reads its own (a misspelt key changes nothing, without a
    # word); with FSDP_VERSION=2 (the CPU clusters; composer reads it from the environment) FSDP2Config drops what
    # it does not know with a warning in the log, FSDP1's settings (the presets') included.
    fsdp2 = str(value(cfg, "cluster.env.FSDP_VERSION")) == "2"
    known = {*names.FSDP_CONFIG_KEYS, *names.FSDP2_CONFIG_KEYS} if fsdp2 else set(names.FSDP_CONFIG_KEYS)
    for key in (config.keys() if hasattr(config, "keys") else ()):
        if key == "device_mesh" and not fsdp2:
            yield Problem("fsdp_config.device_mesh", "composer's FSDPConfig refuses it (a ValueError when the trainer "
                          "is built)", "fsdp_config.data_parallel_shard_degree and/or "
                          "fsdp_config.data_parallel_replicate_degree")
        elif key not in known:
            fsdp2_only = key in names.FSDP2_CONFIG_KEYS
            yield Problem(f"fsdp_config.{key}", ("is FSDP2's setting, and this cluster trains with FSDP1" if fsdp2_only
                          else "is not an FSDP setting composer knows") + (": FSDP2Config drops it (a warning in the "
                          "log)" if fsdp2 else ": FSDPConfig keeps it and nothing reads it"),
                          "remove it, or cluster.env.FSDP_VERSION=2 (composer's FSDP2)" if fsdp2_only else
                          close_match(str(key), known) or f"remove it (~fsdp_config.{key})", WARNING)
    strategy = value(cfg, "fsdp_config.sharding_strategy")
    if strategy is not None and strategy not in estimate.SHARDING_STRATEGIES:
        yield Problem("fsdp_config.sharding_strategy", f"{strategy!r} is not an FSDP sharding strategy",
                      close_match(str(strategy), estimate.SHARDING_STRATEGIES)
                      or f"one of {', '.join(estimate.SHARDING_STRATEGIES)}")
    mixed = value(cfg, "fsdp_config.mixed_precision")
    if isinstance(mixed, str) and mixed.upper() not in names.MIXED_PRECISION:
        yield Problem("fsdp_config.mixed_precision", f"{mixed!r} is not a mixed precision composer knows (a ValueError "
                      "when the trainer is built)", close_match(mixed.upper(), names.MIXED_PRECISION)
                      or f"one of {', '.join(names.MIXED_PRECISION)}, or a mapping of param_dtype, reduce_dtype, "
                      "buffer_dtype")
    sd = value(cfg, "fsdp_config.state_dict_type")
    if sd is not None and sd not in STATE_DICT_TYPES:
        yield Problem("fsdp_config.state_dict_type", f"{sd!r} is not a state dict type (composer knows full and "
                      "sharded)", "checkpoint=sharded or checkpoint=full")


def checkpoint(cfg, ctx):
    if value(cfg, "autoresume") and not value(cfg, "save_folder"):
        yield Problem("autoresume", "autoresume needs a save_folder to find its checkpoints in, and there is none "
                      "(composer refuses it)", "pick a checkpoint group with a folder (checkpoint=sharded), or "
                      "autoresume=false")
    folder = value(cfg, "save_folder")
    placeholder = re.search(r"\{(rank|local_rank|world_size|local_world_size|node_rank)\}", str(folder or ""))
    if placeholder and not is_remote(folder):
        yield Problem("save_folder", f"{folder} holds composer's {placeholder.group()}, which it fills per rank: "
                      "each rank would keep its own folder, and a resume, a check or an export of this tool reads "
                      "one", "leave it out (composer's sharded checkpoints already keep a file per rank); "
                      "{run_name} is filled with the run's name")
    keep = value(cfg, "save_num_checkpoints_to_keep")
    if is_int(keep) and keep < -1:  # (another type: train_config_types)
        yield Problem("save_num_checkpoints_to_keep", f"{keep!r} is not -1 (keep all) or a count",
                      "e.g. save_num_checkpoints_to_keep=10")


def cluster_figures(cfg, ctx):
    # types come from the schema (train/config/schema.py); the ranges are ours
    mfu = value(cfg, "cluster.mfu")
    if mfu is not None and not 0 < mfu <= 1:
        yield Problem("cluster.mfu", f"must be a fraction in (0, 1], got {mfu!r}", "e.g. cluster.mfu=0.42")
    peak = value(cfg, "cluster.peak_flops")
    if peak is not None and peak <= 0:
        yield Problem("cluster.peak_flops", f"must be a positive FLOP/s figure, got {peak!r}",
                      "e.g. cluster.peak_flops=989e12 (H100 dense bf16)")
    if scheduler(cfg) == "local" and value(cfg, "cluster.wait") is False:
        yield Problem("cluster.wait", "false has no effect with cluster=local: a local sweep's tasks are this "
                      "command's children, so it waits for them", "drop cluster.wait=false, or run the sweep on a "
                      "Slurm cluster preset, which submits and returns", WARNING)
    setup = value(cfg, "cluster.setup") or []
    if value(cfg, "cluster.container.image") and setup and ctx.slurm:
        # the image is the environment (train/launch/executor.py): setup lines prepare a bare node's, not run then
        yield Problem("cluster.setup", f"{len(setup)} line(s) are not run with cluster.container.image set: the "
                      "image is the tasks' environment (bare mode alone runs setup lines before srun)",
                      "put what they prepare into the image, variables into cluster.env.<NAME>=..., or drop "
                      "cluster.container.image to run them on bare nodes", WARNING)


def batch(cfg, ctx):
    """llm-foundry splits the global batch evenly across the ranks (a ValueError otherwise). Each rank's share is
    then cut into microbatches: a microbatch larger than the share is reduced to it (llm-foundry's warning), and a
    share that is no multiple of it ends each step with a smaller one (composer handles both: warnings)."""
    if value(cfg, "cluster.preflight.only"):
        return  # a preflight-only job builds no trainer
    gbs = value(cfg, "global_train_batch_size")
    mb = value(cfg, "device_train_microbatch_size")
    ws = ctx.world_size(cfg)
    if not is_int(gbs):
        return  # numbers refuses it
    if gbs % ws:
        lower, upper = gbs // ws * ws, (gbs // ws + 1) * ws
        tasks = value(cfg, "cluster.tasks_per_node")
        nodes_ok = [n for n in range(1, 257) if gbs % (n * tasks) == 0]
        alternatives = f"global_train_batch_size={upper}" + (f" or {lower}" if lower else "")
        if nodes_ok:
            alternatives += f", or cluster.nodes in {nodes_ok[:8]} (with -m)"
        yield Problem("global_train_batch_size", f"{gbs} is not divisible by {ctx.world_words(cfg)} (llm-foundry "
                      "refuses it: each rank trains an equal share)", alternatives)
        return
    share = gbs // ws
    if not is_int(mb) or share % mb == 0:
        return
    if mb > share:
        yield Problem("device_train_microbatch_size", f"{mb} is more than the {share} samples each rank trains per "
                      f"step ({gbs} over {ctx.world_words(cfg)}): llm-foundry reduces it to {share}",
                      f"device_train_microbatch_size={share}, or a larger global_train_batch_size", WARNING)
    else:
        yield Problem("device_train_microbatch_size", f"{mb} does not divide the {share} samples each rank trains "
                      f"per step ({gbs} over {ctx.world_words(cfg)}): each step ends with a microbatch of "
                      f"{share % mb}", f"a device_train_microbatch_size that divides {share}, or global_train_batch_size="
                      f"{(share // mb + 1) * mb * ws}", WARNING)


def storage_root(cfg, ctx):
    """The storage's root (PRETRAIN_ROOT for the local preset) must be a folder this user can make and write:
    a file there, or /proc, would fail after the checks (a traceback making the outputs folder), or be refused as
    a disk without room. A mounted storage that is not on this node is the mounts rule's to name."""
    from common.paths import unwritable

    root = value(cfg, "storage.root")
    if not root or is_remote(root) or (value(cfg, "storage.mounts") and not os.path.exists(str(root))):
        return
    why = unwritable(root)
    if why:
        env = os.environ.get("PRETRAIN_ROOT")
        named = f"PRETRAIN_ROOT={env}" if env and ctx.group("storage") == "local" and not ctx.given("storage.root") \
            else f"storage.root={root}"
        yield Problem("storage.root", f"{named}: no run folder can be made there ({why})",
                      "a folder of yours: export PRETRAIN_ROOT=/path/to/folder (storage=local), or "
                      "storage.root=/path/to/folder", WARNING if ctx.mode == "plan" else ERROR)


def storage(cfg, ctx):
    tiers = value(cfg, "storage.tiers")
    if tiers:
        tier = value(cfg, "storage.tier")
        if tier not in tiers:
            yield Problem("storage.tier", f"{tier!r} is not a tier of storage={ctx.group('storage')}",
                          f"one of {', '.join(tiers)} (or give storage.write_GBps directly)")
            return  # storage.write_GBps follows the tier
    for key in ("storage.write_GBps", "storage.file_GBps"):
        bw = value(cfg, key)
        if bw is not None and bw <= 0:
            yield Problem(key, f"must be a positive bandwidth in GB/s, got {bw!r}", f"e.g. {key}=19.2")
    remote = value(cfg, "variables.data_remote")
    remote_root = value(cfg, "storage.data_remote_root")
    if remote_root and not value(cfg, "storage.data_local_root"):
        yield Problem("storage.data_local_root", f"storage={ctx.group('storage')} streams data from {remote_root} "
                      "and needs a node-local cache, but storage.data_local_root is null",
                      "storage.data_local_root=/tmp/local-storage/${run_name} (node-local NVMe)")
        return
    if remote:
        local = value(cfg, "variables.data_local")
        if not local or str(local).startswith("None/"):
            yield Problem("variables.data_local", f"data is streamed from {remote} but there is no local cache to "
                          "stream it into (streaming refuses it)", "variables.data_local=/tmp/local-storage/<run> "
                          "(node-local NVMe)")
            return
        shared = [str(m).split(":")[0].rstrip("/") for m in value(cfg, "storage.mounts") or []]
        if remote_root:  # a streaming preset (blob): its root is the shared storage
            shared.append(str(value(cfg, "storage.root")))
        if same_or_under(local, remote) or any(same_or_under(local, m) for m in shared if m):
            yield Problem("variables.data_local", f"the cache {local} is on the shared storage it streams from "
                          f"({remote}), not on the node", "variables.data_local=/tmp/local-storage/<run> "
                          "(node-local NVMe)")


EXPORT_PRECISIONS = tuple(estimate.EXPORT_BYTES_PER_PARAM)  # llm-foundry's hf_checkpointer's


def export(cfg, ctx):
    """export=hf: llm-foundry's hf_checkpointer would fail only at the end of training on these. Without the group,
    export.* keys set on the command line do nothing (its callback is what the group adds): said, not ignored."""
    fmt = value(cfg, "export.format")
    if fmt != "hf" or value(cfg, "callbacks.hf_checkpointer") is None:
        given = [k for k in ("precision", "interval", "folder") if value(cfg, f"export.{k}") is not None]
        if fmt != "none" or given:
            key = "export.format" if fmt != "none" else f"export.{given[0]}"
            yield Problem(key, f"{', '.join(f'export.{k}' for k in given) or f'export.format={fmt}'} "
                          f"without export=hf: no Hugging Face export is made (the export group adds llm-foundry's "
                          "hf_checkpointer; its keys alone do nothing)", "add export=hf (the config group), e.g. "
                          "`export=hf export.interval=1000ba`", ERROR if fmt != "none" else WARNING)
        return
    v = value(cfg, "export.precision")
    if v not in EXPORT_PRECISIONS:
        yield Problem("export.precision", f"{v!r} is not a precision the Hugging Face export writes",
                      close_match(str(v), EXPORT_PRECISIONS) or f"one of {', '.join(EXPORT_PRECISIONS)}")
    if zero_interval(value(cfg, "export.interval")) == "never":
        yield Problem("export.interval", f"{value(cfg, 'export.interval')!r} never exports (composer's interval "
                      "never fires, not even at the end)", "leave out export=hf to export nothing (python -m "
                      "train.export exports a checkpoint later), or e.g. export.interval=1000ba")
    else:
        yield from _duration(cfg, "export.interval")


def export_folder_name(cfg, ctx):
    """An export's batch is read back from its folder's name, ba{batch} (train/config/storage_args.py:
    export_batch): train.sample and train.evaluate take a run's newest export, a loss spike's rollback sets aside
    those past its point. composer fills any of its fields into another name, which nothing records where an
    export is read back: said, as hf_checkpointer writes it all the same."""
    key, default = "callbacks.hf_checkpointer.huggingface_folder_name", estimate.HF_FOLDER_NAME
    name = value(cfg, key) if value(cfg, "callbacks.hf_checkpointer") is not None else None
    if name is not None and str(name) != default:
        yield Problem(key, f"{str(name)!r}: train.sample and train.evaluate find a run's exports by their folder "
                      f"name, {default}, and a loss spike's rollback sets aside those past its point by it: "
                      "under another name they pass over this run's exports, and a rollback leaves those of the "
                      "training it went back from beside the others", f"leave it out ({default}) to have them "
                      "found; callbacks.hf_checkpointer.save_folder=<folder> moves the exports", WARNING)


def slurm_preset_needs_m(cfg, ctx):
    """A Slurm cluster preset without `-m` trains in this process: on a login node, with the GPU settings of the
    preset (flash attention, the fused loss, bf16), it fails after importing torch. Inside a Slurm allocation
    (SLURM_JOB_ID set: salloc, an interactive srun, a batch script) a plain run trains there, as asked."""
    if ctx.mode != "run" or not ctx.slurm or os.environ.get("SLURM_JOB_ID"):
        return
    yield Problem("cluster", f"cluster={ctx.group('cluster')} is a Slurm cluster preset, and this plain run (no -m) "
                  f"would train here, on {os.uname().nodename}, which is not in a Slurm allocation (no SLURM_JOB_ID)",
                  "add -m to submit it as Slurm jobs (python -m train ... -m), plan=true to look at what it would "
                  "need, or cluster=local to train on this machine")


def objective_reported(cfg, ctx):
    """A sweeper that reads each point's result (Optuna: hparams_search=, or hydra/sweeper=optuna) gets `objective`
    from the run's final metrics; an evaluation metric of an evaluator this config does not have (eval_loader=null,
    or several evaluators, whose metrics are eval/<label>/...) is in no trial's metrics: each would train, then
    fail to give the sweeper its value."""
    from train.launch.finished import DEFAULT_OBJECTIVE, TRAIN_LOSS

    sweeper = ctx.choices.get("hydra/sweeper")
    if ctx.mode == "run" or sweeper in (None, "checked", "basic"):  # (the launcher's sweepers that read no result)
        return
    name = str(value(cfg, "objective") or DEFAULT_OBJECTIVE)
    if name == TRAIN_LOSS or not name.startswith("eval") or value(cfg, "icl_tasks"):
        return  # (ICL evaluators' labels are llm-foundry's to make)
    labels = ["eval" if k == "eval_loader" else f"eval/{value(cfg, f'{k}.label')}" for k in eval_keys(cfg)]
    prefix, _, metric = name.rpartition("/")
    if prefix in labels:
        reported = _lm_eval_metrics(cfg)
        if reported is None or metric in reported:
            return
        near = nearest(metric, reported)
        yield Problem("objective", f"{name} is no metric of this run ({prefix}/... reports {', '.join(reported)}): "
                      f"the {sweeper} sweeper would get no value from any trial, each failing after its training",
                      f"objective={prefix}/{near or reported[0]}")
        return
    yield Problem("objective", f"{name} is no metric of this run ("
                  + (f"its evaluators report {', '.join(f'{label}/...' for label in labels)}" if labels else
                     "it evaluates nothing: eval_loader=null")
                  + f"): the {sweeper} sweeper would get no value from any trial, each failing after its training",
                  f"objective={labels[0]}/LanguageCrossEntropy" if labels else
                  f"objective={TRAIN_LOSS} (the last training loss), or keep an eval_loader")


def _lm_eval_metrics(cfg) -> tuple | None:
    """The metrics a causal LM's evaluators report (None where this model's are not known here)."""
    from train.checks.foundry_names import LM_EVAL_METRICS

    name = value(cfg, "model.name")  # MPT evaluates its additional_train_metrics too, an hf_causal_lm its own list
    if name not in ("mpt_causal_lm", "hf_causal_lm") or value(cfg, "model.additional_train_metrics" if
                                                               name == "mpt_causal_lm" else "model.additional_eval_metrics"):
        return None
    return LM_EVAL_METRICS


def sweeper_storage(sweeper):
    """Optuna's database storage (`hydra.sweeper.storage`) with the pinned packages: hydra-optuna-sweeper 1.3 pins
    Optuna 2.10, whose RDB storage fails on the SQLAlchemy 2 that MLflow (in llm-foundry's lock) needs: creating
    the study stops with an AssertionError after making an empty database. The value is not echoed (a database URL
    may hold a password)."""
    if str(sweeper.get("_target_", "")).endswith("OptunaSweeper") and sweeper.get("storage") not in (None, ""):
        yield Problem("hydra.sweeper.storage", "Optuna 2.10 (pinned by hydra-optuna-sweeper 1.3) cannot use a database "
                      "with SQLAlchemy 2 (pinned for MLflow): the sweep would stop creating its study, after making "
                      "the database", "hydra.sweeper.storage=null (the study lives in memory for this command; "
                      "every trial's result stays in its run's metrics.json and the sweep's summary)")


def foreign_launcher(config):
    """`-m` with a launcher other than this project's (`hydra/launcher=basic`, `submitit_local`, ...) runs each
    point as it is handed, with none of what ours does first: the checks of every point, a run name each for points
    that train alike, a plan. `plan=true` would then train the points (`-m plan=true
    hydra/launcher=submitit_local` writes a finished run's checkpoints): refused; any other use is warned."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_") or "")
    if not target or names_this_launcher(target):
        return
    choice = config.hydra.runtime.choices.get("hydra/launcher") or target
    if OmegaConf.select(config, "plan", default=None) not in (None, False):
        yield Problem("plan", f"set, but hydra/launcher={choice} runs the points: only this project's launcher "
                      "shows a sweep's plan (and submits nothing)", f"leave out hydra/launcher={choice}")
    else:
        yield Problem("hydra/launcher", f"{choice} runs the points unchecked (this project's launcher checks every "
                      "point before anything starts, and gives points that train alike a run each)",
                      f"leave out hydra/launcher={choice} (local or Slurm follows cluster=)", WARNING)


# The launcher's resource settings, which data_prep's parts and other apps take; a training point's come from its
# cluster group (train/launch/executor.py), so these are taken and not used (hydra.launcher.partition=other
# submits to the preset's partition).
_LAUNCHER_RESOURCES = {"scheduler": "cluster=local or a Slurm preset", "partition": "cluster.partition",
                       "account": "cluster.account", "qos": "cluster.qos", "cpus_per_task": "cluster.cpus_per_task",
                       "mem_gb": "cluster.mem_gb", "timeout_min": "cluster.timeout_min",
                       "max_num_timeout": "cluster.max_num_timeout", "signal_delay_s": "cluster.signal_delay_s",
                       "setup": "cluster.setup", "wait": "cluster.wait", "summary_partition": "cluster.summary_partition",
                       "array_parallelism": None}


def launcher_resources(config):
    """`hydra.launcher.<resource>` given for training, which reads its resources from cluster.* instead."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_") or "")
    if not names_this_launcher(target):
        return
    for override in OmegaConf.select(config, "hydra.overrides.hydra") or []:
        key = override_key(override)
        name = key.removeprefix("hydra.launcher.")
        if name != key and name in _LAUNCHER_RESOURCES:
            home = _LAUNCHER_RESOURCES[name]
            yield Problem(key, "is not read by training: a training point's job takes its resources from its "
                          "cluster group", f"set {home} instead" if home else f"leave out {key}")


def objective_direction(config):
    """Optuna keeps the trial whose objective is lowest (direction=minimize, the presets') or highest, and writes
    its settings as best_params: an accuracy minimized, or a loss maximized, reports the worst trial as the best,
    every trial having trained, exit 0. The metrics the runs report say which way is better by their names
    (composer's LanguageCrossEntropy, LanguagePerplexity and the training loss: lower; TokenAccuracy and the
    in-context learning accuracies: higher); another metric is the user's to know."""
    from train.launch.finished import DEFAULT_OBJECTIVE, TRAIN_LOSS

    sweeper = config.hydra.sweeper
    direction = sweeper.get("direction") if str(sweeper.get("_target_", "")).endswith("OptunaSweeper") else None
    direction = getattr(direction, "name", direction)  # the sweeper's default is its Direction enum, not a string
    if not isinstance(direction, str):  # not Optuna, or several objectives (a list)
        return
    name = str(OmegaConf.select(config, "objective") or DEFAULT_OBJECTIVE)
    metric = name.rsplit("/", 1)[-1]
    better = ("maximize" if "Accuracy" in metric else
              "minimize" if name == TRAIN_LOSS or "CrossEntropy" in metric or "Perplexity" in metric else None)
    if better and direction.lower() != better:
        yield Problem("hydra.sweeper.direction", f"{direction} for objective={name}, of which "
                      f"{'higher' if better == 'maximize' else 'lower'} values are better: Optuna would report the worst trial's "
                      "settings as best_params (optimization_results.yaml) and search away from the good ones",
                      f"hydra.sweeper.direction={better}")


@functools.lru_cache(maxsize=8)
def _recipe(path: str):
    """The user's YAML (`yaml=`) as this process read it (train/config/recipe_yaml.py: its bytes once per
    process), parsed once: the rules below ask it for many keys. None when it does not parse."""
    from train.config.recipe_yaml import read, recipe_file

    try:
        return OmegaConf.load(io.BytesIO(read(recipe_file(path))))
    except Exception:
        return None


def _recipe_value(ctx, key):
    """A key as the user's YAML (`yaml=`) itself writes it; None without a YAML or that key."""
    recipe = _recipe(str(ctx.choices["yaml"])) if ctx.choices.get("yaml") else None
    try:
        return None if recipe is None else OmegaConf.select(recipe, key, default=None)
    except Exception:  # an interpolation that the YAML alone does not resolve
        return None


# `${variables.<name>}` in a YAML's values
_VARIABLE = re.compile(r"\$\{variables\.([A-Za-z_][A-Za-z0-9_]*)")


def _undefined_variables(recipe) -> set:
    """`variables.<name>` the YAML's interpolations read and its `variables:` does not set."""
    from train.checks.safety import _walk

    raw = OmegaConf.to_container(recipe, resolve=False)
    used = {name for _, _, leaf in _walk(raw) if isinstance(leaf, str) for name in _VARIABLE.findall(leaf)}
    variables = raw.get("variables")
    return used - set(variables if isinstance(variables, dict) else ())


_UNSET = object()


def variables_the_yaml_leaves_to_ours(cfg, ctx):
    """A `${variables.<name>}` the YAML reads and its `variables:` does not set: llm-foundry refuses such a YAML
    (an InterpolationKeyError). Here conf/train.yaml's variables lie beneath it: a misspelt `global_sed: 42`
    would train with our seed 17, and a YAML without `variables.max_seq_len` at our 2048, exit 0. Refused where only
    that default fills it; a preset chosen for it (data=c4's data_local, a model's max_seq_len) or the command line
    gives it as asked."""
    recipe = _recipe(str(ctx.choices["yaml"])) if ctx.choices.get("yaml") else None
    if recipe is None:
        return  # no YAML, or an unreadable one: refused before (train/checks/gate.py)
    from common.paths import CONF

    chosen = [(group, ctx.choices.get(group)) for group in ("experiment", "model", "data", "cluster", "storage")]
    preset = {k for group, name in chosen if name and (CONF / group / f"{name}.yaml").is_file()
              for k in _preset_keys(group, name)}
    for name in sorted(_undefined_variables(recipe)):
        key = f"variables.{name}"
        if ctx.given(key) is not None or key in preset:
            continue
        ours = OmegaConf.select(cfg, key, default=_UNSET, throw_on_missing=False)
        if ours is _UNSET or ours == "???":  # nothing sets it: `resolves` names where, or it "has no value"
            continue
        yield Problem(key, "your YAML reads it and its `variables:` does not set it: llm-foundry refuses such a YAML "
                      f"(InterpolationKeyError), and here it would take this tool's default, {ours}",
                      f"set it under `variables:` in your YAML, or {key}=<value>")


def data_beneath_the_yaml(cfg, ctx):
    """`data=c4` with a YAML that names its own data folder: the group goes beneath the YAML (docs/config.md), so
    the YAML's variables.data_local trains, and the preset chosen on the command line does nothing, without a
    word."""
    chosen = ctx.given("data") or (ctx.choices.get("data") if ctx.choices.get("experiment") else None)
    if not ctx.choices.get("yaml") or not chosen or chosen in ("_recipe", "mock"):
        return  # (data=mock: refused above, as it would write into the YAML's folder)
    how = f"data={chosen}" if ctx.given("data") else f"data={chosen} (of experiment={ctx.choices['experiment']})"
    vocab = value(cfg, "model.vocab_size")
    if vocab is not None and _recipe_value(ctx, "model.vocab_size") is None and ctx.given("model.vocab_size") is None:
        # the preset's vocabulary, for its tokenizer, goes beneath a model that leaves its own to its defaults
        yield Problem("model.vocab_size", f"{how} goes beneath your YAML, whose model leaves vocab_size out: the "
                      f"preset's {vocab} trains, where llm-foundry would take the model's own (MPT's default, or a "
                      "Hugging Face model's config)", f"model.vocab_size=<the size you mean> on the command line, or "
                      f"leave {how.split(' ')[0]} out (variables.data_local=<folder> trains on another folder)", WARNING)
    if ctx.given("variables.data_local"):
        return
    theirs = _recipe_value(ctx, "variables.data_local")
    if theirs is not None and str(value(cfg, "variables.data_local")) == str(theirs):
        # (an experiment that sets its own folder goes over the YAML's: experiment_over_the_yaml says so)
        yield Problem("data", f"{how} goes beneath your YAML, whose variables.data_local ({theirs}) is what "
                      "trains: the preset's folder is not read", f"variables.data_local=<the folder> on the command line "
                      f"to train on another (data={chosen}'s: {value(cfg, 'storage.data_local_root')}/{chosen}), "
                      "or leave data= out", WARNING)


# What each group sets that a YAML may set itself: the YAML goes over the groups (docs/config.md), so a group chosen
# on the command line changes nothing the YAML sets: `model=mpt-350m` on mpt-125m.yaml trains the 125M model under
# the same run name; `checkpoint=sharded` (or `none`) on a YAML with state_dict_type full and a save_folder saves
# full checkpoints (or keeps saving), exit 0, no word.
_GROUP_KEYS = {"checkpoint": ("save_folder", "fsdp_config.state_dict_type", "autoresume"),
               "export": tuple(f"callbacks.hf_checkpointer.{k}" for k in ("save_folder", "save_interval", "precision"))}


def _preset_keys(group: str, name: str) -> dict:
    """{dotted key: value as written} of what a preset of conf/<group>/ sets, over the presets it builds on (a list
    is one key)."""
    from common.paths import CONF
    from train.checkpoint.resume import model_keys  # the same flattening, under any top-level key

    raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"), resolve=False)
    keys: dict = {}
    for base in raw.pop("defaults", None) or []:
        if isinstance(base, str) and base != "_self_":  # another preset of the same group (gpt-375m: gpt175b)
            keys.update(_preset_keys(group, base))
    for k, v in raw.items():
        keys.update(model_keys(v, k) if isinstance(v, dict) and v else {k: v})
    return keys


def _is(cfg, key, written) -> bool:
    """Whether the composed `key` holds `written` (a preset's value as written; an interpolation: taken as so)."""
    if isinstance(written, str) and "${" in written:
        return True
    held = value(cfg, key)
    held = OmegaConf.to_container(held, resolve=True) if OmegaConf.is_config(held) else held
    return held == written or str(held) == str(written)


def model_beneath_the_yaml(cfg, ctx):
    """A model preset beneath a YAML (model= on the command line, or an experiment's): the YAML goes over it, and
    what it leaves out is the preset's: gpt-375m (by experiment=gpt-375m-ndv5-check) under mpt-125m.yaml trains
    the YAML's shape with the preset's dropout, GELU, init, optimizer param groups and schedule length, no word."""
    chosen = ctx.choices.get("model") if ctx.choices.get("yaml") else None
    if not chosen:
        return
    how = f"model={chosen}" if ctx.given("model") else f"model={chosen} (of experiment={ctx.choices.get('experiment')})"
    # what the YAML leaves out and the config holds as the preset has it (not a value the YAML's loader gives:
    # device_train_microbatch_size auto, fsdp_config or eval_loader null)
    taken = [k for k, v in _preset_keys("model", chosen).items()
             if _recipe_value(ctx, k) is None and ctx.given(k) is None and _is(cfg, k, v)]
    if not taken:
        if ctx.given("model"):
            yield Problem("model", f"{how} goes beneath your YAML, which sets every key of it: the preset is not "
                          "used", "leave model= out", WARNING)
        return
    shown = "; ".join(f"{k}={str(value(cfg, k))[:60]}" for k in taken[:12]) + (
        f"; and {len(taken) - 12} more" if len(taken) > 12 else "")
    yield Problem("model", f"{how} goes beneath your YAML: what the YAML sets trains, and the preset's values where "
                  f"it leaves a key out: {shown}", "set those keys in the YAML or on the command line, or leave the "
                  "preset out (model.<key>=<value> changes the YAML's model)", WARNING)


def experiment_over_the_yaml(cfg, ctx):
    """An experiment, and an hparams_search preset, go over everything beneath the command line, a YAML too
    (conf/train.yaml): their values replace the YAML's without a word (experiment=gpt-375m-ndv5-check's slimpajama
    folder over the YAML's variables.data_local; hparams_search=mpt_tiny_grid's max_duration over the YAML's)."""
    for group in ("experiment", "hparams_search") if ctx.choices.get("yaml") else ():
        name = ctx.choices.get(group)
        if not name:
            continue
        over = [k for k, v in _preset_keys(group, name).items() if _recipe_value(ctx, k) is not None
                and ctx.given(k) is None and _is(cfg, k, v) and not _is(cfg, k, _recipe_value(ctx, k))]
        if over:
            shown = "; ".join(f"{k}: {str(_recipe_value(ctx, k))[:40]} in the YAML, {str(value(cfg, k))[:40]} here"
                              for k in over[:6]) + (f"; and {len(over) - 6} more" if len(over) > 6 else "")
            yield Problem(group, f"{group}={name} goes over your YAML, and its values replace the YAML's: {shown}",
                          f"set the YAML's on the command line (it goes over both), or leave {group}= out", WARNING)


def local_config_trains_nothing(cfg, ctx):
    """The local config (conf/local/default.yaml) is this machine's account, partition, image and storage roots: a
    key there that decides what trains goes over every command's, a YAML's too, and renames the run, no word."""
    from common.paths import CONF
    from train.config.identity import counts

    name = ctx.choices.get("local")  # (`default` also where the optional file is not there)
    present = name and (CONF / "local" / f"{name}.yaml").is_file()
    counted = [k for k in _preset_keys("local", name) if counts(k) and ctx.given(k) is None] if present else []
    if counted:
        yield Problem(counted[0], f"conf/local/{name}.yaml sets {', '.join(counted[:6])}, which decide"
                      f"{'s' if len(counted) == 1 else ''} what trains: it goes over every command's (a YAML's "
                      "too) and changes the run's name", "keep the local config to the cluster's account, partition, "
                      "image and storage roots, and give these on the command line or in the YAML", WARNING)


def groups_beneath_the_yaml(cfg, ctx):
    for group, keys in _GROUP_KEYS.items():
        # the group given on the command line, or one of export's keys (export.interval=...)
        chosen = f"{group}={ctx.given(group)}" if ctx.given(group) else None
        if chosen is None and group == "export":
            chosen = next((str(o).lstrip("+") for o in ctx.overrides if override_key(o).startswith("export.")), None)
        # (a key the command line sets is not the YAML's; `model=` itself is the group's choice)
        theirs = [k for k in keys if _recipe_value(ctx, k) is not None and (k == group or ctx.given(k) is None)]
        if not chosen or not theirs:
            continue
        fix = "set the YAML's keys on the command line (" + ", ".join(f"{k}=..." for k in theirs) + (
            "; save_folder=null saves none), or leave checkpoint= out" if group == "checkpoint" else
            "), or leave export= out: your YAML's hf_checkpointer exports")
        yield Problem(group, f"{chosen} goes beneath your YAML, whose {', '.join(theirs)} "
                      f"{'is' if len(theirs) == 1 else 'are'} what {'trains' if group == 'checkpoint' else 'exports'}: "
                      "the preset's values there are not used",
                      fix, WARNING)


RULES = [plan_form, known_keys, resolves, keeps_the_run_report, slurm_preset_needs_m, mock_data_only_where_asked,
         numbers, eval_interval, schedule, seq_len, eval_loader_shape, held_out, device, fsdp, checkpoint, storage_root, storage,
         cluster_figures, batch, export, export_folder_name, objective_reported, variables_the_yaml_leaves_to_ours, data_beneath_the_yaml,
         model_beneath_the_yaml, experiment_over_the_yaml, groups_beneath_the_yaml, local_config_trains_nothing]
