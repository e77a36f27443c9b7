"""Exit 0 means the result is right; otherwise the run stops loudly, naming what and where. Real runs of the tiny
model on CPU (one process, or 2 ranks over gloo through `-m`), real small file systems (tmpfs, mounted here as
root) filled while a run trains:

- the reported evaluation is the last one (composer evaluates once more after FIT_END), of each evaluator;
- a non-finite loss stops the run at that step, before its checkpoint (1 rank, and a 2-rank sweep: FAILED);
- so does a finite one that stays far above where it was (lr=100: 1e7 at batch 17, exit 0 before), and an
  evaluation whose perplexity is inf of a finite cross-entropy;
- a full checkpoint file system is one error naming the folder, the bytes needed and free, and the fix; after
  making room the same command resumes exactly (1 and 2 ranks);
- a full outputs file system never stops training: the loss curve and progress files warn; metrics.json, which
  the result is read from, is one clear error.
"""
import csv
import errno
import json
import math
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import finished, kill_run, run, start, train_command, train_here, training

pytestmark = pytest.mark.train


def shown(number: float) -> float:
    """A number as the run's final line prints it (three significant digits; metrics.json holds it whole)."""
    return float(format(number, ".3g"))


def metrics(root: Path) -> dict:
    return json.loads(max((root / "outputs").rglob("metrics.json"), key=lambda p: p.stat().st_mtime).read_text())


def test_the_reported_evaluation_is_the_last_one(tmp_path):
    """max_duration=5ba, eval_interval=3ba: evaluations at 3 and at the end (5); the result is the one at 5."""
    proc = train_here("max_duration=5ba", "eval_interval=3ba", "save_interval=5ba", root=tmp_path, check=True)
    got = metrics(tmp_path)
    assert [b for b, _ in got["eval"]] == [3, 5]
    assert got["final_eval"] == got["eval"][-1][1] != got["eval"][0][1]
    logged = [line for line in proc.stderr.splitlines() if "[progress] eval at step 5/5" in line]
    assert len(logged) == 1 and f"{got['final_eval']['eval/LanguageCrossEntropy']:.4f}" in logged[0]
    assert f"'eval/LanguageCrossEntropy': {shown(got['final_eval']['eval/LanguageCrossEntropy'])}" in proc.stdout


