"""data_prep's shard writer against mosaicml-streaming's own MDSWriter and StreamingDataset."""

import numpy as np
import pytest
from helpers import streaming_dataset

from data_prep.mds import HASHES, ShardWriter

pytestmark = pytest.mark.torch  # streaming's writer and reader import torch


@pytest.mark.parametrize("length, compression, size_limit", [
    (2048, None, 1 << 16),      # several shards
    (2048, None, 1 << 26),      # streaming's default: one shard
    (100, "zstd", 5000),        # compressed, uint8 shape
    (300, "zstd:7", 1 << 20),   # a compression level
    (70000, None, 1 << 20),     # a uint32 shape
])
def test_shards_and_index_are_byte_identical_to_mdswriter(tmp_path, length, compression, size_limit):
    from streaming import MDSWriter

    samples = np.random.default_rng(length).integers(0, 50277, (23, length), dtype=np.int32)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    writer = ShardWriter(ours, length, compression, size_limit)
    writer.add(samples[:5])  # arrives in uneven pieces, as token chunks do
    writer.add(samples[5:])
    writer.finish()
    with MDSWriter(columns={"tokens": "ndarray:int32"}, out=str(theirs), compression=compression,
                   size_limit=size_limit, hashes=list(HASHES)) as mds:
        for row in samples:
            mds.write({"tokens": row})
    names = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    ds = streaming_dataset(ours, shuffle=False, batch_size=1)
    assert np.array_equal(np.stack([ds[i]["tokens"] for i in range(ds.num_samples)]), samples)


def test_mock_data_is_written_by_the_same_writer(tmp_path):
    """data=mock's splits come from data_prep's writer: the same bytes MDSWriter would write for that stream."""
    from streaming import MDSWriter

    from train.task import mock_data

    mock_data.ensure(str(tmp_path / "mock"), seq_len=64, train_samples=40, val_samples=8)
    for split, samples, seed in (("train", 40, 0), ("val", 8, 1)):
        with MDSWriter(columns={"tokens": "ndarray:int32"}, out=str(tmp_path / split), hashes=list(HASHES)) as mds:
            for row in mock_data.token_stream(samples * 64, seed).reshape(samples, 64):
                mds.write({"tokens": row})
        names = sorted(p.name for p in (tmp_path / split).iterdir())
        assert sorted(p.name for p in (tmp_path / "mock" / split).iterdir()) == names
        for name in names:
            assert (tmp_path / "mock" / split / name).read_bytes() == (tmp_path / split / name).read_bytes()
    assert (tmp_path / "mock" / "tokenizer" / "tokenizer.json").is_file()
