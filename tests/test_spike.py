"""A loss spike (kill_loss_spike, train/task/divergence.py's rule) and spike.action (train/task/spike.py): a JSON lines
dataset with a window of garbage documents, through `python -m data_prep` as a user makes it, read in order
(train_loader.dataset.shuffle=false), makes a real spike; rollback goes back to the checkpoint before it, skips the
batches of data that followed that checkpoint, trains on and records one intervention; past spike.max_rollbacks the
run stops non-zero with the command that continues it."""
import csv
import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from helpers import ROOT, made_once, run

pytestmark = pytest.mark.train

BATCH = 16  # mpt-tiny's global_train_batch_size; one document is one sample (127 characters and the end of text)
GARBAGE = range(21, 27)  # the batches (1-based) whose samples are garbage: 6 batches, samples 320 to 415
DRILL = "runs/spike-drill"  # where the drill writes, relative to where it runs
WINDOW = ("callbacks.kill_loss_spike.window_size=5", "callbacks.kill_loss_spike.patience=2")


def _poisoned(folder: Path) -> None:
    """The drill of docs/resume.md ("Loss spikes"), as printed there, run in `folder`: train, 1,200 documents of one
    repeated sentence, those of GARBAGE's batches random printable characters; val, the sentence. The default run's
    byte-level tokenizer (train/task/mock_data.py), one document per 128-token sample."""
    text = (ROOT / "docs" / "resume.md").read_text()
    block = re.search(r"## Loss spikes.*?```bash\n(.*?)```", text, re.S).group(1)
    code = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", block, re.S).group(1)
    env = {"PYTHONPATH": str(ROOT)}
    run("-c", code, cwd=folder, env=env, check=True)
    lines = [line for line in block.splitlines() if line.startswith("python -m data_prep ")]
    assert len(lines) == 2, block
    for line in lines:
        run(*shlex.split(line)[1:], cwd=folder, env=env, check=True, timeout=300)
    summary = json.loads((folder / DRILL / "mds" / "train" / "data_prep_summary.json").read_text())
    assert summary["samples"] == 1200, summary  # each document one sample: the garbage is where GARBAGE says
    garbage = [json.loads(x)["text"] for x in (folder / DRILL / "raw" / "train" / "part.jsonl").open()][
        (GARBAGE[0] - 1) * BATCH:GARBAGE[-1] * BATCH]
    assert all(" " not in g for g in garbage) and len(set(garbage)) == len(garbage)  # no sentence among them


@pytest.fixture
def data(tmp_path_factory) -> Path:
    return made_once(tmp_path_factory, "spike-data", _poisoned) / DRILL


def _args(data: Path, *extra: str) -> list:
    return ["data=mds", f"variables.data_local={data / 'mds'}", f"tokenizer.name={data / 'tokenizer'}",
            "train_loader.dataset.shuffle=false", "save_interval=5ba", "eval_interval=40ba", *WINDOW, *extra]


def _metrics(root: Path) -> dict:
    [found] = list((root / "outputs").rglob("metrics.json"))
    return json.loads(found.read_text())


def _sample_in_epoch(ckpt: Path) -> int:
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state"]
    return int(state["dataset_state"]["train"]["sample_in_epoch"])


