"""Runs that cannot make a dataset: nothing read, a full disk, a merge that fails. Real processes, real C4 excerpts."""
from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import C4_FIRST, C4_SECOND, ROOT, SUMMARY, TOKENIZER, prep, tree

from data_prep.errors import DataPrepError
from data_prep.mds import ShardWriter, write_index

pytestmark = pytest.mark.e2e  # the tier (pyproject.toml markers)


@pytest.fixture(autouse=True)
def need_shared():
    if not (TOKENIZER / "tokenizer.json").is_file() or not C4_FIRST.is_file():
        pytest.skip("../shared/data is missing; these tests read its real C4 excerpts")


def temp_files(folder: Path) -> list[str]:
    """Everything a writer names as temporary: .tmp-<block|tail>.<host>-<pid>/, .<file>.tmp-<host>-<pid>."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp" in p.name)


def prep_limited(file_bytes: int, *overrides: str) -> subprocess.CompletedProcess:
    """python -m data_prep with RLIMIT_FSIZE: the kernel fails any write past file_bytes with EFBIG, as a full
    disk fails it with ENOSPC (a real write error; making a small file system here would need root)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))

    cmd = [sys.executable, "-m", "data_prep", f"tokenizer={TOKENIZER}", "progress=false", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit)


# ------------------------------------------------------------------------------------------------------------
# 1. A run that reads no document


def test_a_wrong_text_key_fails_names_the_key_and_leaves_nothing_marked_complete(tmp_path):
    out = tmp_path / "out"
    proc = prep("dataset=c4", f"input={C4_FIRST}", f"out_root={out}", "dataset.text_key=body", "progress=false",
                check=False)
    assert proc.returncode == 2, proc.stderr
    assert "data_prep: dataset.text_key: no document was read: all 1,000 lines were skipped" in proc.stderr
    assert "missing 'body' field (has text, timestamp, url)" in proc.stderr  # what the lines hold instead
    assert "\n  fix: " in proc.stderr and "Traceback" not in proc.stderr
    split = out / "train"
    assert not (split / "index.json").exists() and not (split / SUMMARY).exists()
    assert not list(split.glob("block-*")) and temp_files(out) == []
    # The fix works in place: the same out_root, the right key.
    prep("dataset=c4", f"input={C4_FIRST}", f"out_root={out}", "progress=false")
    assert json.loads((split / SUMMARY).read_text())["docs"] == 1000


def test_files_that_are_not_json_lines_fail_naming_input(tmp_path):
    plain = tmp_path / "in" / "docs.jsonl"  # the documents as plain text, one per line: not JSON
    plain.parent.mkdir()
    with gzip.open(C4_FIRST, "rb") as fh:
        plain.write_text("\n".join(json.loads(line)["text"].replace("\n", " ") for line in fh) + "\n")
    proc = prep("dataset=jsonl", f"input={plain}", f"out_root={tmp_path / 'out'}", "progress=false", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "data_prep: input: no document was read: all 1,000 lines were skipped (invalid JSON: 1,000)" in proc.stderr
    assert "\n  fix: " in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "out" / "train").glob("block-*"))


def test_a_parts_sweep_that_reads_no_document_fails_with_the_message(tmp_path):
    proc = prep("dataset=c4", f"input={C4_FIRST.parent}", f"out_root={tmp_path / 'out'}", "dataset.text_key=body",
                "num_parts=2", "progress=false", "-m", "part=0,1", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "data_prep: dataset.text_key: no document was read: all 2,000 lines were skipped" in proc.stderr
    split = tmp_path / "out" / "train"
    assert not (split / "index.json").exists() and not list(split.glob("block-*"))


def test_a_file_whose_every_line_is_skipped_beside_a_good_one_still_makes_the_dataset(tmp_path):
    other = tmp_path / "in" / "renamed.jsonl"  # real C4 records whose text sits under another key
    other.parent.mkdir()
    with gzip.open(C4_SECOND, "rb") as fh:
        other.write_text("".join(json.dumps({"body": json.loads(line)["text"]}) + "\n" for line in fh.readlines()[:50]))
    proc = prep("dataset=jsonl", f"input=[{C4_FIRST},{other}]", f"out_root={tmp_path / 'out'}", "progress=false")
    summary = json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())
    assert summary["docs"] == 1000 and summary["skipped_lines"] == 50
    assert summary["skipped_by_reason"] == {"missing 'text' field": 50}
    assert "... 30 more skipped lines" in proc.stderr  # 20 listed, the rest counted


# ------------------------------------------------------------------------------------------------------------
# 2. A full disk names the file being written, and the fix


