"""A dataset damaged after it was made, a rerun killed mid-merge, a tokenizing worker killed: each a real
`python -m data_prep` process on the real C4 excerpts in ../shared/data, killed with a real SIGKILL."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import C4_FIRST, C4_SECOND, ROOT, TOKENIZER, command_env, need_shared, prep, tree

from data_prep.facts import check_index

pytestmark = pytest.mark.e2e  # the tier (pyproject.toml markers)


@pytest.fixture(autouse=True)
def _shared():
    need_shared()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    """Both C4 excerpts as plain JSON lines: with block_bytes=300000, 17 blocks of several shards each."""
    folder = tmp_path_factory.mktemp("recovery-input")
    paths = []
    for name, source in (("c4a.jsonl", C4_FIRST), ("c4b.jsonl", C4_SECOND)):
        (folder / name).write_bytes(gzip.open(source).read())
        paths.append(folder / name)
    return paths


def args(inputs: list[Path], out: Path, *extra: str) -> list[str]:
    return ["dataset=jsonl", f"input=[{','.join(map(str, inputs))}]", "concat_tokens=128", "block_bytes=300000",
            "size_limit=100000", "num_parts=2", "progress=false", f"out_root={out}", *extra]


@pytest.fixture(scope="module")
def clean(inputs, tmp_path_factory) -> Path:
    """The dataset made by one uninterrupted run: what every repaired or resumed run must equal."""
    out = tmp_path_factory.mktemp("recovery-clean")
    prep(*args(inputs, out))
    assert len(list((out / "train").glob("block-*"))) == 17
    return out / "train"


def copy_of(clean: Path, tmp_path: Path) -> Path:
    shutil.copytree(clean.parent, tmp_path / "out", symlinks=True)
    return tmp_path / "out"


# ------------------------------------------------------------------------------------------------------------
# 1. A finished block damaged after the run: the rerun notices it (sizes against the block's index.json)


def cut_short(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(50_000)


@pytest.mark.parametrize("damage", ["cut short", "deleted", "index.json deleted", "block.json emptied"])
def test_a_damaged_finished_block_is_redone_on_rerun(inputs, clean, tmp_path, damage):
    """(An emptied block.json, as an interrupted copy leaves it, stopped every later run with a traceback.)"""
    out = copy_of(clean, tmp_path)
    block = out / "train" / "block-00003"
    shard = block / "shard.00001.mds"
    if damage == "cut short":
        cut_short(shard)
    elif damage == "deleted":
        shard.unlink()
    elif damage == "index.json deleted":
        (block / "index.json").unlink()
    else:
        (block / "block.json").write_bytes(b"")
    proc = prep(*args(inputs, out))
    assert f"data_prep: warning: {block} is damaged" in proc.stderr, proc.stderr
    named = {"index.json deleted": block / "index.json", "block.json emptied": block / "block.json"}.get(damage, shard)
    assert str(named) in proc.stderr, proc.stderr
    assert "(1 blocks done, 16 already complete)" in proc.stdout, proc.stdout
    assert check_index(out / "train") == []
    assert tree(out / "train") == tree(clean)


def test_a_damaged_tail_is_written_again_on_rerun(inputs, clean, tmp_path):
    out = copy_of(clean, tmp_path)
    tail_shard = out / "train" / "tail" / "shard.00000.mds"
    with open(tail_shard, "r+b") as fh:
        fh.truncate(1000)
    prep(*args(inputs, out))
    assert tree(out / "train") == tree(clean)


def test_a_damaged_block_of_another_part_stops_the_merge_naming_the_file(inputs, clean, tmp_path):
    out = copy_of(clean, tmp_path)
    plan = json.loads((out / "train" / "data_prep_plan.json").read_text())
    last = out / "train" / f"block-{len(plan['blocks']) - 1:05d}"  # the last block is part 1's
    (last / "shard.00000.mds").unlink()
    proc = prep(*args(inputs, out, "part=0"), check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{last / 'shard.00000.mds'} is listed in index.json but missing" in proc.stderr, proc.stderr
    assert "part=1" in proc.stderr and "\n  fix: " in proc.stderr and "Traceback" not in proc.stderr
    prep(*args(inputs, out))  # a plain run redoes it
    assert tree(out / "train") == tree(clean)


# ------------------------------------------------------------------------------------------------------------
# 2. A rerun killed at any instant of its merge leaves the old dataset or the new one, never a broken one

# `python -m data_prep`, SIGKILLed by itself just before its KILL_AT-th rename, replace or removal of a file or
# folder once the merge has begun: every instant at which what a reader sees can change.
KILLED_IN_MERGE = """
import os, runpy, signal, sys
import data_prep.app as app

