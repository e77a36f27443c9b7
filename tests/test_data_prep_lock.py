"""Two writers, one out_root: real `python -m data_prep` processes on the real C4 excerpts in ../shared/data.

A run is caught mid-way deterministically: wait until it has written its second block, then SIGSTOP it.
Stopped, it still holds its lock and writes nothing, so the second command meets it for sure and the
folder can be compared before and after; SIGCONT then lets it finish.
"""
from __future__ import annotations

import gzip
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import helpers
import pytest
from helpers import C4, ROOT, TOKENIZER, need_shared

pytestmark = pytest.mark.e2e  # the tier (pyproject.toml markers)

REFUSED = "is being written by another data_prep run"


@pytest.fixture(autouse=True)
def _shared():
    need_shared()


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    """Both C4 files as one plain JSON-lines file: with block_bytes=200000 that is 24 blocks (~80 ms each)."""
    path = tmp_path_factory.mktemp("lock-input") / "docs.jsonl"
    data = b"".join(gzip.open(f).read() for f in sorted(C4.glob("c4-train.*.json.gz")))
    path.write_bytes(data)
    return path


def command(docs: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "data_prep", f"tokenizer={TOKENIZER}", "dataset=jsonl", f"input={docs}",
            "block_bytes=200000", "workers=1", "progress=false", f"out_root={out}", *extra]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return helpers.run(*cmd[1:], timeout=300)


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def catch_mid_way(proc: subprocess.Popen, split: Path) -> None:
    """Wait for the second finished block, then freeze the process (its lock stays held)."""
    deadline = time.time() + 120
    while not (split / "block-00001" / "block.json").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be caught"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGSTOP)
    assert not (split / "index.json").exists(), "the run finished before it could be caught"


def tree(folder: Path, skip=("data_prep_summary.json",)) -> dict[str, bytes]:
    """Every file's bytes (the summary holds timings, so it differs between runs)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip}


@pytest.fixture(scope="module")
def alone(docs, tmp_path_factory) -> dict[str, bytes]:
    """The dataset as written by one run with nobody else around."""
    out = tmp_path_factory.mktemp("alone")
    proc = run(command(docs, out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tree(out / "train")


def assert_refused(proc: subprocess.CompletedProcess, out: Path, holder: subprocess.Popen, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert REFUSED in err and str(out / "train") in err, err
    assert f"pid {holder.pid}" in err and "host " in err, err  # who holds it
    assert "fix: wait for that run to finish" in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def test_second_run_is_refused_and_the_first_finishes_identical(docs, alone, tmp_path):
    out = tmp_path / "out"
    first = start(command(docs, out))
    try:
        catch_mid_way(first, out / "train")
        before = tree(out)
        second = run(command(docs, out))
        assert_refused(second, out, first, "every part and the merge")
        assert tree(out) == before  # the refused run wrote nothing, removed nothing
    finally:
        code, err = finish(first)
    assert code == 0, err[-3000:]
    assert tree(out / "train") == alone


def test_killed_run_leaves_no_stuck_lock(docs, alone, tmp_path):
    out = tmp_path / "out"
    killed = start(command(docs, out))
    catch_mid_way(killed, out / "train")
    killed.kill()  # SIGKILL: no cleanup runs, the lock file and the holder's note stay behind
    killed.communicate()
    assert (out / "train" / ".data_prep_lock" / f"{socket.gethostname()}-{killed.pid}.json").exists()

    again = run(command(docs, out))
    assert again.returncode == 0 and REFUSED not in again.stderr, again.stderr[-3000:]
    assert tree(out / "train") == alone
    assert sorted(p.name for p in (out / "train" / ".data_prep_lock").iterdir()) == ["lock"]  # note gone


def test_parts_of_one_run_write_at_once_a_second_copy_of_a_part_is_refused(docs, alone, tmp_path):
    out = tmp_path / "out"
    part0 = start(command(docs, out, "num_parts=2", "part=0"))  # as one task of the Slurm array does
    try:
        catch_mid_way(part0, out / "train")
        # Part 0 is running (frozen, its lock held): the same part again is the collision and is refused...
        twin = run(command(docs, out, "num_parts=2", "part=0"))
        assert_refused(twin, out, part0, "part 0/2")
        # ...while part 1 of the same run is allowed and writes its blocks beside part 0.
        part1 = run(command(docs, out, "num_parts=2", "part=1"))
        assert part1.returncode == 0, part1.stderr[-3000:]
        assert "other parts are still missing blocks" in part1.stderr, part1.stderr
    finally:
        code, err = finish(part0)
    assert code == 0, err[-3000:]  # the last part merges
    assert tree(out / "train") == alone
