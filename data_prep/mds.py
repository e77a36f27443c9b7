"""MDS writing for one column `tokens: ndarray:int32` of fixed length, byte-identical to streaming's MDSWriter.

streaming's own writer imports torch (slow) and encodes sample by sample in Python; every sample here has
the same length, so a whole shard is laid out with numpy at once. tests/test_data_prep_mds.py checks the
bytes against MDSWriter and the reading against StreamingDataset.

Every shard file's hash is recorded in index.json as MDSWriter(hashes=HASHES) records it (`raw_data.hashes`,
`zip_data.hashes`), so that a training run can tell a damaged shard before it trains on it (train/task/shards.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common import files
from data_prep.errors import writing
from data_prep.facts import INDEX_FILE

# streaming's name for the hash of each shard file: xxh3_64 hashes at memory speed (xxhash, a dependency of
# streaming). MDSWriter wants the list sorted.
HASHES = ("xxh3_64",)


def _hasher(algo: str):
    """A running hash, named as streaming names it (streaming.base.hashing: hashlib's, then xxhash's)."""
    import hashlib

    if hasattr(hashlib, algo):
        return getattr(hashlib, algo)()
    import xxhash

    return getattr(xxhash, algo)()


def file_hashes(parts, hashes) -> dict:
    """{algo: hex digest} of the bytes of `parts` joined, as streaming's get_hash gives for the whole file."""
    running = {algo: _hasher(algo) for algo in hashes}
    for part in parts:
        for h in running.values():
            h.update(part)
    return {algo: h.hexdigest() for algo, h in running.items()}


def _shape_code(length: int) -> tuple[int, str]:
    # streaming stores a dynamic shape in the smallest unsigned type that holds it.
    for code, dtype in enumerate(("uint8", "uint16", "uint32", "uint64")):
        if length < 1 << (8 << code):
            return code, dtype
    raise ValueError(length)


class ShardWriter:
    """Writes shard.NNNNN.mds[.zstd] files and index.json into one folder."""

    def __init__(self, folder: Path, concat_tokens: int, compression: str | None, size_limit: int,
                 hashes=HASHES):
        self.folder = Path(folder)
        self.hashes = sorted(hashes)
        self.length = concat_tokens
        self.compression = compression
        self.size_limit = size_limit
        self.config = {"column_encodings": ["ndarray:int32"], "column_names": ["tokens"], "column_sizes": [None],
                       "compression": compression, "format": "mds", "hashes": self.hashes, "size_limit": size_limit,
                       "version": 2}
        self.config_data = json.dumps(self.config, sort_keys=True).encode("utf-8")
        code, shape_dtype = _shape_code(concat_tokens)
        # One sample: [uint32 size of the column][ndim<<2 | shape code][shape][int32 values].
        datum = bytes([(1 << 2) | code]) + np.array([concat_tokens], shape_dtype).tobytes()
        self.sample_head = np.frombuffer(np.uint32(len(datum) + 4 * concat_tokens).tobytes() + datum, np.uint8)
        self.sample_bytes = len(self.sample_head) + 4 * concat_tokens
        base = 4 + 4 + len(self.config_data)  # what MDSWriter counts for an empty shard
        self.per_shard = (size_limit - base) // (self.sample_bytes + 4) if size_limit else 1 << 62
        self.pending: list[np.ndarray] = []
        self.pending_count = 0
        self.shards: list[dict] = []
        self.samples = 0

    @staticmethod
    def min_size_limit(concat_tokens: int) -> int:
        probe = ShardWriter(Path("."), concat_tokens, None, 1 << 26)
        return 4 + 4 + len(probe.config_data) + probe.sample_bytes + 4 + 64  # room for one sample plus config

    def add(self, samples: np.ndarray) -> None:
        """samples: int32 array of shape (n, concat_tokens)."""
        if len(samples) == 0:
            return
        self.pending.append(samples)
        self.pending_count += len(samples)
        while self.pending_count >= self.per_shard:
            self._flush(self.per_shard)

    def _flush(self, count: int) -> None:
        block = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        head, rest = block[:count], block[count:]
        self.pending = [rest] if len(rest) else []
        self.pending_count = len(rest)
        self._write_shard(head)

    def _write_shard(self, samples: np.ndarray) -> None:
        n = len(samples)
        rows = np.empty((n, self.sample_bytes), np.uint8)
        rows[:, : len(self.sample_head)] = self.sample_head
        rows[:, len(self.sample_head):] = np.ascontiguousarray(samples, dtype="<i4").view(np.uint8).reshape(n, -1)
        header = 4 + 4 * (n + 1) + len(self.config_data)
        offsets = (header + self.sample_bytes * np.arange(n + 1, dtype=np.int64)).astype("<u4")
        parts = (np.uint32(n).tobytes(), offsets.tobytes(), self.config_data, memoryview(rows).cast("B"))
        number = len(self.shards)
        raw_name = f"shard.{number:05d}.mds"
        raw_info = {"basename": raw_name, "bytes": sum(len(p) for p in parts),
                    "hashes": file_hashes(parts, self.hashes)}
        zip_info = None
        name = raw_name
        if self.compression:
            import zstd  # the same binding streaming uses, so compressed shards match MDSWriter's bytes

            level = int(self.compression.split(":")[1]) if ":" in self.compression else 3
            parts, name = (zstd.compress(b"".join(parts), level),), f"{raw_name}.zstd"
            zip_info = {"basename": name, "bytes": len(parts[0]), "hashes": file_hashes(parts, self.hashes)}
        # A partly written shard stays in this writer's temporary folder, which the caller removes on failure.
        with writing(self.folder / name), open(self.folder / name, "wb") as fh:
            for part in parts:  # no joined copy of a 64 MB shard
                fh.write(part)
        shard = {"samples": n, "raw_data": raw_info, "zip_data": zip_info}
        shard.update(self.config)
        self.shards.append(shard)
        self.samples += n

    def finish(self) -> list[dict]:
        if self.pending_count:
            self._flush(self.pending_count)
        write_index(self.folder, self.shards)
        return self.shards


def write_index(folder: Path, shards: list[dict]) -> None:
    atomic_write(Path(folder) / INDEX_FILE, json.dumps({"shards": shards, "version": 2}, sort_keys=True).encode())


def atomic_write(target: Path, data: bytes) -> None:
    """common.files.atomic_write, with a full disk reported as data_prep's error naming the target."""
    with writing(target):
        files.atomic_write(target, data)


def prefixed(shards: list[dict], subfolder: str) -> list[dict]:
    """Shard entries as seen from the parent folder (what streaming's merge_index does)."""
    out = []
    for shard in shards:
        shard = dict(shard)
        for key in ("raw_data", "zip_data"):
            if shard.get(key):
                shard[key] = dict(shard[key], basename=f"{subfolder}/{shard[key]['basename']}")
        out.append(shard)
    return out
