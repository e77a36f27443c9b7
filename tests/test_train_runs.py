"""Real training runs on CPU through llm-foundry: tiny model, few steps, the real code paths."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import C4, PYTHON, ROOT, TOKENIZER, finished, kill_run, need_shared, start, train_here

pytestmark = pytest.mark.train  # the tier (pyproject.toml markers)


def metrics(root: Path) -> dict:
    [path] = (root / "outputs").rglob("metrics.json")
    return json.loads(path.read_text())


def test_default_run_trains_evaluates_checkpoints_and_plots(tmp_path, cli):
    proc = cli("train", check=True)
    m = metrics(tmp_path)
    losses = [loss for _, loss in m["train_loss"]]
    assert m["batches"] == 40 and len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses  # it learns
    assert m["final_eval"]["eval/LanguageCrossEntropy"] < losses[0]
    # tokens/s over the batches (as the progress lines) above the wall clock's, which holds the evaluation at batch
    # 20 and three checkpoints; no MFU without a known peak (CPU)
    assert m["tokens_per_sec"] > m["wall_tokens_per_sec"] > 0 and m["mfu"] is None
    [ckpt_dir] = (tmp_path / "checkpoints").iterdir()
    assert (ckpt_dir / "ep0-ba40-rank0.pt").is_file()
    png = next((tmp_path / "outputs").rglob("loss_curve.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for shown in (str(ckpt_dir), str(png)):  # it says where things are: the answer, on stdout
        assert shown in proc.stdout
    # messages on stderr and in the run's own log file (Hydra's job log)
    [job_log] = (tmp_path / "outputs").rglob("__main__.log")
    # one screen: this tool's messages on the console; the libraries' (llm-foundry's resolved config, its notes,
    # Python's and transformers' warnings) in the log file alone
    assert len((proc.stdout + proc.stderr).strip().splitlines()) <= 30, proc.stdout + proc.stderr
    assert "Building trainer" not in proc.stderr and "UserWarning" not in proc.stderr
    assert "GenerationMixin" not in proc.stderr and "run_name:" not in proc.stderr
    logged = job_log.read_text()
    assert "[llmfoundry.command_utils.train][INFO] - Starting training..." in logged
    assert "[llmfoundry.config][INFO] - run_name: " in logged and "[py.warnings][WARNING]" in logged
    assert "[transformers.modeling_utils][WARNING] - MPTForCausalLM has generative capabilities" in logged
    # rounded for a person; metrics.json holds every number whole
    rounded = float(format(m["final_train_loss"], ".3g"))
    assert proc.stdout.strip().startswith(f"final train loss {rounded}, eval {{'eval/LanguageCrossEntropy': "), proc.stdout
    # progress: one line per console_log_interval (10ba), no bar, none of composer's console metrics blocks
    progress = [line for line in proc.stderr.splitlines() if "[progress] step" in line]
    assert [line.split("[progress] ")[1].split(",")[0] for line in progress] == \
        ["step 10/40", "step 20/40", "step 30/40", "step 40/40"], proc.stderr[-3000:]
    assert all(re.search(r", loss \d+\.\d{4}, [\d,]+ tokens/s, ETA \d+:\d\d:\d\d$", line) for line in progress), progress
    assert progress[-1].endswith("ETA 0:00:00") and "MFU" not in progress[0]  # no peak FLOP/s known on CPU
    # each line's loss: the mean over its batches, the first line's from batch 1 (it left batch 1 out)
    history = [loss for _, loss in metrics(tmp_path)["train_loss"]]
    assert [line.split("loss ")[1].split(",")[0] for line in progress] == \
        [f"{sum(history[i:i + 10]) / 10:.4f}" for i in (0, 10, 20, 30)]
    evals = [line for line in proc.stderr.splitlines() if "[progress] eval at step" in line]
    assert [line.split("eval at ")[1].split(":")[0] for line in evals] == ["step 20/40", "step 40/40"]
    assert "Train loss/train/total" not in proc.stderr and "ba/s" not in proc.stderr
    assert "[train.task.run_report][INFO] - [progress] step 40/40" in job_log.read_text()
    assert "[progress]" not in proc.stdout  # stdout holds only the answer: the final report, not llm-foundry's config
    assert [line.split(" ")[0] for line in proc.stdout.strip().splitlines()] == [
        "final", "checkpoints:", "loss", "metrics:"], proc.stdout[-2000:]


def test_python_log_level_shows_the_libraries_messages_on_the_console_and_the_log_file_keeps_all(tmp_path, cli):
    """llm-foundry's own switch for its messages: the console shows the libraries' messages of that level too (its
    `logging.basicConfig(force=True)` replaced the run's handlers: its log file stopped at the trainer's start)."""
    proc = cli("train", "python_log_level=info", "max_duration=2ba", "eval_interval=2ba", "checkpoint=none",
               check=True)
    assert "INFO: Building trainer..." in proc.stderr and "run_name: " in proc.stderr, proc.stderr[-3000:]
    [job_log] = (tmp_path / "outputs").rglob("__main__.log")
    assert "[train.task.run_report][INFO] - [progress] step 2/2" in job_log.read_text()


def test_the_loss_curve_is_drawn_at_each_checkpoint_of_a_running_job(tmp_path):
    """Killed right after its first checkpoint (a job that never reaches its end): its picture is there."""
    proc = start("-m", "train", "max_duration=40ba", "save_interval=4ba", "eval_interval=40ba", "checkpoint=full",
                 root=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:  # composer points its `latest` link at a checkpoint once it is written
        while not any(p.is_symlink() for p in tmp_path.glob("checkpoints/*/latest-rank0.pt")):
            assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.02)
    finally:
        kill_run(proc, tmp_path)
    [png] = (tmp_path / "outputs").rglob("loss_curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "outputs").rglob("metrics.json"))  # the run did not reach its end
    assert not list(png.parent.glob(".loss_curve.png.tmp-*"))  # written whole, under a temporary name first


def _c4_mds(folder: Path) -> Path:
    """Real C4 documents tokenized with the real tokenizer, written as MDS token samples."""
    import gzip

    import numpy as np
    from streaming import MDSWriter
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    for split, name in (("train", "c4-train.00000-of-01024.first1000.json.gz"),
                        ("val", "c4-train.sample2.1000.json.gz")):
        docs = [json.loads(line)["text"] for line in gzip.open(C4 / name, "rt")][:200]
        ids = np.concatenate([np.array(e.ids + [0], dtype=np.int32) for e in tok.encode_batch(docs)])
        with MDSWriter(out=str(folder / split), columns={"tokens": "ndarray:int32"}) as w:
            for row in ids[: len(ids) // 128 * 128].reshape(-1, 128):
                w.write({"tokens": row})
    return folder


def test_trains_on_real_c4_with_the_real_tokenizer(tmp_path):
    need_shared()
    data = _c4_mds(tmp_path / "c4")
    train_here("data=c4", f"variables.data_local={data}", f"tokenizer.name={TOKENIZER}",
               "max_duration=8ba", "eval_interval=8ba", "checkpoint=none", root=tmp_path, check=True)
    m = metrics(tmp_path)
    assert m["batches"] == 8
    assert m["train_loss"][-1][1] < m["train_loss"][0][1]
    assert 0 < m["final_eval"]["eval/LanguageCrossEntropy"] < 11.0  # below ln(50368): it learned something


def test_two_local_processes_fsdp2_write_a_sharded_checkpoint(tmp_path_factory):
    root = finished(2, "sharded", tmp_path_factory)  # `-m cluster.tasks_per_node=2 checkpoint=sharded` (helpers.py)
    m = metrics(root)
    assert m["world_size"] == 2 and m["batches"] == 40
    [ckpt_dir] = (root / "checkpoints").iterdir()
    shards = sorted(p.name for p in (ckpt_dir / "ep0-ba40").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert os.readlink(ckpt_dir / "latest-sharded-rank0") == "ep0-ba40"
    assert (ckpt_dir / "ep0-ba40.manifest.json").is_file()


def test_cfg_job_and_help_do_not_import_torch_or_llm_foundry():
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch', 'llmfoundry', 'composer', "
             "'streaming') if m in sys.modules)))\n"
             "sys.argv = ['train'] + sys.argv[1:]\n"
             "runpy.run_module('train', run_name='__main__')\n")
    for flags, answer in ((["--cfg", "job"], "model:\n  name: mpt_causal_lm"), (["--help"], "== Config groups ==")):
        out = subprocess.run([str(PYTHON), "-c", probe, *flags], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "HEAVY []" in out.stdout and answer in out.stdout, out.stdout[-1500:]


def test_paths_relative_to_the_working_directory_hold_inside_a_job(tmp_path, cli):
    """A job's task leaves the working directory for a node-local scratch folder (ranks of a node sync through
    files there), removed at its end. A relative icl_tasks file and the relative dataset_uri in it (llm-foundry opens
    both from the working directory) failed the job with FileNotFoundError after the queue; the Hugging Face folders
    of a relative storage.output_root were written into the scratch folder and removed with it, exit 0. All are made
    absolute before the task leaves."""
    work = tmp_path / "work"
    (work / "tasks").mkdir(parents=True)
    (work / "tasks" / "lm.jsonl").write_text(json.dumps({"context": "the cat sat on the", "continuation": " mat"})
                                             + "\n")
    (work / "tasks" / "tasks.yaml").write_text("icl_tasks:\n- {label: lm, dataset_uri: tasks/lm.jsonl, "
                                               "icl_task_type: language_modeling, num_fewshot: [0]}\n")
    cli("train", "-m", "max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "progress_bar=false",
        "+icl_tasks=tasks/tasks.yaml", "export=hf", "storage.output_root=out", cwd=work, check=True)
    [found] = (work / "out").rglob("metrics.json")
    assert "lm/0-shot/InContextLearningLMAccuracy" in json.loads(found.read_text())["final_eval"]
    [exported] = (work / "out").glob("*/huggingface/ba2")
    assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))


def test_an_export_named_by_the_run_is_where_the_plan_says_and_a_finished_run_with_it_is_not_told_nothing_is_exported(
        tmp_path):
    """llm-foundry's hf_checkpointer writes huggingface/<huggingface_folder_name> ({batch} and {run_name} filled in,
    `ba{batch}` by default). The plan showed {run_name} unfilled, and the same command again after the run finished
    warned "Nothing is exported" beside an export named otherwise than ba{B} (exit 0, pointing at a needless
    train.export). Where no folder of that name is there, the warning stays."""
    args = ("max_duration=4ba", "save_interval=4ba", "eval_interval=4ba", "progress_bar=false", "run_name=named",
            "export=hf")
    name = 'callbacks.hf_checkpointer.huggingface_folder_name="{run_name}-step{batch}"'
    planned = json.loads(train_here(*args, name, "plan=json", root=tmp_path, check=True).stdout)["export_folder"]
    assert planned == str(tmp_path / "outputs" / "named" / "huggingface" / "named-step{B}")
    train_here(*args, name, root=tmp_path, check=True)
    written = list((tmp_path / "outputs" / "named" / "huggingface").iterdir())
    assert written == [Path(planned.replace("{B}", "4"))] and (written[0] / "config.json").is_file()
    again = train_here(*args, name, root=tmp_path, check=True)
    assert "already trained to max_duration=4ba" in again.stderr, again.stderr[-3000:]
    assert "Nothing is exported" not in again.stderr, again.stderr[-3000:]
    other = train_here(*args, 'callbacks.hf_checkpointer.huggingface_folder_name="step{batch}"', root=tmp_path,
                       check=True)
    assert "Nothing is exported either" in other.stderr, other.stderr[-3000:]


def test_every_relative_path_of_the_config_is_absolute_before_the_task_leaves_the_working_directory(
        tmp_path, monkeypatch):
    """The key list behind the job above, key by key (the job covers two of them end to end): each relative path a
    config holds is made absolute against the working directory the command ran in; URIs, absolute paths and a hub
    tokenizer name stay as they are."""
    from omegaconf import OmegaConf

    from train.task.main import _node_local_cwd

    work = tmp_path / "work"
    (work / "tok").mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    rel = {"save_folder": "ckpt", "load_path": "old/ep0-ba10-rank0.pt", "variables.data_local": "data",
           "variables.data_remote": "mirror", "eval_gauntlet": "g.yaml",
           "callbacks.hf_checkpointer.save_folder": "out/hf", "train_loader.dataset.local": "cache/train",
           "train_loader.dataset.remote": "mds/c4", "eval_loader.dataset.local": "cache/val",
           "eval_loader.dataset.remote": "mds/c4-val", "tokenizer.name": "tok"}
    kept = {"tokenizer.name": "EleutherAI/gpt-neox-20b", "train_loader.dataset.remote": "s3://bucket/c4",
            "eval_loader.dataset.remote": str(tmp_path / "val")}
    for values, expect in ((rel, {k: str(work / v) for k, v in rel.items()}), (kept, kept)):
        cfg = OmegaConf.create({})
        for key, val in values.items():
            OmegaConf.update(cfg, key, val, force_add=True)
        OmegaConf.update(cfg, "eval_loader.name", "text", force_add=True)
        OmegaConf.update(cfg, "train_loader.name", "text", force_add=True)
        monkeypatch.chdir(work)
        _node_local_cwd(cfg, {"MASTER_PORT": "29500", "NODE_RANK": "0", "LOCAL_RANK": "1"})
        assert {k: OmegaConf.select(cfg, k) for k in values} == expect
        assert Path.cwd().parent == tmp_path / "scratch"  # left for the node's own folder


@pytest.mark.torch
def test_composers_record_names_the_cpu_as_py_cpuinfo_does_without_its_process(monkeypatch):
    """The task reads the CPU's name for composer's environment record from /proc/cpuinfo (common/compat.py):
    the name py-cpuinfo's probe process gives, and no process started for it."""
    import subprocess as sp

    import cpuinfo
    from composer.utils import collect_env

    from common.compat import patch_composer_cpu_model_from_proc

    want = str(cpuinfo.get_cpu_info().get("brand_raw", "CPU"))
    monkeypatch.setattr(collect_env, "get_cpu_model", collect_env.get_cpu_model)  # restored after the test
    patch_composer_cpu_model_from_proc()

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process started: {args}")

    monkeypatch.setattr(sp, "Popen", no_process)
    assert collect_env.get_composer_env_dict()["cpu_model"] == want


