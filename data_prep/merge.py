"""Join the blocks into one dataset: their tails become the last samples, then one index.json lists it all.

Deterministic and idempotent: whichever part finishes last (or a later plain run) merges, and two parts
merging at once write the same bytes.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np

from common import files
from data_prep.blocks import Block
from data_prep.errors import DataPrepError
from data_prep.facts import BLOCK_FILE, INDEX_FILE, SUMMARY_FILE, index_shards
from data_prep.mds import ShardWriter, prefixed, write_index
from data_prep.part import MAX_EXAMPLES, is_complete, scratch
from data_prep.settings import Settings

TAIL_FOLDER = "tail"
# Temporary files of block writers and of merges: .tmp-block-N.<host>-<pid>/, .tmp-tail.<host>-<pid>/,
# .index.json.tmp-<host>-<pid>, .data_prep_summary.json.tmp-<host>-<pid>.
STALE = (".tmp-block-*", f".tmp-{TAIL_FOLDER}.*", f".{INDEX_FILE}.tmp-*", f".{SUMMARY_FILE}.tmp-*")


def all_complete(split_dir: Path, blocks: list[Block]) -> bool:
    return all(is_complete(split_dir, b) for b in blocks)


def _write_tail(split_dir: Path, tokens: np.ndarray, settings: Settings) -> list[dict]:
    """tail/ as the blocks make it. A rerun finds it there with these very bytes (the plan fixes every block) and
    keeps it: the published index.json names its files, so they are never removed or replaced under a reader."""
    final = split_dir / TAIL_FOLDER
    tmp = scratch(split_dir, TAIL_FOLDER)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        writer = ShardWriter(tmp, settings.concat_tokens, settings.compression, settings.size_limit)
        length = settings.concat_tokens
        full = len(tokens) // length * length
        writer.add(tokens[:full].reshape(-1, length))
        shards = writer.finish()
    except BaseException:  # a full disk: leave no half-written tail behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if _same_files(tmp, final):
        files.remove(tmp)
        return shards
    # Another tail (damaged since, or half-replaced by a killed merge): the index that names it goes first, so
    # no index.json names files that are being replaced; the new one is written once the new tail is in place.
    unpublish(split_dir)
    files.remove(final)
    files.publish(tmp, final)  # another part may have merged the same bytes at the same moment
    return shards


def _same_files(new: Path, old: Path) -> bool:
    """Whether folder `old` holds exactly the files of `new`, byte for byte (a tail is at most a sample per block,
    a few MB even for thousands of blocks: read whole)."""
    names = sorted(p.name for p in new.iterdir())
    try:
        if sorted(p.name for p in old.iterdir()) != names:
            return False
        return all((new / n).read_bytes() == (old / n).read_bytes() for n in names)
    except OSError:  # no tail yet, or one that changes under us
        return False


def unpublish(split_dir: Path) -> None:
    """Withdraw the merged dataset before changing a file its index.json names: without index.json the folder is
    no dataset (streaming and the training side refuse it, data_prep.status says the merge is pending) rather
    than one that looks complete with files missing. The next merge publishes it again."""
    for name in (INDEX_FILE, SUMMARY_FILE):  # the index first: the summary describes a published dataset
        (split_dir / name).unlink(missing_ok=True)


def clear_stale(split_dir: Path) -> None:
    """Temporary files of killed writers. Only while merging: every block is complete then and this process
    holds the merge lock, so nobody else is writing any of them."""
    for pattern in STALE:
        for path in split_dir.glob(pattern):
            files.remove(path)


def _nothing_read(split_dir: Path, blocks: list[Block], settings: Settings, lines: int, reasons: Counter,
                  examples: list) -> DataPrepError:
    """The error for a run in which no line was a document. Its blocks hold nothing, so they are removed:
    the folder must not look like a started dataset to the corrected run (other settings are refused)."""
    for block in blocks:
        shutil.rmtree(split_dir / block.folder, ignore_errors=True)
    if not lines:
        return DataPrepError("input", "no document was read: the input files hold no lines",
                             "point input= at the JSON lines files that hold the documents")
    counts = ", ".join(f"{reason}: {n:,}" for reason, n in reasons.most_common())
    path, line, reason = examples[0]
    problem = f"no document was read: all {lines:,} lines were skipped ({counts}); the first: {path}:{line}: {reason}"
    top = reasons.most_common(1)[0][0]
    if top.startswith("missing ") or top.endswith(" is not a string"):  # the lines are JSON, the field is wrong
        return DataPrepError("dataset.text_key", problem,
                             f"set dataset.text_key=<the field holding the text> (it is "
                             f"{settings.dataset.text_key!r} now), or choose the dataset= that matches these files")
    return DataPrepError("input", problem, "point input= at JSON lines files, one object with a text field per line "
                         "(.gz and .zst files are decompressed by their file name)")


def merge(split_dir: Path, blocks: list[Block], settings: Settings) -> dict:
    clear_stale(split_dir)
    shards: list[dict] = []
    tails: list[np.ndarray] = []
    totals = {"docs": 0, "tokens": 0, "skipped_lines": 0}
    reasons: Counter = Counter()
    examples: list[list] = []
    for block in blocks:
        folder = split_dir / block.folder
        block_shards = index_shards(folder)  # a complete block's, checked by part.damage before the merge
        if block_shards is None:
            raise OSError(f"{folder / INDEX_FILE} cannot be read as the block's list of shards")
        shards += prefixed(block_shards, block.folder)
        with open(folder / BLOCK_FILE) as fh:
            meta = json.load(fh)
        for key in totals:
            totals[key] += meta[key]
        reasons.update(meta["skipped_by_reason"])
        examples += meta["skipped_examples"][: max(0, MAX_EXAMPLES - len(examples))]
        tails.append(np.asarray(meta["tail"], np.int32))
    if totals["docs"] == 0:  # an index over no samples would look like a finished dataset
        raise _nothing_read(split_dir, blocks, settings, totals["skipped_lines"], reasons, examples)
    tail = np.concatenate(tails) if tails else np.empty(0, np.int32)
    shards += prefixed(_write_tail(split_dir, tail, settings), TAIL_FOLDER)
    # last, atomically: readers see the old index or the new one, and the files either names are all there
    write_index(split_dir, shards)
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