at, count, armed = int(os.environ["KILL_AT"]), [0], [False]

def counted(call):
    def run(*a, **k):
        if armed[0]:
            count[0] += 1
            if count[0] == at:
                os.kill(os.getpid(), signal.SIGKILL)
        return call(*a, **k)
    return run

for name in ("rename", "replace", "unlink", "remove", "rmdir"):
    setattr(os, name, counted(getattr(os, name)))
merge = app.merge
def merge_armed(*a, **k):
    armed[0] = True
    return merge(*a, **k)
app.merge = merge_armed
sys.argv = ["data_prep", *sys.argv[1:]]
runpy.run_module("data_prep", run_name="__main__", alter_sys=True)
"""


def assert_old_or_new(split: Path, clean: Path) -> None:
    """No index.json (not a dataset: readers and training refuse it), or one whose every shard is there with the
    clean run's bytes."""
    if not (split / "index.json").exists():
        return
    assert check_index(split) == []
    index = json.loads((split / "index.json").read_text())
    assert index == json.loads((clean / "index.json").read_text())
    for shard in index["shards"]:
        name = shard["raw_data"]["basename"]
        assert (split / name).read_bytes() == (clean / name).read_bytes(), name


@pytest.mark.parametrize("before", ["finished", "blocks only"])
def test_a_merge_killed_at_any_instant_leaves_a_readable_dataset_and_reruns_identical(inputs, clean, tmp_path,
                                                                                       before):
    kills = 0
    for at in range(1, 40):
        out = copy_of(clean, tmp_path / str(at))
        split = out / "train"
        if before == "blocks only":  # as a run killed after its last block, before its merge, leaves it
            for done in ("index.json", "data_prep_summary.json", "tail"):
                shutil.rmtree(split / done) if done == "tail" else (split / done).unlink()
        cmd = [sys.executable, "-c", KILLED_IN_MERGE, f"tokenizer={TOKENIZER}", *args(inputs, out)]
        proc = subprocess.run(cmd, cwd=ROOT, env=command_env(env={"KILL_AT": str(at)}), capture_output=True,
                              text=True, timeout=300)
        if proc.returncode == 0:  # the merge ended before its at-th change: every instant was tried
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        kills += 1
        assert_old_or_new(split, clean)
        prep(*args(inputs, out))
        assert tree(split) == tree(clean), f"rerun after a kill at change {at}"
        shutil.rmtree(tmp_path / str(at))
    assert kills >= 3, "the merge changed too little to be killed in it"
    assert_old_or_new(split, clean)
    assert tree(split) == tree(clean)


# ------------------------------------------------------------------------------------------------------------
# 3. A tokenizing worker killed (the OOM killer's SIGKILL) ends the run with a message, not a hang


def test_a_killed_worker_stops_the_run_with_a_message_and_the_rerun_finishes(inputs, clean, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "data_prep", f"tokenizer={TOKENIZER}", *args(inputs, out, "workers=2")]
    # The tokenizers encoder is the slower one: the run is surely mid-way when the worker dies.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=command_env(env={"DATA_PREP_ENCODER": "tokenizers"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (out / "train" / "block-00000" / "block.json").exists():
            assert proc.poll() is None and time.time() < deadline, "the run ended before a worker could be killed"
            time.sleep(0.01)
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2, workers
        os.kill(workers[0].pid, signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the run hangs after one of its workers was killed")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 2, err[-3000:]
    assert "data_prep: workers: a tokenizing worker process" in err and "out of memory" in err, err[-3000:]
    assert "\n  fix: " in err and "Traceback" not in err, err[-3000:]
    assert not (out / "train" / "index.json").exists() and not list((out / "train").glob(".tmp-*"))
    prep(*args(inputs, out))  # the lock went with the process, finished blocks are kept
    assert tree(out / "train") == tree(clean)
