"""data_prep.facts: what training checks about a dataset folder, read from real data_prep output, from
llm-foundry's own converter and streaming's writer, and from the real GPT-NeoX-20B tokenizer."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import C4_FIRST, ROOT, SUMMARY, TOKENIZER, prep

from data_prep.facts import check_index, dataset_facts, first_sample_tokens, tokenizer_fingerprint, vocab_fingerprint

pytestmark = pytest.mark.e2e  # the tier (pyproject.toml markers)

NEOX = str(TOKENIZER)


@pytest.fixture(autouse=True)
def need_shared():
    if not (TOKENIZER / "tokenizer.json").is_file() or not C4_FIRST.is_file():
        pytest.skip("../shared/data is missing; these tests read its real C4 excerpt and tokenizer")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """data_prep's output for the C4 excerpt: out_root/train (concat 2048, 2 shards), out_root/small (512, zstd)."""
    out = tmp_path_factory.mktemp("facts")
    prep("dataset=c4", f"input={C4_FIRST}", f"out_root={out}", "size_limit=1000000", "progress=false")
    prep("dataset=c4", f"input={C4_FIRST}", f"out_root={out}", "split=small", "concat_tokens=512",
         "compression=zstd", "progress=false")
    return out


def copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to, ignore=shutil.ignore_patterns(".data_prep_lock"))
    return to


# ---- recorded by data_prep ------------------------------------------------------------------------------


def test_data_prep_records_the_facts_and_dataset_facts_reads_them(made):
    summary = json.loads((made / "train" / SUMMARY).read_text())
    facts = dataset_facts(made / "train")
    assert facts == {"sample_tokens": 2048, "tokenizer": NEOX, "tokenizer_fingerprint": tokenizer_fingerprint(NEOX),
                     "tokenizer_vocab_size": 50277, "samples": summary["samples"], "source": SUMMARY}
    assert summary["sample_tokens"] == 2048 and summary["tokenizer_fingerprint"] == facts["tokenizer_fingerprint"]
    small = dataset_facts(made / "small")
    assert small["sample_tokens"] == 512 and small["tokenizer_fingerprint"] == facts["tokenizer_fingerprint"]
    assert small["samples"] == json.loads((made / "small" / SUMMARY).read_text())["samples"] > 0


def test_without_the_summary_the_plan_then_the_first_sample_tell_the_sample_length(made, tmp_path):
    split = copy(made / "train", tmp_path / "train")
    (split / SUMMARY).unlink()  # a dataset made before the summary recorded facts
    assert dataset_facts(split) | {"samples": None} == {
        "sample_tokens": 2048, "tokenizer": None, "tokenizer_fingerprint": None, "tokenizer_vocab_size": None,
        "samples": None, "source": "data_prep_plan.json"}
    (split / "data_prep_plan.json").unlink()
    facts = dataset_facts(split)
    assert facts["sample_tokens"] == 2048 and facts["source"] == "first sample" and facts["tokenizer"] is None
    small = copy(made / "small", tmp_path / "small")
    for name in (SUMMARY, "data_prep_plan.json"):
        (small / name).unlink()
    # Compressed shards: the first sample cannot be read without zstd, so nothing is claimed.
    assert dataset_facts(small)["sample_tokens"] is None and dataset_facts(small)["source"] is None


