"""Rules about llm-foundry's own keys: their types (its TrainConfig), the names it resolves through its registries
(optimizers, schedulers, loaders, callbacks, algorithms, loggers, attention, norms, FFNs), and the ranges that
llm-foundry, composer, torch or streaming refuse once the run has started, or that surely fail (NaN, a negative
learning rate). Light: the names and types are kept in foundry_names.py (tested against the pinned library), so
nothing here imports llm-foundry or torch."""
import logging
import math

from omegaconf import ListConfig, OmegaConf

from train.checks import foundry_names as names
from train.checks.core import (
    ERROR,
    WARNING,
    Problem,
    close_match,
    close_or_all,
    is_int,
    is_number,
    mapping,
    nearest,
    time_of,
    value,
)
from train.config.loaders import eval_keys, loader_keys
from train.launch import spec as run_spec

# composer's reproducibility.seed_all refuses seeds outside [0, 2^32 - 1] (numpy's range)
MAX_SEED = 2**32 - 1
# composer keeps its timestamp (batches, samples, tokens) in int64 tensors; a duration past it cannot be counted
MAX_COUNT = 2**63 - 1
# composer's Time strings: a number and a unit (`0.1dur`, `3e4tok`)
_TIME_UNITS = "ba (batches), ep, tok, sp or dur (a fraction of max_duration), e.g. 100ba or 0.01dur"
_BOOL_WORDS = {"y", "yes", "on", "true", "n", "no", "off", "false"}  # what OmegaConf's BooleanNode converts


_TAKES = {
    "None": lambda v: v is None,
    "int": is_int,
    "float": is_number,
    "bool": lambda v: isinstance(v, bool) or is_int(v) or (isinstance(v, str) and v.lower() in _BOOL_WORDS),
    "str": lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict) or hasattr(v, "keys"),
    "list": lambda v: not isinstance(v, str) and hasattr(v, "__len__") and hasattr(v, "index"),  # ListConfig too
}


def _is_a(v, kind: str) -> bool:
    """Whether OmegaConf's node of this type takes v (it converts "17" to an int, "yes" to a bool)."""
    if kind in ("int", "float") and isinstance(v, str):
        try:
            (int if kind == "int" else float)(v)
            return True
        except ValueError:
            return False
    return _TAKES.get(kind, lambda v: True)(v)


_EXAMPLES = {"seed": "seed=17", "eval_first": "eval_first=true", "progress_bar": "progress_bar=true",
             "max_duration": "max_duration=1000ba", "dist_timeout": "dist_timeout=600",
             "python_log_level": "python_log_level=info"}


# Keys whose own rules (values.py: numbers, durations, intervals) refuse every value of another type, null too,
# in their words: said once, not again as a TrainConfig type. eval_interval's rule lets null through (no evaluation
# to time), which the TrainConfig refuses.
_TYPED_BY_THEIR_RULES = ("max_seq_len", "global_train_batch_size", "device_eval_batch_size", "max_duration",
                         "save_interval")
# Keys llm-foundry takes as a value or as the path of a YAML file holding it (config_utils: `icl_tasks_str`).
_FILE_OR_VALUE = ("icl_tasks", "eval_gauntlet")


def train_config_types(cfg, ctx):
    """llm-foundry builds an OmegaConf structured TrainConfig from the config: a value of another type fails the
    run as it starts (after importing llm-foundry and writing the run folder)."""
    present = set(cfg.keys())
    for key, spec in names.TRAIN_CONFIG.items():
        if key not in present:
            continue
        v = value(cfg, key)
        if key in _TYPED_BY_THEIR_RULES or key == "eval_interval" and v is not None:
            continue
        if key in _FILE_OR_VALUE and isinstance(v, str):
            continue  # a file's path: llm-foundry moves it to `<key>_str` before its TrainConfig reads it
        kinds = spec.split("|")
        if kinds == ["bool"] and is_int(v) and v not in (0, 1):
            yield Problem(key, f"{v} is not true or false (OmegaConf reads every number but 0 as true, so "
                          "llm-foundry's TrainConfig takes it as true)", f"{key}=true or {key}=false")
            continue
        if any(_is_a(v, k) for k in kinds):
            continue
        if kinds == ["bool"]:
            fix = f"{key}=true or {key}=false"
        else:
            fix = "e.g. " + _EXAMPLES.get(key, f"{key}=<{' or '.join(k for k in kinds if k != 'None')}>")
        what = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
                "dict": "a mapping", "list": "a list", "None": "null"}
        yield Problem(key, f"{v!r} is not {' or '.join(what[k] for k in kinds)} (llm-foundry's TrainConfig; it "
                      "refuses the value when the run starts)", fix)


def seed(cfg, ctx):
    """A seed composer refuses; and seed=N on a YAML whose loader shuffles by `${variables.global_seed}`: the
    model's initialisation follows, the data order does not (a sweep over seed varied the initialisation alone)."""
    v, order = value(cfg, "seed"), value(cfg, "train_loader.dataset.shuffle_seed")
    if is_int(v) and not 0 <= v <= MAX_SEED:
        yield Problem("seed", f"{v} is outside [0, 2^32 - 1] (composer's seed_all refuses it)", "e.g. seed=17")
    elif ctx.given("seed") is not None and order is not None and str(order) != str(v) \
            and ctx.given("train_loader.dataset.shuffle_seed") is None and ctx.given("variables.global_seed") is None:
        yield Problem("seed", f"seeds the model's initialisation; the data order follows "
                      f"train_loader.dataset.shuffle_seed={order}", "variables.global_seed=<n> (every key that reads "
                      "it follows), or train_loader.dataset.shuffle_seed=<n> too", WARNING)