def _killed_in_the_final_evaluation(args: list, root: Path) -> Path:
    """`python -m train ARGS` killed in the evaluation composer runs after the final checkpoint (as soon as
    metrics.json appears, at FIT_END); its save folder."""
    proc = start(*args, root=root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list((root / "outputs").rglob("metrics.json")):
        assert proc.poll() is None and time.time() < deadline, "the run ended before its final evaluation"
        time.sleep(0.02)
    kill_run(proc, root)
    [folder] = (root / "checkpoints").iterdir()
    return folder


def test_a_kill_during_the_final_evaluation_of_a_run_with_one_checkpoint_trains_it_again(tmp_path):
    """The final checkpoint the run's only one (save_interval past max_duration, as the presets' default for short
    runs): the rerun resumed from it with nothing to train and printed the evaluation at 15 as the final one, exit 0,
    on every rerun (finished.json never written). It now trains the run again from batch 0 and evaluates at the end."""
    args = ["-m", "train", "max_duration=20ba", "scheduler.t_warmup=4ba", "eval_interval=15ba", "save_interval=1000ba",
            "device_eval_batch_size=1", "eval_subset_num_batches=-1", "progress_bar=false"]
    folder = _killed_in_the_final_evaluation(args, tmp_path)
    assert sorted(p.name for p in folder.glob("ep*")) == ["ep0-ba20-rank0.pt", "ep0-ba20-rank0.pt.manifest.json"]
    again = training(*args, root=tmp_path, check=True)
    assert "no checkpoint came before it, so the run trains its 20 batches again from batch 0" in again.stderr
    got = metrics(tmp_path)
    assert got["batches"] == 20 and [b for b, _ in got["eval"]] == [15, 20] and got["final_eval"] == got["eval"][-1][1]
    assert (folder / "finished.json").is_file()
    assert "nothing to do" in training(*args, root=tmp_path, check=True).stderr


@pytest.mark.parametrize("duration,warmup", [("20ba", "4ba"), ("40960tok", "8192tok")])  # 16 x 128 tokens a batch
def test_a_kill_during_the_final_evaluation_is_followed_by_a_rerun_that_reports_the_final_evaluation(
        tmp_path, duration, warmup):
    """max_duration=20ba, eval_interval=15ba: composer writes the final checkpoint (batch 20), then metrics.json at
    FIT_END, then evaluates at 20. Killed in that evaluation (as soon as metrics.json appears; batch size 1 over
    the whole validation split makes it last), the same command again found the final checkpoint, had nothing to
    train, and reported the evaluation at 15 as the final one, exit 0. It now sets that checkpoint aside, trains
    batches 11-20 again from the one before, and evaluates at the end. In tokens too (the final checkpoint was
    told by a max_duration in batches only: 40960tok reported the evaluation at 15, on every rerun)."""
    args = ["-m", "train", f"max_duration={duration}", f"scheduler.t_warmup={warmup}", "eval_interval=15ba",
            "save_interval=10ba", "device_eval_batch_size=1", "eval_subset_num_batches=-1", "progress_bar=false"]
    folder = _killed_in_the_final_evaluation(args, tmp_path)
    assert (folder / "ep0-ba20-rank0.pt").is_file() and not (folder / "finished.json").exists()
    assert [b for b, _ in metrics(tmp_path)["eval"]] == [15]  # killed in the evaluation at 20

    again = training(*args, root=tmp_path, check=True)
    assert "nothing to do" not in again.stderr
    assert "ep0-ba20-rank0.pt cannot be resumed from: it is the final one (batch 20) of a run that stopped " \
        "before its end" in again.stderr
    assert f"resuming from {folder / 'ep0-ba10-rank0.pt'}" in again.stderr
    got = metrics(tmp_path)
    assert got["batches"] == 20 and [b for b, _ in got["eval"]] == [15, 20]
    assert got["final_eval"] == got["eval"][-1][1]
    assert f"'eval/LanguageCrossEntropy': {shown(got['final_eval']['eval/LanguageCrossEntropy'])}" in again.stdout
    assert (folder / "finished.json").is_file() and [p.name.split(".")[0] for p in (folder / "set-aside").iterdir()
                                                     if not p.name.endswith(".json")] == ["ep0-ba20-rank0"]
    # and once finished, the same command has nothing to do, nor the same length in batches (it set the final
    # checkpoint aside and trained its last batches again: finished.json's 40960tok was not read as 20 batches)
    assert "nothing to do" in training(*args, root=tmp_path, check=True).stderr
    same = training("-m", "train", f"run_name={folder.name}", "max_duration=20ba", "scheduler.t_warmup=4ba",
               "eval_interval=15ba", "save_interval=10ba", "progress_bar=false", root=tmp_path, check=True)
    assert "nothing to do" in same.stderr and "cannot be resumed from" not in same.stderr
    if duration.endswith("tok"):
        # continued to twice the tokens at twice the batch size: 81920tok is 20 batches of 32 x 128, the batch of
        # the final checkpoint, and finished.json's 40960tok read at this batch size 10: that finished checkpoint
        # was set aside as the end of a run stopped before it, and batches 11-20 trained again, exit 0. Its
        # manifest says where it stands in tokens, finished.json the batch the run ended at.
        longer = training("-m", "train", f"run_name={folder.name}", "max_duration=81920tok", "scheduler.t_warmup=8192tok",
                     "global_train_batch_size=32", "eval_interval=15ba", "save_interval=10ba", "progress_bar=false",
                     root=tmp_path, check=True)
        assert "cannot be resumed from" not in longer.stderr, longer.stderr[-3000:]
        assert f"resuming from {folder / 'ep0-ba20-rank0.pt'}" in longer.stderr
        assert metrics(tmp_path)["batches"] == 30  # 20 x 16 x 128 + 10 x 32 x 128 = 81920 tokens


def test_a_kill_during_the_final_evaluation_of_a_run_in_epochs_trains_its_last_batches_again(tmp_path):
    """max_duration=1ep (20 batches of 320 samples): the final checkpoint ep1-ba20 was not told in batches, so the
    rerun resumed from it, had nothing to train and printed the evaluation at 15 as the final one, exit 0, on every
    rerun. Its manifest records the epochs done: set aside, batches 17-20 trained again from the one before, and
    the evaluation at the end reported."""
    args = ["-m", "train", "max_duration=1ep", "data.train_samples=320", f"storage.data_local_root={tmp_path / 'data'}",
            "scheduler.t_warmup=4ba", "eval_interval=15ba", "save_interval=8ba", "device_eval_batch_size=1",
            "eval_subset_num_batches=-1", "progress_bar=false"]
    folder = _killed_in_the_final_evaluation(args, tmp_path)
    assert (folder / "ep1-ba20-rank0.pt").is_file() and not (folder / "finished.json").exists()
    again = training(*args, root=tmp_path, check=True)
    assert "nothing to do" not in again.stderr
    assert "ep1-ba20-rank0.pt cannot be resumed from: it is the final one (batch 20)" in again.stderr
    assert f"resuming from {folder / 'ep0-ba16-rank0.pt'}" in again.stderr
    got = metrics(tmp_path)
    assert got["batches"] == 20 and [b for b, _ in got["eval"]] == [15, 20] and got["final_eval"] == got["eval"][-1][1]
    assert f"'eval/LanguageCrossEntropy': {shown(got['final_eval']['eval/LanguageCrossEntropy'])}" in again.stdout
    assert (folder / "finished.json").is_file()
    assert "nothing to do" in training(*args, root=tmp_path, check=True).stderr


def test_with_several_evaluators_each_ones_last_evaluation_is_reported(tmp_path):
    """llm-foundry's eval_loaders (two labelled evaluators; b shuffles, so their numbers differ): composer ends an
    evaluation once per evaluator. The history holds each evaluator once per evaluation, never the other's
    not-yet-computed (NaN) or previous numbers, and the result holds both evaluators' last (it held b's alone)."""
    loader = ("{{label:{},name:text,dataset:{{local:${{variables.data_local}},split:val,shuffle:{},shuffle_seed:3,"
              "max_seq_len:${{max_seq_len}}}},drop_last:false,num_workers:1}}")
    evaluators = f"+eval_loaders=[{loader.format('a', 'false')},{loader.format('b', 'true')}]"
    train_here("max_duration=4ba", "eval_interval=2ba", "save_interval=4ba", "eval_subset_num_batches=1",
               "eval_loader=null", evaluators, root=tmp_path, check=True)
    got = metrics(tmp_path)
    assert [(b, sorted({k.rsplit("/", 1)[0] for k in v})) for b, v in got["eval"]] == \
        [(2, ["eval/a"]), (2, ["eval/b"]), (4, ["eval/a"]), (4, ["eval/b"])], got["eval"]
    assert all(math.isfinite(x) for _, v in got["eval"] for x in v.values())
    assert got["final_eval"] == {**got["eval"][2][1], **got["eval"][3][1]}
    assert got["final_eval"]["eval/a/LanguageCrossEntropy"] != got["final_eval"]["eval/b/LanguageCrossEntropy"]
    # a sweep's summary row shows each evaluator's (its eval_loss cell was blank)
    from train.launch.sweep_app import TrainApp

    report = max((tmp_path / "outputs").rglob("metrics.json")).parent
    row = TrainApp().columns({"report": str(report), "world_size": 1, "checkpoint": ""}, "COMPLETED")
    a, b = (got["final_eval"][f"eval/{x}/LanguageCrossEntropy"] for x in "ab")
    assert row["eval_loss"] == f"a={a:.4g} b={b:.4g}", row


def _newest(folder: Path) -> Path:
    from train.checkpoint import resume

    return resume.find(folder)[-1].path


def test_a_non_finite_loss_stops_the_run_before_its_checkpoint(tmp_path, cli):
    import torch

    proc = cli("train", "optimizer.lr=1e6", "max_duration=30ba", "save_interval=2ba")
    assert proc.returncode == 1, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert "stopped" in line and ("loss is nan at step" in line or "weights are not finite at step" in line)
    step = int(line.split("step ")[1].split("/")[0])
    assert "Traceback" not in proc.stderr and "final train loss" not in proc.stdout
    [folder] = (tmp_path / "checkpoints").iterdir()
    newest = _newest(folder)
    assert int(newest.name.split("-ba")[1].split("-")[0]) < step  # the step's checkpoint was not written
    weights = torch.load(newest, map_location="cpu", weights_only=False)["state"]["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())  # the newest is the last finite one


def test_a_non_finite_loss_fails_a_two_rank_sweep_point(tmp_path, cli):
    proc = cli("train", "-m", "cluster.tasks_per_node=2", "optimizer.lr=1e6", "max_duration=30ba",
               "save_interval=2ba")
    assert proc.returncode == 1
    [row] = csv.DictReader(next(tmp_path.glob("outputs/sweeps/*/summary.csv")).open())
    assert row["state"] == "FAILED" and "RunStopped" in row["error"] and "stopped" in row["error"]
    # the point's step: its last checkpoint's (written every 2 batches), not the "step 0" of a start before its
    # first progress line (every 10 batches)
    stopped_at = int(row["error"].split(" at step ")[1].split("/")[0])
    assert re.fullmatch(r"step \d+/30", row["step"]) and 2 <= int(row["step"][5:].split("/")[0]) < stopped_at, row


# lr=1e6 on the tiny model: the training loss stays finite to batch 4 (~1e12), the evaluation at batch 3 has a
# finite cross-entropy (~5e12; its perplexity is inf, which stops the run: below) and the one at batch 4 is nan: the
# logits overflow on the validation data. eval_interval=5ba: the one evaluation is the one after the fit, at 4
@pytest.mark.parametrize("eval_interval, save_interval, after_fit", [("4ba", "2ba", False), ("5ba", "2ba", True),
                                                                    ("5ba", "4ba", True)])
def test_a_non_finite_evaluation_stops_the_run_however_finite_its_training_loss(tmp_path, cli, eval_interval,
                                                                                 save_interval, after_fit):
    """At batch 4 (eval_interval=4ba) composer evaluates before it checkpoints that step: the run stops without
    that checkpoint. With 5ba the evaluation at batch 4 is the one after the fit, its final checkpoint written:
    the run stops naming it. Either way exit 1, no result printed, and the record holds the non-finite number.
    Where that final checkpoint is the only one (no earlier one to go back to), the same command again stands at
    max_duration: it refuses that result too, not "nothing to do", exit 0."""
    args = ("optimizer.lr=1e6", "max_duration=4ba", f"eval_interval={eval_interval}", f"save_interval={save_interval}")
    proc = cli("train", *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: eval/LanguageCrossEntropy: the ") and "cross-entropy is nan at step 4/4" in line
    assert ("final checkpoint holds these weights" in line) == after_fit
    assert "Traceback" not in proc.stderr and "final train loss" not in proc.stdout
    [folder] = (tmp_path / "checkpoints").iterdir()
    assert (folder / "ep0-ba4-rank0.pt").exists() == after_fit
    assert (folder / "ep0-ba2-rank0.pt").exists() == (save_interval == "2ba")
    if after_fit:
        metrics = json.loads(next((tmp_path / "outputs").rglob("metrics.json")).read_text())
        assert math.isnan(metrics["final_eval"]["eval/LanguageCrossEntropy"])
    if save_interval == "4ba":
        again = cli("train", *args)
        assert again.returncode == 1 and "final train loss" not in again.stdout, again.stderr[-3000:]
        assert "error: eval/LanguageCrossEntropy: the final evaluation's cross-entropy is nan" in again.stderr


def test_a_non_finite_evaluation_fails_a_two_rank_sweep_point_on_every_rank(tmp_path, cli):
    proc = cli("train", "-m", "cluster.tasks_per_node=2", "optimizer.lr=1e6", "max_duration=4ba",
               "eval_interval=4ba", "save_interval=2ba")
    assert proc.returncode == 1
    [row] = csv.DictReader(next(tmp_path.glob("outputs/sweeps/*/summary.csv")).open())
    assert row["state"] == "FAILED" and "RunStopped" in row["error"] and "cross-entropy is nan" in row["error"]


# Training losses measured on the tiny model (the default run, 40 batches; optimizer.lr=100, its first 14 batches;
# optimizer.lr=0.1, which rises to 8.6 at batch 8 and settles at the unigram's 5.6)
DEFAULT_RUN = [6.7943, 6.8008, 6.818, 6.5215, 6.3067, 5.9773, 5.8215, 5.6375, 5.5961, 5.5243, 5.4765, 5.4605, 5.4118,
               5.3728, 5.2945, 5.2688, 5.1762, 5.1164, 4.978, 4.8267, 4.694, 4.5978, 4.4598, 4.3647, 4.2345, 4.1038,
               4.0506, 3.9818, 3.7916, 3.7692, 3.6432, 3.5773, 3.5223, 3.5192, 3.4677, 3.3117, 3.3208, 3.2881, 3.3159,
               3.3335]
LR_100 = [6.7943, 6.8008, 6.818, 47412.9, 146246.95, 364772.81, 478285.56, 746182.63, 1886759.75, 3441873.0,
          4984268.0, 6571113.0, 8043634.0, 9389713.0]
LR_0_1 = [6.79, 6.8, 6.82, 6.52, 6.34, 7.33, 7.44, 8.61, 8.11, 7.64, 6.68, 6.61, 6.23, 6.02, 5.77, 5.78, 5.7, 5.7]


def _first_stop(losses, settings=None):
    from train.task.divergence import Divergence

    rule = Divergence(settings)
    return next((batch for batch, loss in enumerate(losses, 1) if rule.feed(batch, loss)), None), rule


def test_the_divergence_rule_never_fires_on_a_healthy_curve_and_fires_after_its_patience_on_a_diverged_one():
    """The reference is the lowest 10-batch running mean so far (from the first batch on); more than 10 losses in
    a row at 3 times it or more stop the run. A spike of one batch is no divergence."""
    assert _first_stop(DEFAULT_RUN)[0] is None and _first_stop(LR_0_1)[0] is None
    stop, rule = _first_stop(LR_100)
    assert stop == 14 and rule.since == 4 and rule.outliers == 11 and rule.reference_batch == 1
    assert rule.reference == pytest.approx(6.7943)
    spiked = [*DEFAULT_RUN[:25], 100 * DEFAULT_RUN[25], *DEFAULT_RUN[26:]]
    assert _first_stop(spiked)[0] is None
    # 11 batches at 14.8, 3.4 times where the loss was (4.31, the mean of batches 20-29), from batch 30: stops at the
    # 11th
    risen = [*DEFAULT_RUN[:29], *[14.8] * 11]
    assert _first_stop(risen)[0] == 40
    assert _first_stop(risen, {"outlier_multiplier": 4})[0] is None
    assert _first_stop(risen, {"patience": 3})[0] == 33
    # loss_cap: above it is an outlier too, once the first window is full (a fresh model's loss may be above it)
    assert _first_stop(DEFAULT_RUN, {"loss_cap": 6.0, "patience": 0})[0] is None
    assert _first_stop([*DEFAULT_RUN[:20], *[6.5] * 20], {"loss_cap": 6.0})[0] == 31


def test_a_finite_divergence_stops_the_run_before_its_checkpoint_naming_the_loss_and_the_reference(tmp_path, cli):
    """Measured before: optimizer.lr=100 trained to batch 40 at a loss of 1.4e7, evaluated perplexity inf, printed
    its result and exited 0."""
    proc = cli("train", "optimizer.lr=100", "save_interval=10ba")
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = proc.stderr.splitlines()
    [at] = [i for i, line in enumerate(said) if line.startswith("error: ")]
    line, fix = said[at], said[at + 1]
    # (the loss itself, millions, differs from run to run in its last digits; the batches do not)
    assert re.match(r"error: loss/train/total: the training loss is [0-9.e+]+ at step 14/40, [0-9.e+,]+ times 6\.794, "
                    r"where the loss was \(its lowest 10-batch running mean so far, at batch 1\)", line), line
    assert "11 batches in a row (since batch 4" in line, line
    assert "the run diverged; it stopped there, before that step's checkpoint" in line
    assert "the checkpoint at batch 10, written since the loss rose, holds diverging weights" in line
    assert "callbacks.kill_loss_spike.outlier_multiplier" in fix and "spike.action=rollback" in fix
    # its checkpoint at 10 came after the rise: the command offered starts afresh, at half the learning rate
    assert fix.endswith("to continue it afresh (no checkpoint was written before its numbers went bad) under half "
                        "the learning rate it trained at (100 -> 50; or change the command: a longer "
                        "scheduler.t_warmup, other data from there), as a new run of its own: python -m train "
                        "save_interval=10ba optimizer.lr=50"), fix
    assert "Traceback" not in proc.stderr and "final train loss" not in proc.stdout
    [folder] = (tmp_path / "checkpoints").iterdir()
    assert sorted(p.name for p in folder.glob("*.pt")) == ["ep0-ba10-rank0.pt"]  # none at 14 or after
    # its only checkpoint came after the rise: continuing it by its name is refused, naming the batches
    cont = cli("train", "optimizer.lr=50", "save_interval=10ba", f"continue_from={folder.name}", "plan=true")
    assert cont.returncode == 2 and f"error: continue_from: {folder.name}: every checkpoint of it (batches 10) was " \
        "written after its loss began to diverge at batch 4 (its spike.json)" in cont.stderr, cont.stderr[-2000:]


def test_a_finite_divergence_fails_a_two_rank_sweep_point_on_every_rank(tmp_path, cli):
    proc = cli("train", "-m", "cluster.tasks_per_node=2", "optimizer.lr=100", "max_duration=20ba")
    assert proc.returncode == 1
    [row] = csv.DictReader(next(tmp_path.glob("outputs/sweeps/*/summary.csv")).open())
    assert row["state"] == "FAILED" and "RunStopped" in row["error"], row
    assert "loss/train/total" in row["error"] and "the run diverged" in row["error"], row
    [folder] = (tmp_path / "checkpoints").iterdir()
    assert not list(folder.glob("ep*"))  # both ranks stopped before the checkpoint at 20


def test_an_evaluation_whose_perplexity_is_inf_stops_the_run_and_log_only_lets_the_loss_rule_warn(tmp_path, cli):
    """lr=100 with the loss rule set to warn (log_only) from its 4th outlier: trained on, and the evaluation at
    batch 10 scored cross-entropy 3.2e6 (finite) and perplexity inf (exp overflows from 88.7): the run stops there,
    before that step's checkpoint."""
    key = "callbacks.kill_loss_spike"
    proc = cli("train", "optimizer.lr=100", "max_duration=12ba", "eval_interval=10ba", "save_interval=10ba",
               f"{key}.log_only=true", f"{key}.patience=3")
    assert proc.returncode == 1, proc.stderr[-3000:]
    [warned] = [x for x in proc.stderr.splitlines() if x.startswith("WARNING: loss/train/total: ")]
    assert "at step 7/12" in warned and "it goes on (log_only=true)" in warned, warned
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: eval/LanguagePerplexity: the evaluation's LanguagePerplexity is inf at step "
                           "10/12 (its cross-entropy is "), line
    assert "the run stopped there, before that step's checkpoint" in line
    assert "Traceback" not in proc.stderr and "final train loss" not in proc.stdout
    [folder] = (tmp_path / "checkpoints").iterdir()
    assert not list(folder.glob("ep*"))
    # its settings are read before anything starts
    bad = cli("train", f"{key}.patience=-1", f"+{key}.outlier_multipler=5", "spike.action=undo",
              "spike.lr_scale=2", check=2)
    assert "error: callbacks.kill_loss_spike.patience: must be a whole number" in bad.stderr
    assert "error: callbacks.kill_loss_spike.outlier_multipler: is not a setting" in bad.stderr
    assert "error: spike.action: must be stop or rollback, got 'undo'" in bad.stderr
    assert "error: spike.lr_scale: must be a number above 0 and at most 1" in bad.stderr
    assert "did you mean `outlier_multiplier`?" in bad.stderr


# ------------------------------------------------------------------------------------------ full file systems

@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = []

    def mount(name: str, size: str) -> Path:
        mnt = tmp_path / name
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill_when(path_glob: str, base: Path, mnt: Path, proc: subprocess.Popen, leave: int = 0) -> Path:
    """Once a file matching `path_glob` under `base` exists, fill `mnt` up to `leave` bytes free, as another job
    writing to the same file system would."""
    deadline = time.time() + 300
    while not list(base.glob(path_glob)):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    filler = mnt / "filler"
    want = shutil.disk_usage(mnt).free - leave
    chunk = b"\0" * (64 << 10)
    # the run writes beside the filler: a write it beat to the last blocks ends the filling (the file system is
    # as full as asked, or fuller), not the test
    try:
        with open(filler, "wb", buffering=0) as f:
            while want > 0:
                want -= f.write(chunk[:want])
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    return filler


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_full_checkpoint_file_system_is_one_clear_error_and_resuming_after_making_room_is_exact(
        ranks, tmp_path, tmpfs, tmp_path_factory):
    want = metrics(finished(ranks, "sharded", tmp_path_factory))  # the same training, uninterrupted

    # up to four checkpoints of ~5.3 MiB (1 rank) to ~6.3 MiB (2 ranks) at once: the 2 kept, the cut-off one set
    # aside and the next; they fit until another job fills the rest
    mnt = tmpfs("ckpt", "32m")
    root = tmp_path / "root"
    cmd = train_command(ranks, "sharded", "save_num_checkpoints_to_keep=2", f"storage.checkpoint_root={mnt}")
    proc = start(*cmd, root=root, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    filler = _fill_when("*/ep0-ba20*.manifest.json", mnt, mnt, proc, leave=1 << 20)  # then another job fills it
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    [folder] = [p for p in mnt.iterdir() if p.is_dir()]
    if ranks == 1:
        [line] = [x for x in err.splitlines() if x.startswith("error: ")]
        assert "Traceback" not in err
    else:
        [row] = csv.DictReader(next(root.glob("outputs/sweeps/*/summary.csv")).open())
        assert row["state"] == "FAILED"
        line = row["error"]
    assert f"{folder}: no space left on its file system writing a checkpoint" in line, line
    assert "bytes free" in line and "needs " in line

    filler.unlink()  # room made: the same command resumes from the newest complete checkpoint
    training(*cmd, root=root, check=True)
    got = metrics(root)
    assert got["batches"] == 40 and [b for b, _ in got["eval"]] == [10, 20, 30, 40]
    assert got["final_train_loss"] == pytest.approx(want["final_train_loss"], rel=1e-6)
    assert got["final_eval"] == pytest.approx(want["final_eval"], rel=1e-6)


def test_a_full_outputs_file_system_never_stops_training_and_names_the_metrics_file(tmp_path, tmpfs):
    mnt = tmpfs("outputs", "2m")
    root = tmp_path / "root"
    proc = start("-m", "train", "max_duration=40ba", f"storage.output_root={mnt}", root=root, text=True,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _fill_when("*/progress.json", mnt, mnt, proc)  # full from the first progress line on
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    assert "could not write" in err and "training goes on without it" in err  # the curve and progress: warnings
    [folder] = (root / "checkpoints").iterdir()
    assert _newest(folder).name.startswith("ep0-ba40")  # trained to the end, every checkpoint written
    [line] = [x for x in err.splitlines() if x.startswith("error: ")]
    assert "metrics.json: no space left on its file system" in line and "Traceback" not in err


def test_the_plan_of_a_finished_run_says_it_trains_and_submits_nothing(tmp_path, tmp_path_factory):
    """A plan of a run that reached its max_duration planned it as if it would train (and, under `-m`, showed the
    sbatch it would submit), while the same command trains nothing and `-m` submits nothing for it. Now the plan
    says so, names finished.json, and the sweep's table says which points it would submit; nothing written."""
    root = tmp_path / "root"
    shutil.copytree(finished(1, "sharded", tmp_path_factory), root, symlinks=True)
    [folder] = (root / "checkpoints").iterdir()
    before = sorted(str(p) for p in root.rglob("*"))
    plan = run(*train_command(1, "sharded"), "plan=true", root=root, check=True).stdout
    assert (f"finished    this run reached max_duration 40ba earlier ({folder / 'finished.json'}): the same command "
            "trains nothing") in plan and f"run_name={folder.name} and a larger max_duration" in plan, plan
    assert json.loads(run(*train_command(1, "sharded"), "plan=json", root=root, check=True).stdout)["finished"] == \
        str(folder / "finished.json")
    longer = run(*train_command(1, "sharded"), f"run_name={folder.name}", "max_duration=60ba", "plan=true",
                 root=root, check=True).stdout
    assert "finished " not in longer  # continued to 60ba: it would train, from where the run stands
    assert (f"resumes     from {folder / 'ep0-ba40-rank0.pt'} (batch 40, 81.92 k tokens trained): 20 steps left = "
            "40.96 k tokens") in longer, longer
    # 4e1ba is 40 batches (one run, one name): finished too (the sweep submitted it again, to train nothing)
    sweep = run(*[a for a in train_command(1, "sharded") if a != "max_duration=40ba"], "-m",
                "max_duration=4e1ba,50ba", "plan=true", root=root, check=True).stdout
    rows = [line.split(" | ") for line in sweep.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert [r[-1] for r in rows] == ["no: finished earlier |", "yes |"], sweep
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_continuing_a_run_by_name_with_a_model_of_another_shape_is_refused_before_anything_changes(
        tmp_path, tmp_path_factory):
    """run_name=<a run> model.n_layers=3 (the run trained 2) rewrote the run's record, then failed loading its
    checkpoint with a KeyError traceback, after the queue. Now refused by the key, the record untouched (a key the run
    left at MPT's default as well); another changed setting (the schedule's) continues the run, as asked, but not the
    optimizer's, which the checkpoint restores over the command's."""
    root = tmp_path / "root"
    shutil.copytree(finished(1, "sharded", tmp_path_factory), root, symlinks=True)
    [folder] = (root / "checkpoints").iterdir()
    record = (folder / "identity.json").read_text()
    line = [*train_command(1, "sharded"), f"run_name={folder.name}"]
    proc = run(*line, "model.n_layers=3", root=root, check=2)
    assert "error: model.n_layers: " in proc.stderr and "model.n_layers=2 there, 3 here" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and (folder / "identity.json").read_text() == record
    # a shape key the run left at MPT's default (no_bias: false), added with `+`
    proc = run(*line, "+model.no_bias=true", root=root, check=2)
    assert "model.no_bias=False there, True here" in proc.stderr, proc.stderr
    assert "model.no_bias" not in run(*line, "+model.no_bias=false", "plan=true", root=root,
                                      check=True).stderr  # the default spelled out: the same model
    # what MPT derives: alibi turns its learned position embeddings off (measured: resumed without them, exit 0)
    proc = run(*line, "+model.attn_config.alibi=true", "plan=true", root=root, check=2)
    assert "model.learned_pos_emb=True there, False here" in proc.stderr, proc.stderr
    # another n_heads of the same multihead attention: the same weights (they load), split into other heads: warned,
    # not refused (it was, as a load that would fail)
    proc = run(*line, "model.n_heads=8", "plan=true", root=root, check=True)
    assert "warning: model.n_heads: " in proc.stderr and "model.n_heads=4 there, 8 here" in proc.stderr, proc.stderr
    plan = run(*line, "scheduler.alpha_f=0.5", "max_duration=80ba", "plan=true", root=root, check=True)
    assert "model.n_layers" not in plan.stderr  # other settings: continued under them, as run_name= asks
    assert "continues the run in" not in plan.stderr
    # but not the optimizer's: composer restores them from the checkpoint (measured: lr=1e-12 went on at 0.003)
    proc = run(*line, "optimizer.lr=0.5", "max_duration=80ba", "plan=true", root=root, check=2)
    assert "error: optimizer.lr: " in proc.stderr and "optimizer.lr=0.003 there, 0.5 here" in proc.stderr
    # a save_folder fixed in a user's YAML is a continuation too (every variant of the YAML shares it): a model of
    # another shape there is refused as by run_name= (it was not checked: the KeyError came after the queue), and
    # other settings are said (the YAML's other seed resumed the run's checkpoint without a word)
    model = "model: {name: mpt_causal_lm, d_model: 128, n_heads: 4, n_layers: %d, max_seq_len: 128, vocab_size: 320}"
    # A setting the YAML leaves out is a change too: weight_decay dropped is decoupled_adamw's 1e-05, which the
    # checkpoint's 0.0 would replace (it resumed without a word); eps spelled out at its default is none.
    for layers, lr, seed, decay in ((3, 0.5, 17, 0.0), (2, 0.5, 17, 0.0), (2, 0.003, 17, None), (2, 0.003, 7, 0.0)):
        (tmp_path / "mine.yaml").write_text(
            "variables: {data_local: /tmp/nowhere-c4}\nmax_seq_len: 128\n" + model % layers +
            f"\noptimizer: {{name: decoupled_adamw, lr: {lr}, eps: 1.0e-08"
            + ("" if decay is None else f", weight_decay: {decay}") + f"}}\nseed: {seed}\nsave_folder: {folder}\n")
        proc = run("-m", "train", f"yaml={tmp_path / 'mine.yaml'}", "plan=true", root=root)
        if layers == 3:
            assert proc.returncode == 2 and "error: model.n_layers: the checkpoints this command continues " \
                "(save_folder=)" in proc.stderr, proc.stderr
        elif lr == 0.5:
            assert proc.returncode == 2 and "error: optimizer.lr: the checkpoints this command continues " \
                "(save_folder=)" in proc.stderr and "optimizer.lr=0.003 there, 0.5 here" in proc.stderr, proc.stderr
        elif decay is None:
            assert proc.returncode == 2 and "error: optimizer.weight_decay: " in proc.stderr and \
                "optimizer.weight_decay=0 there, 1e-05 here" in proc.stderr, proc.stderr
            assert "optimizer.eps" not in proc.stderr and "optimizer.betas" not in proc.stderr, proc.stderr
        else:
            assert "warning: save_folder: continues the run in" in proc.stderr and \
                "seed=17 there, 7 here" in proc.stderr, proc.stderr
    # so is a run named in a YAML (`run_name:`, or llm-foundry's `variables.run_name`): only run_name= on the command
    # line was checked, and a model of another shape continued the run's checkpoints without a word
    for named in (f"variables: {{data_local: /tmp/nowhere-c4}}\nrun_name: {folder.name}\n",
                  f"variables: {{data_local: /tmp/nowhere-c4, run_name: {folder.name}}}\nrun_name: ${{variables.run_name}}\n"):
        (tmp_path / "named.yaml").write_text(named + "max_seq_len: 128\n" + model % 3 + "\n")
        proc = run("-m", "train", f"yaml={tmp_path / 'named.yaml'}", "plan=true", root=root, check=2)
        assert "error: model.n_layers: the checkpoints this command continues (run_name=)" in proc.stderr, proc.stderr
        # the same model under another seed: continued, said under the name's key (every variant of the YAML
        # shares its name), with a fix that applies to a name
        (tmp_path / "named.yaml").write_text(named + "max_seq_len: 128\n" + model % 2 +
                                             "\noptimizer: {name: decoupled_adamw, lr: 0.003, weight_decay: 0.0}\nseed: 7\n")
        proc = run("-m", "train", f"yaml={tmp_path / 'named.yaml'}", "plan=true", root=root)
        assert "warning: run_name: continues the run in" in proc.stderr and "seed=17 there, 7 here" in proc.stderr \
            and "give it another name (run_name=... on the command line)" in proc.stderr, proc.stderr
    # its weights loaded into a model of another shape: the same refusal (the run's record names the model)
    from train.checkpoint.resume import find

    grown = ["-m", "train", f"load_path={find(folder)[-1].path}", "+load_weights_only=true", "model.n_layers=3",
             "run_name=grown"]
    proc = run(*grown, root=root, check=2)
    assert "error: load_path: " in proc.stderr and "model.n_layers=2 there, 3 here" in proc.stderr, proc.stderr
    assert not (root / "checkpoints" / "grown").exists()
    assert "load_path" not in run(*grown, "+load_strict_model_weights=false", "plan=true", root=root,
                                  check=True).stderr  # the weights that match: a grown model, as asked


def test_a_two_rank_sharded_checkpoint_as_load_path_into_a_model_of_another_shape_is_refused(tmp_path_factory,
                                                                                             tmp_path):
    """The same refusal for a sharded checkpoint (a folder of shards, `ep0-ba40/`) of a 2-rank run: its run's
    record is beside the folder, and the model given here has fewer layers."""
    src = finished(2, "sharded", tmp_path_factory)
    [folder] = (src / "checkpoints").iterdir()
    shards = folder / "ep0-ba40"
    assert (shards / ".metadata").is_file() and (folder / "identity.json").is_file()
    line = ["-m", "train", f"load_path={shards}", "+load_weights_only=true", "run_name=smaller"]
    proc = run(*line, "model.n_layers=1", root=tmp_path, check=2)
    assert "error: load_path: " in proc.stderr and "model.n_layers=2 there, 1 here" in proc.stderr, proc.stderr
    assert not (tmp_path / "checkpoints" / "smaller").exists()
    # the same shape loads, where shards are read (at one rank they are not: consolidate first, as its check says)
    assert "load_path" not in run(*line, "-m", "cluster.tasks_per_node=2", "plan=true", root=tmp_path,
                                  check=True).stderr
    assert "python -m train.consolidate" in run(*line, "plan=true", root=tmp_path, check=True).stderr
    # copied away from its run's record (identity.json), the shards are read for the model config composer stored
    # in them: every rank reads it (torch's reader of shards is collective), the same shape trains on, another
    # (alibi: no learned position embeddings, and composer dropped them, exit 0) is refused before training
    copy = tmp_path / "copy" / "ep0-ba40"
    shutil.copytree(shards, copy)
    proc = run("-m", "train", "-m", "cluster.tasks_per_node=2", f"load_path={copy}", "+load_weights_only=true",
               "+model.attn_config.alibi=false,true", "max_duration=42ba", "save_interval=42ba", "eval_interval=42ba",
               "progress_bar=false", root=tmp_path / "copied", check=1)
    rows = {r["overrides"].split("alibi=")[1].split()[0]: r for r in csv.DictReader(
        next((tmp_path / "copied" / "outputs" / "sweeps").glob("*/summary.csv")).open())}
    assert rows["False"]["state"] == "COMPLETED" and rows["True"]["state"] == "FAILED", proc.stdout
    assert "model.learned_pos_emb=True there, False here" in rows["True"]["error"], rows["True"]["error"]
