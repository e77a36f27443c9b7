"""Read one block as chunks of whole lines, decompressing gzip/zstd on the fly (one pass, no extract step)."""
from __future__ import annotations

import gzip
import io
import os
import zlib
from typing import BinaryIO, Iterator

from data_prep.blocks import Block
from data_prep.errors import DataPrepError
from data_prep.inputs import Source, open_local

CHUNK_BYTES = 1 << 19  # small enough that the last chunks finish together on every core, big enough to amortise a round-trip


def _unreadable(path: str, err: BaseException) -> DataPrepError:
    # A broken compressed stream has no next line to skip to, so even strict=false stops here.
    return DataPrepError("input", f"{path}: cannot be read to the end ({type(err).__name__}: {err})",
                         "re-download or repair that file, or leave it out of input=")


def _open_stream(path: str, codec: str, raw: BinaryIO) -> BinaryIO:
    if codec == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if codec == "zstd":
        return _ZstdFrames(raw)
    return raw


class _ZstdFrames:
    """The frames of a .zst file (SlimPajama's may hold several) as one stream, like zstandard's stream_reader
    with read_across_frames, which ends quietly where a frame is cut short: a partly downloaded file would lose
    its tail's documents without a word. A frame unfinished at the end of the file is an EOFError here, as gzip's."""

    def __init__(self, raw: BinaryIO):
        import zstandard

        self._raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self._frame = None  # the frame being decompressed; None between frames
        self._out, self._pos = b"", 0

    def read(self, size: int) -> bytes:
        while self._pos >= len(self._out):
            data = self._raw.read(1 << 20)
            if not data:
                if self._frame is not None:
                    raise EOFError("the file ends inside a zstd frame (cut short)")
                return b""
            out = []
            while data:
                self._frame = self._frame or self._new()
                out.append(self._frame.decompress(data))
                data = self._frame.unused_data if self._frame.eof else b""
                if self._frame.eof:
                    self._frame = None
            self._out, self._pos = b"".join(out), 0
        piece = self._out[self._pos:self._pos + size]
        self._pos += len(piece)
        return piece


class BlockReader:
    """Yields (chunk of whole lines, raw bytes consumed so far) for the lines a block owns.

    A line belongs to the block in which it starts, so byte ranges of one file never share or lose a line.
    """

    def __init__(self, block: Block, chunk_bytes: int = CHUNK_BYTES):
        self.block = block
        self.chunk_bytes = chunk_bytes
        self.first_line_pos = 0  # byte offset of the block's first line (plain files), for line numbers

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        block = self.block
        try:
            path = open_local(Source(block.path, 0, 0, block.codec))
            with open(path, "rb", buffering=0) as raw:
                if block.codec != "plain" and os.fstat(raw.fileno()).st_size == 0:
                    # no compressor writes 0 bytes (an empty gzip is 20); a download that failed does
                    raise EOFError(f"0 bytes: not a {block.codec} file")
                if block.codec != "plain":
                    yield from self._whole(_open_stream(path, block.codec, io.BufferedReader(raw, 1 << 20)), raw)
                else:
                    yield from self._range(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise _unreadable(block.path, err) from None
        except Exception as err:
            if type(err).__name__ != "ZstdError":  # zstandard is imported only for .zst input
                raise
            raise _unreadable(block.path, err) from None

    def _whole(self, stream: BinaryIO, raw: BinaryIO) -> Iterator[tuple[bytes, int]]:
        for chunk in _line_chunks(stream, self.chunk_bytes):
            yield chunk, raw.tell()

    def _range(self, raw: BinaryIO) -> Iterator[tuple[bytes, int]]:
        start, end = self.block.start, self.block.end
        pos = start
        if start > 0:
            # The line running into the block belongs to the previous block: skip to the first newline.
            raw.seek(start - 1)
            pos = start - 1
            while True:
                data = raw.read(self.chunk_bytes)
                if not data:
                    self.first_line_pos = pos
                    return
                nl = data.find(b"\n")
                if nl >= 0:
                    pos += nl + 1
                    break
                pos += len(data)
        self.first_line_pos = pos
        if end is not None and pos >= end:
            return  # one long line spans this whole block; the block where it starts owns it
        raw.seek(pos)
        for chunk in _line_chunks(raw, self.chunk_bytes):
            if end is None or pos + len(chunk) <= end:
                pos += len(chunk)
                yield chunk, pos
                if end is not None and pos >= end:
                    return
                continue
            # The last line this block owns starts before `end` and runs to its newline.
            nl = chunk.find(b"\n", end - pos - 1)
            stop = nl + 1 if nl >= 0 else len(chunk)
            yield chunk[:stop], pos + stop
            return


def _line_chunks(stream: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    """Whole lines, about chunk_bytes at a time; a line longer than that is gathered without quadratic copying."""
    pending: list[bytes] = []  # pieces of a line not finished yet
    while True:
        data = stream.read(chunk_bytes)
        if not data:
            break
        cut = data.rfind(b"\n") + 1
        if not cut:
            pending.append(data)
            continue
        if pending:
            pending.append(data[:cut])
            yield b"".join(pending)
            pending = []
        else:
            yield data[:cut]
        if cut < len(data):
            pending.append(data[cut:])
    if pending:
        yield b"".join(pending)


def line_number_of(path: str, pos: int) -> int:
    """1-based number of the line starting at byte `pos` of a plain file (counted only when reporting errors)."""
    count = 0
    with open(path, "rb") as fh:
        left = pos
        while left > 0:
            data = fh.read(min(left, 1 << 24))
            if not data:
                break
            count += data.count(b"\n")
            left -= len(data)
    return count + 1