def _finite(v) -> bool:
    return is_number(v) and math.isfinite(v)


def _named(cfg, key: str, options, what: str, registry: str):
    """A name llm-foundry looks up in one of its registries."""
    v = value(cfg, key)
    if v is None or v in options:
        return
    yield Problem(key, f"{v!r} is not {what} llm-foundry knows (its `{registry}` registry would refuse it when "
                  "the run starts)", close_or_all(v, options))


def _kwargs(cfg, key: str, name, known: dict, extra=(), example="100ba"):
    """The keyword arguments a registered class takes: another key is a TypeError when it is built."""
    spec = known.get(name)
    node = value(cfg, key)
    if spec is None or not hasattr(node, "keys"):
        return
    accepted, required = spec
    for k in node.keys():
        if k != "name" and k not in accepted and k not in extra:
            options = (*accepted, *extra)
            hint = close_match(str(k), options)
            yield Problem(f"{key}.{k}", f"is not an argument of {name} (it takes {', '.join(options) or 'none'}): "
                          "building it would fail with a TypeError", hint or f"remove it (~{key}.{k})")
    for k in required:
        if k not in node.keys():
            yield Problem(f"{key}.{k}", f"{name} needs it, and it is not set", f"e.g. {key}.{k}={example}")


def registries(cfg, ctx):
    yield from _named(cfg, "optimizer.name", names.OPTIMIZERS, "an optimizer", "optimizers")
    yield from _kwargs(cfg, "optimizer", value(cfg, "optimizer.name"), names.OPTIMIZERS, names.OPTIMIZER_EXTRA)
    yield from _named(cfg, "scheduler.name", names.SCHEDULERS, "a scheduler", "schedulers")
    yield from _kwargs(cfg, "scheduler", value(cfg, "scheduler.name"), names.SCHEDULERS)
    for loader in loader_keys(cfg):
        yield from _named(cfg, f"{loader}.name", names.DATALOADERS, "a dataloader", "dataloaders")
    groups = (("callbacks", (*names.CALLBACKS, *names.CALLBACKS_WITH_CONFIG, *names.OUR_CALLBACKS), "callback"),
              ("algorithms", names.ALGORITHMS, "algorithm"), ("loggers", names.LOGGERS, "logger"))
    arguments = {"callbacks": names.CALLBACK_KWARGS, "algorithms": names.ALGORITHM_KWARGS,
                 "loggers": names.LOGGER_KWARGS}
    for key, options, what in groups:
        node = value(cfg, key)
        for name in (node.keys() if hasattr(node, "keys") else ()):
            if name not in options:
                yield Problem(f"{key}.{name}", f"is not a {what} llm-foundry knows (its `{key}` registry would refuse "
                              "it when the run starts)", close_or_all(name, options))
            elif hasattr(value(cfg, f"{key}.{name}"), "keys"):
                yield from _kwargs(cfg, f"{key}.{name}", name, arguments[key], example="<value>")
    yield from _named(cfg, "model.name", names.MODELS, "a model", "models")
    if value(cfg, "model.name") != "mpt_causal_lm":
        return
    yield from _named(cfg, "model.attn_config.attn_impl", names.ATTENTION_IMPLEMENTATIONS, "an attention "
                      "implementation", "attention_implementations")
    yield from _named(cfg, "model.attn_config.attn_type", names.ATTENTION_CLASSES, "an attention type",
                      "attention_classes")
    yield from _named(cfg, "model.norm_type", names.NORMS, "a norm", "norms")
    yield from _named(cfg, "model.ffn_config.ffn_type", names.FFNS, "an FFN type", "ffns")
    fc = value(cfg, "model.fc_type")
    yield from _named(cfg, "model.fc_type.name" if hasattr(fc, "keys") else "model.fc_type", names.FCS,
                      "a linear layer type", "fcs")
    loss = value(cfg, "model.loss_fn")
    if isinstance(loss, str) and loss not in ("fused_crossentropy", "torch_crossentropy"):
        yield Problem("model.loss_fn", f"{loss!r} is not a loss MPT knows (it refuses it when the model is built)",
                      close_match(loss, ("fused_crossentropy", "torch_crossentropy"))
                      or "model.loss_fn=torch_crossentropy (or fused_crossentropy on a GPU with flash-attn)")


def optimizer(cfg, ctx):
    name = value(cfg, "optimizer.name")
    lr = value(cfg, "optimizer.lr")
    if is_number(lr) and not math.isfinite(lr):
        yield Problem("optimizer.lr", f"{lr} is not a finite number: the first step turns every weight into NaN "
                      "(surely fails)" + (" (torch refuses NaN)" if lr != lr else ""), "e.g. optimizer.lr=6.0e-4")
    betas = value(cfg, "optimizer.betas")
    if betas is not None:
        listed = list(betas) if hasattr(betas, "__len__") and not isinstance(betas, str) else None
        if listed is None or len(listed) != 2 or not all(_finite(b) and 0 <= b < 1 for b in listed):
            yield Problem("optimizer.betas", f"{listed if listed is not None else betas!r} is not two numbers in "
                          f"[0, 1) ({name} refuses it when it is built)", "e.g. optimizer.betas=[0.9,0.95]")
    for key, example in (("eps", "1.0e-08"), ("weight_decay", "0.0")):
        v = value(cfg, f"optimizer.{key}")
        if v is None:
            continue
        if not _finite(v) or v < 0:
            who = "torch's Adam refuses it" if name == "decoupled_adamw" or key == "eps" else "surely fails: a " \
                  "negative decay grows every weight at each step"
            yield Problem(f"optimizer.{key}", f"must be a finite number >= 0, got {v!r} ({who})",
                          f"e.g. optimizer.{key}={example}")


