"""Checks of the data a run would read and the tokenizer it would use, before anything starts: vocabulary sizes
from real tokenizer folders and the hub cache, real MDS made by data_prep (the `c4_mds` fixture), and data that
cannot train (sample length, missing or short shards, another tokenizer, raw JSON given as MDS).
"""
import json

import pytest
from helpers import TOKENIZER, need_shared, problems_in, run

from train.checks import ERROR, WARNING, Context, Problem, check
from train.config.compose import compose


def test_tokenizer_size_from_a_real_tokenizer_folder():
    need_shared()
    found = check(compose(["data=mds", f"tokenizer.name={TOKENIZER}", "model.vocab_size=50000",
                           "variables.data_local=/nonexistent"]), Context())
    assert any(p.key == "model.vocab_size" and "50277 ids" in p.problem for p in found), found


def test_data_mds_takes_its_vocabulary_from_the_tokenizer():
    """mpt-tiny's 320 fits the mock tokenizer; data=mds sizes the vocabulary from the tokenizer it names."""
    need_shared()
    assert compose(["data=mds", f"tokenizer.name={TOKENIZER}", "variables.data_local=/x"]).model.vocab_size == 50304
    assert compose(["data=c4"]).model.vocab_size == 50368  # llm-foundry's figure for gpt-neox-20b
    assert compose([]).model.vocab_size == 320


def test_mock_tokenizer_size_matches_mock_data():
    from train.config import vocab
    from train.task import mock_data

    assert vocab.MOCK_IDS == mock_data.BYTES + 1


@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_good_data_folder_passes(tmp_path, c4_mds):
    assert check(compose(["data=c4", f"tokenizer.name={TOKENIZER}", "max_seq_len=128",
                          f"variables.data_local={c4_mds}"]), Context()) == []
    # streamed from a remote that is a folder (blobfuse's /blob): copied into the node-local cache as the run starts
    blob = ["storage=blob", f"storage.root={tmp_path}", "storage.mounts=[]", "data=c4", f"tokenizer.name={TOKENIZER}"]
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "c4").symlink_to(c4_mds)
    assert check(compose(blob), Context()) == []


# ------------------------------------------------------------------------------- data that cannot train


def _data(c4_mds, *more):
    return compose(["data=mds", f"tokenizer.name={TOKENIZER}", f"variables.data_local={c4_mds}", *more])


def test_sample_length_unlike_max_seq_len_is_a_warning_with_the_fix(c4_mds, tmp_path, cli):
    [p] = check(_data(c4_mds, "max_seq_len=64"), Context())  # 128-token samples, half of each dropped
    assert (p.level, p.key) == (WARNING, "max_seq_len") and "50 % of the prepared tokens" in p.problem, p
    assert "max_seq_len=128" in p.fix
    [p] = check(_data(c4_mds, "max_seq_len=256"), Context())
    assert p.level == WARNING and "shorter than max_seq_len=256" in p.problem, p
    proc = cli("train", "data=mds", f"tokenizer.name={TOKENIZER}", f"variables.data_local={c4_mds}",
               "max_seq_len=64", "plan=json")
    assert proc.returncode == 0 and "warning: max_seq_len:" in json.loads(proc.stdout)["warnings"][0]


def _copy(c4_mds, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(c4_mds, copy)
    index = json.loads((copy / "train" / "index.json").read_text())
    shard = copy / "train" / index["shards"][0]["raw_data"]["basename"]
    return copy, shard


def test_an_index_naming_a_missing_or_short_shard_is_refused(c4_mds, tmp_path, cli):
    copy, shard = _copy(c4_mds, tmp_path)
    shard.write_bytes(shard.read_bytes()[:100])
    [p] = check(_data(copy), Context())
    assert p.key == "variables.data_local" and str(shard.name) in p.problem and "copy the data again" in p.fix, p
    shard.unlink()
    [p] = check(_data(copy), Context())
    assert p.key == "variables.data_local" and "missing" in p.problem, p
    proc = cli("train", "data=mds", f"tokenizer.name={TOKENIZER}", f"variables.data_local={copy}", root=tmp_path / "root")
    assert proc.returncode == 2 and "error: variables.data_local:" in proc.stderr and "Traceback" not in proc.stderr


def _other_tokenizer(tmp_path):
    """gpt-neox-20b with two ids swapped: the same size, another meaning."""
    other = tmp_path / "other-tokenizer"
    other.mkdir()
    definition = json.loads((TOKENIZER / "tokenizer.json").read_text())
    vocab = definition["model"]["vocab"]
    a, b = list(vocab)[1000:1002]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(definition))
    return other