def test_llm_foundry_converter_output_is_read_from_its_first_sample(tmp_path):
    out = tmp_path / "foundry"
    script = (f"from llmfoundry.command_utils.data_prep.convert_dataset_json import convert_dataset_json_from_args\n"
              f"convert_dataset_json_from_args(path={str(C4_FIRST)!r}, out_root={str(out)!r}, compression=None, "
              f"concat_tokens=1024, split='train', tokenizer={NEOX!r}, bos_text='', eos_text='<|endoftext|>')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    index = json.loads((out / "index.json").read_text())
    assert index["shards"][0]["column_encodings"] == ["ndarray:int32"]
    facts = dataset_facts(out)
    assert facts["sample_tokens"] == 1024 and facts["source"] == "first sample"
    assert facts["samples"] == sum(s["samples"] for s in index["shards"]) > 400
    assert facts["tokenizer"] is None and facts["tokenizer_fingerprint"] is None
    assert check_index(out) == []


@pytest.mark.torch  # streaming's writer
@pytest.mark.parametrize("columns, value", [
    ({"tokens": "ndarray:int32"}, lambda ids: ids.astype(np.int32)),
    ({"tokens": "ndarray"}, lambda ids: ids.astype(np.int64)),  # dtype stored in each sample
    ({"tokens": "ndarray:int32:300"}, lambda ids: ids.astype(np.int32)),  # shape fixed in the column
    ({"tokens": "bytes"}, lambda ids: ids.astype(np.int64).tobytes()),  # llm-foundry's legacy int64 bytes
    ({"id": "int", "tokens": "ndarray:uint16", "url": "str"}, lambda ids: ids.astype(np.uint16)),  # other columns
])
def test_the_first_sample_of_streaming_mds_writer_output(tmp_path, columns, value):
    from streaming import MDSWriter
    from tokenizers import Tokenizer

    with open(C4_FIRST, "rb") as fh:
        import gzip

        texts = [json.loads(line)["text"] for line in gzip.decompress(fh.read()).splitlines()[:20]]
    ids = np.array([i for e in Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).encode_batch(texts)
                    for i in e.ids])
    with MDSWriter(columns=columns, out=str(tmp_path)) as writer:
        for n in range(len(ids) // 300):
            writer.write({"tokens": value(ids[n * 300:(n + 1) * 300]), "id": n, "url": "https://example.com"})
    assert first_sample_tokens(tmp_path) == 300
    assert dataset_facts(tmp_path)["sample_tokens"] == 300 and check_index(tmp_path) == []


@pytest.mark.torch  # streaming's writer
def test_a_folder_without_tokens_says_nothing(tmp_path):
    from streaming import MDSWriter

    with MDSWriter(columns={"text": "str"}, out=str(tmp_path)) as writer:
        writer.write({"text": "a document"})
    assert dataset_facts(tmp_path) == {"sample_tokens": None, "tokenizer": None, "tokenizer_fingerprint": None,
                                       "tokenizer_vocab_size": None, "samples": 1, "source": None}
    assert dataset_facts(tmp_path / "nothing-here")["samples"] is None


# ---- index.json against the shard files -----------------------------------------------------------------


def test_check_index_finds_deleted_and_truncated_shards(made, tmp_path):
    assert check_index(made / "train") == [] and check_index(made / "small") == []
    split = copy(made / "train", tmp_path / "train")
    shards = sorted(split.rglob("shard.*.mds"))
    assert len(shards) >= 2
    shards[0].unlink()
    size = shards[1].stat().st_size
    with open(shards[1], "r+b") as fh:
        fh.truncate(size - 100)
    problems = check_index(split)
    assert problems == [f"{shards[0]} is listed in index.json but missing",
                        f"{shards[1]} has {size - 100:,} bytes but index.json records {size} (cut short or replaced)"]


def test_check_index_on_compressed_shards_accepts_the_decompressed_copy(made, tmp_path):
    small = copy(made / "small", tmp_path / "small")
    [zst, *_] = sorted(small.rglob("shard.*.mds.zstd"))
    import zstd

    raw = zst.with_suffix("")  # what streaming leaves in a local cache: the shard decompressed, the .zstd gone
    raw.write_bytes(zstd.decompress(zst.read_bytes()))
    zst.unlink()
    assert check_index(small) == []
    raw.unlink()
    assert check_index(small) == [f"{zst} is listed in index.json but missing"]


def test_check_index_without_or_with_a_broken_index(made, tmp_path):
    split = copy(made / "train", tmp_path / "train")
    index = split / "index.json"
    text = index.read_text()
    index.write_text(text[: len(text) // 2])
    assert check_index(split) == [f"{index} cannot be read as JSON (cut short or overwritten?)"]
    index.unlink()
    assert check_index(split) == [f"{index} does not exist: {split} is not a finished MDS dataset"]


# ---- tokenizer fingerprint ------------------------------------------------------------------------------


def test_the_same_vocabulary_matches_wherever_and_however_it_is_saved(tmp_path):
    from tokenizers import Tokenizer

    fingerprint = tokenizer_fingerprint(NEOX)
    assert fingerprint and len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    copied = shutil.copytree(TOKENIZER, tmp_path / "copy")
    assert tokenizer_fingerprint(str(copied)) == fingerprint
    assert tokenizer_fingerprint(str(copied / "tokenizer.json")) == fingerprint
    # Saved again by the tokenizers library (another layout and key order): data_prep's hub path uses this.
    resaved = tmp_path / "resaved"
    resaved.mkdir()
    Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).save(str(resaved / "tokenizer.json"), pretty=False)
    assert (resaved / "tokenizer.json").read_bytes() != (TOKENIZER / "tokenizer.json").read_bytes()
    assert tokenizer_fingerprint(str(resaved)) == fingerprint
    assert vocab_fingerprint(json.loads(Tokenizer.from_file(str(resaved / "tokenizer.json")).to_str())) == fingerprint


@pytest.mark.parametrize("change", ["two ids swapped", "a token added", "an added token renamed"])
def test_another_vocabulary_differs(tmp_path, change):
    definition = json.loads((TOKENIZER / "tokenizer.json").read_text())
    vocab = definition["model"]["vocab"]
    if change == "two ids swapped":
        vocab["the"], vocab["The"] = vocab["The"], vocab["the"]
    elif change == "a token added":
        definition["added_tokens"].append({**definition["added_tokens"][-1], "id": 50277, "content": "<|im_end|>"})
    else:
        definition["added_tokens"][1]["content"] = "<|pad|>"
    (tmp_path / "tokenizer.json").write_text(json.dumps(definition))
    assert tokenizer_fingerprint(str(tmp_path)) != tokenizer_fingerprint(NEOX)


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_hub_name_is_found_in_the_local_hugging_face_cache(tmp_path, monkeypatch, variable):
    hub = tmp_path / "hub"
    repo = hub / "models--EleutherAI--gpt-neox-20b"
    for commit in ("0123abc", "4567def"):  # refs/main names the second
        (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("4567def")
    shutil.copy(TOKENIZER / "tokenizer.json", repo / "snapshots" / "4567def" / "tokenizer.json")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(hub if variable == "HF_HUB_CACHE" else tmp_path))
    assert tokenizer_fingerprint("EleutherAI/gpt-neox-20b") == tokenizer_fingerprint(NEOX)
    assert tokenizer_fingerprint("EleutherAI/pythia-70m") is None  # not downloaded here
    assert tokenizer_fingerprint(str(tmp_path / "no-such-folder")) is None


def test_facts_imports_nothing_beyond_the_standard_library():
    code = ("import sys; before = set(sys.modules); import data_prep.facts; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert loaded - set(sys.stdlib_module_names) == {"data_prep"}, loaded


def test_the_status_calls_a_dataset_merged_only_while_its_index_is_there(tmp_path):
    """`python -m data_prep.status`'s heading: merged (its size) needs the merged index.json too, which streaming
    reads (it said "merged, 1,917 samples" with the index deleted)."""
    from data_prep.facts import PLAN_FILE, SUMMARY_FILE
    from data_prep.sweep_app import DataPrepApp

    (tmp_path / PLAN_FILE).write_text(json.dumps({"blocks": []}))
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"samples": 1917, "tokens": 981504, "docs": 1000}))
    manifest = {"points": [{"split_dir": str(tmp_path)}]}
    assert "not merged yet" in DataPrepApp().heading(manifest)
    (tmp_path / "index.json").write_text("{}")
    assert "merged, 1,917 samples" in DataPrepApp().heading(manifest)