def scheduler(cfg, ctx):
    name = value(cfg, "scheduler.name")
    for key in ("t_warmup", "t_max"):
        v = value(cfg, f"scheduler.{key}")
        if v is not None and time_of(v) is None:
            yield Problem(f"scheduler.{key}", f"{v!r} is not a composer time (a number and a unit): {name} refuses "
                          "it when it is built", f"use {_TIME_UNITS}")
        elif v is not None and time_of(v)[0] < 0:
            yield Problem(f"scheduler.{key}", f"{v!r} is negative: a time before training starts, which {name} "
                          "takes without a word (surely a mistake)", f"a positive time, e.g. scheduler.{key}="
                          + ("100ba" if key == "t_warmup" else "1dur"))
    for key in ("alpha_f", "alpha_i", "alpha"):
        v = value(cfg, f"scheduler.{key}")
        if v is None:
            continue
        if not _finite(v) or v < 0:
            yield Problem(f"scheduler.{key}", f"{v!r}: the learning rate is optimizer.lr x {key}, so it turns "
                          "negative (or NaN) and training climbs the loss (surely fails)",
                          f"a fraction of optimizer.lr, e.g. scheduler.{key}=0.1")
        elif v > 1:
            yield Problem(f"scheduler.{key}", f"{v} makes the learning rate rise above optimizer.lr "
                          f"(optimizer.lr x {v})", f"a fraction of optimizer.lr, e.g. scheduler.{key}=0.1", WARNING)


def model(cfg, ctx):
    if value(cfg, "model.name") != "mpt_causal_lm":
        return
    ratio = value(cfg, "model.expansion_ratio")
    if ratio is not None:
        if not _finite(ratio) or ratio < 0:
            yield Problem("model.expansion_ratio", f"must be a number >= 0, got {ratio!r} (the MLP's width is "
                          "d_model x expansion_ratio: torch refuses a negative size)", "e.g. model.expansion_ratio=4")
        elif ratio * (value(cfg, "model.d_model") or 0) < 1:
            yield Problem("model.expansion_ratio", f"{ratio}: the MLP has no hidden unit (d_model x expansion_ratio "
                          "< 1): a transformer without its MLP", "e.g. model.expansion_ratio=4", WARNING)
    for key in ("model.attn_config.attn_pdrop", "model.resid_pdrop", "model.emb_pdrop"):
        v = value(cfg, key)
        if v is not None and (not _finite(v) or not 0 <= v <= 1):
            yield Problem(key, f"must be a probability in [0, 1], got {v!r} (MPT's config refuses it)",
                          f"e.g. {key}=0.0")
    pdrop = value(cfg, "model.attn_config.attn_pdrop")
    if value(cfg, "model.attn_config.attn_impl") == "torch" and _finite(pdrop) and 0 < pdrop <= 1:
        # llm-foundry 0.22's torch attention drops out the softmax output in place, which autograd then needs:
        # "one of the variables needed for gradient computation has been modified by an inplace operation" at
        # the first backward (flash attention drops out inside its kernel)
        yield Problem("model.attn_config.attn_pdrop", f"{pdrop} with model.attn_config.attn_impl=torch: llm-foundry's "
                      "torch attention fails at the first backward step with attention dropout (an in-place dropout "
                      "of what autograd keeps)", "model.attn_config.attn_pdrop=0 with torch attention (CPU), or "
                      "flash attention on a GPU cluster")
    fraction = value(cfg, "model.embedding_fraction")
    if fraction is not None and (not _finite(fraction) or not 0 < fraction <= 1):
        yield Problem("model.embedding_fraction", f"must be in (0, 1], got {fraction!r} (MPT's config refuses it)",
                      "model.embedding_fraction=1.0")
    heads, kv = value(cfg, "model.n_heads"), value(cfg, "model.attn_config.kv_n_heads")
    if kv is not None and value(cfg, "model.attn_config.attn_type") == "grouped_query_attention" and \
            (not is_int(kv) or kv <= 0 or (is_int(heads) and heads % kv)):
        yield Problem("model.attn_config.kv_n_heads", f"{kv!r} does not divide model.n_heads={heads} (grouped query "
                      "attention refuses it)", "a divisor of model.n_heads, e.g. model.attn_config.kv_n_heads=8")
    for key in ("model.learned_pos_emb", "model.no_bias", "model.attn_config.alibi", "model.attn_config.rope",
                "model.attn_config.qk_ln", "model.attn_config.qk_gn", "model.attn_config.fused_qkv",
                "model.attn_config.attn_uses_sequence_id", "model.use_cache", "model.tie_word_embeddings",
                "model.use_pad_tok_in_ffn", "model.use_train_metrics", "model.load_in_8bit"):
        v = value(cfg, key)
        if v is not None and not isinstance(v, bool):
            yield Problem(key, f"{v!r} is not true or false (MPT's config tests it as a flag: any string is on)",
                          f"{key}=true or {key}=false")
    tokenizer = value(cfg, "tokenizer.name")
    if not isinstance(tokenizer, str) or not tokenizer.strip():
        yield Problem("tokenizer.name", f"{tokenizer!r} names no tokenizer (transformers' AutoTokenizer refuses it)",
                      "a hub name, e.g. tokenizer.name=EleutherAI/gpt-neox-20b, or a folder saved by save_pretrained")