@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_data_tokenized_with_another_tokenizer_is_refused(c4_mds, tmp_path):
    other = _other_tokenizer(tmp_path)
    found = check(compose(["data=mds", f"tokenizer.name={other}", f"variables.data_local={c4_mds}",
                           "max_seq_len=128"]), Context())
    [p] = [p for p in found if p.key == "tokenizer.name"]
    assert p.level == ERROR and f"{c4_mds / 'train'} and {c4_mds / 'val'} were tokenized with {TOKENIZER}, " \
        f"not {other}" in p.problem, p
    assert f"tokenizer.name={TOKENIZER}" in p.fix
    import shutil

    same = tmp_path / "same-tokenizer"
    shutil.copytree(TOKENIZER, same)  # the same tokenizer elsewhere is the same tokenizer
    assert check(compose(["data=mds", f"tokenizer.name={same}", f"variables.data_local={c4_mds}",
                          "max_seq_len=128"]), Context()) == []


@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_each_loader_is_checked_at_its_own_folder_and_split(c4_mds, tmp_path):
    """What streaming will open: a loader's own dataset.local (llm-foundry's vocabulary, beside variables.data_local)
    and split; eval_loader=null (no evaluation, legal in llm-foundry) reads nothing."""
    assert check(_data(c4_mds, "max_seq_len=128", "eval_loader=null"), Context()) == []  # was: "has no None/index.json"
    # the loaders given their folder directly, variables.data_local left at a preset's folder that does not exist
    assert check(compose(["data=c4", f"tokenizer.name={TOKENIZER}", "max_seq_len=128",
                          f"train_loader.dataset.local={c4_mds}", f"eval_loader.dataset.local={c4_mds}"]), Context()) == []
    # data=mds (no folder of its own) with only the loaders' folders: variables.data_local is read by nothing
    loaders = [f"train_loader.dataset.local={c4_mds}", f"eval_loader.dataset.local={c4_mds}"]
    assert check(compose(["data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128", *loaders]), Context()) == []
    # ... and one loader left referring to it: the missing value named once (not each key that refers to it)
    assert check(compose(["data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128", loaders[0]]), Context()) \
        == [Problem("variables.data_local", "has no value", "pass it on the command line: variables.data_local=<value>")]
    # ... and a value no key resolves: named where it fails, once (each loader referring to it said it again)
    [p] = check(compose(["data=c4", f"tokenizer.name={TOKENIZER}", "max_seq_len=128",
                         "variables.data_local=${nope}/c4"]), Context())
    assert (p.key, p.problem) == ("variables.data_local",
                                  "`${nope}/c4` cannot be resolved: Interpolation key 'nope' not found"), p
    [p] = check(_data(c4_mds, "max_seq_len=128", f"eval_loader.dataset.local={tmp_path / 'nothing'}"), Context())
    assert (p.key, p.level) == ("eval_loader.dataset.local", ERROR) and "does not exist" in p.problem, p
    assert "eval_loader.dataset.local at an MDS folder" in p.fix
    [p] = check(_data(c4_mds, "max_seq_len=128", "eval_loader.dataset.split=val_small"), Context())
    assert (p.key, p.level) == ("eval_loader.dataset.split", ERROR), p
    assert "holds no split 'val_small'" in p.problem and "its splits: train, val" in p.problem, p
    [p] = check(_data(c4_mds, "max_seq_len=128", f"variables.data_local={tmp_path / 'nothing'}"), Context())
    assert p.key == "variables.data_local" and "does not exist" in p.problem  # said once for both splits


@pytest.mark.e2e  # runs data_prep
def test_a_validation_split_tokenized_with_another_tokenizer_is_refused_naming_it(c4_mds, tmp_path):
    """The training split matches the run's tokenizer, the validation split was made with another one: the eval
    loss would be over token ids that mean other words."""
    import shutil

    from helpers import C4

    other = _other_tokenizer(tmp_path)
    data = tmp_path / "data"
    shutil.copytree(c4_mds / "train", data / "train")
    run("-m", "data_prep", "dataset=c4", f"input={C4 / 'c4-train.sample2.1000.json.gz'}", f"out_root={data}",
        "split=val", f"tokenizer={other}", "concat_tokens=128", "num_parts=1", "progress=false", check=True, timeout=300)
    [p] = [p for p in check(_data(data, "max_seq_len=128"), Context()) if p.key == "tokenizer.name"]
    assert p.level == ERROR and p.problem.startswith(f"{data / 'val'} was tokenized with {other}, not {TOKENIZER}"), p
    assert f"tokenizer.name={other}" in p.fix


