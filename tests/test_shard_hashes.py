"""Shards carry hashes: data_prep records each shard file's xxh3_64 in index.json (as streaming's MDSWriter does),
and a training run hashes the train and val shards it will read before it builds the trainer, naming a damaged
one. A real byte flip in a real shard."""
import json

import numpy as np
import pytest
from helpers import run, streaming_dataset, train_here

from data_prep.mds import HASHES, ShardWriter
from train.task import mock_data
from train.task.shards import DamagedShard, shard_files, verify, verify_shards


def _write(folder, samples=40, length=64, compression=None, size_limit=1 << 12):
    folder.mkdir(parents=True)
    writer = ShardWriter(folder, length, compression, size_limit)
    writer.add(np.random.default_rng(0).integers(0, 255, (samples, length), dtype=np.int32))
    writer.finish()
    return folder


def _fcfg(local, remote=None):
    return {loader: {"dataset": {"local": str(local), "remote": remote, "split": split}}
            for loader, split in (("train_loader", "train"), ("eval_loader", "val"))}


def _flip(file, offset=-5):
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01  # one bit of one token
    file.write_bytes(bytes(data))


def test_every_shard_records_its_hash_in_the_index(tmp_path):
    for compression in (None, "zstd"):
        folder = _write(tmp_path / str(compression), compression=compression)
        index = json.loads((folder / "index.json").read_text())
        assert len(index["shards"]) > 1
        for shard in index["shards"]:
            assert shard["hashes"] == list(HASHES)
            for kind in ("raw_data",) + (("zip_data",) if compression else ()):
                assert set(shard[kind]["hashes"]) == set(HASHES) and len(shard[kind]["hashes"]["xxh3_64"]) == 16
        assert len(shard_files(folder)) == len(index["shards"])


def test_a_flipped_byte_in_a_val_shard_is_named(tmp_path):
    data = tmp_path / "mds"
    _write(data / "train")
    _write(data / "val", samples=10)
    assert verify(_fcfg(data)) == []
    victim = sorted((data / "val").glob("shard.*.mds"))[-1]
    _flip(victim)
    [(key, file, why)] = verify(_fcfg(data))
    assert (key, file) == ("eval_loader.dataset", str(victim)) and "xxh3_64" in why
    with pytest.raises(DamagedShard) as caught:
        verify_shards(_fcfg(data))
    assert str(victim) in str(caught.value) and "eval_loader.dataset" in str(caught.value)
    # remote data is streaming's to check as it downloads; a folder without hashes is left as it is
    assert verify(_fcfg(data, remote="s3://bucket/c4")) == []
    # several evaluators (eval_loaders): each one's split is checked, named by its place
    good = tmp_path / "good"
    _write(good / "val", samples=10)
    several = {"train_loader": _fcfg(data)["train_loader"], "eval_loader": None,
               "eval_loaders": [{"label": "a", "dataset": {"local": str(good), "split": "val"}},
                                {"label": "b", "dataset": {"local": str(data), "split": "val"}}]}
    [(key, file, _)] = verify(several)
    assert (key, file) == ("eval_loaders.1.dataset", str(victim))


def test_the_work_is_spread_over_the_ranks(tmp_path):
    data = tmp_path / "mds"
    _write(data / "train", samples=60)
    _write(data / "val", samples=10)
    files = sorted((data / "train").glob("shard.*.mds"))
    for f in files:
        _flip(f)
    found = [verify(_fcfg(data), rank, 3) for rank in range(3)]
    assert sorted(f for part in found for _, f, _ in part) == sorted(map(str, files))
    assert all(found)  # every rank had its share