# What transformers' AutoTokenizer.from_pretrained reads of the keyword arguments llm-foundry passes it
# (tokenizer.kwargs; transformers 4.51): its own, PreTrainedTokenizerBase's and the fast tokenizers', and those of
# the byte-level BPE tokenizers this tool trains with. Another key goes to the tokenizer's class, which keeps what
# it does not read: nothing reads a misspelt one.
TOKENIZER_KWARGS = (
    "add_bos_token", "add_eos_token", "add_prefix_space", "additional_special_tokens", "bos_token", "cache_dir",
    "chat_template", "clean_up_tokenization_spaces", "cls_token", "code_revision", "eos_token", "errors",
    "extra_special_tokens", "force_download", "from_slow", "legacy", "local_files_only", "mask_token",
    "merges_file", "model_input_names", "model_max_length", "pad_token", "padding_side", "proxies", "revision",
    "sep_token", "split_special_tokens", "subfolder", "token", "tokenizer_file", "tokenizer_type",
    "trust_remote_code", "truncation_side", "unk_token", "use_auth_token", "use_fast", "vocab_file",
)
_TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token", "add_prefix_space", "clean_up_tokenization_spaces",
                    "force_download", "from_slow", "legacy", "local_files_only", "split_special_tokens",
                    "trust_remote_code", "use_fast")


def tokenizer_kwargs(cfg, ctx):
    """tokenizer.kwargs, passed as they are to AutoTokenizer.from_pretrained (a name in llm-foundry's own tokenizer
    registry, tiktoken, takes its own): a padding side it refuses stops the run with a traceback after its
    folder is made; a length of letters, or a word for a flag, trains; a misspelt key is kept and read by
    nothing."""
    kwargs = mapping(cfg, "tokenizer.kwargs")
    if kwargs is None or value(cfg, "tokenizer.name") == "tiktoken":
        return
    if not hasattr(kwargs, "keys"):
        yield Problem("tokenizer.kwargs", f"{OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else kwargs!r}"
                      " is not a mapping of keyword arguments (llm-foundry passes them to AutoTokenizer by name)",
                      "tokenizer.kwargs.<name>=<value>, e.g. tokenizer.kwargs.model_max_length=2048")
        return
    length = kwargs.get("model_max_length")
    if length is not None and (not is_int(length) or length <= 0):
        yield Problem("tokenizer.kwargs.model_max_length", f"must be a positive whole number of tokens, got {length!r}",
                      f"tokenizer.kwargs.model_max_length={value(cfg, 'max_seq_len')} (max_seq_len, which the "
                      "presets' tokenizer.kwargs follow)")
    for key in ("padding_side", "truncation_side"):
        side = kwargs.get(key)
        if side is not None and side not in ("left", "right"):
            yield Problem(f"tokenizer.kwargs.{key}", f"{side!r} is not left or right (transformers refuses it as "
                          "the tokenizer is built, after the run has started)", f"tokenizer.kwargs.{key}=right")
    for key in _TOKENIZER_FLAGS:
        v = kwargs.get(key)
        if v is not None and not isinstance(v, bool):
            yield Problem(f"tokenizer.kwargs.{key}", f"{v!r} is not true or false (transformers tests it as a flag: "
                          "any word is on)", f"tokenizer.kwargs.{key}=true or tokenizer.kwargs.{key}=false")
    for key in kwargs.keys():
        if key not in TOKENIZER_KWARGS:
            yield Problem(f"tokenizer.kwargs.{key}", "is not a keyword argument transformers' tokenizers read (the "
                          "tokenizer keeps it, and nothing uses it)", close_match(str(key), TOKENIZER_KWARGS)
                          or f"remove it (~tokenizer.kwargs.{key})", WARNING)


INIT_DEVICES = ("cpu", "meta", "mixed")  # llm-foundry's train (process_init_device) asserts one of them


def init_device(cfg, ctx):
    """Where the model's weights are made: llm-foundry's train asserts cpu, meta or mixed (a bare AssertionError as
    the model is built, after the queue and the run's first files); mixed needs FSDP."""
    device = value(cfg, "model.init_device")
    if device is None:
        return
    if device not in INIT_DEVICES:
        gpus = value(cfg, "cluster.gpus_per_node") or 0
        where = (f"; cluster={value(cfg, 'cluster.name')} has no GPU either (cluster.gpus_per_node=0)"
                 if str(device).startswith("cuda") and not gpus else "")
        yield Problem("model.init_device", f"{device!r} is not one llm-foundry builds a model on (it asserts one of "
                      f"{', '.join(INIT_DEVICES)}){where}", "model.init_device=" + ("meta (FSDP moves the weights to "
                      "the GPUs)" if gpus else "cpu (what the CPU presets set)"))
    elif device == "mixed" and value(cfg, "fsdp_config") is None:
        yield Problem("model.init_device", "mixed needs FSDP (llm-foundry raises NotImplementedError without "
                      "fsdp_config)", "model.init_device=cpu")
    elif device == "meta" and value(cfg, "fsdp_config") is not None and ctx.world_size(cfg) > 1 \
            and not value(cfg, "cluster.gpus_per_node"):
        # composer's FSDP2 makes the meta weights real with to_empty(device="cuda")
        yield Problem("model.init_device", f"meta on cluster={value(cfg, 'cluster.name')}, which has no GPU "
                      "(cluster.gpus_per_node=0): composer makes the sharded weights on the GPU, and the run fails "
                      "as it starts (\"Found no NVIDIA driver\")", "model.init_device=cpu (what the CPU presets set)")


