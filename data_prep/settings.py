"""Typed, checked view of the composed config. Pure: reads nothing but the config."""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from common.errors import Problem
from data_prep.errors import DataPrepError, gather

# MDS stores sample byte offsets as uint32, so a shard can never reach 4 GiB (streaming enforces the same).
MAX_SHARD_BYTES = 2**32 - 1
# A sample is one record of a shard, 4 bytes a token: it fits one shard with the shard's header (a few hundred
# bytes). A longer one would overflow numpy's uint32 as the first shard is written, a traceback.
MAX_CONCAT_TOKENS = (MAX_SHARD_BYTES - 4096) // 4


@dataclass(frozen=True)
class DatasetKind:
    name: str
    file_globs: tuple[str, ...]  # tried inside a folder given as input=
    text_key: str
    # Only c4: read from the hub when no input= is given. hub_shards maps a hub split to its file count.
    hub_repo: Optional[str]
    hub_subset: str
    hub_split: str
    hub_shards: dict


@dataclass(frozen=True)
class Settings:
    dataset: DatasetKind
    inputs: tuple[str, ...]  # as given; empty means "the hub", resolved in inputs.py
    out_root: Path
    split: str
    tokenizer: str
    concat_tokens: int
    eos_text: str
    bos_text: str
    compression: Optional[str]
    size_limit: int
    num_parts: int
    part: Optional[int]  # None: every part in this process, then merge
    workers: int
    strict: bool
    block_bytes: int
    model: Optional[str]
    model_vocab_size: Optional[int]
    progress: bool

    @property
    def split_dir(self) -> Path:
        return self.out_root / self.split


def _int(cfg: DictConfig, key: str, minimum: int, allow_none: bool = False) -> Optional[int]:
    value = cfg.get(key)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataPrepError(key, f"must be an integer >= {minimum}, got {value!r}", f"pass {key}=<integer>")
    return value


def _concat_tokens(cfg: DictConfig) -> int:
    tokens = _int(cfg, "concat_tokens", 1)
    if tokens > MAX_CONCAT_TOKENS:
        raise DataPrepError("concat_tokens", f"{tokens} tokens a sample do not fit an MDS shard (a shard's offsets "
                            f"are 32-bit: at most {MAX_CONCAT_TOKENS} tokens of 4 bytes a sample)",
                            "the sequence length the model trains on, e.g. concat_tokens=2048")
    return tokens


def _text(cfg: DictConfig, key: str) -> str:
    value = cfg.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataPrepError(key, f"must be a string, got {value!r}", f"quote it: {key}='...'")
    return value


def _compression(value) -> Optional[str]:
    if value in (None, "", "null", "none", "None"):
        return None
    match = re.fullmatch(r"zstd(?::(\d+))?", str(value))
    if not match or (match.group(1) and not 1 <= int(match.group(1)) <= 22):
        raise DataPrepError("compression", f"{value!r} is not supported", "use compression=null, zstd or zstd:<1-22>")
    # as streaming names it in each shard's index entry (zstd:3; `zstd:03` is no algorithm it reads)
    return f"zstd:{int(match.group(1))}" if match.group(1) else "zstd"


def _inputs(value) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    items = OmegaConf.to_container(value) if not isinstance(value, (list, tuple)) else list(value)
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise DataPrepError("input", f"must be a path, a glob or a list of them, got {value!r}")
    return tuple(items)


def _dataset(cfg: DictConfig) -> DatasetKind:
    ds = cfg.get("dataset")
    if not isinstance(ds, DictConfig) or not ds.get("name"):
        raise DataPrepError("dataset", "no dataset kind selected", "pass dataset=c4, dataset=slimpajama or dataset=jsonl")
    globs = ds.get("file_globs") or []
    if isinstance(globs, str):
        globs = [globs]
    text_key = ds.get("text_key")
    if not isinstance(text_key, str) or not text_key:
        raise DataPrepError("dataset.text_key", f"must name the JSON field holding the text, got {text_key!r}",
                            "e.g. dataset.text_key=text")
    hub = ds.get("hub") or {}
    return DatasetKind(
        name=str(ds.name),
        file_globs=tuple(str(g) for g in globs),
        text_key=text_key,
        hub_repo=hub.get("repo"),
        hub_subset=str(hub.get("subset") or ""),
        hub_split=str(hub.get("split") or ""),
        hub_shards=dict(hub.get("shards") or {}),
    )


def default_workers() -> int:
    # Slurm and taskset restrict the CPUs a job may use; os.cpu_count() would ignore that.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# What llm-foundry's converter (and training) call what data_prep reads under another name.