def test_a_waited_sweep_ends_on_the_merged_dataset_or_says_it_is_not_merged(made, tmp_path, capsys):
    """The status's heading and a waited-for sweep's end decide "merged" alike (data_prep/app.py: merged_summary):
    every block complete but no summary (a merge that did not end) is no dataset, said, exit non-zero (it read the
    missing summary and failed with FileNotFoundError); with the summary but no index, none either; whole, the
    dataset's summary as a plain run prints it."""
    from data_prep.sweep_app import DataPrepApp

    split = copy(made / "train", tmp_path / "train")
    summary = (split / SUMMARY).read_bytes()
    results, rows, manifest = [{"dataset": str(split)}], [{"state": "COMPLETED"}], {"points": [{"split_dir": str(split)}]}
    assert DataPrepApp().finish(results, rows) is False and "merged" in DataPrepApp().heading(manifest)
    assert f"{json.loads(summary)['samples']:,}" in capsys.readouterr().out
    (split / SUMMARY).unlink()
    assert DataPrepApp().finish(results, rows) is True and "not merged yet" in DataPrepApp().heading(manifest)
    assert "every block is written, but the merge did not end" in capsys.readouterr().err
    (split / SUMMARY).write_bytes(summary)
    (split / "index.json").unlink()  # what streaming reads: no dataset without it
    assert DataPrepApp().finish(results, rows) is True and "not merged yet" in DataPrepApp().heading(manifest)
    # two datasets (`-m split=train,val`): each said; one merged and one not is not exit 0 (it read the first only)
    (split / "index.json").write_text((made / "train" / "index.json").read_text())
    other = copy(made / "train", tmp_path / "val")
    (other / SUMMARY).unlink()
    results, rows = [{"dataset": str(split)}, {"dataset": str(other)}], rows * 2
    manifest = {"points": [{"split_dir": str(split)}, {"split_dir": str(other)}]}
    assert DataPrepApp().finish(results, rows) is True
    said = capsys.readouterr()
    assert f"{json.loads(summary)['samples']:,}" in said.out and f"the dataset {other} is not merged" in said.err
    assert DataPrepApp().heading(manifest).splitlines() == [
        DataPrepApp().heading({"points": [{"split_dir": str(split)}]}),
        f"dataset {other}: every block complete, not merged yet (the last part to finish merges)"]


@pytest.mark.parametrize("name", ["gpt2", "EleutherAI/gpt-neox-20b", "a.b-c_d/e.f", "/abs/tok", "/tok", "./tok",
                                  "../tok", "~/tok", ".tok", "no/such/tokenizer", "my tok", "a--b", "a..b", "x.git",
                                  "-x", "x/", "/"])
def test_a_hub_name_is_what_huggingface_hub_takes_for_a_repository_id(name):
    """The one reading of "a Hugging Face hub name" (facts.hub_name and its reason, not_a_hub_name: the tokenizer
    rule, data_prep's tokenizer and the hub cache lookup), as huggingface_hub's own validate_repo_id reads one."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from data_prep import facts

    try:
        validate_repo_id(name)
        theirs = True
    except HFValidationError:
        theirs = False
    assert facts.hub_name(name) is theirs
    assert (facts.not_a_hub_name(name) is None) is theirs
