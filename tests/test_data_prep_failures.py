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
    assert os.listdir(tmp_path) == []  # nothing of the failed run left: no lock folder, no split folder


# ------------------------------------------------------------------------------------------------------------
# 4. A refused run writes nothing: out_root is left as it was (it did not exist: it still does not)


def everything(folder: Path) -> dict:
    """Every file (its bytes) and folder (None) under folder, the folder itself included."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
            for p in [folder, *folder.rglob("*")]} if folder.exists() else {}


def _bad_inputs(folder: Path) -> dict:
    """Real C4 documents in the forms a download or a copy breaks them: the file, and what the refusal names."""
    folder.mkdir()
    raw = C4_FIRST.read_bytes()
    made = {"empty.json.gz": b"", "fake.json.gz": gzip.decompress(raw)[:5000],  # JSON lines named .gz
            "truncated.json.gz": raw[: len(raw) // 2]}
    # saved as Latin-1, not UTF-8: every line starts "été" (\xe9t\xe9)
    made["latin1.jsonl"] = b"".join(json.dumps({"text": "\u00e9t\u00e9 " + json.loads(line)["text"]},
                                               ensure_ascii=False).encode("latin-1", "replace") + b"\n"
                                    for line in gzip.decompress(raw).splitlines()[:20])
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in made}


@pytest.mark.parametrize("bad, key, said", [
    ("empty.json.gz", "input", "0 bytes: not a gzip file"),
    ("fake.json.gz", "input", "not a gzip file: it starts with b'{\"'"),
    ("truncated.json.gz", "input", "cannot be read to the end (EOFError"),
    ("latin1.jsonl", "input", "no document was read: all 20 lines were skipped (invalid UTF-8: 20)"),
    ("text_key", "dataset.text_key", "no document was read: all 1,000 lines were skipped"),
])
def test_a_refused_run_leaves_out_root_as_it_was(tmp_path, bad, key, said):
    """Before: the lock folder and data_prep_plan.json stayed behind (and out_root, made for them)."""
    files = _bad_inputs(tmp_path / "in")
    source = ["dataset=c4", f"input={C4_FIRST}", "dataset.text_key=body"] if bad == "text_key" else \
        ["dataset=jsonl", f"input={files[bad]}"]
    new = tmp_path / "new" / "out"  # neither it nor its parent exists
    proc = prep(*source, f"out_root={new}", "progress=false", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"data_prep: {key}: " in proc.stderr and said in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "new").exists()
    # into an out_root holding a finished dataset (its train split): that stays as it was, byte for byte
    out = tmp_path / "out"
    prep("dataset=c4", f"input={C4_SECOND}", f"out_root={out}", "concat_tokens=128", "progress=false")
    was = everything(out)
    assert any(".data_prep_lock" in name for name in was)
    proc = prep(*source, f"out_root={out}", "split=val", "progress=false", check=False)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert everything(out) == was


def test_a_sweep_refused_says_what_its_parts_share_and_each_part_s_own_at_once(tmp_path):
    """The sweep's shared settings (input, tokenizer, out_root) are checked with each part's, every problem in one
    pass, as data_prep's error the launcher reports (exit 2); they were checked alone first, in a Hydra callback
    that printed them and called sys.exit, and a part out of range was said only once the input was fixed."""
    files = _bad_inputs(tmp_path / "in")
    out = tmp_path / "out"
    proc = prep("dataset=jsonl", f"input=[{files['empty.json.gz']},{files['fake.json.gz']}]", f"out_root={out}",
                "num_parts=2", "-m", "part=0,5", check=False, tokenizer=tmp_path / "no-tokenizer")
    assert proc.returncode == 2, proc.stderr
    for line in (f"data_prep: tokenizer: {tmp_path / 'no-tokenizer'}", f"data_prep: input: {files['empty.json.gz']}: cannot be read to the end (0 bytes",
                 f"data_prep: input: {files['fake.json.gz']}: cannot be read to the end (not a gzip file",
                 "data_prep: [sweep point #1] part: is 5 but num_parts=2"):
        assert line in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "Callback" not in proc.stderr
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["in"]


def test_a_refused_run_takes_back_the_blocks_it_finished_and_keeps_those_made_before(tmp_path):
    """A good file's block finished, then the next file is cut short: that block goes (made of an input list that is
    to change, it would make the corrected run "another dataset"), the blocks an earlier run finished stay, and so
    does the plan they were made with."""
    files = _bad_inputs(tmp_path / "in")
    out = tmp_path / "out"
    # an earlier run of the same settings, killed after its first block (as part=0 of num_parts=2 leaves it)
    args = ["dataset=jsonl", f"input=[{C4_FIRST},{C4_SECOND},{files['truncated.json.gz']}]", "num_parts=3",
            "progress=false"]
    prep(*args, f"out_root={out}", "part=0")
    was = everything(out)
    assert "train/block-00000/block.json" in was and "train/data_prep_plan.json" in was
    proc = prep(*args, f"out_root={out}", check=False)  # every part: block 1 is made, block 2 cannot be read
    assert proc.returncode == 2 and f"data_prep: input: {files['truncated.json.gz']}: cannot be read" in proc.stderr
    assert everything(out) == was
    # from nothing: the good files' blocks are made, then taken back with everything else
    proc = prep(*args, f"out_root={tmp_path / 'fresh'}", check=False)
    assert proc.returncode == 2 and not (tmp_path / "fresh").exists(), proc.stderr


def test_a_run_stopped_by_anything_but_its_input_keeps_the_blocks_it_finished(tmp_path):
    """A tokenizing worker killed (the OOM killer) said "the same command again (finished blocks are kept)" and
    removed every block the run had finished, as a refusal of its input does: those are made of good input, and
    the same command again goes on from them. Refused for its input, they go (the test above)."""
    from data_prep.app import Before, prepare, take_back
    from data_prep.blocks import plan_bytes
    from data_prep.lock import OutRootLock
    from data_prep.part import is_complete
    from train.config.compose import compose

    args = ["dataset=jsonl", f"input=[{C4_FIRST},{C4_SECOND}]", "num_parts=2", "progress=false",
            f"out_root={tmp_path}"]
    job = prepare(compose([*args, f"tokenizer={TOKENIZER}"], config_name="data_prep"))
    s, mine = job.settings, [b for part in job.parts for b in part]
    before = Before.look(s, mine)  # as the whole run starts: nothing here
    prep(*args, "part=0")  # what the run had finished when it stopped: part 0's blocks
    made = [b for b in mine if is_complete(s.split_dir, b)]
    assert made and len(made) < len(mine)
    died = DataPrepError("workers", "a tokenizing worker process died (pid 1, killed by SIGKILL)", "run it again")
    take_back(s, before, OutRootLock(s, mine, plan_bytes(job.plan)), mine, died)
    assert all(is_complete(s.split_dir, b) for b in made)
    take_back(s, before, OutRootLock(s, mine, plan_bytes(job.plan)), mine, DataPrepError("input", "cut short"))
    assert not any(is_complete(s.split_dir, b) for b in made)


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


def test_a_tokenizing_worker_killed_is_named_by_its_pid_and_signal():
    """The pool's workers are the processes it started (multiprocessing's own list of children): one killed from
    outside (the OOM killer's SIGKILL) ends the run naming it, not the workers the pool stopped itself."""
    import signal

    from tokenizers import Tokenizer, models, pre_tokenizers

    from data_prep.encode import EncoderPool

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    with EncoderPool(tok, "text", [], [], workers=2) as pool:
        assert [p.pid for p in pool.processes] == sorted(pool.pool._processes)  # every worker, nothing else
        os.kill(pool.processes[1].pid, signal.SIGKILL)
        pool.processes[1].join(10)
        with pytest.raises(DataPrepError) as err:
            list(pool.map([(0, b'{"text": "a a"}\n')]))
    assert f"a tokenizing worker process died (pid {pool.processes[1].pid}, killed by SIGKILL)" in str(err.value)