@pytest.mark.e2e  # runs data_prep
def test_the_fix_for_raw_json_given_as_mds_data_is_a_command_that_works(tmp_path, cli):
    import re
    import shlex
    import shutil

    from helpers import C4

    need_shared()
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(C4 / "c4-train.00000-of-01024.first1000.json.gz", raw)
    proc = cli("train", "data=mds", f"tokenizer.name={TOKENIZER}", f"variables.data_local={raw}", root=tmp_path / "root")
    [fix] = [f for level, k, _, f in problems_in(proc.stderr) if k == "variables.data_local"]
    command = re.search(r"`(python -m data_prep [^`]+)`", fix).group(1)
    words = shlex.split(command)
    run(*words[1:], "progress=false", check=True, timeout=300)
    assert (tmp_path / "raw-mds" / "train" / "index.json").is_file() and f"variables.data_local={tmp_path}/raw-mds" in fix


@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_a_hub_tokenizer_in_the_cache_passes_offline_and_sizes_the_vocabulary(tmp_path, monkeypatch, c4_mds):
    import shutil

    snapshot = tmp_path / "hub" / "models--my-org--my-tok" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(TOKENIZER / "tokenizer.json", snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose(["data=mds", "tokenizer.name=my-org/my-tok", f"variables.data_local={c4_mds}", "max_seq_len=128"])
    assert cfg.model.vocab_size == 50304  # its 50277 ids, padded
    assert check(cfg, Context()) == []  # cached: no download needed; the same vocabulary the data was made with
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    [p] = [p for p in check(cfg, Context()) if p.key == "tokenizer.name"]
    assert "HF_HUB_OFFLINE is set" in p.problem and str(tmp_path / "empty") in p.problem


def test_a_tokenizer_file_is_read_once_until_it_changes(tmp_path):
    """The checks and the vocabulary resolver ask for a tokenizer's ids many times: one read per file as it is on
    disk; the same file written again (other ids) is read again."""
    from train.config.vocab import _ids_in, tokenizer_ids

    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 5}]}))
    before = _ids_in.cache_info().misses
    assert [tokenizer_ids(str(tmp_path)) for _ in range(3)] == [(6, str(tmp_path))] * 3
    assert _ids_in.cache_info().misses == before + 1
    path.write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 5}, {"id": 1000}]}))
    assert tokenizer_ids(str(tmp_path)) == (1001, str(tmp_path))
    path.write_text("not json")
    assert tokenizer_ids(str(tmp_path)) == (None, str(tmp_path))


# ------------------------------------------------------------------ what passed the checks and failed on the allocation


