"""Checks a composed config before anything starts or is submitted. Light: no torch, no llm-foundry.

Each rule raises ConfigError naming the key, what is wrong and the fix, so that a mistake costs seconds on
the login node instead of a day in the queue.
"""
import difflib
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

# Ours; removed before llm-foundry sees the config (train/foundry.py).
PRODUCT_KEYS = frozenset({"cluster", "storage", "data", "checkpoint", "plan"})
# llm-foundry 0.22's TrainConfig fields (tests/test_config.py checks this list against the library).
FOUNDRY_KEYS = frozenset("""
model tokenizer optimizer scheduler train_loader device_train_batch_size device_eval_batch_size max_duration
max_seq_len seed precision code_paths max_split_size_mb expandable_segments cuda_load_lazy dist_timeout
fsdp_config tp_config accumulate_train_batch_on_tokens eval_interval eval_loader eval_loaders icl_tasks
icl_tasks_str eval_gauntlet eval_gauntlet_str icl_subset_num_batches icl_seq_len loggers progress_bar
log_to_console python_log_level console_log_interval log_config callbacks algorithms save_folder
save_latest_filename save_overwrite save_weights_only save_filename save_interval save_num_checkpoints_to_keep
load_path load_weights_only load_strict_model_weights load_ignore_keys save_ignore_keys only_hf_checkpoint
only_composer_checkpoint train_subset_num_batches device_train_microbatch_size global_train_batch_size
spin_dataloaders eval_subset_num_batches eval_first compile_config metadata flatten_metadata run_name
autoresume profiler variables n_gpus device_train_grad_accum
""".split())

_DURATION = re.compile(r"^\d+(ba|ep|tok|sp|dur)$")
_TIME_UNITS = "ba (batches), ep (epochs), tok (tokens) or sp (samples), e.g. 1000ba"


class ConfigError(ValueError):
    def __init__(self, key: str, problem: str, fix: str):
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"error: {key}: {problem}\n  fix: {fix}")


def close_match(word: str, options) -> str:
    found = difflib.get_close_matches(word, sorted(options), n=1)
    return f"did you mean `{found[0]}`?" if found else ""


def value(cfg: DictConfig, key: str):
    """The resolved value at a dotted key, turning OmegaConf's errors into ours."""
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(key, "has no value", f"pass it on the command line: {key}=<value>") from None
    except InterpolationResolutionError as err:
        raise ConfigError(key, f"cannot be resolved ({err.__cause__ or err})",
                          "set the keys it refers to, or give it a value directly") from None


def _positive_int(cfg, key):
    v = value(cfg, key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(key, f"must be a positive whole number, got {v!r}", f"e.g. {key}=8")
    return v


def _duration(cfg, key):
    v = value(cfg, key)
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    if not isinstance(v, str) or not _DURATION.match(v):
        raise ConfigError(key, f"{v!r} is not a duration with a unit", f"use {_TIME_UNITS}: {key}=1000ba")
    return v


def check_keys(cfg):
    for key in cfg:
        if key not in FOUNDRY_KEYS | PRODUCT_KEYS:
            hint = close_match(key, FOUNDRY_KEYS | PRODUCT_KEYS)
            raise ConfigError(key, "is not a key llm-foundry or this tool knows",
                              hint or "remove it, or put your own values under `variables.`")


def check_numbers(cfg):
    for key in ("max_seq_len", "global_train_batch_size", "model.d_model", "model.n_heads", "model.n_layers",
                "model.vocab_size", "device_eval_batch_size"):
        _positive_int(cfg, key)
    mb = value(cfg, "device_train_microbatch_size")
    if mb != "auto":
        _positive_int(cfg, "device_train_microbatch_size")
    for key in ("max_duration", "eval_interval", "save_interval"):
        _duration(cfg, key)
    lr = value(cfg, "optimizer.lr")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        raise ConfigError("optimizer.lr", f"must be a positive number, got {lr!r}", "e.g. optimizer.lr=6.0e-4")
    if value(cfg, "model.d_model") % value(cfg, "model.n_heads"):
        raise ConfigError("model.n_heads", f"{cfg.model.n_heads} does not divide model.d_model={cfg.model.d_model}",
                          "pick a head count that divides d_model (head size 128 suits flash attention)")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.path.exists(name)


def check_tokenizer(cfg):
    if value(cfg, "data.kind") == "mock":
        return  # written beside the mock data when the run starts
    name = str(value(cfg, "tokenizer.name"))
    if _looks_like_path(name):
        folder = Path(name).expanduser()
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
            raise ConfigError("tokenizer.name", f"{folder} is not a tokenizer folder (no tokenizer.json)",
                              "point it at a folder saved by save_pretrained, or use a hub name such as "
                              "EleutherAI/gpt-neox-20b")


def check_data(cfg):
    kind = value(cfg, "data.kind")
    local = value(cfg, "variables.data_local")
    if kind == "mock":
        return
    if value(cfg, "variables.data_remote"):
        return  # streamed into data_local when the run starts
    for split_key in ("train_loader.dataset.split", "eval_loader.dataset.split"):
        split = value(cfg, split_key)
        index = Path(local) / split / "index.json"
        if not index.is_file():
            where = "does not exist" if not Path(local).exists() else f"has no {split}/index.json"
            raise ConfigError("variables.data_local", f"{local} {where}",
                              f"make it with `python -m data_prep out_root={local} split={split} ...`, or point "
                              "variables.data_local at an MDS folder (or set variables.data_remote to stream one)")


RULES = [check_keys, check_numbers, check_tokenizer, check_data]


def validate(cfg: DictConfig) -> None:
    for rule in RULES:
        rule(cfg)


def resolve_all(cfg: DictConfig) -> None:
    """Resolve every interpolation in place, naming the key whose interpolation fails."""
    try:
        OmegaConf.resolve(cfg)
    except InterpolationResolutionError as err:
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(key, f"cannot be resolved ({err.__cause__ or err})".splitlines()[0],
                          "set the keys it refers to, or give it a value directly") from None


def check_sweep(cfgs: list) -> None:
    """Every point of a sweep, before the first is submitted: each valid, and no two sharing a save_folder
    (they would resume from, and overwrite, each other's checkpoints)."""
    folders = {}
    for num, cfg in enumerate(cfgs):
        try:
            validate(cfg)
        except ConfigError as err:
            raise ConfigError(f"[sweep point #{num}] {err.key}", err.problem, err.fix) from None
        folder = cfg.get("save_folder")
        if folder and folder in folders:
            raise ConfigError("save_folder", f"sweep points #{folders[folder]} and #{num} both write to {folder}",
                              "leave save_folder to the checkpoint group (one folder per run_name), or make it "
                              "differ per point, e.g. save_folder=/data/ckpt/${run_name}")
        folders[folder] = num
