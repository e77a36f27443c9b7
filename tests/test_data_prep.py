"""python -m data_prep end to end on the real excerpts in ../shared/data: every run is a real process. (One module
for data_prep's whole command-line contract, with its shared reference dataset made once: hence its length.)"""
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

import numpy as np
import pytest
from helpers import (
    C4,
    C4_FIRST,
    C4_SECOND,
    ROOT,
    SHARED,
    SUMMARY,
    TOKENIZER,
    need_shared,
    prep,
    streaming_dataset,
    tree,
)

pytestmark = pytest.mark.e2e  # the tier (pyproject.toml markers)

SLIMPAJAMA = SHARED / "slimpajama"
EOS = 0  # <|endoftext|> in GPT-NeoX-20B


@pytest.fixture(autouse=True)
def shared_data():
    need_shared()


def texts(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        return [json.loads(line)["text"] for line in fh]


def reference_tokens(docs: list[str]) -> np.ndarray:
    """The token stream a converter must produce: each document's ids, then EOS (as llm-foundry does)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    out: list[int] = []
    for enc in tok.encode_batch(docs):
        out += enc.ids + [EOS]
    return np.array(out, np.int32)


def expected_samples(per_block: list[np.ndarray], length: int = 2048) -> np.ndarray:
    """Full samples of each block in order, then the blocks' leftovers joined into the last samples."""
    rows, tails = [], []
    for stream in per_block:
        full = len(stream) // length * length
        rows.append(stream[:full].reshape(-1, length))
        tails.append(stream[full:])
    tail = np.concatenate(tails)
    rows.append(tail[: len(tail) // length * length].reshape(-1, length))
    return np.concatenate(rows)


def streaming_samples(split_dir: Path) -> np.ndarray:
    ds = streaming_dataset(split_dir, shuffle=False, batch_size=1)
    return np.stack([ds[i]["tokens"] for i in range(ds.num_samples)])


@pytest.fixture(scope="module")
def c4_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("c4")
    proc = prep("dataset=c4", f"input={C4}", f"out_root={out}", "model_preset=mpt-125m")
    assert "docs/s" in proc.stderr and "tokens/s" in proc.stderr, proc.stderr  # the progress bar
    assert "data_prep summary" in proc.stdout
    return out


@pytest.mark.torch  # reads the shards back with streaming's reader
def test_round_trip_one_file_decodes_to_the_documents_joined_by_eos(tmp_path):
    prep("dataset=c4", f"input={C4_FIRST}", f"out_root={tmp_path}", "num_parts=1")
    samples = streaming_samples(tmp_path / "train")
    assert samples.dtype == np.int32 and samples.shape[1] == 2048
    docs = texts(C4_FIRST)
    stream = reference_tokens(docs)
    assert len(samples) == len(stream) // 2048
    assert np.array_equal(samples.ravel(), stream[: samples.size])
    from tokenizers import Tokenizer

    decoded = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).decode(samples.ravel().tolist(),
                                                                             skip_special_tokens=False)
    joined = "".join(d + "<|endoftext|>" for d in docs)
    assert joined.startswith(decoded) and len(joined) - len(decoded) < 2048 * 8


@pytest.mark.torch  # reads the shards back with streaming's reader
def test_two_c4_files_every_token_kept_summary_written(c4_dataset):
    samples = streaming_samples(c4_dataset / "train")
    streams = [reference_tokens(texts(f)) for f in sorted(C4.glob("c4-train.*.json.gz"))]
    assert np.array_equal(samples, expected_samples(streams))
    summary = json.loads((c4_dataset / "train" / SUMMARY).read_text())
    total = sum(len(s) for s in streams)
    assert summary["docs"] == 2000 and summary["tokens"] == total and summary["skipped_lines"] == 0
    assert summary["samples"] == len(samples) == total // 2048
    assert summary["dropped_tail_tokens"] == total % 2048
    assert summary["shards"] >= 3 and summary["this_run"]["tokens_per_second"] > 0


@pytest.mark.torch  # reads the shards back with streaming's reader
def test_llm_foundry_text_loader_reads_the_dataset(c4_dataset):
    script = f"""
import numpy as np
from llmfoundry.data.text_data import build_text_dataloader
from llmfoundry.utils.builders import build_tokenizer

from train.task import shm_registry

tok = build_tokenizer({str(TOKENIZER)!r}, {{}})
with shm_registry.registering():  # the node-wide lock the product's jobs take to register streaming's shared memory
    spec = build_text_dataloader(tok, 4, dict(local={str(c4_dataset)!r}, split='train', shuffle=False,
                                 max_seq_len=2048), drop_last=False, num_workers=1)
rows = [b['input_ids'].numpy() for b in spec.dataloader]
np.save({str(c4_dataset / 'loaded.npy')!r}, np.concatenate(rows))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = np.load(c4_dataset / "loaded.npy")
    assert np.array_equal(loaded, streaming_samples(c4_dataset / "train").astype(loaded.dtype))


def test_parts_dispatched_with_submitit_then_merged_equal_a_single_part(tmp_path):
    single, parallel = tmp_path / "single", tmp_path / "parallel"
    # The same files named by a glob here and by their folder below.
    prep("dataset=c4", f"input={C4}/c4-train.*.json.gz", f"out_root={single}", "num_parts=1", "progress=false")
    proc = prep("dataset=c4", f"input={C4}", f"out_root={parallel}", "num_parts=2", "progress=false",
                "-m", "part=0,1")
    jobs = list((parallel / ".data_prep_jobs" / "train").glob("*/part-*"))
    assert len(jobs) == 2, proc.stdout  # two submitit jobs ran, one per part
    assert tree(parallel / "train") == tree(single / "train")  # byte for byte, merged index included


def test_a_file_given_again_through_a_link_is_read_once_and_said_so(tmp_path):
    """The same file named twice was read once; through a link (a staging folder of links) it was read twice,
    doubling its documents without a word; so was a hard link (the same file under a second name)."""
    given = tmp_path / "given" / C4_FIRST.name
    given.parent.mkdir()
    shutil.copy(C4_FIRST, given)
    link, hard = tmp_path / "staged" / C4_FIRST.name, tmp_path / "staged" / "hard.json.gz"
    link.parent.mkdir()
    link.symlink_to(given)
    os.link(given, hard)
    proc = prep("dataset=c4", f"input=[{given},{link},{hard}]", f"out_root={tmp_path / 'out'}", "progress=false")
    assert f"input: {link} is {given} (a link to it): read once" in proc.stderr
    assert f"input: {hard} is {given} (a link to it): read once" in proc.stderr
    assert json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())["docs"] == 1000


def test_a_file_beside_its_compressed_copy_is_read_as_given_and_said(tmp_path):
    """a.jsonl and a.jsonl.gz (what `gzip -k` leaves) in one input folder: both are read, as given, every document
    twice; said, naming both (it was silent)."""
    folder = tmp_path / "in"
    folder.mkdir()
    with gzip.open(C4_FIRST, "rt") as f:
        text = "".join(line for _, line in zip(range(50), f))
    (folder / "a.jsonl").write_text(text)
    with gzip.open(folder / "a.jsonl.gz", "wt") as f:
        f.write(text)
    proc = prep("dataset=jsonl", f"input={folder}", f"out_root={tmp_path / 'out'}", "progress=false")
    assert f"input: {folder / 'a.jsonl'} and {folder / 'a.jsonl.gz'} are one file and its compressed copy" \
        in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())["docs"] == 100


def test_an_out_root_inside_the_input_folder_is_not_read_as_input(tmp_path):
    """dataset=jsonl of a folder with out_root inside it: the rerun read the tool's own files there as input (then
    refused its own dataset as another's, for good); they are left out, said, and the rerun finds it made."""
    folder = tmp_path / "in"
    folder.mkdir()
    with gzip.open(C4_FIRST, "rt") as f:
        (folder / "a.jsonl").write_text("".join(line for _, line in zip(range(200), f)))
    line = ("dataset=jsonl", f"input={folder}", f"out_root={folder / 'out'}", "progress=false")
    prep(*line)
    again = prep(*line)
    assert "file(s) under out_root" in again.stderr and "left out" in again.stderr, again.stderr
    assert json.loads((folder / "out" / "train" / SUMMARY).read_text())["docs"] == 200


def test_a_sweep_of_some_of_the_parts_says_so_and_does_not_end_as_if_the_dataset_were_made(tmp_path):
    """`-m part=0` of num_parts=2: legal (the other part may run in another sweep), warned at submission; at its
    end no dataset exists, which it said as "every part finished", exit 0. Then the same command without -m
    writes the missing part and merges, byte for byte as a single run."""
    single, some = tmp_path / "single", tmp_path / "some"
    prep("dataset=c4", f"input={C4}", f"out_root={single}", "num_parts=1", "progress=false")
    proc = prep("dataset=c4", f"input={C4}", f"out_root={some}", "num_parts=2", "progress=false", "-m", "part=0",
                check=False)
    assert "this sweep runs part 0 of num_parts=2" in proc.stderr and "part 1 not" in proc.stderr
    assert proc.returncode != 0 and "the dataset is not merged" in proc.stderr
    assert "every part finished" not in proc.stderr and not (some / "train" / "index.json").exists()
    prep("dataset=c4", f"input={C4}", f"out_root={some}", "num_parts=2", "progress=false")
    assert tree(some / "train") == tree(single / "train")


@pytest.mark.torch  # reads the shards back with streaming's reader
def test_byte_ranges_of_one_plain_file_lose_and_repeat_no_line(tmp_path):
    big = tmp_path / "in" / "docs.jsonl"
    big.parent.mkdir()
    with gzip.open(C4_FIRST, "rb") as a, gzip.open(C4_SECOND, "rb") as b:
        big.write_bytes(a.read() + b.read())
    prep("dataset=jsonl", f"input={big}", f"out_root={tmp_path / 'out'}", "block_bytes=300000", "num_parts=3",
         "workers=2", "progress=false")
    split = tmp_path / "out" / "train"
    blocks = sorted(split.glob("block-*"))
    assert len(blocks) == -(-big.stat().st_size // 300000)
    # Each block's samples then its leftover, block after block, are exactly the file's token stream.
    rebuilt = []
    for block in blocks:
        rows = streaming_samples(block) if json.loads((block / "index.json").read_text())["shards"] else []
        rebuilt += [np.ravel(rows), np.array(json.loads((block / "block.json").read_text())["tail"], np.int32)]
    docs = texts(C4_FIRST) + texts(C4_SECOND)
    assert np.array_equal(np.concatenate(rebuilt), reference_tokens(docs))
    assert json.loads((split / SUMMARY).read_text())["docs"] == 2000


def test_interrupted_run_resumes_to_identical_bytes(tmp_path):
    src = tmp_path / "docs.jsonl"
    with gzip.open(C4_FIRST, "rb") as a, gzip.open(C4_SECOND, "rb") as b:
        src.write_bytes(a.read() + b.read())
    args = ["dataset=jsonl", f"input={src}", "block_bytes=200000", "workers=1", "progress=false"]
    prep(*args, f"out_root={tmp_path / 'whole'}")

    out = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "data_prep", f"tokenizer={TOKENIZER}", *args, f"out_root={out}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list((out / "train").glob("block-00001")) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    split = out / "train"
    assert not (split / "index.json").exists(), "the run finished before it could be interrupted"
    assert (split / "block-00000" / "block.json").exists()

    rerun = prep(*args, f"out_root={out}")
    assert not list(split.glob(".tmp-*"))
    this_run = json.loads((split / SUMMARY).read_text())["this_run"]
    assert this_run["blocks_skipped"] >= 2 and this_run["blocks_done"] >= 1, rerun.stdout
    assert tree(split) == tree(tmp_path / "whole" / "train")


CORRUPT_LINES = [
    (b'{"text": "cut off', "invalid JSON"),
    (b'{"url": "https://example.com/no-text"}', "missing 'text' field"),
    (b'{"text": "caf\xe9 au lait"}', "invalid UTF-8"),
    (b'[{"text": "a list"}]', "not a JSON object"),
    (b'{"text": 17}', "'text' is not a string"),
]


def corrupt_file(folder: Path) -> tuple[Path, dict[int, str], list[str]]:
    """40 real C4 lines with one corrupt line of each kind after every eighth; (path, {line: reason}, good texts)."""
    with gzip.open(C4_FIRST, "rb") as fh:
        good = fh.read().splitlines()[:40]
    lines, bad = [], {}
    for i, line in enumerate(good):
        lines.append(line)
        if i % 8 == 3:
            text, reason = CORRUPT_LINES[len(bad)]
            lines.append(text)
            bad[len(lines)] = reason  # 1-based line number
    path = folder / "corrupt.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, bad, [json.loads(line)["text"] for line in good]


@pytest.mark.torch  # reads the shards back with streaming's reader
def test_corrupt_lines_are_skipped_counted_and_reported_with_file_and_line(tmp_path):
    src, bad, good = corrupt_file(tmp_path)
    proc = prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "concat_tokens=256",
                "progress=false")
    for line, reason in bad.items():
        assert f"skipped {src}:{line}: {reason}" in proc.stderr, proc.stderr
    summary = json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())
    assert summary["docs"] == 40 and summary["skipped_lines"] == len(bad)
    assert sorted(summary["skipped_by_reason"]) == sorted(r for r in bad.values())
    assert [[p, n] for p, n, _ in summary["skipped_examples"]] == [[str(src), n] for n in bad]
    samples = streaming_samples(tmp_path / "out" / "train")
    assert np.array_equal(samples.ravel(), reference_tokens(good)[: samples.size])


def test_strict_mode_stops_at_the_first_corrupt_line(tmp_path):
    src, bad, _ = corrupt_file(tmp_path)
    proc = prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "strict=true", check=False)
    first_line, first_reason = next(iter(bad.items()))
    assert proc.returncode != 0
    assert f"{src}:{first_line}: {first_reason}" in proc.stderr and "strict=false" in proc.stderr
    assert "Traceback" not in proc.stderr
    split = tmp_path / "out" / "train"
    assert not (split / "index.json").exists() and not list(split.glob("block-*")) and not list(split.glob(".tmp-*"))
    # made with strict=false (lines skipped, counted), then the same run with strict=true: refused, not merged
    # again (it exited 0 printing "skipped lines 5")
    prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "progress=false")
    again = prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "strict=true", check=False)
    assert again.returncode == 2 and f"skipped {len(bad)} line(s) (the first: {src}:{first_line}: {first_reason}" \
        in again.stderr, again.stderr
    # blocks of one part of two made with strict=false, the rest with strict=true: refused before tokenizing the
    # rest (it was refused at the merge, after tokenizing every other block)
    out = tmp_path / "parts"
    prep("dataset=jsonl", f"input={src}", f"out_root={out}", "block_bytes=20000", "num_parts=2", "part=0",
         "progress=false")
    made = sorted(p.name for p in (out / "train").glob("block-*"))
    again = prep("dataset=jsonl", f"input={src}", f"out_root={out}", "block_bytes=20000", "strict=true",
                 "progress=false", check=False)
    assert again.returncode == 2 and f"(the first: {src}:{first_line}: {first_reason}" in again.stderr, again.stderr
    assert sorted(p.name for p in (out / "train").glob("block-*")) == made and len(made) >= 1