@pytest.mark.torch
def test_mpt_is_known_to_be_no_registered_causal_lm_without_importing_them_all(monkeypatch):
    """composer's question (is the model one of transformers' registered causal LMs?) answered for MPT without
    its scan of every registered class (common/compat.py): the answer composer's own scan gives, and other
    models still asked as composer asks."""
    from composer.models import huggingface
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.auto import modeling_auto

    from common.compat import patch_composer_skip_causal_lm_registry_scan

    mpt = MPTForCausalLM(MPTConfig(d_model=16, n_heads=2, n_layers=1, max_seq_len=8, vocab_size=32))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_head=2, n_layer=1, n_positions=8, vocab_size=32))
    composers = huggingface._is_registered_causal_lm
    assert composers(mpt) is False and composers(gpt2) is True  # composer's scan
    monkeypatch.setattr(huggingface, "_is_registered_causal_lm", composers)  # restored after the test
    patch_composer_skip_causal_lm_registry_scan()
    assert huggingface._is_registered_causal_lm(gpt2) is True
    monkeypatch.setattr(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING.__class__, "values",
                        lambda self: pytest.fail("scanned every registered causal LM"))
    assert huggingface._is_registered_causal_lm(mpt) is False


def test_a_training_in_the_test_process_leaves_the_process_as_it_was(tmp_path):
    """helpers.train_here, which the one-rank training tests use: the run trains as the command does (its files,
    its answer on stdout, its messages on stderr and in its log file), and afterwards the test process is as it
    was: no thread of the run alive (streaming's prefetching threads outlived a training stopped mid-epoch,
    polling until the process exited), no process group, the environment, working directory, umask and root
    logger's handlers as before."""
    import logging
    import threading

    env, cwd, handlers = dict(os.environ), os.getcwd(), list(logging.getLogger().handlers)
    umask = os.umask(0o022)
    os.umask(umask)
    threads = set(threading.enumerate())
    proc = train_here("max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "progress_bar=false",
                      root=tmp_path, check=True)
    assert proc.stdout.strip().startswith("final train loss ") and "[progress] step 2/2" in proc.stderr
    [job_log] = (tmp_path / "outputs").rglob("__main__.log")
    assert "[llmfoundry.command_utils.train][INFO] - Starting training..." in job_log.read_text()
    assert (tmp_path / "outputs").stat().st_mode & 0o007 == 0  # the command's umask

    import torch.distributed as torch_dist

    assert not [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not torch_dist.is_initialized()
    assert dict(os.environ) == env and os.getcwd() == cwd and logging.getLogger().handlers == handlers
    assert os.umask(umask) == umask
