"""compose (Hydra) -> validate -> plan -> run this process's parts -> merge when every block is complete."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig

from common import files
from common.errors import Problem
from data_prep.blocks import (
    LOCK_FOLDER,
    PLAN_FILE,
    Block,
    assign_parts,
    check_out_root,
    make_blocks,
    plan_bytes,
    plan_document,
    read_plan,
    source_weight,
    started,
    write_plan,
)
from data_prep.encode import EncoderPool
from data_prep.errors import DataPrepError, gather
from data_prep.facts import BLOCK_FILE, INDEX_FILE, SUMMARY_FILE
from data_prep.inputs import Source, resolve_sources
from data_prep.lock import OutRootLock
from data_prep.mds import ShardWriter
from data_prep.merge import all_complete, merge, unpublish
from data_prep.part import RunStats, damage, is_complete, run_blocks
from data_prep.progress import Progress, print_skipped, print_summary, summarize
from data_prep.settings import Settings, settings_from
from data_prep.tokenizer import LoadedTokenizer, load_tokenizer, with_encoder

log = logging.getLogger(__name__)


@dataclass
class Job:
    settings: Settings
    tokenizer: LoadedTokenizer
    sources: list[Source]
    blocks: list[Block]
    parts: list[list[Block]]
    plan: dict

    def weight(self, block: Block) -> int:
        return source_weight(block, {s.path: s.size for s in self.sources})


def prepare(cfg: DictConfig) -> Job:
    """Every check that can fail, before anything is written."""
    settings = settings_from(cfg)
    problems = []  # the shard size, the input and the tokenizer checked side by side: every problem at once
    minimum = ShardWriter.min_size_limit(settings.concat_tokens)
    if settings.size_limit < minimum:
        problems.append(Problem("size_limit", f"{settings.size_limit} bytes cannot hold one sample of "
                                f"{settings.concat_tokens} tokens", f"use size_limit >= {minimum}"))
    sources = gather(problems, resolve_sources, settings)
    tokenizer = gather(problems, load_tokenizer, settings)
    if problems:
        raise DataPrepError(problems=problems)
    blocks = make_blocks(sources, settings.block_bytes)
    parts = assign_parts(blocks, settings.num_parts, {s.path: s.size for s in sources})
    plan = plan_document(settings, sources, blocks, tokenizer.fingerprint)
    check_out_root(settings, plan)
    return Job(settings, tokenizer, sources, blocks, parts, plan)



def missing_blocks(split_dir: Path) -> list[str]:
    """Folders of planned blocks that are not complete (every block, when there is no plan yet)."""
    planned = (read_plan(split_dir) or {}).get("blocks")
    if not isinstance(planned, list):
        return ["(no plan)"]
    blocks = [Block(**b) for b in planned]
    return [b.folder for b in blocks if not is_complete(split_dir, b)]


def merged_summary(split_dir: Path) -> dict | None:
    """The merged dataset's summary, or None where it is not merged: a block not complete, no index (streaming
    reads the index; one deleted since is no dataset) or no readable summary (a merge not run yet, killed, or
    withdrawn while a damaged block is written again)."""
    if missing_blocks(split_dir) or not (split_dir / INDEX_FILE).is_file():
        return None
    summary = files.read_json(split_dir / SUMMARY_FILE)
    return summary if isinstance(summary, dict) and summary else None


def redo_damaged(split_dir: Path, blocks: list[Block]) -> None:
    """A finished block whose files no longer match its index.json (a shard deleted or cut short since: a disk
    error, a careless copy) is done again by this run, rather than skipped and merged into a dataset that
    streaming cannot read. The merged index names its files, so it is withdrawn first (see unpublish)."""
    for block in blocks:
        problems = damage(split_dir, block) if is_complete(split_dir, block) else []
        if problems:
            more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
            log.warning(f"data_prep: warning: {split_dir / block.folder} is damaged ({problems[0]}{more}): "
                        f"this run writes it again")
            unpublish(split_dir)
            shutil.rmtree(split_dir / block.folder)


def strict_over_blocks_made_before(split_dir: Path, blocks: list[Block]) -> None:
    """strict=true stops at the first line it cannot read; blocks finished by an earlier run with strict=false may
    have skipped some, which a rerun with strict=true would merge without a word, exit 0. The first such line is
    named before the merge instead."""
    skipped, first = 0, None
    for block in blocks:
        meta = json.loads((split_dir / block.folder / BLOCK_FILE).read_text())  # checked readable (part.damage)
        skipped += meta["skipped_lines"]
        first = first or next(iter(meta["skipped_examples"]), None)
    if skipped:
        where = f" (the first: {first[0]}:{first[1]}: {first[2]})" if first else ""
        raise DataPrepError("strict", f"true, but blocks made before (with strict=false) skipped {skipped} line(s)"
                            f"{where}", "fix those lines and run into a new out_root, or strict=false to merge with "
                            "them skipped and counted")


def check_other_parts(job: Job, mine: list[Block]) -> None:
    """Before a merge, the blocks of other parts (this run checked its own before it began): one damaged since it
    was made cannot be redone here, because its part's lock is not this run's to take."""
    s, ours = job.settings, set(mine)
    for number, part in enumerate(job.parts):
        for block in (b for b in part if b not in ours):
            problems = damage(s.split_dir, block)
            if problems:
                raise DataPrepError("out_root", f"{s.split_dir / block.folder} (part {number} of num_parts="
                                    f"{s.num_parts}) is damaged: " + "; ".join(problems[:3]),
                                    f"run part={number} again, or the same command without part=, to write that "
                                    f"block again (the other finished blocks are kept)")


def _this_run(s: Settings, stats: RunStats, skipped_blocks: int, started: float) -> dict:
    wall = time.perf_counter() - started
    return {"part": s.part, "num_parts": s.num_parts, "workers": s.workers, "blocks_done": stats.blocks_done,
            "blocks_skipped": skipped_blocks, "docs": stats.docs, "tokens": stats.tokens,
            "wall_seconds": round(wall, 3), "tokens_per_second": round(stats.tokens / wall, 1),
            "docs_per_second": round(stats.docs / wall, 1)}


@dataclass(frozen=True)
class Before:
    """What out_root held before this run wrote anything: what a refused run leaves as it found it."""

    missing: tuple[Path, ...]  # the split folder and those above it that did not exist, deepest first
    lock_folder: bool
    plan: bool
    complete: frozenset[str]  # this run's blocks finished already (by an earlier run)

    @classmethod
    def look(cls, s: Settings, mine: list[Block]) -> Before:
        missing, folder = [], s.split_dir
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        return cls(tuple(missing), (s.split_dir / LOCK_FOLDER).exists(), (s.split_dir / PLAN_FILE).exists(),
                   frozenset(b.folder for b in mine if is_complete(s.split_dir, b)))


# What a refusal for the input names: the blocks made of that input go with the run (take_back).
INPUT_KEYS = ("input", "strict", "dataset.text_key")


def take_back(s: Settings, before: Before, lock: OutRootLock, mine: list[Block], err: Exception) -> None:
    """A refused or failed run leaves out_root as it found it. Refused for its input (an unreadable file, no
    document, strict's first bad line, the text key), the blocks it finished go too: made of input that is to be
    fixed, they would make the corrected run's plan "another dataset" and be refused. Any other failure (a full
    disk, a tokenizing worker killed) keeps them, for the same command again. The plan, the lock folder and the
    folders it made go only while no other run or part holds a range here (theirs to keep) and no finished block
    needs the plan."""
    split = s.split_dir
    if isinstance(err, DataPrepError) and err.key in INPUT_KEYS:
        for block in mine:
            if block.folder not in before.complete and is_complete(split, block):
                shutil.rmtree(split / block.folder, ignore_errors=True)
    if not lock.alone():
        return
    if not before.plan and not started(split):
        (split / PLAN_FILE).unlink(missing_ok=True)
    if not before.lock_folder:
        lock.withdraw()
    for folder in before.missing:
        try:
            folder.rmdir()
        except OSError:  # not empty (blocks kept), or made again by a run starting now
            break


def run(cfg: DictConfig, started: float | None = None) -> dict | None:
    started = time.perf_counter() if started is None else started
    job = prepare(cfg)
    s = job.settings
    part_ids = range(s.num_parts) if s.part is None else [s.part]
    mine = [b for p in part_ids for b in job.parts[p]]
    before = Before.look(s, mine)
    # Before anything is written: a second, independent run into this split is refused here (exit 2).
    lock = OutRootLock(s, mine, plan_bytes(job.plan))
    try:
        lock.acquire()
        return _run_locked(job, lock, mine, started)
    except Exception as err:
        with contextlib.suppress(OSError):  # the error to show is the run's, not one of tidying after it
            take_back(s, before, lock, mine, err)
        raise
    finally:
        lock.release()


def _run_locked(job: Job, lock: OutRootLock, mine: list[Block], started: float) -> dict | None:
    s, split_dir = job.settings, job.settings.split_dir
    # Again under the lock: a run that finished between prepare() and now may have left a dataset here.
    check_out_root(s, job.plan)
    # every check passed: the fast encoder's tables may be built (and cached) now; the check before a sweep's
    # launch (prepare alone) builds none
    job = replace(job, tokenizer=with_encoder(job.tokenizer))
    write_plan(split_dir, job.plan)

    redo_damaged(split_dir, mine)  # a stat per shard: cheap enough for every rerun
    todo = [b for b in mine if not is_complete(split_dir, b)]
    if s.strict:  # before tokenizing the rest; again before the merge, for blocks other parts finish meanwhile
        # (another part's damaged block is named at the merge, check_other_parts: its record may not read)
        strict_over_blocks_made_before(split_dir, [b for b in job.blocks if is_complete(split_dir, b)
                                                   and not damage(split_dir, b)])
    label = "data_prep" if s.part is None else f"part {s.part}/{s.num_parts}"
    known = all(src.size for src in job.sources)  # hub files have no size until they are fetched
    tok = job.tokenizer
    # The pool forks first, so no thread of the progress bar is copied into the workers.
    workers = s.workers if todo else 1  # nothing left to tokenize: no processes to start
    with EncoderPool(tok.tokenizer, s.dataset.text_key, tok.bos_ids, tok.eos_ids, workers, tok.fast) as pool:
        progress = Progress(sum(job.weight(b) for b in todo) if known else None, label, s.progress)
        try:
            stats = run_blocks(split_dir, todo, s, pool, progress)
        finally:
            progress.close()
    if not all_complete(split_dir, job.blocks):
        wall = time.perf_counter() - started
        print_skipped(stats.examples, sum(stats.skipped.values()))
        log.info(f"data_prep: {label} finished ({stats.blocks_done} blocks, {stats.tokens:,} tokens, "
                 f"{stats.tokens / wall / 1e6:.2f}M tokens/s); other parts are still missing blocks, so the merge "
                 f"runs when the last part finishes (or run again without part= to merge)")
        return None
    lock.lock_merge()  # waits while another part of this run merges the same blocks
    if not all_complete(split_dir, job.blocks):  # that merge failed and removed its empty blocks; it says why
        log.warning(f"data_prep: {label} finished, but another part's merge removed the blocks (see its message)")
        return None
    check_other_parts(job, mine)
    if s.strict:
        strict_over_blocks_made_before(split_dir, job.blocks)
    totals = merge(split_dir, job.blocks, s)
    local = os.path.expanduser(s.tokenizer)
    facts = {"sample_tokens": s.concat_tokens,  # what a training run checks before it starts (facts.py reads them)
             "tokenizer": os.path.abspath(local) if os.path.exists(local) else s.tokenizer,  # a folder, or a hub name
             "tokenizer_fingerprint": tok.vocab_fingerprint, "tokenizer_vocab_size": tok.vocab_size}
    run = {**_this_run(s, stats, len(mine) - len(todo), started), "encoder": tok.encoder}
    summary = summarize(split_dir, totals, facts, run)
    print_skipped(totals["skipped_examples"], totals["skipped_lines"])
    print_summary(summary)
    if totals["samples"] == 0:
        log.warning(f"data_prep: warning: the input holds fewer than concat_tokens={s.concat_tokens} tokens, "
                    f"so the dataset has no samples")
    return summary