def _max_duration_count(cfg):
    time = time_of(value(cfg, "max_duration"))
    return time if time and time[1] in ("ba", "ep", "tok", "sp") else (None, None)


def durations(cfg, ctx):
    count, unit = _max_duration_count(cfg)
    if count == 0:
        yield Problem("max_duration", f"{value(cfg, 'max_duration')} trains nothing (llm-foundry refuses it: "
                      "\"No training would occur\")", "e.g. max_duration=1000ba")
    elif count is not None and count > MAX_COUNT:
        yield Problem("max_duration", f"{count}{unit} is past what composer counts (its timestamps are 64-bit: at "
                      f"most {MAX_COUNT:.2e}); the run's ETA overflows (surely fails)", "e.g. max_duration=143100ba")
    for key in ("console_log_interval", "callbacks.run_report.interval"):
        v = value(cfg, key)
        if key == "callbacks.run_report.interval" and (v is None or ctx.given(key) is None):
            continue
        bad = is_number(v) and v <= 0 or isinstance(v, str) and not _positive_batches_or_epochs(v)
        if bad or v is None:
            yield Problem(key, f"{v!r} is not a positive number of batches or epochs (the progress report refuses "
                          "it when the run starts)", f"e.g. {key}=10ba")
    for key in ("eval_subset_num_batches", "train_subset_num_batches"):
        v = value(cfg, key)
        if is_int(v) and (v == 0 or v < -1):
            why = "evaluates no batch: every eval metric is NaN" if key.startswith("eval") else "trains no batch"
            yield Problem(key, f"{v} {why} (surely fails); -1 means all batches", f"{key}=-1, or a positive count")
    level = value(cfg, "python_log_level")
    if isinstance(level, str) and not isinstance(logging.getLevelName(level.upper()), int):
        yield Problem("python_log_level", f"{level!r} is not a logging level (llm-foundry's logging set-up refuses "
                      "it)", close_match(level.lower(), ("debug", "info", "warning", "error", "critical"))
                      or "python_log_level=info (or null)")
    mb = value(cfg, "device_train_microbatch_size")
    if mb == "auto" and not value(cfg, "cluster.gpus_per_node"):
        yield Problem("device_train_microbatch_size", "auto needs a GPU (composer: \"Can only use adaptive "
                      f"device_train_microbatch_size on GPU\") and cluster={value(cfg, 'cluster.name')} has none",
                      "a number, e.g. device_train_microbatch_size=8")  # (another word: values.numbers)


def _positive_batches_or_epochs(text: str) -> bool:
    """A time the progress report takes (composer's Time of batches or epochs, above 0)."""
    found = time_of(text)
    return found is not None and found[1] in ("ba", "ep") and found[0] > 0


def workers(cfg, ctx):
    for loader in loader_keys(cfg):
        n = value(cfg, f"{loader}.num_workers")
        key = f"{loader}.num_workers"
        if n is None:
            continue
        if not is_int(n) or n < 0:
            yield Problem(key, f"must be a count of worker processes, got {n!r} (torch's DataLoader refuses it)",
                          f"e.g. {key}=8")
        elif n == 0:
            # torch's DataLoader's own tests, on llm-foundry's build_text_dataloader defaults (2, True)
            prefetch = value(cfg, f"{loader}.prefetch_factor", default=2)
            persistent = value(cfg, f"{loader}.persistent_workers", default=True)
            refused = []
            if prefetch is not None:
                refused.append((f"prefetch_factor {prefetch}", "prefetch_factor option could only be specified in "
                                "multiprocessing"))
            if persistent:
                refused.append((f"persistent_workers {persistent}", "persistent_workers option needs num_workers > 0"))
            if refused:
                yield Problem(key, f"0 workers with {' and '.join(s for s, _ in refused)}: torch's DataLoader refuses "
                              f"it ({'; '.join(repr(m) for _, m in refused)})",
                              f"{key}=1 (or more), or {loader}.prefetch_factor=null {loader}.persistent_workers=false "
                              "to load in the training process")


# Settings the libraries read as flags (`if x:`) and take whatever is given: a word (`maybe`, `no`) or a number is
# true there. composer's FSDP settings (FSDPConfig, FSDP2Config: dataclasses without a type check), torch's
# DataLoader's, streaming's dataset's. (llm-foundry's own top-level flags: train_config_types; MPT's: `model`.)
_FSDP_FLAGS = ("activation_checkpointing", "activation_checkpointing_reentrant", "activation_cpu_offload",
               "cpu_offload", "forward_prefetch", "keep_low_precision_grads", "limit_all_gathers",
               "load_monolith_rank0_only", "sync_module_states", "te_checkpoint_wrapper", "te_shard_fp8_weight",
               "use_orig_params", "verbose")
_LOADER_FLAGS = ("drop_last", "pin_memory", "persistent_workers")
_DATASET_FLAGS = ("shuffle", "keep_zip", "allow_unsafe_types")


def flags(cfg, ctx):
    keys = [f"fsdp_config.{k}" for k in _FSDP_FLAGS] if hasattr(value(cfg, "fsdp_config"), "keys") else []
    for loader in loader_keys(cfg):
        keys += [f"{loader}.{k}" for k in _LOADER_FLAGS] + [f"{loader}.dataset.{k}" for k in _DATASET_FLAGS]
    for key in keys:
        v = value(cfg, key)
        if v is not None and not isinstance(v, bool) and not (is_int(v) and v in (0, 1)):
            yield Problem(key, f"{v!r} is not true or false (read as a flag, where any word or number but 0 is "
                          "true)", f"{key}=true or {key}=false")