def c4_lines(folder: Path, change) -> Path:
    """C4's first 1000 documents as plain JSON lines, line n (1-based) replaced by change(n, line) (None: kept)."""
    with gzip.open(C4_FIRST, "rb") as fh:
        lines = fh.read().splitlines()
    path = folder / "c4.jsonl"
    path.write_bytes(b"".join((change(n, line) or line) + b"\n" for n, line in enumerate(lines, 1)))
    return path


def with_surrogate(n: int, line: bytes) -> bytes | None:
    # U+D800 encoded as UTF-8 would encode it (ED A0 80): no UTF-8 decoder accepts it, Python's json.loads(bytes)
    # does (it decodes with surrogatepass), and the tokenizer then fails on the lone surrogate
    return line.replace(b'{"text":"', b'{"text":"\xed\xa0\x80', 1) if n == 500 else None


@pytest.mark.parametrize("encoder", ["fast", "tokenizers"])
def test_utf8_encoded_surrogates_are_invalid_utf8_skipped_and_reported(tmp_path, encoder):
    src = c4_lines(tmp_path, with_surrogate)
    env = {"DATA_PREP_ENCODER": "tokenizers"} if encoder == "tokenizers" else None
    proc = prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "progress=false", env=env)
    assert f"data_prep: skipped {src}:500: invalid UTF-8" in proc.stderr and "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())
    assert summary["docs"] == 999 and summary["skipped_by_reason"] == {"invalid UTF-8": 1}


