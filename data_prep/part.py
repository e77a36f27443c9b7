"""One part: read, check, tokenize and write each of its blocks into block-NNNNN/ (renamed in when complete)."""
from __future__ import annotations

import json
import os
import shutil
import socket
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from data_prep.blocks import Block
from data_prep.encode import ChunkResult, EncoderPool
from data_prep.errors import DataPrepError, writing
from data_prep.facts import BLOCK_FILE, INDEX_FILE, index_shards, shard_problems
from data_prep.mds import ShardWriter
from data_prep.reader import BlockReader, line_number_of
from data_prep.settings import Settings

# Skipped lines the summary lists (all are counted): the first of the whole dataset, in input order. Blocks are
# made apart, so each keeps as many: the first block may hold every one of them.
MAX_EXAMPLES = 1000


def scratch(split_dir: Path, name: str) -> Path:
    """The hidden folder this process writes a block's (or the tail's) folder `name` in before it renames it into
    place; one a killed writer left is removed by the next that writes that folder (clear_partial, merge.STALE)."""
    return split_dir / f".tmp-{name}.{socket.gethostname()}-{os.getpid()}"


def is_complete(split_dir: Path, block: Block) -> bool:
    return (split_dir / block.folder / BLOCK_FILE).exists()


def damage(split_dir: Path, block: Block) -> list[str]:
    """What is wrong with a complete block's files, against its own index.json: a shard missing or of another
    size than recorded ([] when none is). A stat per shard, so that every rerun can afford it on terabytes; a
    shard of the right size with other bytes is found by the hashes the training side checks."""
    folder = split_dir / block.folder
    if not (folder / INDEX_FILE).exists():
        return [f"{folder / INDEX_FILE} is missing"]
    shards = index_shards(folder)  # its index.json's list of shards as the training side reads it
    if shards is None:
        return [f"{folder / INDEX_FILE} cannot be read as the block's list of shards (cut short or overwritten?)"]
    return _unreadable_record(folder) + shard_problems(folder, shards)


# What the merge reads of each block's record (merge.py): a record without them would stop every later run
_RECORD_KEYS = ("docs", "tokens", "skipped_lines", "skipped_by_reason", "skipped_examples", "tail")


def _unreadable_record(folder: Path) -> list[str]:
    try:
        meta = json.loads((folder / BLOCK_FILE).read_text())
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or any(k not in meta for k in _RECORD_KEYS):
        return [f"{folder / BLOCK_FILE} cannot be read as the block's record (cut short or overwritten?)"]
    return []


@dataclass
class RunStats:
    """What this process did (blocks it skipped as already complete count for nothing)."""

    docs: int = 0
    tokens: int = 0
    samples: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    blocks_done: int = 0


class BlockSink:
    """Cuts one block's token stream into samples; its last partial sample is kept for the merge step."""

    def __init__(self, split_dir: Path, block: Block, settings: Settings):
        self.split_dir, self.block, self.settings = split_dir, block, settings
        self.tmp = scratch(split_dir, block.folder)
        self.tmp.mkdir()
        self.writer = ShardWriter(self.tmp, settings.concat_tokens, settings.compression, settings.size_limit)
        self.carry = np.empty(0, np.int32)
        self.docs = self.tokens = self.lines = 0
        self.skipped: Counter = Counter()
        self.examples: list[list] = []
        self._first_line: int | None = None

    def add(self, result: ChunkResult, first_line_pos: int) -> None:
        length = self.settings.concat_tokens
        buf = np.concatenate((self.carry, result.tokens)) if len(self.carry) else result.tokens
        full = len(buf) // length * length
        self.writer.add(buf[:full].reshape(-1, length))
        self.carry = buf[full:].copy()
        self.docs += result.docs
        self.tokens += len(result.tokens)
        for index, reason in result.errors:
            self._skip(self.lines + index, reason, first_line_pos)
        self.lines += result.lines

    def _skip(self, line_index: int, reason: str, first_line_pos: int) -> None:
        if self._first_line is None:
            # Line numbers of a byte range that starts mid-file cost a scan, so only pay when reporting.
            self._first_line = 1 if first_line_pos == 0 else line_number_of(self.block.path, first_line_pos)
        where = f"{self.block.path}:{self._first_line + line_index}"
        if self.settings.strict:
            raise DataPrepError("strict", f"{where}: {reason}",
                                "fix or remove that line, or run with strict=false to skip and count such lines")
        key = reason.split(" (")[0]
        self.skipped[key] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append([self.block.path, self._first_line + line_index, reason])

    def finish(self) -> None:
        shards = self.writer.finish()
        block = {"index": self.block.index, "path": self.block.path, "start": self.block.start, "end": self.block.end}
        meta = {"block": block, "docs": self.docs, "tokens": self.tokens, "samples": self.writer.samples,
                "shards": len(shards), "skipped_lines": sum(self.skipped.values()),
                "skipped_by_reason": dict(sorted(self.skipped.items())), "skipped_examples": self.examples,
                "tail": self.carry.tolist()}
        # block.json last: its presence in the renamed folder is what marks the block complete.
        with writing(self.tmp / BLOCK_FILE), open(self.tmp / BLOCK_FILE, "w") as fh:
            json.dump(meta, fh, sort_keys=True)
        os.rename(self.tmp, self.split_dir / self.block.folder)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def clear_partial(split_dir: Path, block: Block) -> None:
    """Leftovers of an interrupted attempt at this block (a killed job never renamed its temporary folder)."""
    for stale in split_dir.glob(f".tmp-{block.folder}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = split_dir / block.folder
    if final.exists() and not (final / BLOCK_FILE).exists():
        shutil.rmtree(final)


def _items(readers: list[BlockReader]) -> Iterator[tuple[tuple, bytes | None]]:
    # One stream over all blocks, so the workers stay busy across block boundaries; (reader, None) ends a block.
    for reader in readers:
        for chunk, raw_pos in reader:
            yield (reader, raw_pos), chunk
        yield (reader, None), None


def run_blocks(split_dir: Path, blocks: list[Block], settings: Settings, pool: EncoderPool, progress) -> RunStats:
    stats = RunStats()
    todo = [b for b in blocks if not is_complete(split_dir, b)]
    for block in todo:
        clear_partial(split_dir, block)
    readers = [BlockReader(b) for b in todo]
    sink: BlockSink | None = None
    last_pos = 0
    try:
        for (reader, raw_pos), result in pool.map(_items(readers)):
            if sink is None or sink.block is not reader.block:
                sink = BlockSink(split_dir, reader.block, settings)
                last_pos = reader.block.start
            if result is None:  # end of this block
                sink.finish()
                stats.samples += sink.writer.samples
                stats.skipped.update(sink.skipped)
                stats.examples += sink.examples
                stats.blocks_done += 1
                sink = None
                continue
            sink.add(result, reader.first_line_pos)
            stats.docs += result.docs
            stats.tokens += len(result.tokens)
            progress.advance(raw_pos - last_pos, result.docs, len(result.tokens))
            last_pos = raw_pos
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    return stats