_THEIR_NAMES = {"max_seq_len": "concat_tokens", "splits": "split", "num_workers": "workers",
                "data_subset": "dataset.hub.subset", "local": "input", "path": "input"}
_DATASET_KEYS = ("name", "file_globs", "text_key", "hub")


def _unknown_keys(cfg: DictConfig) -> list:
    """A key data_prep does not read would be ignored: Hydra's own advice for an unknown key (`+max_seq_len=4096`)
    would make shards of concat_tokens' default length, exit 0."""
    import difflib

    from common.paths import CONF

    top = set(OmegaConf.load(CONF / "data_prep.yaml")) - {"defaults", "hydra"} | {"dataset"}
    unknown = [(str(k), top) for k in cfg if k != "hydra" and k not in top]
    unknown += [(f"dataset.{k}", {f"dataset.{d}" for d in _DATASET_KEYS}) for k in (cfg.get("dataset") or {})
                if k not in _DATASET_KEYS]
    problems = []
    for key, known in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        theirs = _THEIR_NAMES.get(key) or (close[0] if close else None)
        problems.append(Problem(key, "is not a key data_prep reads: it would be ignored",
                                f"{theirs}=<value>" + (f" (data_prep's name for {key})" if key in _THEIR_NAMES
                                                       else "") if theirs else f"its keys: {', '.join(sorted(known))}"))
    return problems


def _required(cfg: DictConfig, key: str, fix: str) -> str:
    value = cfg.get(key)
    if not value or not isinstance(value, str):
        raise DataPrepError(key, "is required", fix)
    return value


def _out_root(cfg: DictConfig) -> Path:
    out_root = _required(cfg, "out_root", "pass out_root=<folder that will hold the <split>/ dataset>")
    return Path(os.path.expanduser(out_root)).absolute()


def _split(cfg: DictConfig) -> str:
    split = cfg.get("split")
    if not isinstance(split, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", split) or split in (".", ".."):
        raise DataPrepError("split", f"must be a plain folder name such as train or val, got {split!r}")
    return split


def _part(cfg: DictConfig, num_parts: Optional[int]) -> Optional[int]:
    part = _int(cfg, "part", 0, allow_none=True)
    if part is not None and num_parts is not None and part >= num_parts:
        raise DataPrepError("part", f"is {part} but num_parts={num_parts} (parts are 0..{num_parts - 1})",
                            f"sweep -m part=range(0,{num_parts}) or raise num_parts")
    return part


def _size_limit(cfg: DictConfig) -> int:
    size_limit = _int(cfg, "size_limit", 1)
    if size_limit > MAX_SHARD_BYTES:
        raise DataPrepError("size_limit", f"{size_limit} bytes does not fit MDS's uint32 offsets", "use size_limit <= 4294967295")
    return size_limit


def _flag(cfg: DictConfig, key: str) -> bool:
    flag = cfg.get(key)
    if not isinstance(flag, bool):  # (a word such as `no` would be true)
        raise DataPrepError(key, f"must be true or false, got {flag!r}", f"{key}=true or {key}=false")
    return flag


def _model(cfg: DictConfig) -> Optional[str]:
    model = cfg.get("model_preset")
    if model is not None and not isinstance(model, str):
        raise DataPrepError("model_preset", f"must be a model preset name from conf/model, got {model!r}")
    return model


def settings_from(cfg: DictConfig) -> Settings:
    """The settings, or a DataPrepError with every problem of them at once (a user fixes them in one go)."""
    problems = _unknown_keys(cfg)
    read = functools.partial(gather, problems)
    num_parts = read(_int, cfg, "num_parts", 1)
    fields = dict(
        dataset=read(_dataset, cfg),
        inputs=read(_inputs, cfg.get("input")),
        out_root=read(_out_root, cfg),
        split=read(_split, cfg),
        tokenizer=read(_required, cfg, "tokenizer", "pass tokenizer=<folder containing tokenizer.json> or a hub "
                       "name such as EleutherAI/gpt-neox-20b"),
        concat_tokens=read(_concat_tokens, cfg),
        eos_text=read(_text, cfg, "eos_text"),
        bos_text=read(_text, cfg, "bos_text"),
        compression=read(_compression, cfg.get("compression")),
        size_limit=read(_size_limit, cfg),
        num_parts=num_parts,
        part=read(_part, cfg, num_parts),
        workers=read(_int, cfg, "workers", 1, True) or default_workers(),
        strict=read(_flag, cfg, "strict"),
        block_bytes=read(_int, cfg, "block_bytes", 1),
        model=read(_model, cfg),
        model_vocab_size=read(_int, cfg, "model_vocab_size", 1, True),
        progress=read(_flag, cfg, "progress"),
    )
    if problems:
        raise DataPrepError(problems=problems)
    return Settings(**fields)
