"""Byte ranges of one plain file: every line read exactly once, whole, whatever the line and block sizes."""
import gzip
from pathlib import Path

import pytest

from data_prep.blocks import make_blocks
from data_prep.inputs import Source
from data_prep.reader import BlockReader

C4_FIRST = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "c4" / "en" / \
    "c4-train.00000-of-01024.first1000.json.gz"


def read_all(path: Path, block_bytes: int, chunk_bytes: int) -> list[bytes]:
    size = path.stat().st_size
    blocks = make_blocks([Source(str(path), size, 0, "plain")], block_bytes)
    chunks = []
    for block in blocks:
        for chunk, pos in BlockReader(block, chunk_bytes):
            assert chunk.endswith(b"\n") or pos == size  # only the file's last line may lack its newline
            chunks.append(chunk)
    return chunks


@pytest.mark.parametrize("block_bytes, chunk_bytes", [(7, 3), (64, 5), (1000, 64), (5000, 1 << 19), (10**9, 128)])
def test_lines_longer_than_blocks_and_chunks_are_read_once(tmp_path, block_bytes, chunk_bytes):
    lines = [b"x" * n for n in (0, 1, 5, 300, 7, 2500, 2, 64, 63, 65, 4000, 1)]
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert b"".join(read_all(path, block_bytes, chunk_bytes)) == path.read_bytes()
    path.write_bytes(b"\n".join(lines))  # no final newline
    assert b"".join(read_all(path, block_bytes, chunk_bytes)) == path.read_bytes()


def test_real_c4_lines_split_into_ranges_come_back_in_order(tmp_path):
    if not C4_FIRST.is_file():
        pytest.skip("../shared/data is missing (the C4 excerpt this test splits)")
    path = tmp_path / "c4.jsonl"
    path.write_bytes(gzip.decompress(C4_FIRST.read_bytes()))
    for block_bytes in (4096, 100_003, 1 << 20):
        assert b"".join(read_all(path, block_bytes, 1 << 16)) == path.read_bytes()