def test_a_full_disk_while_writing_a_shard_names_the_file(tmp_path):
    # /dev/full fails every write with ENOSPC, exactly as a full file system does.
    (tmp_path / "shard.00000.mds").symlink_to("/dev/full")
    writer = ShardWriter(tmp_path, 2048, None, 1 << 26)
    writer.add(np.zeros((3, 2048), np.int32))
    with pytest.raises(DataPrepError) as caught:
        writer.finish()
    text = str(caught.value)
    assert text.startswith(f"data_prep: out_root: cannot write {tmp_path / 'shard.00000.mds'}: No space left on device")
    assert " bytes free there)\n  fix: free space" in text and "another out_root" in text


def test_a_full_disk_while_writing_index_json_names_it_and_removes_the_temporary_file(tmp_path):
    # write_index writes a temporary file first and renames it; that file here is /dev/full (ENOSPC).
    tmp = tmp_path / f".index.json.tmp-{socket.gethostname()}-{os.getpid()}"
    tmp.symlink_to("/dev/full")
    with pytest.raises(DataPrepError) as caught:
        write_index(tmp_path, [{"samples": 1}] * 2000)
    assert f"cannot write {tmp_path / 'index.json'}: No space left on device" in str(caught.value)
    assert sorted(os.listdir(tmp_path)) == []  # no temporary file (nor link) left behind


def test_a_file_size_limit_while_writing_blocks_stops_with_the_path_and_cleans_up(tmp_path):
    out = tmp_path / "out"
    proc = prep_limited(100_000, "dataset=c4", f"input={C4_FIRST}", f"out_root={out}")
    assert proc.returncode == 2, proc.stderr
    assert f"data_prep: out_root: cannot write {out / 'train'}/.tmp-block-00000." in proc.stderr
    assert "/shard.00000.mds: File too large\n  fix: " in proc.stderr and "Traceback" not in proc.stderr
    assert temp_files(out) == [] and not list((out / "train").glob("block-*"))


def test_the_first_file_a_run_writes_is_named_too(tmp_path):
    # 100 bytes: the lock file stays empty, the note naming this run (about 150 bytes) is the first write to fail.
    proc = prep_limited(100, "dataset=c4", f"input={C4_FIRST}", f"out_root={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    assert f"data_prep: out_root: cannot write {tmp_path / 'train' / '.data_prep_lock'}/" in proc.stderr
    assert ".json: File too large\n  fix: " in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path / "train" / ".data_prep_lock") == ["lock"]


# ------------------------------------------------------------------------------------------------------------
# 3. A failed merge leaves no temporary file, and the next run finishes the same dataset


@pytest.mark.parametrize("fails_at", ["tail shard", "index.json"])
def test_a_failed_merge_leaves_no_temporary_files_and_a_rerun_finishes(tmp_path, fails_at):
    args = ["dataset=c4", f"input={C4_FIRST.parent}", "size_limit=20000", "progress=false"]  # many small shards
    whole, out = tmp_path / "whole", tmp_path / "out"
    prep(*args, f"out_root={whole}")
    shutil.copytree(whole, out)
    split = out / "train"
    # As a run killed after its blocks and before the merge leaves the folder.
    index_bytes = (split / "index.json").stat().st_size
    for done in (split / "index.json", split / SUMMARY):
        done.unlink()
    shutil.rmtree(split / "tail")
    # A tail shard holds at most 2 * 2048 tokens (16 KB); the merged index lists 200+ shards (about 80 KB).
    limit = 4096 if fails_at == "tail shard" else index_bytes // 2
    if fails_at == "index.json":
        assert limit > 20_000  # room for any shard (size_limit), not for the index
    proc = prep_limited(limit, *args, f"out_root={out}")
    assert proc.returncode == 2, proc.stderr
    path = f"{split}/.tmp-tail." if fails_at == "tail shard" else f"{split / 'index.json'}: File too large"
    assert f"data_prep: out_root: cannot write {path}" in proc.stderr and "Traceback" not in proc.stderr
    assert temp_files(out) == []
    assert not (split / "index.json").exists()
    prep(*args, f"out_root={out}")
    assert tree(split) == tree(whole / "train")


def test_the_next_merge_removes_what_a_killed_merge_left(tmp_path):
    args = ["dataset=c4", f"input={C4_FIRST}", "progress=false"]
    prep(*args, f"out_root={tmp_path}")
    split = tmp_path / "train"
    (split / "index.json").unlink()
    # What a merge killed with SIGKILL on another node leaves (made by hand: a kill cannot be timed into it).
    (split / ".tmp-tail.node7-4711").mkdir()
    (split / ".tmp-tail.node7-4711" / "shard.00000.mds").write_bytes(b"\0" * 100)
    (split / ".index.json.tmp-node7-4711").write_text("{")
    (split / f".{SUMMARY}.tmp-node7-4711").write_text("{")
    prep(*args, f"out_root={tmp_path}")
    assert temp_files(tmp_path) == [] and (split / "index.json").exists()