def cluster_numbers(cfg, ctx):
    timeout = value(cfg, "dist_timeout")
    if is_number(timeout) and timeout <= 0:
        yield Problem("dist_timeout", f"must be a positive number of seconds, got {timeout} (0 would be "
                      "read as 600 without a word)", "e.g. dist_timeout=600")
    limit = value(cfg, "cluster.timeout_min")
    if is_int(limit) and limit <= 0:
        yield Problem("cluster.timeout_min", f"must be a positive number of minutes, got {limit} (Slurm refuses "
                      "the time limit)", "e.g. cluster.timeout_min=2880 (48 h)")
    delay = value(cfg, "cluster.signal_delay_s")
    if is_int(delay):
        if delay < 0 or delay > 65535:
            yield Problem("cluster.signal_delay_s", f"{delay} is outside Slurm's --signal range (0 to 65535 s): "
                          "sbatch refuses it", "e.g. cluster.signal_delay_s=120")
        elif ctx.slurm and is_int(limit) and limit > 0 and delay >= limit * 60:
            yield Problem("cluster.signal_delay_s", f"{delay} s is not shorter than the time limit "
                          f"(cluster.timeout_min={limit}, {limit * 60} s): Slurm would signal the job as it starts, "
                          "and it would requeue itself before training a batch, again and again (surely fails)",
                          f"cluster.signal_delay_s={min(120, limit * 30)}, or a longer cluster.timeout_min")
    for key, low, example in (("cluster.max_num_timeout", 0, 20), ("cluster.cpus_per_task", 1, 12),
                              ("cluster.gpus_per_node", 0, 8)):
        v = value(cfg, key)
        if is_int(v) and v < low:
            yield Problem(key, f"must be at least {low}, got {v} (Slurm or submitit refuses it)", f"e.g. {key}={example}")
    mem = value(cfg, "cluster.mem_gb")
    if is_int(mem) and mem <= 0:
        yield Problem("cluster.mem_gb", f"must be a positive number of GB, got {mem} (0 asks Slurm for a whole "
                      "node's memory only with --mem=0; this tool writes it as null)", "cluster.mem_gb=null (what "
                      "the node has) or e.g. cluster.mem_gb=1800")
    if run_spec.scheduler(cfg) == "local" and is_int(value(cfg, "cluster.nodes")) and value(cfg, "cluster.nodes") > 1:
        nodes = value(cfg, "cluster.nodes")
        yield Problem("cluster.nodes", f"{nodes} nodes with cluster=local: the local launcher starts "
                      "cluster.tasks_per_node processes on this one machine, so the run would train at world size "
                      f"{value(cfg, 'cluster.tasks_per_node')} while its plan and summary say {nodes} nodes",
                      "cluster.nodes=1 (more processes here: cluster.tasks_per_node=N), or a Slurm cluster preset "
                      "(cluster=ndv5 ...) for several nodes", WARNING if ctx.mode == "run" else ERROR)


def algorithms(cfg, ctx):
    clip = value(cfg, "algorithms.gradient_clipping")
    if not hasattr(clip, "keys"):
        return
    kind = value(cfg, "algorithms.gradient_clipping.clipping_type")
    if kind not in ("norm", "value", "adaptive"):
        yield Problem("algorithms.gradient_clipping.clipping_type", f"{kind!r} is not norm, value or adaptive "
                      "(composer's gradient clipping refuses it)", close_match(str(kind), ("norm", "value", "adaptive"))
                      or "algorithms.gradient_clipping.clipping_type=norm")
    threshold = value(cfg, "algorithms.gradient_clipping.clipping_threshold")
    if not _finite(threshold) or threshold <= 0:
        yield Problem("algorithms.gradient_clipping.clipping_threshold", f"must be a positive number, got "
                      f"{threshold!r} (0 or less zeroes or flips every gradient: surely fails)",
                      "e.g. algorithms.gradient_clipping.clipping_threshold=1.0")


def speed_monitor(cfg, ctx):
    v = value(cfg, "callbacks.speed_monitor.window_size")
    if v is not None and (not is_int(v) or v <= 0):
        yield Problem("callbacks.speed_monitor.window_size", f"must be a positive number of batches, got {v!r} "
                      "(composer's SpeedMonitor divides by it)", "e.g. callbacks.speed_monitor.window_size=10")


def loader_arguments(cfg, ctx):
    """llm-foundry builds a text loader with its keys as build_text_dataloader's keyword arguments: another key
    (`num_worker`, or a `label` on a lone eval_loader, which only a list of evaluators pops) is a TypeError."""
    for loader in loader_keys(cfg):
        if value(cfg, f"{loader}.name") == "text":
            label = ("label",) if loader.startswith("eval_loaders.") else ()
            yield from _kwargs(cfg, loader, "llm-foundry's text loader", {"llm-foundry's text loader":
                               names.TEXT_LOADER_KWARGS}, label, example="<value>")