def test_a_spike_rolls_back_skips_the_garbage_and_trains_on_to_where_the_loss_was(tmp_path, cli, data):
    """The garbage begins at batch 21; three outliers in a row (patience 2) find it at batch 23, before that
    batch's checkpoint. The newest checkpoint from before it is batch 20's: the run goes back to it, skips the next 6
    batches of data (samples 320-415: the garbage, exactly) and trains on to batch 40 without another spike."""
    proc = cli("train", *_args(data, "max_duration=40ba", "spike.action=rollback", "spike.skip_batches=6",
                                 "spike.lr_scale=0.5", "logger=mlflow"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    [warned] = [x for x in proc.stderr.splitlines() if x.startswith("WARNING: loss spike at batch")]
    assert "at batch 23 (" in warned and "since batch 21" in warned and "(batch 20)" in warned, warned
    m = _metrics(tmp_path)
    [i] = m["interventions"]
    assert (i["action"], i["batch"], i["since"], i["resumed_from"], i["skip_batches"]) == ("rollback", 23, 21, 20, 6)
    assert i["checkpoint"].endswith("ep0-ba20-rank0.pt") and i["skipped_samples"] == [320, 416], i
    assert i["loss"] > 3 * i["window_mean"]
    assert i["lr_scale"] == 0.5 and 0 < i["lr"] < 0.003 * 0.5, i  # mpt-tiny's optimizer.lr, halved at most
    losses = dict(m["train_loss"])
    assert sorted(losses) == list(range(1, 41))  # the batches of the first try after 20 are the history no more
    before = min(losses[b] for b in range(16, 21))
    assert max(losses[b] for b in range(21, 41)) < 3 * before, losses  # no garbage read after the rollback
    assert m["final_train_loss"] <= before, (m["final_train_loss"], before)  # back where it was, and lower
    folder = next((tmp_path / "checkpoints").iterdir())
    # the data position moved with the skip: composer writes it from the timestamp's count in the epoch
    assert _sample_in_epoch(folder / "ep0-ba25-rank0.pt") == (25 + 6) * BATCH
    assert _sample_in_epoch(folder / "ep0-ba20-rank0.pt") == 20 * BATCH
    # composer's loggers have it, in the run's one tracking run (MLflow's file store here: one file per metric)
    [runs] = {p.parent.parent.parent for p in (tmp_path / "outputs" / "mlruns").rglob("metrics/spike/resumed_from")}
    assert [p.parents[3] for p in (tmp_path / "outputs" / "mlruns").rglob("metrics/loss/train/total")] == [runs]
    steps = [int(line.split()[2]) for line in (runs / "metrics" / "loss" / "train" / "total").read_text().splitlines()]
    # (composer's step of a batch's loss is the batch before it): the first try's batches 21-23, then from 21 again
    assert steps == [*range(0, 23), *range(20, 40)], steps
    lrs = [(int(step), float(lr)) for _, lr, step in
           (line.split() for line in (runs / "metrics" / "lr-DecoupledAdamW" / "group0").read_text().splitlines())]
    first, then = (dict(lrs[:n]) for n in (23, None))  # the first try's, and with the later values over them
    # the learning rate after the rollback: lr_scale times the schedule's at the same batch
    assert [b for b, _ in lrs] == [*range(1, 24), *range(21, 41)]
    assert then[21] == pytest.approx(0.5 * first[21], rel=1e-6) and then[23] == pytest.approx(0.5 * first[23], rel=1e-6)
    assert (runs / "metrics" / "spike" / "resumed_from").read_text().split()[1] == "20.0"
    assert (runs / "metrics" / "spike" / "skip_batches").read_text().split()[1] == "6.0"
    parts = m["goodput_parts"]
    assert parts["rollbacks"] == 1 and parts["retrained_batches"] == 3, parts  # batches 21-23 trained twice


def test_past_spike_max_rollbacks_the_run_stops_printing_the_continue_from_command(tmp_path, cli, data):
    """A skip too short (1 batch) meets the garbage again after each rollback to batch 20: the second rollback to it
    skips the sum of the skips and scales the learning rate by the product of the scales; the third spike, past
    spike.max_rollbacks=2, stops the run non-zero, naming the limit and the command that continues it from batch 20
    under half the rate it last trained at (0.003 x 0.5 x 0.5, halved)."""
    proc = cli("train", *_args(data, "max_duration=30ba", "spike.action=rollback", "spike.skip_batches=1",
                                 "spike.max_rollbacks=2", "spike.lr_scale=0.5"))
    assert proc.returncode == 1, proc.stderr[-4000:]
    said = proc.stderr.splitlines()
    [at] = [n for n, line in enumerate(said) if line.startswith("error: ")]
    assert said[at].startswith("error: loss/train/total: the training loss is "), said[at]
    assert "it did not roll back: it rolled back 2 times already (spike.max_rollbacks=2)" in said[at], said[at]
    folder = next((tmp_path / "checkpoints").iterdir())
    assert "Traceback" not in proc.stderr and "final train loss" not in proc.stdout
    record = json.loads((folder / "spike.json").read_text())["interventions"]
    assert [(i["action"], i["batch"], i.get("resumed_from")) for i in record] == \
        [("rollback", 23, 20), ("rollback", 23, 20), ("stop", 23, None)], record
    assert [i["skipped_samples"] for i in record[:2]] == [[320, 336], [320, 352]]
    assert [i["base_lr"] for i in record[:2]] == [pytest.approx(0.003 * 0.5), pytest.approx(0.003 * 0.25)]
    assert record[1]["lr"] == pytest.approx(record[0]["lr"] / 2)  # the same batch of the schedule, scaled again
    assert said[at + 1].endswith(f"continue_from={folder.name}@ba20 optimizer.lr=0.000375"), said[at + 1]
    assert "(0.00075 -> 0.000375;" in said[at + 1]


def test_continuing_a_run_that_stopped_at_a_spike_by_its_name_skips_its_diverging_checkpoints(tmp_path, cli, data):
    """spike.action=stop with a checkpoint every batch: the spike found at batch 23 began at 21, and the run's
    checkpoints of batches 21 and 22 stay in its folder, holding diverging weights. continue_from=RUN (its name alone)
    goes on from batch 20, its newest from before the spike, and says so; its plan and its start agree. Asked by its
    batch, a diverging checkpoint is continued from, with a warning; that run diverges on, and its fix names the run
    continued's batch 20 (not "afresh": it has no good checkpoint of its own)."""
    stopped = cli("train", *_args(data, "max_duration=30ba", "save_interval=1ba"))
    assert stopped.returncode == 1, stopped.stderr[-4000:]
    folder = next((tmp_path / "checkpoints").iterdir())
    [i] = json.loads((folder / "spike.json").read_text())["interventions"]
    assert (i["action"], i["batch"], i["since"]) == ("stop", 23, 21), i
    assert (folder / "ep0-ba22-rank0.pt").is_file() and (folder / "ep0-ba21-rank0.pt").is_file()
    warned = (f"warning: continue_from: {folder.name}: continues from batch 20, its newest checkpoint from before its "
              "loss began to diverge at batch 21 (its spike.json); the later ones (21, 22) hold diverging weights")
    plan = cli("train", *_args(data, "max_duration=22ba", "optimizer.lr=0.001", f"continue_from={folder.name}",
                               "plan=true"), check=True)
    assert warned in plan.stdout + plan.stderr, plan.stdout + plan.stderr
    assert f"from {folder.name} at batch 20 (its newest checkpoint that verifies when it starts from before its loss " \
        "began to diverge at batch 21" in plan.stdout, plan.stdout
    asked = cli("train", *_args(data, "max_duration=24ba", f"continue_from={folder.name}@ba22", "plan=true"), check=True)
    assert f"continue_from: {folder.name}@ba22: its checkpoint of batch 22 was written after its loss began to " \
        "diverge at batch 21" in asked.stdout + asked.stderr and f"continue_from={folder.name}@ba20, its last " \
        "before then" in asked.stdout + asked.stderr
    # continued from a diverging one, it diverges on; its fix names the run continued's checkpoint from before
    diverged = cli("train", *_args(data, "max_duration=30ba", f"continue_from={folder.name}@ba22"))
    assert diverged.returncode == 1 and "the run diverged" in diverged.stderr, diverged.stderr[-4000:]
    assert f"to continue it from its last good checkpoint ({folder.name}@ba20)" in diverged.stderr, diverged.stderr
    went = cli("train", *_args(data, "max_duration=22ba", "optimizer.lr=0.001", f"continue_from={folder.name}"))
    assert went.returncode == 0, went.stderr[-4000:]
    assert warned in went.stderr and f"continuing {folder.name} from batch 20: " in went.stderr, went.stderr[-4000:]
    [child] = [f for f in (tmp_path / "checkpoints").iterdir() if f.name in went.stdout]
    assert json.loads((child / "identity.json").read_text())["continued_from"]["batch"] == 20


@pytest.mark.parametrize("fmt,written", [("sharded", "ep0-ba20"), ("full", "ep0-ba20-rank0.pt")])
def test_two_ranks_roll_back_together(tmp_path, cli, data, fmt, written):
    """Two ranks, either checkpoint format (a folder of shards; rank 0's one file, which each rank loads): both judge
    the same all-reduced loss, roll back to batch 20's checkpoint together and skip the same samples; the sweep's
    summary shows the intervention."""
    proc = cli("train", "-m", "cluster.tasks_per_node=2", f"checkpoint={fmt}",
               *_args(data, "max_duration=30ba", "spike.action=rollback", "spike.skip_batches=6"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = _metrics(tmp_path)
    [i] = m["interventions"]
    assert (i["batch"], i["resumed_from"], i["skipped_samples"]) == (23, 20, [320, 416]), i
    assert Path(i["checkpoint"]).name == written and m["world_size"] == 2
    assert max(loss for b, loss in m["train_loss"] if b > 20) < 3 * min(loss for b, loss in m["train_loss"] if b <= 20)
    [row] = csv.DictReader(next(tmp_path.glob("outputs/sweeps/*/summary.csv")).open())
    assert row["state"] == "COMPLETED" and row["interventions"] == "1", row
    assert row["spikes"].startswith("rollback at batch 23 (loss "), row
    assert "to batch 20, 6 batches skipped" in row["spikes"], row
    status = cli("train.status", check=True)  # the newest sweep's table
    [head] = [line for line in status.stdout.splitlines() if "interventions" in line]
    [point] = [line for line in status.stdout.splitlines() if "COMPLETED" in line]
    assert point.split("|")[head.split("|").index(" interventions ")].strip() == "1", status.stdout


def test_kill_loss_spike_is_llm_foundrys_callback_deciding_on_every_rank_alike():
    """The callback llm-foundry builds for `kill_loss_spike` is its own class, adapted (common/compat.py): the
    project's keys and defaults, the rule of train/task/divergence.py, its state through checkpoints."""
    from llmfoundry.callbacks import KillLossSpike
    from llmfoundry.registry import callbacks

    from common import compat
    from train.task.spike import SpikeRule

    adapted = compat.patch_llmfoundry_kill_loss_spike(SpikeRule)
    assert callbacks.get("kill_loss_spike") is adapted and issubclass(adapted, KillLossSpike)
    assert compat.patch_llmfoundry_kill_loss_spike(SpikeRule) is adapted  # once
    cb = adapted(window_size=2, patience=0, outlier_multiplier=3.0, loss_cap=None, log_only=False)
    for batch, loss in enumerate([6.0, 5.0, 4.0], 1):
        assert not cb.rule.feed(batch, loss)
    saved = cb.state_dict()
    again = adapted(window_size=2, patience=0)
    again.load_state_dict(saved)
    assert again.rule.reference == pytest.approx(4.5) and again.rule.feed(4, 14.0)


def test_a_slurm_job_requeued_in_the_middle_of_a_rollback_finishes_it_once(slurm, tmp_path, data):
    """A Slurm job requeued (`scontrol requeue`, as a preemption) as soon as its rollback is recorded, before the
    trainer rolled back to batch 20 wrote a checkpoint: the next allocation resumes from batch 20, skips the same
    samples again, trains on to the end, and the run records one intervention, not two, and no second spike."""
    import subprocess

    from helpers import job_log, requeue_once_written, start

    out = (tmp_path / "sweep.log").open("w")
    proc = start("-m", "train", "-m", "cluster=slurm-local", "cluster.tasks_per_node=1", "cluster.wait=true",
                 *_args(data, "max_duration=30ba", "spike.action=rollback", "spike.skip_batches=6"),
                 root=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        requeue_once_written(tmp_path, "checkpoints/*/spike.json", proc, tmp_path / "sweep.log", within=600)
        proc.wait(timeout=900)
    finally:
        proc.kill()
    assert proc.returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    [row] = csv.DictReader(next(tmp_path.glob("outputs/sweeps/*/summary.csv")).open())
    assert row["state"] == "COMPLETED" and row["interventions"] == "1" and int(row["requeues"]) >= 1, row
    log = job_log(row)
    assert log.count("Starting with JobEnvironment") == 2, log[-3000:]
    assert log.count("WARNING: loss spike at batch 23") == 1, log[-3000:]
    # the allocation after the requeue loaded batch 20 and skipped the garbage again (its first start may have
    # been requeued before or after it did)
    assert 1 <= log.count("rolled back to batch 20 (") <= 2, log[-3000:]
    assert [Path(p).name for p in re.findall(r"resuming from (/\S+)", log)][-1] == "ep0-ba20-rank0.pt", log[-3000:]
    m = _metrics(tmp_path)
    [i] = m["interventions"]
    assert (i["batch"], i["resumed_from"], i["skipped_samples"]) == (23, 20, [320, 416]), i
    losses = dict(m["train_loss"])
    assert sorted(losses) == list(range(1, 31))
    assert max(losses[b] for b in range(21, 31)) < 3 * min(losses[b] for b in range(16, 21)), losses
    folder = next((tmp_path / "checkpoints").iterdir())
    assert _sample_in_epoch(folder / "ep0-ba25-rank0.pt") == (25 + 6) * BATCH


def test_a_start_after_a_kill_between_the_record_and_the_moves_finishes_the_rollback(tmp_path):
    """spike.json is written before anything moves: a start that finds a rollback recorded and not carried out sets
    aside the checkpoints after its point (kept, not deleted) before it chooses one, once."""
    from train.checkpoint import resume
    from train.task import interventions, spike

    for batch in (10, 15, 20):
        (tmp_path / f"ep0-ba{batch}-rank0.pt").write_bytes(b"x")
    interventions.write(tmp_path, [{"action": "rollback", "batch": 17, "resumed_from": 10, "skip_batches": 6,
                                    "lr_scale": 1.0, "pending": True}])
    spike.finish_pending(tmp_path)
    assert [c.batch for c in resume.find(tmp_path)] == [10]
    assert sorted(p.name.split(".pt")[0] for p in (tmp_path / resume.SET_ASIDE).iterdir()) == ["ep0-ba15-rank0",
                                                                                             "ep0-ba20-rank0"]
    [entry] = interventions.read(tmp_path)
    assert entry["pending"] is False and len(interventions.rollbacks(interventions.read(tmp_path))) == 1
    (tmp_path / "ep0-ba25-rank0.pt").write_bytes(b"x")  # trained after the rollback: the run's own, kept
    spike.finish_pending(tmp_path)
    assert [c.batch for c in resume.find(tmp_path)] == [10, 25]


def test_spike_settings_are_checked_before_anything_starts_all_at_once(tmp_path, cli):
    typed = cli("train", "spike.max_rollbacks=1.5", "plan=json", check=2)  # the schema's, at composition
    assert typed.stderr.startswith("error: spike.max_rollbacks: 1.5 is not a whole number"), typed.stderr[-2000:]
    ok = cli("train", "spike.action=rollback", "checkpoint=none", "plan=json", check=2)
    assert "error: spike.action: is rollback, but the run writes no checkpoints (checkpoint=none) to roll back to" \
        in ok.stderr, ok.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # a refused look writes nothing
    remote = cli("train", "spike.action=rollback", "save_folder=s3://bucket/ckpt", "plan=json", check=2)
    assert "error: spike.action: is rollback, but save_folder s3://bucket/ckpt is in an object store" \
        in remote.stderr, remote.stderr[-2000:]
    assert cli("train", "save_folder=s3://bucket/ckpt", "plan=json", check=True).returncode == 0  # stop: no folder read
    neg = cli("train", "spike.skip_batches=-1", "spike.lr_scale=0", "plan=json", check=2)
    assert "error: spike.skip_batches: must be a whole number, 0 or more, got -1" in neg.stderr
    assert "error: spike.lr_scale: must be a number above 0 and at most 1" in neg.stderr


def test_a_run_killed_after_its_rollback_samples_from_no_export_of_the_training_gone_back(tmp_path, cli, data):
    """export=hf every batch: the first try exported batches 21-22 before the spike at 23. The rollback sets them
    aside with the checkpoints after batch 20 (kept under huggingface/set-aside/), so a run killed after it samples
    and evaluates from an export of its own training (it was batch 22's of the abandoned one, exit 0)."""
    from helpers import start, stop

    out = (tmp_path / "train.log").open("w")
    proc = start("-m", "train", *_args(data, "max_duration=40ba", "spike.action=rollback", "spike.skip_batches=6",
                                       "export=hf", "export.interval=1ba"), root=tmp_path,
                 stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        # the rollback's moves are done once its record says so (pending: false)
        while not [i for p in tmp_path.glob("checkpoints/*/spike.json")
                   for i in json.loads(p.read_text() or "{}").get("interventions", []) if i.get("pending") is False]:
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "train.log").read_text()[-3000:]
            time.sleep(0.05)
    finally:
        stop(proc)
        proc.wait()
    [save] = (tmp_path / "checkpoints").iterdir()
    hf = tmp_path / "outputs" / save.name / "huggingface"
    said = cli("train.sample", save.name, "the cat", "--max-new-tokens=4", check=True,
               env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    [folder] = re.findall(r"sampling from (\S+)", said.stderr)
    assert Path(folder).parent == hf and int(Path(folder).name[2:]) <= 21, said.stderr[-3000:]
    aside = {p.name.split(".")[0]: p for p in (hf / "set-aside").iterdir()}
    assert set(aside) >= {"ba21", "ba22"}, aside
    # left in place (a run rolled back before its exports were set aside): passed over, named, as older than it
    aside["ba22"].rename(hf / "ba22")
    said = cli("train.sample", save.name, "the cat", "--max-new-tokens=4", check=True,
               env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert f"{hf / 'ba22'}: of a training since rolled back over a loss spike" in said.stderr, said.stderr[-3000:]
    assert re.findall(r"sampling from (\S+)", said.stderr) == [folder], said.stderr[-3000:]