def test_utf8_encoded_surrogates_stop_a_strict_run(tmp_path):
    src = c4_lines(tmp_path, with_surrogate)
    proc = prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "strict=true", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"data_prep: strict: {src}:500: invalid UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_the_summary_lists_the_first_1000_skipped_lines_of_the_dataset_in_input_order(tmp_path):
    # 750 broken lines in one block, then 300 in a second file: the first 1000 of the input are listed
    src = c4_lines(tmp_path, lambda n, line: line[:-40] if n % 4 else None)  # cut off: invalid JSON
    more = tmp_path / "more.jsonl"
    more.write_bytes(b'{"text": "cut\n' * 300)
    proc = prep("dataset=jsonl", f"input=[{src},{more}]", f"out_root={tmp_path / 'out'}", "progress=false",
                "block_bytes=100000000")
    summary = json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())
    assert summary["skipped_lines"] == 750 + 300 and summary["docs"] == 250
    expected = [[str(src), n] for n in range(1, 1001) if n % 4] + [[str(more), n] for n in range(1, 251)]
    assert [[p, n] for p, n, _ in summary["skipped_examples"]] == expected
    assert "... 1030 more skipped lines (listed in data_prep_summary.json, first 1000)" in proc.stderr


def test_an_empty_plain_input_file_is_warned_about(tmp_path):
    empty = tmp_path / "copied.jsonl"
    empty.touch()
    src = c4_lines(tmp_path, lambda n, line: None)
    proc = prep("dataset=jsonl", f"input=[{src},{empty}]", f"out_root={tmp_path / 'out'}", "progress=false")
    assert f"data_prep: warning: input: {empty} is empty (0 bytes)" in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "out" / "train" / SUMMARY).read_text())["docs"] == 1000


