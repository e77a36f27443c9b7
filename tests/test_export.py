"""After training: the Hugging Face folder (export=hf, and `python -m train.export` from a full or a 2-rank sharded
checkpoint), sampling from it offline, its cross-entropy against the trainer's own evaluation, and llm-foundry's
in-context-learning evaluation through `python -m train.evaluate --icl-tasks`.

Real runs of mpt-tiny: at one rank on real C4 MDS (the `c4_mds` fixture: data_prep with the gpt-neox-20b tokenizer,
128-token samples), 4 samples a batch (the 50,368-token vocabulary's logits make each sample dear on a CPU); at two
ranks the reference training the resume tests share (the mock data). The trainer evaluates the first
`eval_subset_num_batches` (4) batches of its part of the val split on each rank: `python -m train.evaluate RUN`
scores the same samples (the run's metrics.json says which), so the same number.
On two nodes those are other samples than the split's first batches: tests/test_slurm_sweeps.py.
"""
import gzip
import json
import os
import shutil
import subprocess

import helpers
import pytest
from helpers import C4, PYTHON, ROOT, TOKENIZER, finished, made_once, run, train_here

BATCH = 4  # samples a batch on each rank, training and evaluating (device_eval_batch_size follows the microbatch)
ARGS = ("data=mds", "max_duration=10ba", "eval_interval=10ba", "save_interval=10ba", "progress_bar=false",
        f"device_train_microbatch_size={BATCH}")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def eval_ce(metrics: dict) -> float:
    return metrics["final_eval"]["eval/LanguageCrossEntropy"]


def scored(root, model) -> dict:
    """`python -m train.evaluate MODEL --json` without --data: the run's own evaluation, its one evaluator's result."""
    out = json.loads(run("-m", "train.evaluate", str(model), "--json", root=root, check=True,
                         env=OFFLINE).stdout.strip().splitlines()[-1])
    [(label, got)] = out["evaluators"].items()
    assert label == "eval"
    return {**got, "model": out["model"]}


# The 1-rank run's model attends within each C4 document of a sample (documents end with gpt-neox-20b's EOS, 0,
# in data_prep's samples): the same samples score otherwise without the loader's sequence ids.
SEQUENCE_ID = ("+model.attn_config.attn_uses_sequence_id=true", "+train_loader.dataset.eos_token_id=0",
               "+eval_loader.dataset.eos_token_id=0")


def one_rank_args(data) -> tuple:
    return (*ARGS, f"global_train_batch_size={BATCH}", f"variables.data_local={data}", f"tokenizer.name={TOKENIZER}",
            "checkpoint=full", "export=hf", "run_name=one", *SEQUENCE_ID)


@pytest.fixture(scope="session")
def one_rank(tmp_path_factory, c4_mds):
    """A 1-rank run with checkpoint=full and export=hf (trained in the first asking worker's process): its root and
    metrics."""
    root = made_once(tmp_path_factory, "export-one-rank",
                     lambda root: train_here(*one_rank_args(c4_mds), root=root, check=True, env=OFFLINE))
    return root, json.loads((root / "outputs" / "one" / "metrics.json").read_text())


