"""Join the blocks into one dataset: their tails become the last samples, then one index.json lists it all.

Deterministic and idempotent: whichever part finishes last (or a later plain run) merges, and two parts
merging at once write the same bytes.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from collections import Counter
from pathlib import Path

import numpy as np

from data_prep.mds import ShardWriter, prefixed, read_index, write_index
from data_prep.part import BLOCK_FILE, is_complete
from data_prep.plan import Block
from data_prep.settings import Settings

TAIL_FOLDER = "tail"


def all_complete(split_dir: Path, blocks: list[Block]) -> bool:
    return all(is_complete(split_dir, b) for b in blocks)


def _write_tail(split_dir: Path, tokens: np.ndarray, settings: Settings) -> list[dict]:
    final = split_dir / TAIL_FOLDER
    tmp = split_dir / f".tmp-{TAIL_FOLDER}.{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    writer = ShardWriter(tmp, settings.concat_tokens, settings.compression, settings.size_limit)
    length = settings.concat_tokens
    full = len(tokens) // length * length
    writer.add(tokens[:full].reshape(-1, length))
    shards = writer.finish()
    shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:  # another part merged at the same moment and wrote the same bytes
        shutil.rmtree(tmp, ignore_errors=True)
    return shards


def merge(split_dir: Path, blocks: list[Block], settings: Settings) -> dict:
    shards: list[dict] = []
    tails: list[np.ndarray] = []
    totals = {"docs": 0, "tokens": 0, "skipped_lines": 0}
    reasons: Counter = Counter()
    examples: list[list] = []
    for block in blocks:
        folder = split_dir / block.folder
        shards += prefixed(read_index(folder), block.folder)
        with open(folder / BLOCK_FILE) as fh:
            meta = json.load(fh)
        for key in totals:
            totals[key] += meta[key]
        reasons.update(meta["skipped_by_reason"])
        examples += meta["skipped_examples"][: max(0, 1000 - len(examples))]
        tails.append(np.asarray(meta["tail"], np.int32))
    tail = np.concatenate(tails) if tails else np.empty(0, np.int32)
    shards += prefixed(_write_tail(split_dir, tail, settings), TAIL_FOLDER)
    write_index(split_dir, shards)  # last, atomically: readers never see a half-merged dataset
    samples = sum(s["samples"] for s in shards)
    return {
        **totals,
        "samples": samples,
        "shards": len(shards),
        "tokens_in_samples": samples * settings.concat_tokens,
        "dropped_tail_tokens": len(tail) % settings.concat_tokens,
        "skipped_by_reason": dict(sorted(reasons.items())),
        "skipped_examples": examples,
    }
