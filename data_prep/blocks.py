"""Cut the sources into blocks, group blocks into parts, and guard out_root.

A block is the unit of output: its samples depend only on its own bytes, so the merged dataset is the same
whatever num_parts is and however the parts were dispatched or interrupted. Each compressed file is one
block; a plain file larger than block_bytes is cut into byte ranges of block_bytes (on line boundaries).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from common.paths import unwritable
from data_prep.errors import DataPrepError
from data_prep.facts import BLOCK_FILE, INDEX_FILE, PLAN_FILE
from data_prep.inputs import Source
from data_prep.mds import atomic_write
from data_prep.settings import Settings

LOCK_FOLDER = ".data_prep_lock"  # out_root/<split>/.data_prep_lock/: see lock.py
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Block:
    index: int
    path: str
    codec: str
    start: int  # byte offset; lines are owned by the block in which they start
    end: int | None  # None: to the end of the file

    @property
    def folder(self) -> str:
        return f"block-{self.index:05d}"

    @property
    def weight(self) -> int:
        return (self.end - self.start) if self.end is not None else 1


def make_blocks(sources: list[Source], block_bytes: int) -> list[Block]:
    blocks: list[Block] = []
    for src in sources:
        if src.splittable and src.size > block_bytes:
            for start in range(0, src.size, block_bytes):
                end = min(start + block_bytes, src.size)
                blocks.append(Block(len(blocks), src.path, src.codec, start, end))
        else:
            end = src.size if src.size and src.codec == "plain" else None
            blocks.append(Block(len(blocks), src.path, src.codec, 0, end))
    return blocks


def source_weight(block: Block, sizes: dict[str, int]) -> int:
    return block.weight if block.end is not None else max(sizes.get(block.path, 0), 1)


def assign_parts(blocks: list[Block], num_parts: int, sizes: dict[str, int]) -> list[list[Block]]:
    """Contiguous runs of blocks with about equal bytes per part (some parts are empty if blocks are few)."""
    weights = [source_weight(b, sizes) for b in blocks]
    total = sum(weights) or 1
    parts: list[list[Block]] = [[] for _ in range(num_parts)]
    done = 0
    for block, weight in zip(blocks, weights):
        # A block goes to the part whose share of the bytes holds the block's midpoint.
        part = min(num_parts - 1, (2 * done + weight) * num_parts // (2 * total))
        parts[part].append(block)
        done += weight
    return parts


def plan_document(settings: Settings, sources: list[Source], blocks: list[Block], tokenizer_fingerprint: str) -> dict:
    """Everything the output bytes depend on; num_parts, part, workers and strict are deliberately absent."""
    return {
        "format_version": FORMAT_VERSION,
        "settings": {
            "dataset": settings.dataset.name,
            "text_key": settings.dataset.text_key,
            "tokenizer_sha256": tokenizer_fingerprint,
            "concat_tokens": settings.concat_tokens,
            "eos_text": settings.eos_text,
            "bos_text": settings.bos_text,
            "compression": settings.compression,
            "size_limit": settings.size_limit,
            "block_bytes": settings.block_bytes,
        },
        "sources": [{"path": s.path, "size": s.size, "mtime_ns": s.mtime_ns} for s in sources],
        "blocks": [asdict(b) for b in blocks],
    }


def plan_bytes(plan: dict) -> bytes:
    return (json.dumps(plan, indent=1, sort_keys=True) + "\n").encode()


def _differences(old: dict, new: dict) -> list[str]:
    diffs = [f"{k}: {old.get('settings', {}).get(k)!r} then, {v!r} now"
             for k, v in new["settings"].items() if old.get("settings", {}).get(k) != v]
    if old.get("sources") != new["sources"]:
        diffs.append("the input files changed: " + _source_changes(old.get("sources") or [], new["sources"]))
    if not diffs and old != new:
        diffs.append("the plan format changed")
    return diffs


def _source_changes(old: list, new: list) -> str:
    """Which input files differ, the first few named: added, gone, or another size or modification time."""
    was, now = {s["path"]: s for s in old}, {s["path"]: s for s in new}
    changes = [f"{p} added" for p in now if p not in was] + [f"{p} gone" for p in was if p not in now]
    for p in (p for p in now if p in was and now[p] != was[p]):
        changes.append(f"{p}: {was[p]['size']:,} bytes then, {now[p]['size']:,} now" if now[p]["size"] !=
                       was[p]["size"] else f"{p}: modified since (same size)")
    changes = changes or ["their order"]
    return "; ".join(changes[:3]) + (f" (and {len(changes) - 3} more)" if len(changes) > 3 else "")


def read_plan(split_dir: Path) -> dict | None:
    """The plan a run wrote in `split_dir`, or None where there is none or it cannot be read as one (emptied, cut
    short, not a JSON object)."""
    try:
        plan = json.loads((split_dir / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) else None


def started(split_dir: Path) -> bool:
    """Whether a dataset was begun in `split_dir` (a block finished, or an index published): what its plan
    protects from a run with other settings, and what a refused run must not take the plan from."""
    return (split_dir / INDEX_FILE).exists() or made_blocks(split_dir)


def made_blocks(split_dir: Path) -> bool:
    return any(split_dir.glob(f"block-*/{BLOCK_FILE}"))


def check_out_root(settings: Settings, plan: dict) -> None:
    """Refuse anything that could overwrite or mix with another dataset. Writes nothing."""
    out_root, split_dir = settings.out_root, settings.split_dir
    if out_root.exists() and not out_root.is_dir():
        raise DataPrepError("out_root", f"{out_root} is a file, not a folder", "choose a folder for out_root")
    if (out_root / INDEX_FILE).exists():
        raise DataPrepError("out_root", f"{out_root} is itself an MDS dataset (it has index.json); out_root is the "
                            f"folder that holds <split>/ folders", "choose an empty or new out_root")
    if split_dir.exists():
        if not split_dir.is_dir():
            raise DataPrepError("out_root", f"{split_dir} is a file", "choose another out_root or split")
        plan_file = split_dir / PLAN_FILE
        if plan_file.exists():
            old = read_plan(split_dir)
            # A plan with no finished block and no index protects nothing: a new run may replace it.
            begun = started(split_dir)
            if old is None and begun:  # the settings the blocks were made with are unknown
                raise DataPrepError("out_root", f"{plan_file} cannot be read (emptied or cut short), so whether "
                                    f"{split_dir}'s blocks were made with these settings is unknown",
                                    "choose a new out_root (or split), or delete that folder to start over")
            diffs = _differences(old or {}, plan)
            if diffs and begun:
                raise DataPrepError("out_root", f"{split_dir} holds another dataset made with different settings: "
                                    + "; ".join(diffs),
                                    "choose a new out_root (or split), or delete that folder to start over")
        # a run that locked, not yet planned; or another part of this run writing the plan this instant (its
        # temporary file, common.files.temp_name): not "files data_prep did not write"
        elif any(p.name != LOCK_FOLDER and not p.name.startswith(f".{PLAN_FILE}.tmp-") for p in split_dir.iterdir()):
            what = "an MDS dataset" if (split_dir / INDEX_FILE).exists() else "files"
            # this tool's blocks without their plan (deleted since): not another tool's files, but made with
            # settings no longer known
            ours = f" (its blocks' settings file {PLAN_FILE} is gone)" if made_blocks(split_dir) else \
                " that data_prep did not write"
            raise DataPrepError("out_root", f"{split_dir} already holds {what}{ours}",
                                "choose a new out_root (or split), or empty that folder")
    why = unwritable(split_dir)  # told without writing: a refused run writes nothing
    if why:
        raise DataPrepError("out_root", f"{split_dir} cannot be made ({why})",
                            "choose a folder you can write to, or fix its permissions")


def write_plan(split_dir: Path, plan: dict) -> None:
    """Every part writes the same bytes, so concurrent parts may race here harmlessly."""
    split_dir.mkdir(parents=True, exist_ok=True)
    target = split_dir / PLAN_FILE
    data = plan_bytes(plan)
    if target.exists() and target.read_bytes() == data:
        return
    atomic_write(target, data)