@pytest.mark.torch  # reads the shards back with streaming's reader
def test_slimpajama_zst_is_read_in_one_pass(tmp_path):
    import zstandard

    [src] = SLIMPAJAMA.glob("*.jsonl.zst")
    before = sorted(p.name for p in SLIMPAJAMA.iterdir())
    proc = prep("dataset=slimpajama", f"input={SLIMPAJAMA}", f"out_root={tmp_path}", "compression=zstd",
                "progress=false")
    assert sorted(p.name for p in SLIMPAJAMA.iterdir()) == before  # nothing extracted beside the input
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]  # nor anywhere in the output
    with open(src, "rb") as fh:
        raw = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    docs = [json.loads(line)["text"] for line in raw.splitlines()]
    assert len(docs) == 362
    # The sample holds one real blank document ("\n"): encoded as llm-foundry's converter encodes it (dropping it
    # shifted every later sample), not skipped
    assert len([d for d in docs if not d.strip()]) == 1 and "skipped" not in proc.stderr
    shards = list((tmp_path / "train").rglob("shard.*"))
    assert shards and all(p.name.endswith(".mds.zstd") for p in shards)  # before streaming unpacks them
    samples = streaming_samples(tmp_path / "train")
    assert np.array_equal(samples, expected_samples([reference_tokens(docs)]))


