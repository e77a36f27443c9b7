"""What a training run can check about a dataset folder before it starts, cheaply and without the ML stack.

Light on purpose: only the standard library, so a launcher can call it before importing torch, transformers,
tokenizers or streaming (each slow to import). It reads what data_prep recorded beside the shards; for an MDS folder
written by something else (llm-foundry's converter, streaming's MDSWriter) it reads the first sample instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from math import prod
from pathlib import Path

INDEX_FILE = "index.json"
PLAN_FILE = "data_prep_plan.json"
SUMMARY_FILE = "data_prep_summary.json"
BLOCK_FILE = "block.json"  # a block's record, in its folder: there once the block is complete

# streaming's NDArray value dtypes: bytes per value by name (in the column) and by code (in each sample).
_DTYPE_BYTES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "float16": 2, "uint32": 4, "int32": 4,
                "float32": 4, "uint64": 8, "int64": 8, "float64": 8}
_VALUE_BYTES = {8: 1, 9: 1, 16: 2, 17: 2, 18: 2, 32: 4, 33: 4, 34: 4, 64: 8, 65: 8, 66: 8}
_MAX_SAMPLE_BYTES = 1 << 30  # a first sample larger than this is a broken header, not something to read


# ---- tokenizer ------------------------------------------------------------------------------------------


def vocab_fingerprint(definition: dict) -> str | None:
    """sha256 of a tokenizer.json's vocabulary: model.vocab and the added tokens' ids and contents.

    Only what decides which id means which token: formatting, key order, merges, normalizer or
    truncation settings do not change it, so the same vocabulary hashes the same wherever it was saved.
    """
    vocab = (definition.get("model") or {}).get("vocab") if isinstance(definition, dict) else None
    if vocab is None:
        return None
    added = sorted([t.get("id"), t.get("content")] for t in definition.get("added_tokens") or [] if isinstance(t, dict))
    canonical = json.dumps({"vocab": vocab, "added_tokens": added}, sort_keys=True, ensure_ascii=False,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads (its own order of environment variables)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expanduser(os.environ[var]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expanduser(cache)) / "huggingface" / "hub"


def hub_file(name: str, filename: str) -> Path | None:
    """A file of a hub name's repository in the local cache: the snapshot refs/main points at, else the newest."""
    repo = hub_cache() / ("models--" + name.replace("/", "--"))
    snapshots = repo / "snapshots"
    try:
        main = (repo / "refs" / "main").read_text().strip()
        if (snapshots / main / filename).is_file():
            return snapshots / main / filename
    except OSError:
        pass
    found = [p for p in snapshots.glob(f"*/{filename}") if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime, str(p))) if found else None


def tokenizer_file(name_or_path: str) -> Path | None:
    """The tokenizer.json a tokenizer name stands for on this machine, or None."""
    path = Path(os.path.expanduser(name_or_path))
    if path.is_dir():
        path = path / "tokenizer.json"
        return path if path.is_file() else None
    if path.is_file():
        return path if path.suffix == ".json" else None
    return hub_file(name_or_path, "tokenizer.json") if hub_name(name_or_path) else None


# huggingface_hub's repository id (validate_repo_id): [namespace/]name, letters, digits and -_. between word characters
_HUB_ID = re.compile(r"(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b")


def not_a_hub_name(name: str) -> str | None:
    """Why `name` cannot be a Hugging Face hub repository as huggingface_hub validates one (transformers would not
    even ask the hub; a path `/`, `./`, `../` or `~` at its start is none), or None."""
    if name.count("/") > 1:
        return "it has more than one /"
    if not _HUB_ID.fullmatch(name) or "--" in name or ".." in name or name.endswith(".git"):
        return "it holds characters a hub name does not (a hub name is [namespace/]name of letters, digits, -, _, .)"
    return None


def hub_name(name: str) -> bool:
    """Whether a tokenizer's name, where no file or folder of that name is here, names a hub repository (`name` or
    `owner/name`) rather than a path that does not exist."""
    return not_a_hub_name(name) is None


def tokenizer_fingerprint(name_or_path: str) -> str | None:
    """Vocabulary fingerprint (64 hex) of a folder holding tokenizer.json, a tokenizer.json, or a hub name
    found in the local Hugging Face cache; None when it is not on this machine or cannot be read."""
    file = tokenizer_file(name_or_path)
    if file is None:
        return None
    try:
        with open(file, "rb") as fh:
            return vocab_fingerprint(json.load(fh))
    except (OSError, ValueError):
        return None


