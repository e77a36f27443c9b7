"""Parse, check and tokenize chunks of JSON lines on every core (one single-threaded process per core).

Processes rather than the tokenizer's own thread pool: JSON parsing and turning ids into arrays are Python
work that threads would serialise behind the GIL, which caps a many-core node far below its tokenizer speed.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer

from common.signals import leave_to_the_task
from data_prep.errors import RERUN, DataPrepError
from data_prep.fast_bpe import FastEncoder

# Set in each worker by _init (fork copies the already-loaded tokenizer; nothing is pickled).
_TOK: Tokenizer | None = None
_FAST: FastEncoder | None = None  # the same ids as _TOK, faster; it sends what it doubts to _TOK
_TEXT_KEY = "text"
_BOS: list[int] = []
_EOS: list[int] = []


@dataclass
class ChunkResult:
    tokens: np.ndarray  # int32: bos + ids + eos of every good document, in order
    docs: int
    lines: int
    errors: list[tuple[int, str]]  # (0-based line index within the chunk, reason)


def _init(tok: Tokenizer, text_key: str, bos: list[int], eos: list[int], fast: FastEncoder | None = None) -> None:
    global _TOK, _TEXT_KEY, _BOS, _EOS, _FAST
    leave_to_the_task()  # forked from a submitit job: the pool must be able to end it, and it must not requeue
    # One process per core already: the tokenizer's own threads would only oversubscribe the CPUs.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    _TOK, _TEXT_KEY, _BOS, _EOS, _FAST = tok, text_key, list(bos), list(eos), fast


def _check_line(line: bytes) -> tuple[str | None, str]:
    """(text, "") for a good document, (None, reason) for a line to skip."""
    try:
        if b"\xed" in line:
            # json.loads(bytes) decodes with surrogatepass: a surrogate written as UTF-8 (ED A0..BF xx) would come
            # through as half a character the tokenizer cannot take. ED also leads Hangul, so only then decode
            # strictly (one more pass, for such lines alone).
            line.decode("utf-8")
        obj = json.loads(line)
    except UnicodeDecodeError:
        return None, "invalid UTF-8"
    except ValueError as err:
        if not line.strip():
            return None, "blank line"
        return None, f"invalid JSON ({getattr(err, 'msg', err)} at column {getattr(err, 'colno', '?')})"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    text = obj.get(_TEXT_KEY)
    if text is None:
        # The fields it has instead: a wrong dataset.text_key is then obvious from the first skipped line.
        fields = ", ".join(k[:40] for k in list(obj)[:8]) + (", ..." if len(obj) > 8 else "")
        return None, f"missing {_TEXT_KEY!r} field (has {fields or 'no fields'})"
    if not isinstance(text, str):
        return None, f"{_TEXT_KEY!r} is not a string"
    # an empty or blank document is encoded as llm-foundry's converter encodes it (its bos/eos alone, or the
    # spaces' ids): dropping it would shift every later sample (SlimPajama's sample holds one "\n" document)
    if b"\\ud" in line or b"\\uD" in line:
        # JSON may escape half a surrogate pair, which is not text and which the tokenizer cannot take.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None, "invalid UTF-8 (unpaired surrogate escape)"
    return text, ""


def encode_chunk(chunk: bytes) -> ChunkResult:
    lines = chunk.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the chunk's final newline
    texts: list[str] = []
    errors: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        text, reason = _check_line(line)
        if text is None:
            errors.append((i, reason))
        else:
            texts.append(text)
    if _FAST is not None:
        return ChunkResult(_FAST.encode_docs(texts, _BOS, _EOS), len(texts), len(lines), errors)
    encode = getattr(_TOK, "encode_batch_fast", None) or _TOK.encode_batch  # _fast skips char offsets
    encodings = encode(texts)
    count = sum(len(enc) for enc in encodings) + len(encodings) * (len(_BOS) + len(_EOS))
    pieces = ((_BOS, enc.ids, _EOS) for enc in encodings)
    tokens = np.fromiter(chain.from_iterable(chain.from_iterable(pieces)), np.int32, count)
    return ChunkResult(tokens, len(texts), len(lines), errors)


class EncoderPool:
    """Ordered, bounded map of encode_chunk over (meta, chunk) items; chunk None passes meta through.

    concurrent.futures' pool rather than multiprocessing.Pool: when a worker dies (the OOM killer's SIGKILL),
    multiprocessing.Pool starts another and waits forever for the chunk the dead one held, with the out_root
    lock held; this one fails every pending chunk with BrokenProcessPool, which ends the run with a message."""

    def __init__(self, tok: Tokenizer, text_key: str, bos, eos, workers: int, fast: FastEncoder | None = None):
        self.workers = workers
        self.args = (tok, text_key, list(bos), list(eos), fast)
        self.pool: ProcessPoolExecutor | None = None
        self.processes: list = []

    def __enter__(self) -> "EncoderPool":
        if self.workers > 1:
            # fork: workers start in milliseconds and inherit the loaded tokenizer.
            before = set(multiprocessing.active_children())
            self.pool = ProcessPoolExecutor(self.workers, multiprocessing.get_context("fork"), _init, self.args)
            # With fork every worker starts at the first submit: now, before the progress bar starts a thread.
            self.pool.submit(int).result()
            # its workers, the processes started since, in the order they started: to name the dead one
            self.processes = sorted(set(multiprocessing.active_children()) - before, key=lambda p: p.pid)
        else:
            _init(*self.args)
        return self

    def __exit__(self, exc_type, *_) -> None:
        if self.pool is not None:
            # On an error the chunks not started are dropped; the few running finish quickly.
            self.pool.shutdown(wait=True, cancel_futures=exc_type is not None)

    def map(self, items: Iterable[tuple[Any, bytes | None]]) -> Iterator[tuple[Any, ChunkResult | None]]:
        if self.pool is None:
            for meta, chunk in items:
                yield meta, (encode_chunk(chunk) if chunk is not None else None)
            return
        try:
            yield from self._map_in_pool(items)
        except BrokenProcessPool:
            self.pool.shutdown(wait=True)  # joins the workers: the dead one's exit status is known after this
            raise self._died() from None

    def _map_in_pool(self, items: Iterable[tuple[Any, bytes | None]]) -> Iterator[tuple[Any, ChunkResult | None]]:
        window = 2 * self.workers + 2  # keeps every worker fed while bounding memory to a few MB per core
        pending: deque = deque()
        for meta, chunk in items:
            pending.append((meta, self.pool.submit(encode_chunk, chunk) if chunk is not None else None))
            while len(pending) > window:
                meta0, fut = pending.popleft()
                yield meta0, (fut.result() if fut is not None else None)
        while pending:
            meta0, fut = pending.popleft()
            yield meta0, (fut.result() if fut is not None else None)

    def _died(self) -> DataPrepError:
        """A worker ended without a word: killed from outside, almost always by the kernel's OOM killer."""
        dead = [p for p in self.processes if p.exitcode not in (None, 0, -signal.SIGTERM)]  # the pool SIGTERMs the rest
        how = ""
        if dead:
            code = dead[0].exitcode
            how = f" (pid {dead[0].pid}, " + (f"killed by {signal.Signals(-code).name})" if code < 0
                                              else f"exit status {code})")
        return DataPrepError("workers", f"a tokenizing worker process died{how}: most likely out of memory (the "
                             f"kernel's OOM killer sends SIGKILL); the blocks not finished are left for the next run",
                             f"{RERUN} to resume; if it happens again, give the job more memory or lower "
                             f"workers= (now {self.workers})")