def test_a_compressed_shard_is_checked_as_its_compressed_file(tmp_path):
    data = tmp_path / "mds"
    _write(data / "train", compression="zstd")
    _write(data / "val", compression="zstd")
    victim = sorted((data / "train").glob("shard.*.mds.zstd"))[0]
    _flip(victim, offset=len(victim.read_bytes()) // 2)
    assert [f for _, f, _ in verify(_fcfg(data))] == [str(victim)]


@pytest.mark.torch  # streaming imports torch
def test_streaming_itself_accepts_the_hashes(tmp_path):
    data = _write(tmp_path / "mds", samples=20)
    ds = streaming_dataset(data, shuffle=False, batch_size=1, validate_hash="xxh3_64")
    assert ds.num_samples == 20 and len(ds[19]["tokens"]) == 64


def _everything(folder):
    """Every file (its bytes) and folder (None) under folder."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


@pytest.mark.train  # imports torch and composer (the check runs before llm-foundry is imported)
def test_a_run_stops_before_training_naming_the_damaged_val_shard_and_leaves_nothing(tmp_path):
    """Hashing the shards is the job's work (spread over its ranks), so this refusal comes from the task, after
    Hydra wrote the run folder's .hydra/ and log and the run claimed its save folder: all of it was left behind.
    Now the task takes back what it made, and an earlier start's run folder is as it was, byte for byte."""
    root = tmp_path / "root"
    mock = mock_data.ensure(str(root / "datasets" / "mock-seq128"), 128, 1024, 64)  # what data=mock reads
    [victim] = (mock / "val").glob("shard.*.mds")
    _flip(victim)
    before = _everything(root)
    proc = train_here("max_duration=4ba", root=root)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: eval_loader.dataset: shard {victim} is damaged: its xxh3_64 is" in proc.stderr
    assert "Traceback" not in proc.stderr and "[progress]" not in proc.stderr
    assert _everything(root) == before  # no outputs/<run>/ (.hydra/, __main__.log), no checkpoints/<run>/.lock
    # a run of this name started before: its run folder as it was (Hydra rewrites .hydra/ and appends to the log)
    name = json.loads(run("-m", "train", "max_duration=4ba", "plan=json", root=root, check=True).stdout)["run_name"]
    earlier = root / "outputs" / name
    (earlier / ".hydra").mkdir(parents=True)
    (earlier / ".hydra" / "overrides.yaml").write_text("- max_duration=4ba\n- seed=3\n")
    (earlier / "__main__.log").write_text("[the earlier start's log]\n")
    before = _everything(root)
    proc = train_here("max_duration=4ba", root=root)
    assert proc.returncode == 2 and "is damaged" in proc.stderr, proc.stderr[-3000:]
    assert _everything(root) == before


@pytest.mark.train  # two real runs
def test_a_second_run_of_the_same_name_started_beside_the_first_touches_nothing_of_it(tmp_path):
    """Both passed the checks (the first had not claimed its save folder yet: that came with its task, seconds
    later), so the second's Hydra wrote into the first's .hydra/ and log before its task was refused. The run
    claims its save folder as its checks pass, before Hydra writes: the second is refused then, having written
    nothing. The same run (one name) told apart by an environment variable, which is no part of what is trained."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path / "root"
    mock_data.ensure(str(root / "datasets" / "mock-seq128"), 128, 1024, 64)  # not written by both at once

    def start(who):
        return run("-m", "train", "max_duration=4ba", f"cluster.env.WHO={who}", root=root, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(("who-7f3a", "who-c91e"), pool.map(start, ("who-7f3a", "who-c91e"))))
    assert sorted(p.returncode for p in procs.values()) == [0, 2], [p.stderr[-2000:] for p in procs.values()]
    [first] = [who for who, p in procs.items() if p.returncode == 0]
    [second] = [who for who in procs if who != first]
    assert "error: save_folder: " in procs[second].stderr and "is in use by another run" in procs[second].stderr
    assert "Traceback" not in procs[second].stderr
    [run_dir] = (root / "outputs").iterdir()
    assert f"WHO={first}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert (run_dir / "__main__.log").read_text().count("shards checked against index.json") == 1  # one start
    assert not [p for p in root.rglob("*") if p.is_file() and second.encode() in p.read_bytes()]


def test_each_stream_of_a_mixture_is_checked_and_a_resume_on_other_data_is_seen(tmp_path):
    """A loader mixing streams (`dataset.streams`, llm-foundry's YAMLs) reads each stream's folder: a flipped byte in
    one was trained on, exit 0, and a stream's data made again went unseen on resume (only a loader's own
    dataset.local was looked at)."""
    from train.task.shards import OtherData, same_train_data, train_data

    a, b = _write(tmp_path / "a" / "train"), _write(tmp_path / "b" / "train", samples=20)
    mixture = {"train_loader": {"dataset": {"split": "train", "streams": {
        "a": {"local": str(a.parent), "proportion": 0.5}, "b": {"local": str(b.parent), "proportion": 0.5}}}}}
    assert verify(mixture) == []
    then = train_data(mixture)
    assert then["samples"] == 60
    victim = sorted(b.glob("shard.*.mds"))[-1]
    _flip(victim)
    [(key, file, _)] = verify(mixture)
    assert (key, file) == ("train_loader.dataset.streams.b", str(victim))
    # stream b made again: another run's data, as for a single split
    import shutil

    shutil.rmtree(b)
    _write(b, samples=30)
    with pytest.raises(OtherData):
        same_train_data(then, train_data(mixture), mixture, "ep0-ba10-rank0.pt")


def test_a_shard_named_outside_the_dataset_folder_is_not_hashed_but_named(tmp_path):
    """index.json's reader (data_prep/facts.py: index_shards, shard_file) is the one the checks and the task's
    hashes share: a shard whose basename points outside the split's folder (here a byte-for-byte copy, with the
    right hash) is reported by check_index and by the task alike, never hashed as if it were this data's."""
    from data_prep.facts import check_index, first_sample_tokens

    data = tmp_path / "mds"
    _write(data / "train")
    _write(data / "val", samples=10)
    index = json.loads((data / "train" / "index.json").read_text())
    first = data / "train" / index["shards"][0]["raw_data"]["basename"]
    elsewhere = tmp_path / "elsewhere.mds"
    elsewhere.write_bytes(first.read_bytes())
    index["shards"][0]["raw_data"]["basename"] = str(elsewhere)
    (data / "train" / "index.json").write_text(json.dumps(index))
    assert "outside the dataset folder" in " ".join(check_index(data / "train"))
    assert first_sample_tokens(data / "train") is None  # not read from the file outside
    assert (elsewhere, None) in shard_files(data / "train")
    [(key, file, why)] = verify(_fcfg(data))
    assert (key, file) == ("train_loader.dataset", str(elsewhere)) and "outside the dataset folder" in why