@pytest.mark.train
def test_export_hf_writes_a_folder_that_loads_offline_generates_and_scores_the_trainers_eval(one_rank, c4_mds,
                                                                                              tmp_path, cli):
    root, metrics = one_rank
    folder = root / "outputs" / "one" / "huggingface" / "ba10"
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "modeling_mpt.py"} <= names, names
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "float32"  # fp32 on the CPU preset
    plan = json.loads(cli("train", *one_rank_args(c4_mds), "plan=json", root=root, check=True, env=OFFLINE).stdout)  # its size, foreseen
    assert plan["export_bytes"] == pytest.approx((folder / "model.safetensors").stat().st_size, rel=1e-3)

    # transformers alone, from a copy of the folder, with an empty cache and no network
    copy = shutil.copytree(folder, tmp_path / "model")
    script = ("import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
              "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
              "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
              "ids = t('The weather today is', return_tensors='pt').input_ids\n"
              "out = m.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=t.eos_token_id)\n"
              "print(out.shape[1] - ids.shape[1])\n")
    proc = subprocess.run([str(PYTHON), "-c", script, str(copy)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **OFFLINE, "HF_HOME": str(tmp_path / "hf-home")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "5"
    alone = cli("train.evaluate", str(copy), env=OFFLINE)  # no run around it says what to score: --data
    assert alone.returncode == 2 and "error: --data: no data to score on" in alone.stderr

    # the exported model's cross-entropy on the samples the trainer evaluated
    got = scored(root, "one")  # a run name: its newest export
    assert got["model"] == str(folder) and got["samples"] == 4 * BATCH and got["tokens"] == 4 * BATCH * 127
    assert (got["nodes"], got["ranks_per_node"], got["batches_per_rank"], got["batch_size"]) == (1, 1, 4, BATCH)
    assert got["cross_entropy"] == pytest.approx(eval_ce(metrics), rel=1e-6)  # the trainer's weights and samples
    assert got["trainer"] == {"metric": "eval/LanguageCrossEntropy", "cross_entropy": eval_ce(metrics), "batch": 10}

    # --data: the same first 4 batches, documents apart at the token the run's loader used; without it, refused
    # (the model uses sequence ids) before the model loads
    data = ("train.evaluate", "one", f"--data={c4_mds}", "--batches=4", f"--batch-size={BATCH}")
    refused = cli(*data, root=root, env=OFFLINE)
    assert refused.returncode == 2 and "error: --eos-token-id: the model of" in refused.stderr, refused.stderr
    again = json.loads(cli(*data, "--eos-token-id=0", "--json", root=root, check=True, env=OFFLINE).stdout)
    assert again["cross_entropy"] == pytest.approx(eval_ce(metrics), rel=1e-6)


@pytest.mark.train
def test_export_command_on_a_full_checkpoint_gives_the_trainers_weights(one_rank, tmp_path, cli):
    from safetensors.torch import load_file

    root, _ = one_rank
    out = cli("train.export", "one", f"--out={tmp_path / 'hf'}", root=root, check=True, env=OFFLINE).stdout.strip()  # a run name
    assert out == str(tmp_path / "hf")
    ours, trainers = load_file(tmp_path / "hf" / "model.safetensors"), load_file(
        root / "outputs" / "one" / "huggingface" / "ba10" / "model.safetensors")
    assert ours.keys() == trainers.keys()
    assert all((ours[k] == trainers[k]).all() for k in ours)

    half = cli("train.export", str(root / "checkpoints" / "one" / "ep0-ba10-rank0.pt"),
               f"--out={tmp_path / 'bf16'}", "--precision=bfloat16", root=root, check=True, env=OFFLINE).stdout.strip()
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (tmp_path / "bf16" / "model.safetensors").stat().st_size < 0.55 * (
        tmp_path / "hf" / "model.safetensors").stat().st_size
    assert half == str(tmp_path / "bf16")


# The reference 2-rank sharded training (helpers.finished: mpt-tiny on the mock data, 40 batches, evaluated every 10;
# a copy) exported on one process from its save folder, scored by `train.evaluate` (the run's metrics.json is in the
# sweep's folder, found by the run's name) and sampled from by run name. One step per test's setup (the training, made
# once for the session; the export), the copy and its export shared by the module's tests (one pytest-xdist group).


@pytest.fixture(scope="module")
def sharded2(tmp_path_factory):
    """A copy of the reference training's root: (root, its save folder, its metrics)."""
    root = tmp_path_factory.mktemp("sharded2") / "root"
    shutil.copytree(finished(2, "sharded", tmp_path_factory), root, symlinks=True)
    [save] = (root / "checkpoints").iterdir()
    [metrics] = [json.loads(p.read_text()) for p in (root / "outputs" / "sweeps").rglob("metrics.json")]
    return root, save, metrics


@pytest.fixture(scope="module")
def sharded2_exported(sharded2):
    """`python -m train.export SAVE_FOLDER` (its newest checkpoint): what it printed."""
    root, save, _ = sharded2
    return run("-m", "train.export", str(save), root=root, check=True, env=OFFLINE).stdout


@pytest.mark.train
@pytest.mark.xdist_group("export-sharded2")
def test_two_rank_sharded_checkpoint_holds_a_shard_per_rank_and_its_runs_metrics(sharded2):
    root, save, metrics = sharded2
    assert sorted(p.name for p in (save / "ep0-ba40").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert metrics["world_size"] == 2


@pytest.mark.train
@pytest.mark.xdist_group("export-sharded2")
def test_two_rank_sharded_checkpoint_exported_on_one_process_scores_the_trainers_eval(sharded2, sharded2_exported):
    root, save, metrics = sharded2
    folder = root / "outputs" / save.name / "huggingface" / "ba40"  # where export=hf would have written it
    assert sharded2_exported.strip() == str(folder)
    got = scored(root, folder)
    assert (got["nodes"], got["ranks_per_node"], got["batches_per_rank"]) == (1, 2, 4)
    assert got["samples"] == 2 * 4 * got["batch_size"]
    assert got["cross_entropy"] == pytest.approx(eval_ce(metrics), rel=1e-6)
    assert got["trainer"]["batch"] == 40


@pytest.mark.train
@pytest.mark.xdist_group("export-sharded2")
def test_a_two_rank_sharded_runs_export_samples_by_run_name_and_what_cannot_be_done_is_refused(
        sharded2, sharded2_exported, cli, monkeypatch, capsys):
    root, save, _ = sharded2
    samples = cli("train.sample", save.name, "In 2019, the company", "The weather today is", "In 2019, the company",
                  "--max-new-tokens=8", "--seed=3", root=root, check=True, env=OFFLINE)
    blocks = samples.stdout.split("\n---\n")
    assert blocks[0].startswith("In 2019, the company") and blocks[1].startswith("The weather today is")
    assert len(blocks[1]) > len("The weather today is")
    # the same seed gives a prompt the same sample, whatever prompts come before it (none, or two)
    assert blocks[2] == blocks[0], (blocks[0], blocks[2])
    # The refusals below through the commands' own main() in this process (PRETRAIN_ROOT as the commands had it):
    # each one's exit status and its message, without a process to start for each.
    from train import export, sample

    monkeypatch.setenv("PRETRAIN_ROOT", str(root))
    # past the model's max_seq_len (128): said before generating, with what fits (it was a traceback, no sample)
    assert sample.main([save.name, "In 2019, the company", "--max-new-tokens=200"]) == 2
    said = capsys.readouterr().err
    assert "error: --max-new-tokens: 200 new tokens after a prompt of" in said and "or fewer" in said, said

    mine = root / "mine"
    (mine / "keep").mkdir(parents=True)  # a folder of the user's (or the run's checkpoints) as --out: refused, kept whole
    for out in (mine, save):
        assert export.main([str(save), f"--out={out}"]) == 2
        said = capsys.readouterr().err
        assert "error: --out: " in said and out.is_dir(), said
    assert (mine / "keep").is_dir() and (save / "ep0-ba40" / ".metadata").is_file()


@pytest.mark.train
def test_icl_evaluation_of_an_exported_model_on_a_task_file_from_real_c4(one_rank, tmp_path, cli):
    """A language-modeling task file from real C4 text (8 words of context, the next word to predict), through
    llm-foundry's ICL evaluation of the exported folder: one accuracy per task and shot count, named after the file."""
    root, _ = one_rank
    folder = root / "outputs" / "one" / "huggingface" / "ba10"
    task = tmp_path / "c4_next_word.jsonl"
    with gzip.open(C4 / "c4-train.sample2.1000.json.gz", "rt") as f, task.open("w") as out:
        written = 0
        for line in f:
            words = json.loads(line)["text"].split()
            if len(words) > 12 and written < 16:
                out.write(json.dumps({"context": " ".join(words[:8]), "continuation": words[8]}) + "\n")
                written += 1
    result = json.loads(cli("train.evaluate", str(folder), f"--icl-tasks={task}", "--json",
                            cwd=tmp_path, root=root, check=True, env=OFFLINE).stdout.strip().splitlines()[-1])
    assert result["model"] == str(folder)
    # nothing left where the command ran (llm-foundry links each task's file into its working directory)
    assert [p.name for p in tmp_path.iterdir()] == [task.name]
    accuracy = result["c4_next_word/0-shot/InContextLearningLMAccuracy"]
    assert 0.0 <= accuracy <= 1.0


@pytest.mark.e2e  # starts a Python process of its own
def test_errors_name_the_key_and_the_fix_and_write_nothing(tmp_path):
    """Checked before torch is imported: no checkpoint, an incomplete one, no data, bad sampling values."""
    def cli(*args):
        return run("-m", *args, root=tmp_path / "root", timeout=120)

    proc = cli("train.export", "no-such-run")
    assert proc.returncode == 2 and "error: checkpoint: 'no-such-run'" in proc.stderr and "fix:" in proc.stderr
    (tmp_path / "save" / "ep0-ba5").mkdir(parents=True)  # a sharded write that never finished: no .metadata
    proc = cli("train.export", str(tmp_path / "save"))
    assert proc.returncode == 2 and "no complete checkpoint" in proc.stderr and "fix:" in proc.stderr
    proc = cli("train.evaluate", str(tmp_path), "--batch-size=0", "--split=train")  # flags of --data, without it
    assert proc.returncode == 2 and "error: --batch-size: applies to --data;" in proc.stderr
    assert "error: --split: applies to --data;" in proc.stderr
    assert "error: --batch-size: must be positive" in proc.stderr
    proc = cli("train.sample", "no-such-run", "Hello", "", "--temperature=-1")
    assert proc.returncode == 2 and "--temperature" in proc.stderr and "error: PROMPT: an empty prompt" in proc.stderr
    proc = cli("train.sample", "no-such-run", "Hello")
    assert proc.returncode == 2 and "error: model:" in proc.stderr and "python -m train.export" in proc.stderr
    assert not (tmp_path / "root").exists() and sorted(p.name for p in tmp_path.rglob("*")) == ["ep0-ba5", "save"]


def test_an_out_inside_a_checkpoint_is_refused(tmp_path):
    """`train.export CKPT --out CKPT/hf` wrote into the checkpoint, which then failed its manifest: the next export
    by run name set it aside and took the one before, exit 0. Beside the checkpoints (the default --out of a
    save_folder= not under checkpoints/) is fine."""
    from common.errors import UserError
    from train.export import replaceable

    run_folder = tmp_path / "checkpoints" / "mpt-tiny-1"
    (run_folder / "ep0-ba30").mkdir(parents=True)
    (run_folder / "ep0-ba30" / ".metadata").write_bytes(b"x")
    (run_folder / "identity.json").write_text("{}")
    (run_folder / "ep0-ba20").mkdir()  # a sharded checkpoint still being written: no .metadata yet
    for out, ckpt in [(run_folder / "ep0-ba30" / "hf", "ep0-ba30"), (run_folder / "ep0-ba30", "ep0-ba30"),
                      (run_folder / "ep0-ba20" / "x" / "hf", "ep0-ba20")]:
        with pytest.raises(UserError) as err:
            replaceable(out)
        assert err.value.key == "--out" and f"inside the checkpoint {run_folder / ckpt}:" in err.value.problem
    replaceable(tmp_path / "outputs" / "mpt-tiny-1" / "huggingface" / "ba30")  # the default: beside, not inside
    replaceable(run_folder / "huggingface" / "ba30")  # a save_folder= of the user's: the default is beside them
    assert sorted(p.name for p in tmp_path.rglob("*")) == [".metadata", "checkpoints", "ep0-ba20", "ep0-ba30",
                                                          "identity.json", "mpt-tiny-1"]


@pytest.mark.e2e  # starts Python processes of their own
def test_what_is_not_a_checkpoint_and_an_out_that_cannot_be_made_are_refused_by_name_and_nothing_is_written(tmp_path):
    """A README was called a checkpoint whose write was cut off; a zip of other files, or a torch file of other
    things, a traceback; an --out under a file or in /proc a traceback as the folder was made, after the weights
    were read. Each: exit 2, what it is, a fix, nothing written."""
    import zipfile

    readme, other = tmp_path / "README.md", tmp_path / "other.pt"
    readme.write_text("# notes\n")
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("README.md", "# notes\n")
    save = tmp_path / "save"
    save.mkdir()
    shutil.copy(other, save / "ep0-ba2-rank0.pt")  # whole as a zip: the --out is refused before it is read
    before = sorted(tmp_path.rglob("*"))
    for args, said in [([readme], f"error: checkpoint: {readme}: not a checkpoint:"),
                       ([other, "--out", tmp_path / "out"], f"error: checkpoint: {other} is not a checkpoint torch "
                        "can read"),
                       ([save, "--out", readme / "hf"], f"error: --out: {readme / 'hf'} cannot be written: {readme} "
                        "is a file: no folder can be made inside it"),
                       ([save, "--out", "/proc/hf"], "error: --out: /proc/hf cannot be written: /proc is on the "
                        "kernel's proc file system")]:
        proc = run("-m", "train.export", *args, root=tmp_path / "root", timeout=120)
        assert proc.returncode == 2 and said in proc.stderr and "\n  fix: " in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "truncated" not in proc.stderr
    assert sorted(tmp_path.rglob("*")) == before


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict:
    return helpers.checkpoint_kinds(tmp_path_factory.mktemp("kinds"))


@pytest.mark.torch  # makes the checkpoints
@pytest.mark.parametrize("kind", helpers.CHECKPOINT_KINDS)
def test_export_refuses_a_checkpoint_exactly_where_the_task_refuses_it(kind, kinds):
    """Each kind of checkpoint (test_resume.py: composer loads exactly the ones the task accepts), named by its path:
    export takes it exactly where the task's resume.problem does, and refuses the others naming the file and the
    task's own reason (a legacy-pickle file is taken, as composer loads it)."""
    from common.errors import UserError
    from train import export
    from train.checkpoint import resume

    path = kinds[kind]
    why = resume.problem(resume.Checkpoint(path, 0, 10, sharded=path.is_dir()))
    assert (why is None) == helpers.CHECKPOINT_KINDS[kind]
    try:
        assert export.locate(str(path)).path == path and why is None
    except UserError as err:
        assert why is not None and err.key == "checkpoint" and err.problem == f"{path}: {why}" and err.fix


def test_the_readme_lines_of_export_sample_and_evaluate_parse():
    """The `python -m train.export|sample|evaluate` lines of README.md and docs/*.md (test_readme.py runs the
    `python -m train` ones) name arguments these commands take: each parses, through the command's own parser,
    without running."""
    import re
    import shlex

    from train import evaluate, export, sample
    from train.config.storage_args import roots, take

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)
    lines = re.findall(r"^(python -m train\.(?:export|sample|evaluate) .*)$", readme, flags=re.M)
    assert {line.split()[2] for line in lines} == {"train.export", "train.sample", "train.evaluate"}, lines
    for line in lines:
        words, storage = take(shlex.split(line, comments=True))  # storage overrides: train/config/storage_args.py
        module = {"train.export": export, "train.sample": sample, "train.evaluate": evaluate}[words[2]]
        module.parser().parse_args(words[3:])  # exits 2 on an unknown option or a missing argument
        assert all(roots(storage))  # they name a storage


# The default run (mock data, its byte-level tokenizer) with its checkpoints apart from its outputs
# (storage.checkpoint_root elsewhere), found by `train.export/evaluate/sample <run>` on the storage the training
# command named (its storage overrides after the run name), not on $PRETRAIN_ROOT. One step per test's setup (the
# training, the export), shared by the module's tests (one pytest-xdist group).


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`python -m train` on the default run, its storage named on the command line: (the folder its storage is in,
    the PRETRAIN_ROOT it ran with, its storage overrides, the run's name)."""
    tmp_path = tmp_path_factory.mktemp("default-run")
    elsewhere = tmp_path / "elsewhere"  # not $PRETRAIN_ROOT
    storage = (f"storage.root={tmp_path / 'lustre'}", f"storage.checkpoint_root={tmp_path / 'ckpt'}")
    run("-m", "train", "max_duration=10ba", "save_interval=10ba", *storage, root=elsewhere, check=True, env=OFFLINE)
    [name] = [p.name for p in (tmp_path / "ckpt").iterdir()]
    return tmp_path, elsewhere, storage, name


@pytest.fixture(scope="module")
def default_exported(default_run):
    """`python -m train.export <run>` with the training's storage overrides: the folder it printed."""
    _, elsewhere, storage, name = default_run
    return run("-m", "train.export", name, *storage, root=elsewhere, check=True,
               env=OFFLINE).stdout.strip().splitlines()[-1]


@pytest.mark.train
@pytest.mark.xdist_group("export-default")
def test_the_default_runs_export_without_its_storage_is_refused_naming_where_it_looked(default_run, cli):
    """`train.export <run>` looks for the run on the storage its command names: without the training's storage
    overrides (the run is not under $PRETRAIN_ROOT) it is refused, naming where it looked."""
    _, elsewhere, _, name = default_run
    missed = cli("train.export", name, root=elsewhere, env=OFFLINE)
    assert missed.returncode == 2 and str(elsewhere / "checkpoints") in missed.stderr


@pytest.mark.train
@pytest.mark.xdist_group("export-default")
def test_the_default_runs_export_writes_under_its_output_root_where_export_hf_writes(default_run, default_exported):
    """`train.export <run>` with the run's storage overrides writes under storage.output_root, where export=hf
    writes and `train.sample`/`train.evaluate <run>` look, not beside the checkpoints (storage.checkpoint_root
    elsewhere); the same folder where the run is named by its save folder's path."""
    tmp_path, _, storage, name = default_run
    folder = default_exported
    assert folder == str(tmp_path / "lustre" / "outputs" / name / "huggingface" / "ba10")  # where export=hf writes
    from train.config.storage_args import roots
    from train.export import default_out, locate

    at = roots(list(storage))  # named by its save folder's path: the same folder
    assert str(default_out(locate(str(tmp_path / "ckpt" / name), at), at)) == folder


@pytest.mark.train
@pytest.mark.xdist_group("export-default")
def test_the_default_runs_export_evaluated_by_run_name_scores_the_runs_own_number(default_run, default_exported, cli):
    """`train.evaluate <run>` scores the run's export against the run's own number (its metrics.json, batch 10)."""
    _, elsewhere, storage, name = default_run
    folder = default_exported
    own = json.loads(cli("train.evaluate", name, "--json", *storage, root=elsewhere, check=True,
                         env=OFFLINE).stdout.strip().splitlines()[-1])  # the run's own evaluation: its metrics.json
    [(_, got)] = own["evaluators"].items()
    assert own["model"] == folder and got["trainer"]["batch"] == 10
    assert got["cross_entropy"] == pytest.approx(got["trainer"]["cross_entropy"], rel=1e-6)


@pytest.mark.train
@pytest.mark.xdist_group("export-default")
def test_the_default_runs_export_samples_by_run_name_and_says_when_bytes_are_no_text(default_run, default_exported,
                                                                                    cli):
    """`train.sample <run> ...` continues the prompt from the run's export (its byte-level tokenizer)."""
    _, elsewhere, storage, name = default_run
    sample = cli("train.sample", name, "The weather today is", "--max-new-tokens=8", *storage, root=elsewhere, check=True, env=OFFLINE)
    assert sample.stdout.startswith("The weather today is")
    # a continuation of bytes that are no UTF-8 text is said to be so, and why
    assert ("\ufffd" in sample.stdout) == ("not UTF-8 text, shown as \ufffd (data=mock's" in sample.stderr)


@pytest.mark.train
@pytest.mark.xdist_group("export-default")
def test_the_default_runs_export_scores_the_data_it_trained_on_named_by_data(default_run, default_exported, cli):
    """`train.evaluate <run> --data=FOLDER` scores the run's export on that data, saying which model it scored."""
    tmp_path, elsewhere, storage, name = default_run
    folder = default_exported
    [data] = (tmp_path / "lustre" / "datasets").iterdir()  # the mock data the run trained on
    scored = cli("train.evaluate", name, f"--data={data}", "--batches=1", *storage, root=elsewhere, check=True,
                 env=OFFLINE)
    assert scored.stdout.startswith("cross-entropy ") and f"\nmodel {folder}\n" in scored.stdout  # what was scored


@pytest.mark.train
@pytest.mark.e2e  # starts a Python process of its own
@pytest.mark.xdist_group("export-default")
def test_the_default_runs_export_generates_with_plain_transformers(default_exported):
    """The exported folder generates with `model.generate(**tokenizer(text))`, transformers alone."""
    folder = default_exported
    code = ("import sys\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
            "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
            "out = m.generate(**t('The weather today is', return_tensors='pt'), max_new_tokens=5, do_sample=False,"
            " pad_token_id=t.eos_token_id)\nprint(out.shape[1])\n")
    gen = subprocess.run([str(PYTHON), "-c", code, folder], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **OFFLINE})
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert int(gen.stdout.strip().splitlines()[-1]) == len(b"The weather today is") + 5


def test_a_run_named_whose_newest_export_is_older_than_its_checkpoints_is_warned(tmp_path, caplog):
    """`train.evaluate <run>` / `train.sample <run>` take the run's newest export: after the run trained on past
    it (continued to a longer max_duration without export=hf), that is older weights than the run's, which
    scored without a word. Named by its folder, the folder is what is meant: nothing to warn."""
    from train.hf_model import find_folder

    export = tmp_path / "outputs" / "r" / "huggingface" / "ba40"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    whole_weights(export)
    (tmp_path / "checkpoints" / "r").mkdir(parents=True)
    (tmp_path / "checkpoints" / "r" / "ep0-ba40-rank0.pt").write_bytes(b"")
    roots = (tmp_path / "checkpoints", tmp_path / "outputs")
    assert find_folder("r", roots) == export and not caplog.records
    (tmp_path / "checkpoints" / "r" / "ep0-ba60-rank0.pt").write_bytes(b"")
    assert find_folder("r", roots) == export
    [warned] = caplog.records
    assert "newest export, of batch 40; the run trained on to batch 60" in warned.getMessage()
    assert "python -m train.export r" in warned.getMessage()
    caplog.clear()
    assert find_folder(str(export), roots) == export and not caplog.records


def whole_weights(folder) -> None:
    """A stand-in export's weights and tokenizer as a complete one has them: a safetensors file of one 4-byte
    tensor, as long as its header says."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (folder / "tokenizer_config.json").write_text("{}")


def test_an_export_stopped_midway_is_passed_over_for_the_one_before(tmp_path, caplog):
    """llm-foundry's hf_checkpointer writes its folder in place, config.json first, then the weights, then the
    tokenizer: an export killed midway has no weights, part of them (a safetensors file cut short, not all of an
    index's shards) or no tokenizer, and `train.sample <run>` took it and failed with a traceback."""
    from train.hf_model import find_folder

    hf = tmp_path / "outputs" / "r" / "huggingface"
    for batch in (20, 40):
        (hf / f"ba{batch}").mkdir(parents=True)
        (hf / f"ba{batch}" / "config.json").write_text("{}")
        whole_weights(hf / f"ba{batch}")
    roots = (tmp_path / "checkpoints", tmp_path / "outputs")
    assert find_folder("r", roots) == hf / "ba40"
    weights = hf / "ba40" / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:-2])  # cut short
    assert find_folder("r", roots) == hf / "ba20"
    assert "ba40: an export without all its weights" in caplog.records[0].getMessage()
    weights.write_bytes(whole)
    (hf / "ba40" / "tokenizer_config.json").unlink()  # stopped before its tokenizer
    assert find_folder("r", roots) == hf / "ba20"
    (hf / "ba40" / "tokenizer_config.json").write_text("{}")
    weights.unlink()
    (hf / "ba40" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (hf / "ba40" / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert find_folder("r", roots) == hf / "ba20"  # a shard missing
    (hf / "ba40" / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert find_folder("r", roots) == hf / "ba40"


def test_an_export_left_from_a_training_since_gone_back_is_not_taken_for_the_runs(tmp_path, caplog):
    """Trained to 80 with an export, checkpoints past 40 deleted by hand, trained again to 60: `train.evaluate
    <run>` scored the export of batch 80, beside the run's own number at 60, exit 0. Named by the run or by its
    outputs folder, the export at the run's end is taken; without one, it stops naming the stale export."""
    from common.errors import UserError
    from train.hf_model import find_folder

    hf, save = tmp_path / "outputs" / "r" / "huggingface", tmp_path / "checkpoints" / "r"
    for batch in (60, 80):
        (hf / f"ba{batch}").mkdir(parents=True)
        (hf / f"ba{batch}" / "config.json").write_text("{}")
        whole_weights(hf / f"ba{batch}")
    save.mkdir(parents=True)
    (save / "ep0-ba60-rank0.pt").write_bytes(b"")
    (save / "finished.json").write_text(json.dumps({"max_duration": "60ba", "batch": 60}))
    roots = (tmp_path / "checkpoints", tmp_path / "outputs")
    for arg in ("r", str(tmp_path / "outputs" / "r"), str(hf)):
        caplog.clear()
        assert find_folder(arg, roots) == hf / "ba60", arg
        assert "past where the run now ends (batch 60" in caplog.records[0].getMessage()
    shutil.rmtree(hf / "ba60")
    with pytest.raises(UserError) as err:
        find_folder("r", roots)
    assert "ba80" in err.value.problem and "python -m train.export r" in err.value.fix
    assert find_folder(str(hf / "ba80"), roots) == hf / "ba80"  # its own path: what is meant
    (save / "ep0-ba80-rank0.pt").write_bytes(b"")  # trained to 80 again since: its export is the newest
    assert find_folder("r", roots) == hf / "ba80"


def test_data_of_another_tokenizer_is_refused_and_longer_samples_warned_before_the_model_loads(tmp_path, caplog):
    """`train.evaluate RUN --data` on a folder tokenized with another vocabulary printed a cross-entropy of ids
    that mean other words, exit 0 (a training on it is refused); 256-token samples were cut to the model's 128
    unsaid. What data_prep recorded beside the split decides."""
    from common.errors import UserError
    from data_prep.facts import SUMMARY_FILE, tokenizer_fingerprint
    from train.evaluate import _same_tokens
    from train.task.mock_data import write_tokenizer

    export, split = tmp_path / "ba10", tmp_path / "data" / "val"
    write_tokenizer(export)
    split.mkdir(parents=True)
    (split / "index.json").write_text(json.dumps({"version": 2, "shards": []}))
    facts = {"sample_tokens": 128, "tokenizer": "/data/other-tokenizer", "tokenizer_fingerprint": "0" * 64}
    (split / SUMMARY_FILE).write_text(json.dumps(facts))
    with pytest.raises(UserError) as err:
        _same_tokens(export, split, 128)
    assert err.value.key == "--data" and "/data/other-tokenizer" in err.value.problem
    ours = tokenizer_fingerprint(str(export))
    assert ours and ours != "0" * 64
    (split / SUMMARY_FILE).write_text(json.dumps({**facts, "tokenizer_fingerprint": ours}))
    _same_tokens(export, split, 128)
    assert not caplog.records
    (split / SUMMARY_FILE).write_text(json.dumps({**facts, "tokenizer_fingerprint": ours, "sample_tokens": 256}))
    _same_tokens(export, split, 128)
    assert "samples of 256 tokens: each is scored on its first 128 (the model's max_seq_len" in caplog.text
    caplog.clear()
    _same_tokens(export, split, 64, given=True)  # --max-seq-len 64 is the command's, not the model's
    assert "each is scored on its first 64 (--max-seq-len)" in caplog.text


@pytest.mark.e2e  # starts a Python process of its own
def test_status_and_export_look_on_the_storage_the_training_command_named(tmp_path):
    """`python -m train.status storage=amlfs storage.root=...` / `train.export NAME storage=...`: the storage presets
    composed as the training composed them, not the local root."""
    for args, where in ((["train.status", "storage=amlfs", f"storage.root={tmp_path}"], tmp_path / "outputs" / "sweeps"),
                        (["train.export", "a-run", "storage=amlfs", f"storage.root={tmp_path}"],
                         tmp_path / "checkpoints")):
        proc = run("-m", *args, root=tmp_path / "local", timeout=120)
        assert proc.returncode == 2 and str(where) in proc.stderr, proc.stderr


@pytest.mark.torch
@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_the_samples_a_run_evaluated_are_the_ones_its_loader_reads(c4_mds):
    """`train.evaluate RUN` scores `trainer_batches`: checked against llm-foundry's text loader itself with 2 loader
    workers (torch takes their batches in turn), its first 5 batches, with streaming's default canonical nodes and
    with 2 set (each canonical node a stretch of the split, read in turn, as two physical nodes would by default:
    then the samples read are not the split's first ones, which `--batches` would score). Two real nodes:
    tests/test_slurm_sweeps.py (a world of several processes is not made in this one)."""
    import itertools

    import torch
    from llmfoundry.data.text_data import build_text_dataloader
    from transformers import AutoTokenizer

    from train.evaluate import _loader, trainer_batches
    from train.task import shm_registry

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    for canonical in (None, 2):
        dataset = {"local": str(c4_mds), "remote": None, "split": "val", "max_seq_len": 128,
                   "num_canonical_nodes": canonical}
        reads = {"nodes": 1, "ranks_per_node": 1, "workers": 2, "batch_size": 3, "batches": 5,
                 "num_canonical_nodes": canonical, "shuffle_algo": "py1e"}
        spec = _loader(tokenizer, 3, dataset)
        ids = trainer_batches(spec.dataloader.dataset, reads)
        assert len(ids) == 5 and all(len(batch) == 3 for batch in ids)
        ours = [spec.dataloader.collate_fn([spec.dataloader.dataset[i] for i in batch])["input_ids"] for batch in ids]
        with shm_registry.registering():  # as every loader built beside the other worker's jobs
            loader = build_text_dataloader(tokenizer, 3, dataset={**dataset, "shuffle": False}, drop_last=False,
                                           num_workers=2, prefetch_factor=2, persistent_workers=False,
                                           pin_memory=False)
        real = [batch["input_ids"] for batch in itertools.islice(loader.dataloader, 5)]
        assert all(torch.equal(a, b) for a, b in zip(real, ours, strict=True)), canonical
        assert (sorted(i for batch in ids for i in batch) == list(range(15))) == (canonical is None)

    # what metrics.json records of a loader that gives the model sequence ids (train/task/run_report.py): the
    # dataset key that llm-foundry's collator was built from, which evaluate hands back to the same builder
    from train.task.run_report import _sequence_id

    base = {"local": str(c4_mds), "remote": None, "split": "val", "max_seq_len": 128}
    for given in ({}, {"eos_token_id": 0}, {"bos_token_id": 0}):  # llm-foundry: the tokenizer's BOS
        assert _sequence_id(_loader(tokenizer, 3, {**base, **given}).dataloader.collate_fn) == given


def test_an_export_scoring_apart_from_its_runs_number_at_the_same_batch_is_warned(caplog):
    """`train.evaluate RUN` on a float32 export of the batch the run last evaluated: the same weights on the same
    samples give the run's number (to ~1e-7); further apart than 1e-4 it is warned as other weights. Another
    batch's export, or a bfloat16 one, is only shown beside the run's number."""
    from train.evaluate import _warn_if_apart

    def scored(ce, batch=10):
        return {"eval": {"cross_entropy": ce, "trainer": {"metric": "eval/LanguageCrossEntropy", "cross_entropy": 9.0,
                                                          "batch": batch}}}

    _warn_if_apart(10, scored(9.0000001), "torch.float32")
    _warn_if_apart(10, scored(9.1, batch=20), "torch.float32")
    _warn_if_apart(10, scored(9.01), "torch.bfloat16")
    assert not caplog.records
    _warn_if_apart(10, scored(9.01), "torch.float32")
    [warned] = caplog.records
    assert "scores 9.010000 where the run reported 9.000000 at that batch" in warned.getMessage()


def test_an_export_of_an_earlier_batch_is_shown_beside_the_runs_number_at_that_batch():
    """The run's number beside an export is the one it evaluated at the export's batch (measured: ba20 scored
    5.5642 beside the run's 5.2517 of batch 40, which also kept the check above from ever comparing it); an export
    of a batch the run did not evaluate is shown beside its last number, with that batch."""
    from train.evaluate import _trainers

    key = "eval/LanguageCrossEntropy"
    metrics = {"eval": [[10, {key: 5.9}], [10, {"icl/0-shot/InContextLearningLMAccuracy": 0.1}], [20, {key: 5.56}],
                        [40, {key: 5.25}]], "final_eval": {key: 5.25}, "evaluators_since": 0}
    assert _trainers(metrics, "eval", 20) == {"metric": key, "cross_entropy": 5.56, "batch": 20}
    assert _trainers(metrics, "eval", 40) == {"metric": key, "cross_entropy": 5.25, "batch": 40}
    assert _trainers(metrics, "eval", 30) == {"metric": key, "cross_entropy": 5.25, "batch": 40}
    assert _trainers(metrics, "eval", None)["batch"] == 40 and _trainers(metrics, "other", 20) is None
    # the last start resumed at batch 20 (at another world size, say): its evaluators, which evaluate scores on,
    # read other samples than the evaluations before it: those are not shown beside an export's score
    assert _trainers({**metrics, "evaluators_since": 20}, "eval", 20)["batch"] == 40
    assert _trainers({**metrics, "evaluators_since": 10}, "eval", 20)["batch"] == 20
    assert _trainers({k: v for k, v in metrics.items() if k != "evaluators_since"}, "eval", 20)["batch"] == 40


def test_icl_options_are_refused_where_they_would_be_ignored_and_a_bad_task_line_is_named(tmp_path):
    """`train.evaluate --icl-tasks` scores the task file: --data's options with it were taken and ignored (exit 0),
    a negative --fewshot ran 0-shot labelled -1-shot, and the ICL options without --icl-tasks were ignored; each is
    refused by name before anything loads. A line the task type cannot read is named (it was a traceback)."""
    from train.evaluate import _problems, parser

    task = tmp_path / "t.jsonl"
    task.write_text('{"context": "a", "continuation": "b"}\n')

    def keys(*argv):
        return [p.key for p in _problems(parser().parse_args(["run", *argv]))]

    assert keys(f"--icl-tasks={task}", "--fewshot=2", "--icl-delimiter=:", "--max-seq-len=64", "--batch-size=2") == []
    assert keys(f"--icl-tasks={task}", f"--data={tmp_path}", "--split=val", "--batches=2", "--eos-token-id=0",
                "--fewshot=-1") == ["--data", "--split", "--batches", "--eos-token-id", "--fewshot"]
    assert keys("--fewshot=1", "--icl-type=schema", "--icl-delimiter=:") == ["--icl-type", "--fewshot",
                                                                               "--icl-delimiter"]
    [bad] = _problems(parser().parse_args(["run", f"--icl-tasks={task}", "--icl-type=multiple_choice"]))
    assert bad.key == "--icl-tasks" and "line 1: no query, choices, gold" in str(bad), str(bad)


def test_the_runs_record_is_found_and_what_cannot_be_read_again_is_refused_before_the_model_loads(tmp_path):
    """Without --data, evaluate reads the newest metrics.json of the export's run (beside the export, or a sweep
    point's under <output_root>/sweeps/), and refuses at once, each by its evaluator's label, an evaluator whose
    samples it cannot read again: several streams, a shuffle, replication, a resampled epoch, a folder no longer
    there."""
    from common.errors import UserError
    from train.evaluate import _run_metrics, run_problems

    outputs = tmp_path / "outputs"
    export = outputs / "r" / "huggingface" / "ba10"
    export.mkdir(parents=True)
    (tmp_path / "data" / "val").mkdir(parents=True)
    (tmp_path / "data" / "val" / "index.json").write_text("{}")

    def reads(local=tmp_path / "data", streams=1, **kw):
        return {"streams": [{"local": str(local), "remote": None, "split": "val"}] * streams, "shuffle": False,
                "replication": 1, "sequence_id": {}, "epoch_size": 64, "samples": 64, **kw}

    def point(num, run_name, evaluators, age):
        path = outputs / "sweeps" / "t" / str(num) / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"run_name": run_name, **({} if evaluators is None else {"evaluators": evaluators})}))
        os.utime(path, (age, age))
        return path

    with pytest.raises(UserError, match="no data to score on"):
        _run_metrics(export)
    point(0, "r", None, 1000)  # an older start, before the record
    newest = point(1, "r", {"eval": reads(), "mixed": reads(streams=2), "shuffled": reads(shuffle=True),
                            "copied": reads(replication=2), "resampled": reads(epoch_size=16),
                            "moved": reads(local=tmp_path / "gone"),
                            "early": {k: v for k, v in reads().items() if k != "sequence_id"}}, 2000)
    point(2, "another", {"eval": reads()}, 3000)  # newer, another run's
    path, metrics = _run_metrics(export)
    assert path == newest
    problems = [str(p) for p in run_problems(metrics["evaluators"], uses_sequence_id=False)]
    assert len(problems) == 5 and all(p.startswith("error: --data: the run's evaluator '") for p in problems)
    assert ["mixed" in problems[0], "shuffles" in problems[1], "replication=2" in problems[2],
            "16 samples of the split's 64 (eval_loader.dataset.epoch_size" in problems[3],
            "holds no index.json now" in problems[4]] == [True] * 5
    # a record from before sequence ids were recorded, of a model that attends within documents: not sure, refused
    early = [str(p) for p in run_problems(metrics["evaluators"], uses_sequence_id=True)][5:]
    assert len(early) == 1 and "'early' ran before metrics.json recorded whether it gave" in early[0], early
    os.utime(newest, (500, 500))
    with pytest.raises(UserError, match="does not say what the run's evaluation read"):
        _run_metrics(export)  # the newest is now the start from before the record


def test_a_continuation_that_is_not_text_is_said_to_be_so_and_why():
    from train.sample import undecodable

    assert undecodable(["plain text", "more"], 257) is None
    assert "data=mock's byte-level tokenizer" in undecodable(["ab\ufffdc"], 257)
    assert "data=mock" not in undecodable(["ab\ufffdc"], 50368)


@pytest.mark.train
def test_a_run_given_its_data_by_a_relative_path_is_scored_on_that_data_from_anywhere(tmp_path, cli):
    """The data folder relative to where the run ran: metrics.json records the folder whole, so `train.evaluate
    RUN` run from elsewhere scores the samples the run evaluated (it read the path against its own folder: other
    data, or none, beside the run's number)."""
    here = tmp_path / "here"
    here.mkdir()
    run("-m", "train", "max_duration=10ba", "save_interval=10ba", "export=hf", "storage.data_local_root=data",
        root=tmp_path / "runs", cwd=here, check=True, env=OFFLINE)
    [metrics] = (tmp_path / "runs").rglob("metrics.json")
    [(_, reads)] = json.loads(metrics.read_text())["evaluators"].items()
    assert reads["streams"][0]["local"] == str(here / "data" / "mock-seq128"), reads
    name = metrics.parent.name
    own = json.loads(cli("train.evaluate", name, "--json", root=tmp_path / "runs", check=True,
                         env=OFFLINE).stdout.strip().splitlines()[-1])
    [(_, got)] = own["evaluators"].items()
    assert got["data"] == str(here / "data" / "mock-seq128" / "val"), got
    assert got["cross_entropy"] == pytest.approx(got["trainer"]["cross_entropy"], rel=1e-6)


@pytest.mark.train
def test_evaluation_settings_that_change_the_samples_read_are_rebuilt_or_refused_before_the_model_loads(tmp_path,
                                                                                                        cli):
    """eval_loader.drop_last with a batch size that does not divide the split (64 samples in batches of 10): the run
    evaluated 60, and `train.evaluate RUN` scores those 60 and the run's number. A resampled epoch
    (eval_loader.dataset.epoch_size=16) is refused by name before the model loads (both scored all 64, exit 0)."""
    common = ("max_duration=10ba", "save_interval=10ba", "export=hf", "device_eval_batch_size=10",
              "eval_subset_num_batches=-1")
    dropped = tmp_path / "dropped"
    run("-m", "train", *common, "eval_loader.drop_last=true", root=dropped, check=True, env=OFFLINE)
    [name] = [p.name for p in (dropped / "checkpoints").iterdir()]
    own = json.loads(cli("train.evaluate", name, "--json", root=dropped, check=True,
                         env=OFFLINE).stdout.strip().splitlines()[-1])
    [(_, got)] = own["evaluators"].items()
    assert got["samples"] == 60, got
    assert got["cross_entropy"] == pytest.approx(got["trainer"]["cross_entropy"], rel=1e-6)
    assert "all full batches of 10" in cli("train.evaluate", name, root=dropped, check=True, env=OFFLINE).stdout

    resampled = tmp_path / "resampled"
    run("-m", "train", *common, "+eval_loader.dataset.epoch_size=16", root=resampled, check=True, env=OFFLINE)
    [name] = [p.name for p in (resampled / "checkpoints").iterdir()]
    refused = cli("train.evaluate", name, root=resampled, check=2, env=OFFLINE)
    assert "read a resampled epoch of 16 samples of the split's 64 (eval_loader.dataset.epoch_size" \
        in refused.stderr, refused.stderr[-3000:]
    assert "Instantiating" not in refused.stderr and not refused.stdout  # before the model loads