def dataset_keys(cfg, ctx):
    """llm-foundry's text loader passes its dataset the keys StreamingTextDataset or StreamingDataset take and
    drops any other without a word: a misspelt `shuffle_sed: 3` trains with the default seed."""
    known = (*names.TEXT_DATASET_PARAMS, *names.TEXT_DATASET_EXTRA)
    for loader in loader_keys(cfg):
        dataset = mapping(cfg, f"{loader}.dataset")
        if value(cfg, f"{loader}.name") != "text" or not hasattr(dataset, "keys"):
            continue
        for key, choices in names.DATASET_CHOICES.items():
            chosen = dataset.get(key)
            if chosen is not None and chosen not in choices:
                yield Problem(f"{loader}.dataset.{key}", f"{chosen!r} is not one of streaming's ({', '.join(choices)}): "
                              "it fails when the data is first read, after the queue",
                              close_match(str(chosen), choices) or f"one of {', '.join(choices)}")
        for key in dataset.keys():
            if key not in known:
                yield Problem(f"{loader}.dataset.{key}", "is not a setting llm-foundry's text loader reads "
                              "(StreamingTextDataset's or StreamingDataset's): it is dropped without a word",
                              close_match(str(key), known) or f"remove it (its settings: {', '.join(known)})",
                              WARNING)


def model_keys(cfg, ctx):
    """An MPT model's config (transformers' PretrainedConfig) keeps any key it is given and nothing reads one it
    does not know: a misspelt `n_layer: 24` trains model.n_layers layers."""
    known = (*names.MPT_MODEL_KEYS, *names.MPT_MODEL_EXTRA, *names.HF_CONFIG_KEYS)
    model = value(cfg, "model")
    if not hasattr(model, "keys") or value(cfg, "model.name") != "mpt_causal_lm":
        return
    for key in model.keys():
        if key not in known:
            yield Problem(f"model.{key}", "is not a setting an MPT model reads (MPTConfig keeps it, and nothing uses "
                          "it)", close_match(str(key), names.MPT_MODEL_KEYS) or "remove it", WARNING)


def model_parts(cfg, ctx):
    """An MPT block passes `attn_config` and `ffn_config` to its attention class and FFN builder as keyword
    arguments: a key they do not take (`qk_lnorm`, `kv_n_heads` with multihead attention) is a TypeError when the
    model is built, after the queue. `init_config` goes to an initialization that takes any key and reads few."""
    if value(cfg, "model.name") != "mpt_causal_lm":
        return
    # MPTConfig's defaults when a key is not set (llmfoundry/models/utils/config_defaults.py)
    attn_type = value(cfg, "model.attn_config.attn_type") or "multihead_attention"
    yield from _kwargs(cfg, "model.attn_config", attn_type, names.ATTENTION_KWARGS, names.ATTENTION_CONFIG_EXTRA,
                       example="1 (a divisor of model.n_heads)")
    ffn_type = value(cfg, "model.ffn_config.ffn_type") or "mptmlp"
    yield from _kwargs(cfg, "model.ffn_config", ffn_type, names.FFN_KWARGS, ("ffn_type",))
    init = value(cfg, "model.init_config")
    if not hasattr(init, "keys"):
        return
    yield from _named(cfg, "model.init_config.name", names.PARAM_INIT_FNS, "an initialization", "param_init_fns")
    name = value(cfg, "model.init_config.name") or "kaiming_normal_"
    reads = names.PARAM_INIT_FNS.get(name)
    every = sorted({k for keys in names.PARAM_INIT_FNS.values() for k in keys})

    def read_by(key):
        return [n for n, keys in names.PARAM_INIT_FNS.items() if key in keys]

    for key in init.keys() if reads is not None else ():
        if key == "name" or key in reads:
            continue
        readers = read_by(key)
        if readers:  # a setting of another initialization (init_std is baseline_'s, kaiming_normal_ ignores it)
            fix = f"model.init_config.name={readers[0]} to use it, or remove it"
        else:
            meant = nearest(key, every)
            fix = f"remove it ({name} reads {', '.join(reads) or 'nothing'})" if meant is None else \
                f"did you mean `{meant}`?" + ("" if meant in reads else f" (with model.init_config.name={read_by(meant)[0]})")
        yield Problem(f"model.init_config.{key}", f"is not read by the {name} initialization (it takes any key and "
                      "ignores this one)" + (f"; read by {', '.join(readers)}" if readers else ""), fix, WARNING)


def labels(cfg, ctx):
    """Several evaluators (eval_loaders, or a YAML's eval_loader list): each needs its own label, which names its
    metrics (eval/<label>/LanguageCrossEntropy)."""
    seen = {}
    for loader in eval_keys(cfg):
        if not loader.startswith("eval_loaders."):
            continue
        label = value(cfg, f"{loader}.label")
        if label in (None, ""):
            yield Problem(f"{loader}.label", "is not set: llm-foundry refuses an evaluator of several without one "
                          "(\"each one must include the `label` attribute\")",
                          f"e.g. {loader}.label=c4_val (its metrics are reported as eval/<label>/...)")
        elif label in seen:
            yield Problem(f"{loader}.label", f"{label!r} is also {seen[label]}'s label: composer keeps one set of "
                          "metrics per label, so the two evaluations are reported under one name and cannot be told "
                          "apart", f"give each evaluator its own label, e.g. {loader}.label={label}_2", WARNING)
        else:
            seen[label] = loader