def test_a_part_that_finds_another_part_writing_the_plan_goes_on(tmp_path):
    """Parts of a Slurm array start together: one part found the plan's temporary file that another was writing
    that instant (a file not yet renamed to data_prep_plan.json) and refused the folder as holding "files that
    data_prep did not write" (seen in a full run: a part FAILED, the array incomplete). Another file still is."""
    need_shared()
    split = tmp_path / "out" / "train"
    split.mkdir(parents=True)
    (split / ".data_prep_plan.json.tmp-othernode-4242").write_text("{")
    args = ["dataset=c4", f"input={C4_FIRST}", f"out_root={tmp_path / 'out'}", "progress=false"]
    prep(*args)
    assert (split / "index.json").is_file()
    other = tmp_path / "other" / "train"
    other.mkdir(parents=True)
    (other / "notes.txt").write_text("mine")
    proc = prep("dataset=c4", f"input={C4_FIRST}", f"out_root={tmp_path / 'other'}", check=False)
    assert proc.returncode == 2 and "data_prep did not write" in proc.stderr


def test_a_plan_that_is_not_a_json_object_protects_nothing_and_is_replaced(tmp_path):
    """A split holding only a data_prep_plan.json that is JSON but no object (no block, no index): like an emptied
    one it protects nothing, and the run writes its own plan (it ended in AttributeError's traceback)."""
    split = tmp_path / "out" / "train"
    split.mkdir(parents=True)
    (split / "data_prep_plan.json").write_text("[1]")
    proc = prep("dataset=c4", f"input={C4_FIRST}", f"out_root={tmp_path / 'out'}", "progress=false", check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((split / "data_prep_plan.json").read_text())["blocks"] and (split / "index.json").is_file()


def _snapshot(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*"))


@pytest.mark.parametrize("case", ["missing input", "c4 hub while offline", "unknown dataset", "unwritable out_root",
                                  "out_root under a link to nothing", "missing tokenizer path",
                                  pytest.param("foreign dataset", marks=pytest.mark.torch),  # streaming's writer
                                  "other settings", "missing tokenizer", "model vocab too small", "sweep",
                                  "swept input", "input added", "plan emptied", "plan deleted", "a corpus's root",
                                  "two of Hydra's commands"])
def test_bad_input_gives_one_clear_message_and_writes_nothing(tmp_path, case):
    out = tmp_path / "out"
    args = ["dataset=c4", f"input={C4_FIRST}", f"out_root={out}"]
    expect, env = "out_root", {}
    if case == "c4 hub while offline":
        args.pop(1)
        expect, env = "HF_HUB_OFFLINE", {"HF_HUB_OFFLINE": "1"}
    elif case == "missing input":
        args[1], expect = f"input={tmp_path / 'nope' / 'c4-train.json.gz'}", "input"
    elif case == "unknown dataset":
        args[0], expect = "dataset=c5", "Could not find 'dataset/c5'"
    elif case == "unwritable out_root":
        (tmp_path / "a-file").write_text("x")
        args[2] = f"out_root={tmp_path / 'a-file' / 'out'}"
    elif case == "out_root under a link to nothing":  # was "data_prep: ...: File exists" (exit 1) at the lock
        (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
        args[2], expect = f"out_root={tmp_path / 'gone' / 'out'}", "is a link to nothing"
    elif case == "foreign dataset":
        from streaming import MDSWriter

        with MDSWriter(columns={"tokens": "ndarray:int32"}, out=str(out / "train")) as writer:
            writer.write({"tokens": np.arange(2048, dtype=np.int32)})
        expect = "data_prep did not write"
    elif case == "other settings":
        prep(*args, "concat_tokens=512", "progress=false")
        expect = "concat_tokens: 512 then, 2048 now"
    elif case == "missing tokenizer":
        args.append(f"tokenizer={tmp_path / 'no-tokenizer'}")
        expect = "tokenizer"
    elif case == "missing tokenizer path":  # no hub name has two slashes: it was asked of the hub
        args.append("tokenizer=no/such/tokenizer")
        expect = "tokenizer: no/such/tokenizer does not exist (or is not a tokenizer.json / folder)"
    elif case == "model vocab too small":
        args.append("model_vocab_size=50000")
        expect = "model_vocab_size"
    elif case == "sweep":  # validated once before any job is launched
        args[1], expect = f"input={tmp_path / 'nope.json.gz'}", "input"
        args += ["-m", "part=0,1", "num_parts=2"]
    elif case == "input added":  # the file named (it said only "the input files ... changed")
        prep(*args, "progress=false")
        args[1], expect = f"input=[{C4_FIRST},{C4_SECOND}]", f"the input files changed: {C4_SECOND} added"
    elif case in ("plan emptied", "plan deleted"):  # it said "made with different settings: dataset: None then"
        prep(*args, "progress=false")  # and "files that data_prep did not write"
        plan = out / "train" / "data_prep_plan.json"
        plan.write_bytes(b"") if case == "plan emptied" else plan.unlink()
        expect = "cannot be read (emptied or cut short)" if case == "plan emptied" else "data_prep_plan.json is gone"
    elif case == "a corpus's root":  # SlimPajama-627B/: was every split's documents in split=train, exit 0
        corpus = tmp_path / "SlimPajama-627B"
        for split in ("train", "validation", "test"):
            (corpus / split / "chunk1").mkdir(parents=True)
            (corpus / split / "chunk1" / "part.jsonl.zst").write_bytes(next(SLIMPAJAMA.glob("*.jsonl.zst")).read_bytes())
        args[:2] = ["dataset=slimpajama", f"input={corpus}"]
        expect = (f"input: folder {corpus} holds the splits test, train, validation: read whole, every one of them "
                  f"would be in split=train\n  fix: point input= at one split's folder, e.g. input={corpus / 'train'}")
    elif case == "two of Hydra's commands":  # was Hydra's ValueError, a traceback
        args += ["-m", "--cfg", "job"]
        expect = "data_prep: -m --cfg: Hydra does one of -m, --run, --cfg, --info and --shell-completion at a time"
    elif case == "swept input":  # was "input: is required" (the common check saw no input at all)
        args[1], expect = f"input={C4_FIRST},{C4_SECOND}", "input: is swept (-m input=A,B)"
        args += ["-m"]
    before = _snapshot(tmp_path)
    # an empty tokenizer cache of its own (in tmp_path): a refused run builds no encoder tables into it either
    proc = prep(*args, check=False, env={**env, "DATA_PREP_CACHE": str(tmp_path / "cache")})
    assert proc.returncode != 0
    assert expect in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert _snapshot(tmp_path) == before


def test_an_input_under_a_folder_named_for_another_split_is_said(tmp_path, caplog):
    """A corpus's train/ folder made into split=val went through without a word (an evaluation on training data
    later, reported as held out); a held-out folder made into split=train the same. Said, naming both."""
    from data_prep.inputs import resolve_sources
    from data_prep.settings import settings_from
    from train.config.compose import compose

    folder = tmp_path / "SlimPajama-627B" / "train" / "chunk1"
    folder.mkdir(parents=True)
    shutil.copy(next(SLIMPAJAMA.glob("*.jsonl.zst")), folder / "part.jsonl.zst")

    def said(split, item):
        caplog.clear()
        resolve_sources(settings_from(compose(["dataset=slimpajama", f"input={item}", f"split={split}",
                                               f"out_root={tmp_path / 'out'}", "tokenizer=t"], config_name="data_prep")))
        return [r.getMessage() for r in caplog.records if "is under a folder named" in r.getMessage()]

    assert said("val", folder.parent) == [f"data_prep: warning: input: {folder.parent} is under a folder named train/, "
                                          "made here into split=val: a train split's documents in a held-out split "
                                          "(check input= and split=)"]
    assert said("validation", folder / "part.jsonl.zst") and said("test", f"{folder}/*.zst")
    assert not said("train", folder) and not said("val_small", folder)  # a split of its own naming: not told


@pytest.mark.parametrize("codec, cut", [("gzip", 300_000), ("zstd", 700_000), ("gzip", 0), ("zstd", 0)])
def test_a_truncated_compressed_file_stops_with_its_name_not_a_traceback(tmp_path, codec, cut):
    """A download cut short, or one that failed and left 0 bytes (no compressor writes that). A cut .zst was read
    to its last whole block without a word (zstandard's stream reader ends quietly in a cut frame): SlimPajama's
    sample cut at 700,000 bytes gave 266 of its 362 documents, exit 0; a 0-byte file was an empty input."""
    if codec == "gzip":
        broken, whole = tmp_path / "in" / "c4-train.cut.json.gz", C4_SECOND
    else:
        broken, whole = tmp_path / "in" / "part.cut.jsonl.zst", next(SLIMPAJAMA.glob("*.jsonl.zst"))
    broken.parent.mkdir()
    broken.write_bytes(whole.read_bytes()[:cut])
    proc = prep("dataset=jsonl", f"input={broken}", f"out_root={tmp_path / 'out'}", "progress=false",
                check=False)
    assert proc.returncode != 0
    assert f"{broken}: cannot be read to the end" in proc.stderr and "Traceback" not in proc.stderr
    assert ("0 bytes" if not cut else "cut short" if codec == "zstd" else "EOFError") in proc.stderr
    assert not (tmp_path / "out" / "train" / "index.json").exists()
    assert not list((tmp_path / "out" / "train").glob("block-*"))


def test_a_failing_sweep_job_reports_its_message_not_a_traceback(tmp_path):
    src, bad, _ = corrupt_file(tmp_path)
    first_line, first_reason = next(iter(bad.items()))
    proc = prep("dataset=jsonl", f"input={src}", f"out_root={tmp_path / 'out'}", "strict=true", "num_parts=2",
                "block_bytes=20000", "progress=false", "-m", "part=0,1",
                check=False)
    assert proc.returncode == 2
    # the part's own message, in the launcher's summary of the failed part
    assert f"rank 0: data_prep.errors.DataPrepError: data_prep: strict: {src}:{first_line}: {first_reason}" \
        in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "train" / "index.json").exists()


def test_a_local_tokenizer_run_imports_no_torch_transformers_or_llmfoundry(tmp_path):
    cmd = [sys.executable, "-X", "importtime", "-m", "data_prep", "dataset=c4", f"input={C4_FIRST}",
           f"out_root={tmp_path}", f"tokenizer={TOKENIZER}", "progress=false"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "tokenizers" in imported and "numpy" in imported
    assert not imported & {"torch", "transformers", "llmfoundry", "streaming", "datasets"}


@pytest.mark.parametrize("override, fix", [
    ("+max_seq_len=4096", "concat_tokens=<value> (data_prep's name for max_seq_len)"),
    ("+concat_tokns=4096", "concat_tokens=<value>"),
    ("+dataset.text_field=content", "dataset.text_key=<value>"),
])
def test_a_key_data_prep_does_not_read_is_refused_not_ignored(override, fix, tmp_path):
    """Hydra's own advice for an unknown key is to add it with +: data_prep then ignored it and made samples of
    concat_tokens' default length, exit 0."""
    from data_prep.errors import DataPrepError
    from data_prep.settings import settings_from
    from train.config.compose import compose

    cfg = compose(["dataset=c4", f"out_root={tmp_path}", "tokenizer=t", override], config_name="data_prep")
    with pytest.raises(DataPrepError) as caught:
        settings_from(cfg)
    assert caught.value.problems[0].key == override.split("=")[0].lstrip("+") and caught.value.problems[0].fix == fix
    assert settings_from(compose(["dataset=c4", f"out_root={tmp_path}", "tokenizer=t"], config_name="data_prep"))


@pytest.mark.parametrize("override, said", [
    ("concat_tokens=1000000000000", "1000000000000 tokens a sample do not fit an MDS shard"),  # was a traceback
    ("concat_tokens=0", "must be an integer >= 1, got 0"),
    ("concat_tokens=-5", "must be an integer >= 1, got -5"),
    ("concat_tokens=1.5", "must be an integer >= 1, got 1.5"),
    ("concat_tokens=abc", "must be an integer >= 1, got 'abc'"),
    ("progress=maybe", "must be true or false, got 'maybe'"),  # was on, as any word
    ("progress=no", "must be true or false, got 'no'"),
    ("strict=2", "must be true or false, got 2"),
])
def test_a_length_it_cannot_write_or_a_word_for_a_flag_is_refused_by_key(override, said, tmp_path):
    from data_prep.errors import DataPrepError
    from data_prep.settings import settings_from
    from train.config.compose import compose

    cfg = compose(["dataset=c4", f"out_root={tmp_path}", "tokenizer=t", override], config_name="data_prep")
    with pytest.raises(DataPrepError) as caught:
        settings_from(cfg)
    [problem] = caught.value.problems
    assert problem.key == override.split("=")[0] and said in problem.problem and problem.fix, problem


@pytest.mark.torch  # streaming's compression registry imports torch
@pytest.mark.parametrize("given, spelt", [("zstd", "zstd"), ("zstd:3", "zstd:3"), ("zstd:03", "zstd:3"),
                                          ("null", None)])
def test_a_compression_level_is_spelt_as_streaming_reads_it(given, spelt, tmp_path):
    """Each shard's index entry names its compression, and streaming reads zstd:1 to zstd:22: `zstd:03` was written
    as given, exit 0, and no loader could read the dataset."""
    from streaming.base.compression import is_compression

    from data_prep.settings import settings_from
    from train.config.compose import compose

    cfg = compose(["dataset=c4", f"out_root={tmp_path}", "tokenizer=t", f"compression={given}"],
                  config_name="data_prep")
    assert settings_from(cfg).compression == spelt and (spelt is None or is_compression(spelt))


def test_a_sample_longer_than_a_shard_holds_is_refused_before_anything_is_written(tmp_path):
    """concat_tokens=10**12: numpy's OverflowError as the first shard was written (exit 1, a traceback)."""
    proc = prep("dataset=c4", f"input={C4_FIRST}", f"out_root={tmp_path / 'out'}", "concat_tokens=1000000000000",
                check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "data_prep: concat_tokens: 1000000000000 tokens a sample do not fit an MDS shard" in proc.stderr
    assert "\n  fix: " in proc.stderr and list(tmp_path.iterdir()) == []


def test_every_problem_of_a_data_prep_command_is_reported_in_one_pass_and_nothing_is_written(tmp_path):
    """data_prep stopped at the first bad setting: a user fixing `split=a/b` then learned of `workers=-1`, then of
    the tokenizer, one run at a time. Now each is named at once, the input and tokenizer checked side by side."""
    cmd = [sys.executable, "-m", "data_prep", "dataset=c4", f"input={tmp_path}/missing.json", f"out_root={tmp_path}/out",
           f"tokenizer={tmp_path}/no-tokenizer", "split=a/b", "workers=-1", "strict=maybe", "+max_seq_len=4096"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    named = [line.split(":")[1].strip() for line in proc.stderr.splitlines() if line.startswith("data_prep: ")]
    assert named == ["max_seq_len", "split", "workers", "strict"], proc.stderr  # the settings: nothing read yet
    fixed = [c for c in cmd if c.split("=")[0] not in ("split", "workers", "strict", "+max_seq_len")] + ["size_limit=10"]
    proc = subprocess.run(fixed, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    named = [line.split(":")[1].strip() for line in proc.stderr.splitlines() if line.startswith("data_prep: ")]
    assert proc.returncode == 2 and named == ["size_limit", "input", "tokenizer"], proc.stderr
    assert list(tmp_path.iterdir()) == []