def _everything(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# (overrides, the key refused). {tmp}: an empty folder of the test's; {mds}: real MDS data (train and val splits).
FAILED_ON_THE_ALLOCATION = [
    (["train_loader.dataset.split=nosplit"], "train_loader.dataset.split"),  # data=mock writes train and val only
    (["eval_loader.dataset.split=validation"], "eval_loader.dataset.split"),
    (["eval_loader.dataset.local={tmp}/elsewhere"], "eval_loader.dataset.local"),
    (["tokenizer.name={tmp}/no-tokenizer"], "tokenizer.name"),  # beside data=mock
    (["tokenizer.name=tokenizers/gpt-neox-20b/v2"], "tokenizer.name"),  # neither a folder nor a hub name
    (["model.init_device=cuda"], "model.init_device"),  # cluster=local: a CPU preset
    (["data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128", "variables.data_local={tmp}/cache",
      "variables.data_remote={tmp}/blob/c4"], "variables.data_remote"),  # streamed from a folder that is not there
    (["data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128", "variables.data_local={mds}",
      "eval_loader.dataset.split=validation"], "eval_loader.dataset.split"),
    (["-m", "cluster=slurm-local", "data=mock", "model.init_device=cuda"], "model.init_device"),
    (["-m", "cluster=slurm-local", "data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128",
      "variables.data_local={tmp}/cache", "variables.data_remote={tmp}/nope"], "variables.data_remote"),
]


@pytest.mark.parametrize("overrides, key", FAILED_ON_THE_ALLOCATION, ids=[" ".join(o) for o, _ in
                                                                         FAILED_ON_THE_ALLOCATION])
def test_what_failed_on_the_allocation_is_refused_before_anything_is_written(tmp_path, cli, c4_mds, overrides, key):
    """Each passed `plan` and the checks before a run or a submission, then wrote identity.json, .lock, .hydra/ and
    the log, and failed as the task started (streaming's FileNotFoundError, transformers' OSError, llm-foundry's
    AssertionError on init_device): refused now, by key, with a fix, exit 2, nothing written."""
    scratch, root = tmp_path / "scratch", tmp_path / "root"
    scratch.mkdir()
    args = [o.replace("{tmp}", str(scratch)).replace("{mds}", str(c4_mds)) for o in overrides]
    proc = cli("train", *args, root=root, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    [(level, _, line, fix)] = [p for p in problems_in(proc.stderr) if p[1].split("] ")[-1] == key]  # -m: by point
    assert level == ERROR and fix.startswith("  fix: ") and "Traceback" not in proc.stderr, proc.stderr
    assert _everything(root) == [] and _everything(scratch) == []


@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_the_data_a_run_would_not_find_is_named_by_what_to_change(tmp_path, c4_mds):
    """The details: data=mock's own splits are there once written (no problem), another one is named with the splits
    there are; a remote folder is not needed where the local one holds the whole split; a storage not mounted on this
    node is the mounts rule's to name; names that are not hub names are named as such."""
    found = check(compose(["eval_loader.dataset.split=validation"]), Context())
    [p] = found
    assert "holds no split 'validation'" in p.problem and "its splits: train, val" in p.problem, p
    assert check(compose(["data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128", f"variables.data_local={c4_mds}",
                          f"variables.data_remote={tmp_path / 'gone'}"]), Context()) == []  # a whole copy here
    cache = ["data=mds", f"tokenizer.name={TOKENIZER}", "max_seq_len=128", f"variables.data_local={tmp_path / 'cache'}"]
    assert check(compose([*cache, f"variables.data_remote={c4_mds}"]), Context()) == []  # copied from there
    (tmp_path / "blob").mkdir()
    [p, _] = check(compose([*cache, f"variables.data_remote={tmp_path / 'blob'}"]), Context())  # its train and val
    assert (p.key, p.problem) == ("variables.data_remote", f"{tmp_path / 'blob'} has no train/index.json (streaming copies "
                                  f"train_loader's split from it into {tmp_path / 'cache'} as the run starts, and "
                                  "stops there with nothing to copy)"), p
    mounted = [*cache, "storage=blob", "storage.mounts=[/blob-not-here]", "variables.data_remote=/blob-not-here/c4"]
    assert [p.key for p in check(compose(mounted), Context())] == ["storage.mounts"]
    for name in ("a/b/c", "my tokenizer", "org/name--x", "/no/such/folder"):
        [p] = check(compose(["data=mds", f"tokenizer.name='{name}'", "max_seq_len=128",
                             f"variables.data_local={c4_mds}"]), Context())
        assert p.key == "tokenizer.name" and p.level == ERROR, p
    gpu = ["cluster=ndv5", "data=mock", "global_train_batch_size=64"]
    [p] = [p for p in check(compose([*gpu, "model.init_device=cuda"]), Context(mode="sweep", choices={"cluster": "ndv5"}, scheduler="slurm"))
           if p.key == "model.init_device"]
    assert "asserts one of cpu, meta, mixed" in p.problem and p.fix.startswith("model.init_device=meta"), p


def test_a_data_folder_given_with_a_tilde_is_refused_with_the_expanded_path(tmp_path, cli):
    """Streaming opens os.path.join(local, split) as given: `~` is not expanded there (the shell expands it only at
    the start of a word, not in `variables.data_local="~/mds"`). The checks expanded it and passed, the run claimed
    its folder, then streaming stopped ("local file ~/mds/train/index.json does not exist"), and the task's shard
    hashes and its record of the training data passed the folder over. Refused first, naming the key, with the
    expanded path; the checks, the shard hashes and the record read the same folders (mds_sources)."""
    import numpy as np

    from data_prep.mds import ShardWriter

    need_shared()
    home = tmp_path / "home"
    for split in ("train", "val"):
        (home / "mds" / split).mkdir(parents=True)
        writer = ShardWriter(home / "mds" / split, 128, None, 1 << 16)
        writer.add(np.random.default_rng(0).integers(0, 255, (64, 128), dtype=np.int32))
        writer.finish()
    args = ("data=mds", f"tokenizer.name={TOKENIZER}", "run_name=tilde", "max_duration=2ba", "max_seq_len=128")
    proc = cli("train", *args, 'variables.data_local="~/mds"', root=tmp_path / "root", env={"HOME": str(home)},
               check=2)
    [(level, fix)] = [(level, f) for level, k, _, f in problems_in(proc.stderr) if k == "variables.data_local"]
    assert level == ERROR and fix.strip() == f"fix: variables.data_local={home}/mds", proc.stderr[-3000:]
    assert "streaming does not expand ~" in proc.stderr
    assert not (tmp_path / "root" / "checkpoints" / "tilde").exists()
    # the folder streaming would open is the one the task hashes: ~ as a folder in the working directory
    from train.config.loaders import mds_sources
    from train.task.shards import _split_folders

    cfg = compose([*args, 'variables.data_local="~/mds"'])
    assert {str(s.folder) for s in mds_sources(cfg)} == {"~/mds/train", "~/mds/val"}
    assert _split_folders(cfg) == []
    cfg = compose([*args, f"variables.data_local={home}/mds"])
    assert [(k, str(f)) for k, f in _split_folders(cfg)] == [("train_loader.dataset", f"{home}/mds/train"),
                                                           ("eval_loader.dataset", f"{home}/mds/val")]
    assert not [p for p in check(cfg, Context()) if p.key == "variables.data_local" and p.level == ERROR]