# ---- dataset folder -------------------------------------------------------------------------------------


def _read_json(path: Path):
    try:
        with open(path, "rb") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def index_shards(split_folder: str | os.PathLike, raw: bytes | None = None) -> list[dict] | None:
    """The shards a folder's index.json lists, as recorded; None where it has no readable list. The one reader of
    an MDS index here: the checks, data_prep's merge and the task's shard hashes all read it through this, and
    reach a shard's file through shard_file. raw: the index's bytes, where the caller read them already (what it
    hashes is then what is read here)."""
    if raw is None:
        index = _read_json(Path(split_folder) / INDEX_FILE)
    else:
        try:
            index = json.loads(raw)
        except ValueError:
            index = None
    shards = index.get("shards") if isinstance(index, dict) else None
    return shards if isinstance(shards, list) and all(isinstance(s, dict) for s in shards) else None


def shard_file(split_folder: str | os.PathLike, info: dict) -> Path | None:
    """The file a shard's `raw_data` or `zip_data` entry names, inside the folder; None where it names a file
    outside it (an absolute name, or one with `..`: check_index says so), which nothing here reads or hashes."""
    name = str(info["basename"])
    return None if os.path.isabs(name) or ".." in Path(name).parts else Path(split_folder) / name


def samples_in(split_folder: str | os.PathLike, raw: bytes | None = None) -> int | None:
    """Samples its index.json lists (raw: its bytes, read already); None where there is no readable index."""
    shards = index_shards(split_folder, raw)
    return sum(int(s.get("samples") or 0) for s in shards) if shards is not None else None


def _tokens_in(data: bytes, encoding: str) -> int | None:
    """Token count of one `tokens` value as streaming encodes it."""
    if encoding == "bytes":
        # llm-foundry's legacy bytes samples hold int64 ids (its token_encoding_type default).
        return len(data) // 8 if len(data) % 8 == 0 else None
    args = encoding.split(":")
    if args[0] != "ndarray":
        return None
    if len(args) == 3:  # ndarray:<dtype>:<shape>: the shape is in the column, not the sample
        return prod(int(d) for d in args[2].split(","))
    pos = 0
    if len(args) == 1:  # no dtype in the column: the sample starts with its dtype code
        value_bytes = _VALUE_BYTES.get(data[0]) if data else None
        pos = 1
    else:
        value_bytes = _DTYPE_BYTES.get(args[1])
    if value_bytes is None or len(data) <= pos:
        return None
    ndim, shape_bytes = data[pos] >> 2, 1 << (data[pos] & 3)
    pos += 1
    shape = [int.from_bytes(data[pos + i * shape_bytes: pos + (i + 1) * shape_bytes], "little") for i in range(ndim)]
    count = prod(shape)
    # The rest of the sample must be exactly those values, or this is not the layout we think.
    return count if ndim and len(data) - pos - ndim * shape_bytes == count * value_bytes else None


def first_sample_tokens(split_folder: str | os.PathLike) -> int | None:
    """Tokens in the first sample of the first non-empty shard; None for compressed-only shards (zstd is not in
    the standard library), a folder without a `tokens` column, or anything unreadable."""
    shard = next((s for s in index_shards(split_folder) or [] if s.get("samples")), None)
    if shard is None:
        return None
    try:
        column = shard["column_names"].index("tokens")
        encodings, sizes = shard["column_encodings"], shard["column_sizes"]
        file = shard_file(split_folder, shard["raw_data"])
        if file is None:
            return None
        with open(file, "rb") as fh:  # a compressed shard: no raw file here
            head = fh.read(12)
            start, end = struct.unpack("<II", head[4:12])
            if not 0 < end - start <= _MAX_SAMPLE_BYTES:
                return None
            fh.seek(start)
            sample = fh.read(end - start)
        # A sample: [uint32 size of each variable-size column][each column's bytes, in column order].
        variable = [i for i, size in enumerate(sizes) if not size]
        lengths = dict(zip(variable, struct.unpack(f"<{len(variable)}I", sample[: 4 * len(variable)])))
        pos = 4 * len(variable)
        for i in range(column):
            pos += sizes[i] or lengths[i]
        length = sizes[column] or lengths[column]
        if pos + length > len(sample):
            return None
        return _tokens_in(sample[pos: pos + length], encodings[column])
    except (OSError, KeyError, ValueError, TypeError, IndexError, AttributeError, struct.error):
        return None