def tensor_parallel(cfg, ctx):
    """tp_config: what llm-foundry and composer refuse as they build the model and the trainer, on every rank."""
    tp = value(cfg, "tp_config")
    if not hasattr(tp, "keys"):
        return
    if ctx.world_size(cfg) == 1:
        yield Problem("tp_config", f"llm-foundry drops it at one rank ({ctx.world_words(cfg)}): nothing is split",
                      "remove it (~tp_config), or train on several ranks", WARNING)
        return
    for key in tp.keys():
        if key not in names.TP_CONFIG_KEYS:
            yield Problem(f"tp_config.{key}", "is not a setting of composer's TPConfig (llm-foundry passes it "
                          "device_mesh and tensor_parallel_degree, and the layer plan it builds from strategy): "
                          "building the trainer would fail with a TypeError",
                          close_match(str(key), names.TP_CONFIG_KEYS) or f"remove it (~tp_config.{key})")
    for key, example in (("strategy", "ffn"), ("tensor_parallel_degree", "2")):
        if key not in tp.keys():
            yield Problem(f"tp_config.{key}", "llm-foundry needs it with tp_config (a ValueError as the model is "
                          "built)", f"+tp_config.{key}={example}")
    yield from _named(cfg, "tp_config.strategy", names.TP_STRATEGIES, "a tensor parallel strategy", "tp_strategies")
    degree = value(cfg, "tp_config.tensor_parallel_degree")
    if degree == 1:
        yield Problem("tp_config.tensor_parallel_degree", "1 splits nothing: composer drops tensor parallelism "
                      "(a warning in the log)", "tp_config.tensor_parallel_degree=2 (or more), or ~tp_config",
                      WARNING)
    elif degree is not None and not (is_int(degree) and (degree > 1 or degree == -1)):
        yield Problem("tp_config.tensor_parallel_degree", f"{degree!r} is not a count of ranks (composer builds a "
                      "device mesh of it)", "e.g. tp_config.tensor_parallel_degree=2 (-1: the ranks FSDP leaves)")
    if not value(cfg, "fsdp_config"):
        yield Problem("tp_config", "composer's tensor parallelism needs FSDP, and fsdp_config is null (a ValueError "
                      "when the trainer is built)", "keep an fsdp_config (e.g. fsdp_config.sharding_strategy="
                      "FULL_SHARD), or ~tp_config")
    elif value(cfg, "fsdp_config.use_orig_params") is False:
        yield Problem("fsdp_config.use_orig_params", "composer's tensor parallelism needs use_orig_params=true (a "
                      "ValueError when the trainer is built)", "fsdp_config.use_orig_params=true, or ~tp_config")


_ICL_FIX = {"label": "a name for the task's metrics (label: lambada)",
            "dataset_uri": "the task's .jsonl file (a local path, or a URI: s3://..., hf://...)",
            "icl_task_type": "one of: " + ", ".join(sorted(names.ICL_TASK_KWARGS)),
            "num_fewshot": "the shot counts to evaluate (num_fewshot: [0])"}


def icl_task(task, where: str):
    """One in-context learning task (plain containers) as llm-foundry's build_icl_evaluators reads it, as the trainer
    is built on every rank: `where` names it (`icl_tasks[0]`)."""
    if not isinstance(task, dict):
        yield Problem(where, f"{task!r} is not a task (llm-foundry asserts each is a mapping)",
                      "label, dataset_uri, icl_task_type and num_fewshot keys")
        return
    for key in names.ICL_TASK_REQUIRED:
        if task.get(key) is None:
            yield Problem(f"{where}.{key}", "llm-foundry needs it for each ICL task (an AssertionError as the trainer "
                          "is built)", _ICL_FIX[key])
    kind = task.get("icl_task_type")
    if kind is not None and kind not in names.ICL_TASK_KWARGS:
        yield Problem(f"{where}.icl_task_type", f"{kind!r} is not an ICL task type llm-foundry knows (its "
                      "`icl_datasets` registry)", close_or_all(kind, names.ICL_TASK_KWARGS))
    shots = task.get("num_fewshot")
    if shots is not None and not isinstance(shots, list):
        yield Problem(f"{where}.num_fewshot", f"{shots!r} is not a list (llm-foundry evaluates each shot count in "
                      "it: a TypeError as the trainer is built)", f"{where}.num_fewshot=[{shots}]")
    if "num_beams" in task:
        yield Problem(f"{where}.num_beams", "llm-foundry refuses it at the top of a task (a ValueError)",
                      f"{where}.generation_kwargs.num_beams")
    if "question_prelimiter" in task and "prelimiter" in task:
        yield Problem(f"{where}.question_prelimiter", "names the same argument as prelimiter, which is also set "
                      "(llm-foundry's ValueError)", "keep one of them")
    accepted = names.ICL_TASK_KWARGS.get(kind)
    for key in (task.keys() if accepted else ()):
        if key not in accepted and key not in names.ICL_TASK_OWN and key != "num_beams":
            options = (*accepted, *names.ICL_TASK_OWN)
            yield Problem(f"{where}.{key}", f"is not a setting of a {kind} task (llm-foundry passes it to the "
                          "task's dataset: a TypeError as the trainer is built)",
                          close_match(str(key), options) or f"remove it (~{where}.{key})")


def icl_tasks(cfg, ctx):
    """An inline `icl_tasks` list (a path to a file of them: node.py reads it)."""
    tasks = value(cfg, "icl_tasks")
    if not isinstance(tasks, ListConfig):
        return
    for i, task in enumerate(OmegaConf.to_container(tasks, resolve=True)):
        yield from icl_task(task, f"icl_tasks[{i}]")


RULES = [train_config_types, seed, registries, optimizer, scheduler, model, init_device, tokenizer_kwargs,
         durations, workers, flags, cluster_numbers, algorithms, speed_monitor, labels, loader_arguments, dataset_keys,
         model_keys, model_parts, tensor_parallel, icl_tasks]