def dataset_facts(split_folder: str | os.PathLike) -> dict:
    """What a training run must agree with, for one MDS split folder (e.g. <data_local>/train):

    {"sample_tokens": int | None,          tokens per sample (llm-foundry's concat_tokens / max_seq_len)
     "tokenizer": str | None,               the tokenizer data_prep used (its folder, absolute, or hub name)
     "tokenizer_fingerprint": str | None,   tokenizer_fingerprint() of that tokenizer, when it was made
     "tokenizer_vocab_size": int | None,    largest token id + 1 of that tokenizer
     "samples": int | None,                 samples listed in index.json
     "source": str | None}                  where the facts were read: data_prep_summary.json,
                                            data_prep_plan.json, "first sample", or None (nothing known)
    """
    folder = Path(split_folder)
    facts = {"sample_tokens": None, "tokenizer": None, "tokenizer_fingerprint": None, "tokenizer_vocab_size": None,
             "samples": samples_in(folder),
             "source": None}
    summary = _read_json(folder / SUMMARY_FILE)
    if isinstance(summary, dict) and summary.get("sample_tokens"):
        for key in ("sample_tokens", "tokenizer", "tokenizer_fingerprint", "tokenizer_vocab_size"):
            facts[key] = summary.get(key)
        facts["source"] = SUMMARY_FILE
        return facts
    plan = _read_json(folder / PLAN_FILE)  # a dataset made before the summary recorded these facts
    concat = (plan.get("settings") or {}).get("concat_tokens") if isinstance(plan, dict) else None
    if isinstance(concat, int):
        facts["sample_tokens"], facts["source"] = concat, PLAN_FILE
        return facts
    facts["sample_tokens"] = first_sample_tokens(folder)
    facts["source"] = "first sample" if facts["sample_tokens"] is not None else None
    return facts


def check_index(split_folder: str | os.PathLike) -> list[str]:
    """Problems between index.json and the shard files, one sentence each; [] when every listed shard is there
    with the byte size index.json records. A compressed shard counts as present when either its .zstd file
    or its decompressed file (what streaming leaves in a local cache) is there with its recorded size."""
    folder = Path(split_folder)
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        return [f"{index_path} does not exist: {folder} is not a finished MDS dataset"]
    if _read_json(index_path) is None:
        return [f"{index_path} cannot be read as JSON (cut short or overwritten?)"]
    shards = index_shards(folder)
    if shards is None:
        return [f"{index_path} has no list of shards"]
    if not shards:
        return [f"{index_path} lists no shards: the dataset is empty"]
    return shard_problems(folder, shards)


def shard_problems(folder: str | os.PathLike, shards: list[dict]) -> list[str]:
    """check_index's test of the shards an index.json in `folder` lists (an empty list is no problem here: a
    data_prep block may hold no full sample). Sizes only: a file as long as recorded but with other bytes is
    left to the hashes that index.json records (train/task/shards.py checks them before training)."""
    folder = Path(folder)
    index_path = folder / INDEX_FILE
    problems = []
    for number, shard in enumerate(shards):
        files = [f for f in (shard.get("zip_data"), shard.get("raw_data")) if isinstance(f, dict) and f.get("basename")]
        if not files:
            problems.append(f"{index_path}: shard {number} names no file")
            continue
        found = False
        for info in files:
            file = shard_file(folder, info)
            if file is None:
                problems.append(f"{index_path}: shard {number} names {str(info['basename'])!r}, outside the "
                                "dataset folder")
                found = True
                break
            try:
                size = file.stat().st_size
            except OSError:
                continue
            found = True
            if size != info.get("bytes"):
                problems.append(f"{file} has {size:,} bytes but {INDEX_FILE} records {info.get('bytes')} "
                                f"(cut short or replaced)")
            break
        if not found:
            problems.append(f"{folder / files[0]['basename']} is listed in {INDEX_FILE} but missing")
    return problems
