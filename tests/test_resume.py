"""Resume is the promise: every checkpoint this tool writes resumes, at any rank count, after any event.

Real runs of the tiny model on CPU (one process, or 2 and 4 ranks over gloo with FSDP2 through `-m`). The
matrix: checkpoint format {sharded, full} x ranks {1, 2}, each with evaluations before its checkpoints, each
resumed after (a) SIGKILL right after a checkpoint and (b) the run finished. At one rank there is no FSDP, so
both formats write the same single `.pt` file per checkpoint (only composer's `latest` link is named after the
format, and the resume choice reads content, not links): one rank is run with the default format, `sharded`, and
asserted to write that file; the 1-rank `full` checkpoints are read and exported in test_export.py. Then world-size changes (sharded 2->4->2 and 2->1, full 2->4->1), and the
states an interrupted write leaves on disk. The uninterrupted run of each rank count is the reference. (One
module for the whole matrix, so its shared reference runs are made once: hence its length.)
"""
import csv
import json
import shutil
import subprocess
import time
from pathlib import Path

import helpers
import pytest
from helpers import finished, kill_after_checkpoint, made_once, run, start, stop, training
from helpers import train_command as command

pytestmark = pytest.mark.train  # the tier (pyproject.toml markers)

def newest_metrics(root: Path) -> dict:
    path = max((root / "outputs").rglob("metrics.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(path.read_text())


def task_log(root: Path) -> str:
    """What the last run's ranks wrote (a `-m` run: rank 0's job log; a plain run has none)."""
    logs = sorted((root / "outputs" / "sweeps").rglob("*_0_log.err"), key=lambda p: p.stat().st_mtime)
    return logs[-1].read_text() if logs else ""


def save_folder(root: Path) -> Path:
    [folder] = (root / "checkpoints").iterdir()
    return folder


def straight(ranks: int, tmp_path_factory) -> dict:
    """The uninterrupted run's metrics at this rank count (the checkpoint format does not change training)."""
    return newest_metrics(finished(ranks, "sharded", tmp_path_factory))


@pytest.fixture
def want(ranks, tmp_path_factory) -> dict:
    """straight(ranks) as a fixture: the reference run, where this test is the first to need it, is made in the
    test's setup, apart from what the test itself runs."""
    return straight(ranks, tmp_path_factory)


@pytest.fixture
def sharded2(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank sharded run's root (finished), made in the setup of the first test that needs it."""
    return finished(2, "sharded", tmp_path_factory)


@pytest.fixture
def full2(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank full-format run's root (finished), made in the setup of the first test that needs it."""
    return finished(2, "full", tmp_path_factory)


def assert_same_run(got: dict, want: dict) -> None:
    assert got["batches"] == 40 and [b for b, _ in got["train_loss"]] == list(range(1, 41))
    assert got["final_train_loss"] == pytest.approx(want["final_train_loss"], rel=1e-6)
    assert got["final_eval"] == pytest.approx(want["final_eval"], rel=1e-6)
    assert [b for b, _ in got["eval"]] == [10, 20, 30, 40]  # the evaluation history came through the checkpoint


# (format, ranks): at one rank both formats write one `.pt` (module docstring), asserted in that cell
CELLS = [("sharded", 1), ("sharded", 2), ("full", 2)]


@pytest.fixture
def killed_at_20(fmt, ranks, tmp_path) -> None:
    """The matrix's run killed right after its checkpoint at batch 20, in the test's folder (in the test's setup:
    the kill, the resume and the rerun after are each a whole run of the reference)."""
    kill_after_checkpoint(tmp_path, command(ranks, fmt), batch=20)


@pytest.mark.parametrize("fmt, ranks", CELLS)
def test_killed_after_a_checkpoint_then_finished_the_same_command_resumes_then_does_nothing(
        fmt, ranks, want, killed_at_20, tmp_path):
    cmd = command(ranks, fmt)
    folder = save_folder(tmp_path)
    assert not any(c.name.startswith("ep0-ba40") for c in folder.iterdir()), "killed too late"
    if fmt == "sharded" and ranks > 1:  # a folder of shards
        assert (folder / "ep0-ba20" / ".metadata").is_file()
    else:  # one file: gathered by rank 0 (full), or no FSDP in one process whatever the format
        assert (folder / "ep0-ba20-rank0.pt").is_file()

    resumed = training(*cmd, root=tmp_path, check=True)  # (a) the same command after SIGKILL
    assert "resuming from" in resumed.stderr + task_log(tmp_path)
    got = newest_metrics(tmp_path)
    assert got["world_size"] == ranks
    assert_same_run(got, want)

    if ranks == 1:  # this command's outputs folder holding an earlier stretch's numbers, as a start continued
        # under -m leaves it (its outputs go to the sweep's folder): the numbers of the start that finished it
        stale = max((tmp_path / "outputs").rglob("metrics.json"), key=lambda p: p.stat().st_mtime)
        stale.write_text(json.dumps({**got, "batches": 20, "final_train_loss": 99.0}))
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}
    again = training(*cmd, root=tmp_path, check=True)  # (b) the same command after the run finished
    if ranks == 1:  # a plain run: it starts, finds the run at max_duration, says so and writes nothing
        said = again.stderr + task_log(tmp_path)
        assert "already trained to max_duration=40ba (checkpoint " in said and "nothing to do" in said
        assert f"add run_name={got['run_name']} and a larger max_duration" in said  # how to go on
        # the finished run's numbers, as the final line prints them (three significant digits)
        assert f"final train loss {float(format(got['final_train_loss'], '.3g'))}, " in again.stdout
    else:  # a sweep: the point's run has finished (its finished.json), so nothing is submitted at all
        assert again.stdout.count(": nothing to submit") == 1 and "-> job" not in again.stdout, again.stdout
        assert "| COMPLETED |" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_a_finished_run_again_prints_its_own_numbers_from_a_report_folder_another_run_shares(tmp_path):
    """Two runs with one report folder (hydra.run.dir= the same): the first run again has nothing to train and
    printed the second's numbers from that folder's metrics.json, exit 0. It prints its own finished.json's, and
    where that records no batch (nothing of its own at its checkpoint) it stops naming the other run's file."""
    from helpers import train_here

    shared = tmp_path / "shared"
    first = ["max_duration=4ba", "save_interval=4ba", "eval_interval=4ba", "progress_bar=false",
             f"hydra.run.dir={shared}"]
    train_here(*first, "optimizer.lr=1e-3", root=tmp_path, check=True)
    [folder] = (tmp_path / "checkpoints").iterdir()
    own = json.loads((folder / "finished.json").read_text())["metrics"]
    train_here(*first, "optimizer.lr=5e-3", root=tmp_path, check=True)
    other = json.loads((shared / "metrics.json").read_text())
    assert other["run_name"] != own["run_name"] and other["final_train_loss"] != own["final_train_loss"]

    again = train_here(*first, "optimizer.lr=1e-3", root=tmp_path, check=True)
    assert "nothing to do" in again.stderr
    assert f"final train loss {float(format(own['final_train_loss'], '.3g'))}, " in again.stdout, again.stdout
    assert f"metrics:     {folder / 'finished.json'}" in again.stdout
    record = json.loads((folder / "finished.json").read_text())
    (folder / "finished.json").write_text(json.dumps({k: v for k, v in record.items() if k != "batch"}))
    stopped = train_here(*first, "optimizer.lr=1e-3", root=tmp_path)
    assert stopped.returncode != 0 and "final train loss" not in stopped.stdout
    assert f"{shared / 'metrics.json'} is run {other['run_name']}'s" in stopped.stderr, stopped.stderr[-3000:]


EVERY_20 = command(2, "sharded", "eval_interval=20ba")  # evaluations every 20 batches, checkpoints every 10


@pytest.fixture
def killed_at_30_evaluated_at_20(tmp_path) -> None:
    """EVERY_20's run killed right after its checkpoint at batch 30, in the test's folder (in the test's setup)."""
    kill_after_checkpoint(tmp_path, EVERY_20, batch=30)


def test_killed_after_a_checkpoint_with_no_evaluation_since_the_last_resumes_to_the_same_run(
        sharded2, killed_at_30_evaluated_at_20, tmp_path):
    """The matrix's other side of "after an evaluation": evaluations every 20 batches, checkpoints every 10, the
    2-rank sharded run killed right after its checkpoint at batch 30 (the last evaluation at 20). The same command
    resumes it: the training equals the uninterrupted run's (evaluating does not change it), and the evaluation
    history is the one this command asked for, its last one the uninterrupted run's at batch 40."""
    want = newest_metrics(sharded2)
    cmd = EVERY_20
    assert not (save_folder(tmp_path) / "ep0-ba40").exists(), "killed too late"
    resumed = training(*cmd, root=tmp_path, check=True)
    said = resumed.stderr + task_log(tmp_path)
    assert "resuming from" in said and "ep0-ba30" in said
    got = newest_metrics(tmp_path)
    assert got["batches"] == 40 and [b for b, _ in got["train_loss"]] == list(range(1, 41))
    assert got["final_train_loss"] == pytest.approx(want["final_train_loss"], rel=1e-6)
    assert [b for b, _ in got["eval"]] == [20, 40]
    assert got["final_eval"] == pytest.approx(want["final_eval"], rel=1e-6)


def test_the_same_training_under_another_spelling_and_environment_resumes_the_same_run(tmp_path, tmp_path_factory):
    """Identity: stopped after batch 20 (2-rank sharded, after evaluations); the next command re-spells the
    learning rate (3e-3 as 0.0030), adds an environment variable and another progress interval: the same run,
    resumed from its checkpoint, ending at the uninterrupted loss."""
    _stopped_copy(2, 20, tmp_path, tmp_path_factory)
    proc = training(*command(2, "sharded", "optimizer.lr=0.0030", "cluster.env.NCCL_DEBUG=INFO",
                                 "console_log_interval=5ba"), root=tmp_path, check=True)
    assert "resuming from" in proc.stderr + task_log(tmp_path)
    assert len(list((tmp_path / "checkpoints").iterdir())) == 1  # no second run beside it
    assert_same_run(newest_metrics(tmp_path), straight(2, tmp_path_factory))


def assert_same_losses(got: dict, want: dict) -> None:
    """Batch by batch, within 1e-5 (measured: equal to 1e-7 where the ranks' reductions add in another order)."""
    assert [b for b, _ in got["train_loss"]] == [b for b, _ in want["train_loss"]] == list(range(1, 41))
    for (batch, loss), (_, same) in zip(got["train_loss"], want["train_loss"]):
        assert loss == pytest.approx(same, rel=1e-5), f"batch {batch}"


def test_one_rank_and_two_ranks_train_alike_batch_by_batch(tmp_path_factory):
    """The same global batch of the same samples at 1 rank and at 2 (FSDP2 over gloo) is the same training: the
    2-rank gradient is the mean of the ranks' gradients. torch 2.7's gloo sums when a reduce-scatter asks for the
    average (pytorch/pytorch#162338), so the 2-rank gradients were twice as large; AdamW hid most of it, the
    default gradient clipping (norm 1.0) did not: the runs parted at batch 8 and ended at 4.9507 (2 ranks) and
    5.2075 (1 rank). The evaluations are not compared: eval_subset_num_batches counts batches per rank."""
    assert_same_losses(straight(2, tmp_path_factory), straight(1, tmp_path_factory))


def test_world_size_changes_two_to_one_continue_the_loss(sharded2, tmp_path, tmp_path_factory):
    """The same run continued at another rank count from its sharded checkpoint: here 2 -> 1, the 2-rank run
    stopped after batch 20 continued by a plain one-process run (the shards consolidated). Compared: the loss of
    every batch with the uninterrupted 2-rank run's (the global batch holds the same samples at every world size:
    streaming's order depends on its canonical nodes, not on the ranks), within 1e-5 (measured: equal to 1e-7; the
    ranks' reductions add in another order)."""
    want = newest_metrics(sharded2)
    _stopped_copy(2, 20, tmp_path, tmp_path_factory)
    proc = training(*command(1, "sharded"), root=tmp_path, check=True)
    assert "consolidating its shards" in proc.stderr
    # mpt-tiny evaluates 4 batches of 8 on each rank: 64 samples at two ranks, 32 at one, said (at four ranks,
    # 4 batches of 4 are 64 again: nothing said, test_world_size_changes_two_to_four_to_two_continue_the_loss)
    assert "the evaluations from batch 20 on score 32 samples of the validation data, the run's earlier ones 64 " \
        "samples" in proc.stderr, proc.stderr[-3000:]
    got = newest_metrics(tmp_path)
    assert got["world_size"] == 1 and got["batches"] == 40
    assert_same_losses(got, want)  # 1-20 through the checkpoint, 21-40 at one rank
    assert got["final_train_loss"] == pytest.approx(want["train_loss"][-1][1], rel=1e-5)


def _at_four(fmt: str, tmp_path_factory) -> Path:
    """The 2-rank reference run of this format stopped after batch 20 (_stopped_copy), continued at 4 ranks and
    killed right after its checkpoint at batch 30 (16 samples a batch: 4 per rank at 4 ranks, 8 at 2; no
    accumulation either way): made once, the root whose checkpoints the tests that go on from 4 ranks copy (the
    4-rank stretch is the longest of the world-size changes: one test makes it and checks what it wrote, the
    next goes on from it, on one worker: their xdist_group)."""
    def make(root: Path) -> None:
        folder = _stopped_copy(2, 20, root, tmp_path_factory, fmt)
        assert not list(folder.glob("ep0-ba30*"))
        kill_after_checkpoint(root, command(4, fmt, "device_train_microbatch_size=4"), batch=30)
    return made_once(tmp_path_factory, f"at-four-{fmt}", make)


def _copy_of(root: Path, into: Path) -> Path:
    """The run's checkpoints under `root` copied into a fresh root `into`: its save folder there."""
    shutil.copytree(root / "checkpoints", into / "checkpoints", symlinks=True)
    return save_folder(into)


@pytest.mark.xdist_group("at-four-sharded")
def test_a_sharded_checkpoint_of_two_ranks_continued_at_four_writes_four_shards(sharded2, tmp_path_factory):
    """2 -> 4 (sharded): the 2-rank run stopped after batch 20, continued at 4 ranks, killed after batch 30:
    batch 30's checkpoint is a shard of each of the four ranks."""
    four = _at_four("sharded", tmp_path_factory)
    assert sorted(p.name for p in (save_folder(four) / "ep0-ba30").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]


@pytest.mark.xdist_group("at-four-sharded")
def test_world_size_changes_two_to_four_to_two_continue_the_loss(sharded2, tmp_path, tmp_path_factory):
    """2 -> 4 -> 2 (sharded): the 4-rank stretch's checkpoint at batch 30 (_at_four) continued at 2 ranks. Compared
    as 2 -> 1 is: every batch with the uninterrupted 2-rank run's, 21-30 the 4-rank stretch's."""
    want = newest_metrics(sharded2)
    folder = _copy_of(_at_four("sharded", tmp_path_factory), tmp_path)
    assert (folder / "ep0-ba30" / "__3_0.distcp").is_file() and not (folder / "ep0-ba40").exists()
    assert "not comparable" not in training(*command(2, "sharded"), root=tmp_path, check=True).stderr  # 4 -> 2
    got = newest_metrics(tmp_path)
    assert got["world_size"] == 2 and got["batches"] == 40
    assert_same_losses(got, want)  # 21-30 at 4 ranks, 31-40 back at 2
    assert got["final_train_loss"] == pytest.approx(want["train_loss"][-1][1], rel=1e-5)


@pytest.mark.xdist_group("at-four-full")
def test_a_full_checkpoint_of_two_ranks_continued_at_four_is_still_rank_0s_one_file(full2, tmp_path_factory):
    """2 -> 4 (full): the 2-rank run's full checkpoint (one file, gathered by rank 0), stopped after batch 20,
    continued at 4 ranks (each loads rank 0's file and takes its shards) and killed after batch 30: batch 30's
    checkpoint is again rank 0's one file, whatever the world size."""
    folder = save_folder(_at_four("full", tmp_path_factory))
    assert (folder / "ep0-ba20-rank0.pt").is_file() and (folder / "ep0-ba30-rank0.pt").is_file()
    assert not (folder / "ep0-ba30").exists() and not list(folder.glob("ep0-ba40*"))


@pytest.mark.xdist_group("at-four-full")
def test_a_full_checkpoint_continues_from_two_ranks_at_four_then_at_one_with_the_uninterrupted_loss(
        sharded2, full2, tmp_path, tmp_path_factory):
    """The world-size changes of the other format: the 4-rank stretch's full checkpoint at batch 30 (_at_four)
    finished by a plain one-process run (no FSDP). Compared as the sharded changes are: every batch, with the
    uninterrupted 2-rank run's."""
    want = newest_metrics(sharded2)
    folder = _copy_of(_at_four("full", tmp_path_factory), tmp_path)
    proc = training(*command(1, "full"), root=tmp_path, check=True)
    assert "resuming from" in proc.stderr and "ep0-ba30-rank0.pt" in proc.stderr
    assert (folder / "ep0-ba40-rank0.pt").is_file()
    got = newest_metrics(tmp_path)
    assert got["world_size"] == 1 and got["batches"] == 40
    # the history came through the checkpoints: 21-30 are the 4-rank attempt's, 31-40 the one rank's
    assert_same_losses(got, want)
    assert got["final_train_loss"] == pytest.approx(want["train_loss"][-1][1], rel=1e-5)


def _finished_copy(ranks: int, fmt: str, tmp_path: Path, tmp_path_factory) -> tuple[Path, list]:
    """A finished run's checkpoints (10, 20, 30, 40) in a fresh root, and the command that made them. Without its
    finished.json: these tests damage or cut the newest checkpoint as a run stopped before its end leaves it
    (a run writes finished.json last), so the rerun must start, as it would then."""
    src = finished(ranks, fmt, tmp_path_factory)
    root = tmp_path / "root"
    shutil.copytree(src / "checkpoints", root / "checkpoints", symlinks=True)
    (save_folder(root) / "finished.json").unlink()
    return save_folder(root), command(ranks, fmt)


def _stopped_copy(ranks: int, batch: int, root: Path, tmp_path_factory, fmt: str = "sharded") -> Path:
    """The reference run's checkpoints up to `batch` in `root`, as a run stopped right after that checkpoint
    leaves its folder (the later ones absent, the `latest` link on it, no finished.json): the same files, byte for
    byte, as the uninterrupted run wrote them there. The kill itself is the matrix's."""
    src = finished(ranks, fmt, tmp_path_factory)
    shutil.copytree(src / "checkpoints", root / "checkpoints", symlinks=True)
    folder = save_folder(root)
    (folder / "finished.json").unlink()
    for path in folder.glob("ep0-ba*"):
        if int(path.name.split(".")[0].split("-rank")[0][len("ep0-ba"):]) > batch:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    [link] = folder.glob("latest-*")
    # a folder of shards, or rank 0's one file
    target = next(p for p in (folder / f"ep0-ba{batch}", folder / f"ep0-ba{batch}-rank0.pt") if p.exists())
    link.unlink()
    link.symlink_to(target.name)
    return folder


def _files(folder: Path, older_than: str = "~") -> dict:
    """Content of every checkpoint file whose top-level name sorts before `older_than` (default: all; not the
    run's lock file, which names its holder)."""
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
            and p.name != ".lock" and p.relative_to(folder).parts[0] < older_than}


def test_no_link_and_a_truncated_newest_shard_resume_from_the_previous_checkpoint_never_from_scratch(
        tmp_path, tmp_path_factory):
    """2-rank sharded: the `latest` link gone (a kill between composer's remove and create) and the newest
    checkpoint's second shard cut short. The rerun sets ep0-ba40 aside with a warning naming it, resumes from
    ep0-ba30, ends at the uninterrupted loss, and rewrites none of the older checkpoints."""
    folder, cmd = _finished_copy(2, "sharded", tmp_path, tmp_path_factory)
    (folder / "latest-sharded-rank0").unlink()
    shard = folder / "ep0-ba40" / "__1_0.distcp"
    half = shard.stat().st_size // 2
    shard.write_bytes(shard.read_bytes()[:half])
    older = _files(folder, "ep0-ba40")
    root = folder.parents[1]

    training(*cmd, root=root, check=True)
    log = task_log(root)
    assert "ep0-ba40 cannot be resumed from: shard __1_0.distcp is truncated" in log
    assert "resuming from " + str(folder / "ep0-ba30") in log
    aside, manifest = sorted((folder / "set-aside").iterdir())  # kept, not deleted, with its manifest
    assert aside.name.startswith("ep0-ba40.") and (aside / "__1_0.distcp").stat().st_size == half
    assert manifest.name == f"{aside.name}.manifest.json"
    assert _files(folder, "ep0-ba40") == older  # nothing older was overwritten
    assert_same_run(newest_metrics(root), straight(2, tmp_path_factory))


def test_an_empty_newest_file_beside_a_link_to_the_previous_resumes_from_the_previous(tmp_path, tmp_path_factory):
    """1 rank (one `.pt` a checkpoint): killed the instant composer created the next checkpoint file (0 bytes,
    link still on the previous one). composer alone refuses this folder ("may conflict with a future
    checkpoint")."""
    folder, cmd = _finished_copy(1, "sharded", tmp_path, tmp_path_factory)
    link = folder / "latest-sharded-rank0"
    link.unlink()
    link.symlink_to("ep0-ba30-rank0.pt")
    (folder / "ep0-ba40-rank0.pt").write_bytes(b"")
    root = folder.parents[1]

    proc = training(*cmd, root=root, check=True)
    assert "ep0-ba40-rank0.pt cannot be resumed from: empty file" in proc.stderr
    assert_same_run(newest_metrics(root), straight(1, tmp_path_factory))


def test_a_complete_checkpoint_newer_than_the_link_is_used(tmp_path, tmp_path_factory):
    """2-rank sharded: killed after the newest checkpoint's files, before the link moved to it. The rerun finds
    that checkpoint by content, not by the link. It is the final one and the run never reached its end (no
    finished.json: its end-of-fit work never ran), so it is set aside and the last batches are trained again from
    the one before (with its finished.json, the final checkpoint is resumed from and there is nothing to do:
    test_a_checkpoint_without_its_manifest_resumes_on_its_structure_and_gets_one)."""
    folder, cmd = _finished_copy(2, "sharded", tmp_path, tmp_path_factory)
    link = folder / "latest-sharded-rank0"
    link.unlink()
    link.symlink_to("ep0-ba30")
    older = _files(folder, "ep0-ba40")
    root = folder.parents[1]

    training(*cmd, root=root, check=True)
    log = task_log(root)
    assert "ep0-ba40 cannot be resumed from: it is the final one (batch 40)" in log
    assert "resuming from " + str(folder / "ep0-ba30") in log
    assert _files(folder, "ep0-ba40") == older
    assert_same_run(newest_metrics(root), straight(2, tmp_path_factory))


# a run of its own from a consolidated file: ten batches past the reference's end
CONTINUED = ("-m", "train", "checkpoint=full", "max_duration=50ba", "save_interval=10ba", "eval_interval=10ba",
             "progress_bar=false")


def _consolidated(tmp_path_factory) -> Path:
    """`python -m train.consolidate FOLDER --out consolidated.pt` (a name of the user's) of the 2-rank sharded
    reference's save folder (its final checkpoint), made once: the folder holding the file, its manifest and what
    the command printed (`printed`). The consolidate tests share it, on one worker (their xdist_group); each copies
    the file before it changes anything (_consolidated_copy)."""
    def make(made: Path) -> None:
        folder, _ = _finished_copy(2, "sharded", made, tmp_path_factory)
        proc = run("-m", "train.consolidate", folder, "--out", made / "consolidated.pt", check=True)
        (made / "printed").write_text(proc.stdout)
    return made_once(tmp_path_factory, "consolidated", make)


def _consolidated_copy(tmp_path: Path, tmp_path_factory) -> Path:
    """_consolidated's file and its manifest copied into the test's folder: the copy's path."""
    made = _consolidated(tmp_path_factory)
    for name in ("consolidated.pt", "consolidated.pt.manifest.json"):
        shutil.copy(made / name, tmp_path / name)
    return tmp_path / "consolidated.pt"


@pytest.mark.xdist_group("consolidated")
def test_consolidate_a_sharded_checkpoint_into_one_file_that_load_path_continues_and_checks(sharded2, tmp_path,
                                                                                         tmp_path_factory):
    """`train.consolidate --out FILE` (a name of the user's) then `load_path=FILE`: the new run continues the
    state. The file has a manifest; intact but at max_duration, the run is refused (it printed "already trained",
    of no run of its own, exit 0). The file's other checks: the tests below."""
    made = _consolidated(tmp_path_factory)
    assert (made / "printed").read_text().strip() == str(made / "consolidated.pt")
    assert (made / "consolidated.pt").stat().st_size > 0 and (made / "consolidated.pt.manifest.json").is_file()
    out = _consolidated_copy(tmp_path, tmp_path_factory)

    # a new run (its own name and folder) that starts from the consolidated state and trains 10 more batches
    root = tmp_path / "from-file"
    training(*CONTINUED, f"load_path={out}", root=root, check=True)
    got = newest_metrics(root)
    assert got["batches"] == 50 and [b for b, _ in got["train_loss"]] == list(range(1, 51))

    proc = training(*CONTINUED, "max_duration=40ba", f"load_path={out}", root=tmp_path / "b", check=1)
    assert f"error: max_duration: the checkpoint load_path={out} is already at max_duration=40ba" in proc.stderr
    assert not list((tmp_path / "b").glob("checkpoints/*/ep*"))


@pytest.mark.xdist_group("consolidated")
def test_consolidate_refuses_what_it_must_not_read_or_write(sharded2, tmp_path, tmp_path_factory):
    """No checkpoint there, a folder of the user's as --out, a file that exists, a file inside the checkpoint, a
    name composer gives a checkpoint: refused (exit 2), nothing written."""
    folder, _ = _finished_copy(2, "sharded", tmp_path, tmp_path_factory)
    out = _consolidated_copy(tmp_path, tmp_path_factory)
    bad = run("-m", "train.consolidate", tmp_path / "nowhere")
    assert bad.returncode == 2 and "no complete checkpoint" in bad.stderr
    mine = tmp_path / "mine"
    (mine / "keep").mkdir(parents=True)  # a folder of the user's as --out: never replaced
    assert run("-m", "train.consolidate", folder, "--out", mine, check=2).stderr.startswith("error: --out:")
    assert (mine / "keep").is_dir()
    # only this checkpoint's own file beside it is replaced (another run's ep0-ba40-rank0.pt was overwritten by a
    # batch-20 state that then verified, and was resumed from as batch 40); nor into a checkpoint folder, nor under
    # another batch's checkpoint name
    other = tmp_path / "other.pt"
    shutil.copy(out, other)
    for target, says in ((other, "exists; the conversion replaces it whole"),
                         (folder / "ep0-ba40" / "full.pt", "is inside the checkpoint"),
                         (tmp_path / "ep0-ba20-rank0.pt", "is named as composer names a checkpoint (batch 20)"),
                         (tmp_path / "B" / "ep0-ba40-rank0.pt", "is named as composer names a checkpoint (batch 40)")):
        proc = run("-m", "train.consolidate", folder, "--out", target, check=2)
        assert f"error: --out: {target} {says}" in proc.stderr, proc.stderr
        assert not target.exists() or target == other
    assert other.read_bytes() == out.read_bytes() and not (folder / "ep0-ba40" / "full.pt").exists()


def test_consolidate_writes_beside_the_shards_by_default_and_converts_no_full_file(sharded2, tmp_path,
                                                                                 tmp_path_factory):
    """Without --out, the file is written beside the shards; that file given with an --out: nothing to convert,
    refused (it printed the file's path, exit 0, and --out was never written)."""
    folder, _ = _finished_copy(2, "sharded", tmp_path, tmp_path_factory)
    beside = Path(run("-m", "train.consolidate", folder, check=True).stdout.strip())
    assert beside == folder / "ep0-ba40-rank0.pt"
    proc = run("-m", "train.consolidate", beside, "--out", tmp_path / "copy.pt", check=2)
    assert "is already one full checkpoint file" in proc.stderr and not (tmp_path / "copy.pt").exists()


@pytest.mark.xdist_group("consolidated")
def test_a_consolidated_file_into_a_model_of_another_shape_is_refused_by_its_record_or_its_own_config(
        sharded2, tmp_path, tmp_path_factory):
    """load_path=FILE into a model of another shape: composer dropped what did not match (alibi: MPT builds no
    position embeddings, and the run trained on without them, exit 0); the run record the file's manifest carries
    names it on the login node, before anything is written (and, without it, the checkpoint's own stored model
    config in the task, before anything is trained)."""
    out = _consolidated_copy(tmp_path, tmp_path_factory)
    other = (*CONTINUED, f"load_path={out}", "+load_weights_only=true", "+model.attn_config.alibi=true")
    proc = training(*other, root=tmp_path / "c", check=2)
    assert "error: load_path: " in proc.stderr and "model.learned_pos_emb=True there, False here" in proc.stderr, \
        proc.stderr[-2000:]
    assert "as the run that wrote it records" in proc.stderr
    manifest = tmp_path / "consolidated.pt.manifest.json"
    manifest.write_text(json.dumps({k: v for k, v in json.loads(manifest.read_text()).items() if k != "run"}))
    proc = training(*other, root=tmp_path / "c", check=1)
    assert "error: load_path: " in proc.stderr and "model.learned_pos_emb=True there, False here" in proc.stderr, \
        proc.stderr[-2000:]
    assert not list((tmp_path / "c").glob("checkpoints/*/ep*"))


@pytest.mark.xdist_group("consolidated")
def test_a_consolidated_file_exports_under_its_own_name_and_damaged_is_refused_by_manifest_or_crc(
        sharded2, tmp_path, tmp_path_factory):
    """A consolidated file is exported with --out (its name holds no batch: without --out, refused). Damaged later,
    a run that loads it stops naming it and trains nothing (torch loads flipped weights without a word: the run
    trained on from them, exit 0); without its manifest, its zip records' CRC-32 name it (export, before the model
    loads)."""
    out = _consolidated_copy(tmp_path, tmp_path_factory)
    assert "--out" in run("-m", "train.export", out, root=tmp_path, check=2).stderr  # no batch in its name
    run("-m", "train.export", out, f"--out={tmp_path / 'hf'}", root=tmp_path, check=True)
    assert (tmp_path / "hf" / "model.safetensors").is_file()

    _flip_middle(out)
    proc = training(*CONTINUED, f"load_path={out}", root=tmp_path / "a", check=1)
    assert f"error: load_path: {out} does not match its manifest" in proc.stderr, proc.stderr[-2000:]
    assert not list((tmp_path / "a").glob("checkpoints/*/ep*"))  # nothing trained
    (tmp_path / "consolidated.pt.manifest.json").unlink()
    proc = run("-m", "train.export", out, f"--out={tmp_path / 'hf2'}", root=tmp_path, check=2)
    assert "does not match its CRC-32" in proc.stderr and not (tmp_path / "hf2").exists()


def test_a_stopped_rank_ends_the_whole_job_within_the_timeout_and_the_error_names_the_ranks(tmp_path):
    """SIGSTOP one rank of a 2-rank job: the other fails its next collective after dist_timeout, exits
    non-zero with its own error, the stopped rank is killed, and the sweep reports both ranks, in minutes rather
    than at the job's time limit (60 min here)."""
    import psutil

    proc = start("-m", "train", "-m", "cluster.tasks_per_node=2", "checkpoint=none", "max_duration=100000ba",
                 "progress_bar=false", "dist_timeout=15", root=tmp_path, text=True, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not list(tmp_path.glob("outputs/sweeps/*/.submitit/*/*_0_log.err")) or "[progress] step" not in \
                next(tmp_path.glob("outputs/sweeps/*/.submitit/*/*_0_log.err")).read_text():
            assert proc.poll() is None and time.time() < deadline, "the job never started training"
            time.sleep(0.2)
        # the rank itself (a child of submitit's local controller), not the workers it started
        [controller] = [p for p in psutil.Process(proc.pid).children() if "submitit.local._local" in p.cmdline()]
        [rank1] = [p for p in controller.children() if p.environ().get("SUBMITIT_LOCAL_GLOBALID") == "1"]
        rank1.suspend()  # SIGSTOP
        stopped = time.time()
        out, err = proc.communicate(timeout=600)
        ended = time.time() - stopped
    finally:
        stop(proc)  # whatever is left if the test failed

    assert proc.returncode == 1
    assert ended < 180, f"the job took {ended:.0f} s to end after a rank stopped"
    assert not rank1.is_running() or rank1.status() == psutil.STATUS_ZOMBIE
    [row] = list(csv.DictReader(next(tmp_path.glob("outputs/sweeps/*/summary.csv")).open()))
    assert row["state"] == "FAILED"
    assert row["error"].startswith("rank 0: RuntimeError") and "Timed out" in row["error"]
    assert "rank 1: no result (killed, or stopped responding" in row["error"]
    assert "rank 0: RuntimeError" in err and "rank 1:" in err
    logs = [p.read_text() for p in tmp_path.glob("outputs/sweeps/*/.submitit/*/*_log.*")]
    assert logs and not any("completed successfully" in text for text in logs)


# ------------------------------------------------------------------ integrity: what was written is what loads


def _flip_middle(path: Path, size: int = 4096) -> None:
    """Invert `size` bytes in the middle of a file, as a bad disk block or a bit-rotting copy would: its times
    stay as they were (a file written since is of another training: finished.ended_at_checkpoint)."""
    import os

    was = path.stat()
    with open(path, "r+b") as f:
        f.seek(was.st_size // 2)
        block = f.read(size)
        f.seek(was.st_size // 2)
        f.write(bytes(b ^ 0xFF for b in block))
    os.utime(path, ns=(was.st_atime_ns, was.st_mtime_ns))


def _largest_file(ckpt: Path) -> Path:
    return ckpt if ckpt.is_file() else max((p for p in ckpt.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)


def _checkpoint(folder: Path, batch: int) -> Path:
    [ckpt] = [p for p in folder.iterdir() if p.name in (f"ep0-ba{batch}", f"ep0-ba{batch}-rank0.pt")]
    return ckpt


@pytest.mark.parametrize("fmt, ranks", CELLS)
def test_a_flipped_block_in_the_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
        fmt, ranks, tmp_path, tmp_path_factory):
    """Every checkpoint has a manifest; 4 KiB inverted in the middle of the newest one's largest file (a
    `.distcp` shard, or the `.pt`): the rerun names that file, sets the checkpoint aside (kept), resumes from the
    one before (after 3 evaluations) and ends at exactly the uninterrupted run's loss and evaluation."""
    folder, cmd = _finished_copy(ranks, fmt, tmp_path, tmp_path_factory)
    for batch in (10, 20, 30, 40):
        assert (folder / f"{_checkpoint(folder, batch).name}.manifest.json").is_file()
    damaged = _largest_file(_checkpoint(folder, 40))
    _flip_middle(damaged)
    root = folder.parents[1]

    proc = training(*cmd, root=root, check=True)
    said = proc.stderr + task_log(root)
    assert f"{damaged} does not match its manifest" in said
    assert f"resuming from {_checkpoint(folder, 30)}" in said
    aside = list((folder / "set-aside").iterdir())
    assert len(aside) == 2 and any(p.name.endswith(".manifest.json") for p in aside)  # with its manifest, kept
    assert_same_run(newest_metrics(root), straight(ranks, tmp_path_factory))


@pytest.mark.parametrize("reader, fmt, ranks", [("train.export", "sharded", 1), ("train.consolidate", "sharded", 2)])
def test_a_checkpoint_named_by_its_path_that_does_not_match_its_manifest_is_refused(reader, fmt, ranks, tmp_path,
                                                                                     tmp_path_factory):
    """export and consolidate read the one checkpoint they are pointed at: a damaged one is refused naming the
    file and nothing is written (exit 0 would hand over damaged weights)."""
    folder, _ = _finished_copy(ranks, fmt, tmp_path, tmp_path_factory)
    ckpt = _checkpoint(folder, 40)
    damaged = _largest_file(ckpt)
    _flip_middle(damaged)
    out = tmp_path / "out"
    proc = run("-m", reader, str(ckpt), f"--out={out}", root=tmp_path, check=2)
    assert f"{damaged} does not match its manifest" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_when_no_checkpoint_verifies_the_run_stops_naming_them_and_trains_nothing(tmp_path, tmp_path_factory):
    folder, cmd = _finished_copy(1, "sharded", tmp_path, tmp_path_factory)
    for batch in (10, 20, 30, 40):
        _flip_middle(_checkpoint(folder, batch))
    root = folder.parents[1]

    proc = training(*cmd, root=root)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()
    assert any(line.startswith("error: save_folder: no checkpoint in") for line in last)
    assert all(f"ep0-ba{b}-rank0.pt: " in proc.stderr for b in (10, 20, 30, 40))
    assert "Traceback" not in proc.stderr
    assert len([p for p in (folder / "set-aside").iterdir() if ".manifest" not in p.name]) == 4
    assert not resume_candidates(folder)  # nothing trained from scratch over them


def resume_candidates(folder: Path) -> list:
    from train.checkpoint import resume

    return resume.find(folder)


@pytest.mark.parametrize("record", ["kept", "lost"])
def test_resuming_on_training_data_made_again_in_its_folder_is_refused_naming_it(record, tmp_path,
                                                                                 tmp_path_factory):
    """The run is named by its settings and its data by the folder: data made again there (here: other samples,
    as many: other counts in a mock folder are refused before the job, train/checks/node.py) would go on from
    streaming's place in the old data and end with exit 0. Stopped (2 ranks, after evaluations) before anything is
    trained or written, naming the index, both sample counts, and how to go on from its weights."""
    from train.task.mock_data import write_split

    src = finished(2, "sharded", tmp_path_factory)
    folder = _stopped_copy(2, 20, tmp_path, tmp_path_factory)
    [mock] = [p.parent.parent for p in src.rglob("train/index.json") if "checkpoints" not in p.parts]
    data = tmp_path / mock.relative_to(src)
    shutil.copytree(mock, data)
    shutil.rmtree(data / "train")
    write_split(data / "train", 1024, 128, seed=7)
    if record == "lost":  # copied to new storage without it: the checkpoint's manifest carries the record
        (folder / "identity.json").unlink()
    before = _files(folder)
    proc = training(*command(2, "sharded"), root=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = proc.stderr + task_log(tmp_path)
    assert (f"train_loader.dataset: {data / 'train' / 'index.json'} is not the data this run trained on (1024 "
            "samples now, 1024 when the run started; its index.json hashes") in said, said[-3000:]
    assert f"run_name=<a new name> load_path={folder}/ep0-ba20" in said
    assert "| FAILED |" in proc.stdout and "[progress] step" not in task_log(tmp_path)
    assert _files(folder) == before  # no checkpoint, and its record still names the data it trained on


@pytest.mark.parametrize("fmt, ranks", CELLS)
def test_a_checkpoint_without_its_manifest_resumes_on_its_content_and_gets_one(fmt, ranks, tmp_path,
                                                                              tmp_path_factory):
    """A kill between a checkpoint's last file and its manifest (composer's `latest` link already on it), or a
    copy without `*.manifest.json`: the checkpoint's bytes match the CRCs torch wrote into them, so the run resumes
    from it instead of losing it, ends at the uninterrupted run's loss, and writes its manifest, which carries the
    run's record (identity.json lost as well: what the run is travels in the other checkpoints' manifests)."""
    folder = _stopped_copy(ranks, 30, tmp_path, tmp_path_factory, fmt)
    ckpt = _checkpoint(folder, 30)
    manifest = folder / f"{ckpt.name}.manifest.json"
    written = json.loads(manifest.read_text())
    assert written["run"] == json.loads((folder / "identity.json").read_text())  # the record travels with it
    manifest.unlink()
    (folder / "identity.json").unlink()
    proc = training(*command(ranks, fmt), root=tmp_path, check=True)
    said = proc.stderr + task_log(tmp_path)
    assert f"{ckpt} has no manifest: its content matches the CRCs torch wrote into it" in said, said[-3000:]
    assert f"resuming from {ckpt}" in said and not (folder / "set-aside").exists()
    assert_same_run(newest_metrics(tmp_path), straight(ranks, tmp_path_factory))
    again = json.loads(manifest.read_text())
    assert again["files"] == written["files"] and again["run"]["train_data"] == written["run"]["train_data"]

    # no manifest and no identity.json anywhere: what the checkpoints are cannot be established
    older = _stopped_copy(ranks, 30, tmp_path / "older", tmp_path_factory, fmt)
    for made in [*older.glob("*.manifest.json"), older / "identity.json"]:
        made.unlink()
    before = _files(older)
    stopped = training(*command(ranks, fmt), root=tmp_path / "older")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    said = stopped.stderr + task_log(tmp_path / "older")
    assert (f"save_folder: what run {_checkpoint(older, 30)} belongs to cannot be established: "
            f"{older / 'identity.json'} is missing or unreadable") in said, said[-3000:]
    assert "Traceback" not in stopped.stderr and _files(older) == before  # nothing written, nothing certified


@pytest.mark.parametrize("fmt, ranks", CELLS)
def test_a_damaged_checkpoint_without_its_manifest_is_set_aside_by_its_crcs_and_never_certified(
        fmt, ranks, tmp_path, tmp_path_factory):
    """The window a manifest leaves: the newest checkpoint damaged (4 KiB inverted in its largest file) and its
    manifest missing. Its CRCs name the file; it is set aside without a manifest; the run resumes from the one
    before and ends at the uninterrupted run's loss (it resumed from the damaged weights, exit 0, and certified
    them)."""
    folder, cmd = _finished_copy(ranks, fmt, tmp_path, tmp_path_factory)
    ckpt = _checkpoint(folder, 40)
    (folder / f"{ckpt.name}.manifest.json").unlink()
    damaged = _largest_file(ckpt)
    _flip_middle(damaged)
    root = folder.parents[1]

    proc = training(*cmd, root=root, check=True)
    said = proc.stderr + task_log(root)
    assert f"cannot be resumed from: {damaged}: " in said and "(damaged since torch wrote it)" in said, said[-3000:]
    assert f"resuming from {_checkpoint(folder, 30)}" in said
    [aside] = (folder / "set-aside").iterdir()  # no manifest was written for it
    assert aside.name.startswith(f"{ckpt.name}.")
    assert_same_run(newest_metrics(root), straight(ranks, tmp_path_factory))
    from train.checkpoint import integrity

    rewritten = _checkpoint(folder, 40)  # trained again: intact, and certified by its manifest
    assert integrity.share_differs(rewritten, integrity.read_manifest(rewritten), 1, 0) is None


def test_the_content_check_finds_a_flipped_byte_in_any_record_of_either_format(tmp_path, tmp_path_factory):
    """integrity.content_differs on the reference checkpoints: intact ones pass at every rank's share; one byte
    flipped in any record (the first, a middle and the last one of a shard, or of the `.pt`) is named, by the rank
    that owns that file."""
    import pickle

    from train.checkpoint import integrity

    sharded = _checkpoint(save_folder(finished(2, "sharded", tmp_path_factory)), 20)
    full = _checkpoint(save_folder(finished(2, "full", tmp_path_factory)), 20)
    for ckpt in (sharded, full):
        assert all(integrity.content_differs(ckpt, 2, rank) is None for rank in (0, 1))
    copy = tmp_path / sharded.name
    shutil.copytree(sharded, copy)
    with open(copy / ".metadata", "rb") as f:
        items = sorted((i for i in pickle.load(f).storage_data.values() if i.relative_path == "__1_0.distcp"),
                       key=lambda i: i.offset)
    shard = copy / "__1_0.distcp"
    for info in (items[0], items[len(items) // 2], items[-1]):
        at = info.offset + info.length // 2
        data = bytearray(shard.read_bytes())
        data[at] ^= 0x01
        shard.write_bytes(bytes(data))
        assert integrity.content_differs(copy, 2, 0) is None  # rank 0 does not own that shard
        assert integrity.content_differs(copy, 2, 1).startswith(f"{shard}: at byte {info.offset}, ")
        data[at] ^= 0x01
        shard.write_bytes(bytes(data))
    one = tmp_path / full.name
    data = bytearray(full.read_bytes())
    data[len(data) // 3] ^= 0x80
    one.write_bytes(bytes(data))
    assert "(damaged since torch wrote it)" in integrity.content_differs(one)


def test_the_final_checkpoint_is_told_in_the_durations_own_unit_at_any_batch_size(tmp_path):
    """A checkpoint is set aside as the final one of a run stopped before its end only where the command's
    max_duration ends at it, read from where it stands as its manifest records it: a run of 81920tok at 16 x 128
    tokens a batch, stopped after batch 20 (40960 tokens), resumed at 32 a batch (81920tok is 20 of those) had batch
    20 read as its end, set aside, and batches 11-20 trained again, exit 0."""
    import torch
    from omegaconf import OmegaConf

    from train.checkpoint import integrity
    from train.checkpoint.resume import find
    from train.task.main import _end_not_reached

    folder = tmp_path / "ckpts"
    folder.mkdir()
    for batch in (10, 20):
        path = folder / f"ep0-ba{batch}-rank0.pt"
        torch.save({"state": {"model": {"w": torch.ones(8)}}}, path)
        stamp = {"batch": batch, "sample": 16 * batch, "token": 2048 * batch,
                 "before": {"batch": batch - 1, "sample": 16 * (batch - 1), "token": 2048 * (batch - 1)}}
        integrity.write_manifest(path, None, stamp)
    twenty = find(folder)[-1]

    def command(duration, batch_size):
        return OmegaConf.create({"max_duration": duration, "global_train_batch_size": batch_size, "max_seq_len": 128,
                                 "save_folder": str(folder)})

    assert _end_not_reached(twenty, command("81920tok", 32)) is None  # 40960 of 81920 tokens: not its end
    assert _end_not_reached(twenty, command("640sp", 32)) is None  # 320 of 640 samples
    assert "it is the final one (batch 20)" in _end_not_reached(twenty, command("40960tok", 32))  # its end
    assert "it is the final one (batch 20)" in _end_not_reached(twenty, command("40000tok", 16))  # the batch reaching it
    assert _end_not_reached(twenty, command("38912tok", 16)) is None  # reached by batch 19: trained past it
    # in epochs the end is not told in batches: the newest checkpoint is taken for the final one where its name's
    # epochs done could end the run (ep0-ba20: an epoch's last batch saved before the epoch counts as done)
    assert "it is the newest (batch 20) and, as max_duration=1ep is not told in batches, taken for the final one" \
        in _end_not_reached(twenty, command("1ep", 16))
    assert _end_not_reached(twenty, command("1ep", 16), newest=False) is None  # a later one was set aside
    assert _end_not_reached(twenty, command("3ep", 16)) is None  # in the first of 3 epochs
    # recorded in epochs done (an epoch's last batch ends it): the end of 1ep, not a checkpoint inside it
    for epochs, final in (((0, 1), True), ((0, 0), False), ((1, 1), False)):
        stamp = {"batch": 20, "sample": 320, "token": 40960, "epoch": epochs[1],
                 "before": {"batch": 19, "sample": 304, "token": 38912, "epoch": epochs[0]}}
        integrity.write_manifest(twenty.path, None, stamp)
        said = _end_not_reached(twenty, command("1ep", 16))
        assert ("it is the final one (batch 20)" in said) if final else said is None, (epochs, said)
    (folder / "finished.json").write_text(json.dumps({"max_duration": "40960tok", "batch": 20}))
    assert _end_not_reached(twenty, command("40960tok", 32)) is None  # the run ended there
    assert _end_not_reached(twenty, command("1ep", 16)) is None


def test_a_final_checkpoint_is_the_runs_end_only_by_a_finished_json_written_after_it(tmp_path):
    """A run killed after writing its final checkpoint and before its end: resumed from it, the run had nothing to
    train and printed the evaluation before as its final one, exit 0, on every rerun. Where a finished.json of an
    earlier training that ended at that batch was there (its checkpoint deleted by hand to go back), or no checkpoint
    came before it, the same. Now such a checkpoint is set aside: the last batches are trained again, from batch 0
    where it was the run's one checkpoint ever; only one whose earlier checkpoints were rotated away is resumed,
    warned."""
    import os

    import torch
    from omegaconf import OmegaConf

    from train.checkpoint import integrity
    from train.checkpoint.resume import find
    from train.task.main import _end_not_reached

    folder = tmp_path / "ckpts"
    folder.mkdir()
    path = folder / "ep0-ba20-rank0.pt"
    torch.save({"state": {"model": {"w": torch.ones(8)}}}, path)
    integrity.write_manifest(path, None, {"batch": 20, "sample": 320, "token": 40960,
                                          "before": {"batch": 19, "sample": 304, "token": 38912}})
    [twenty] = find(folder)

    def command(every):
        return OmegaConf.create({"max_duration": "20ba", "global_train_batch_size": 16, "max_seq_len": 128,
                                 "save_folder": str(folder), "save_interval": every})

    assert "trains its 20 batches again from batch 0" in _end_not_reached(twenty, command("1000ba"))
    assert _end_not_reached(twenty, command("5ba")) is None  # batches 5-15's checkpoints rotated away: warned
    record = folder / "finished.json"
    record.write_text(json.dumps({"max_duration": "20ba", "batch": 20}))
    assert _end_not_reached(twenty, command("1000ba")) is None  # written after it: the run ended there
    os.utime(integrity.manifest_path(path))  # a manifest written by a later start (for one without) changes nothing
    assert _end_not_reached(twenty, command("1000ba")) is None
    os.utime(record, (path.stat().st_mtime - 60,) * 2)  # an earlier training's, the checkpoint written since
    assert "it is the final one (batch 20)" in _end_not_reached(twenty, command("1000ba"))
    (folder / "ep0-ba20").mkdir()  # the same batch's other format, from before the record: of the same checkpoint
    os.utime(folder / "ep0-ba20", (path.stat().st_mtime - 120,) * 2)
    assert _end_not_reached(twenty, command("1000ba")) is None


def test_a_sweep_takes_a_run_for_finished_only_while_the_checkpoint_it_finished_at_is_kept(tmp_path):
    """A sweep run again reports a finished point from its finished.json instead of submitting it. With the final
    checkpoint deleted by hand the plain command trains the batches since the one before: so must the sweep
    (measured: it said "finished earlier" with batch 40's numbers while the run's newest checkpoint was ba30). Nor
    with a finished.json written before every checkpoint of its batch, as the task tells a run's end: the final
    checkpoint deleted by hand, then written again by a start killed in its final evaluation (it said "finished
    earlier" with the deleted training's objective and the killed start's evaluation before its end)."""
    import os

    from omegaconf import OmegaConf

    from train.launch.finished import read

    folder = tmp_path / "run"
    folder.mkdir()
    cfg = OmegaConf.create({"max_duration": "40ba", "save_folder": str(folder), "autoresume": True})
    for name in ("ep0-ba30-rank0.pt", "ep0-ba40-rank0.pt"):
        (folder / name).write_bytes(b"")
    record = folder / "finished.json"
    record.write_text(json.dumps({"max_duration": "40ba", "batch": 40, "metrics": {"x": 1}}))
    assert read(cfg)["value"] == {"x": 1}
    os.utime(record, ((folder / "ep0-ba40-rank0.pt").stat().st_mtime - 60,) * 2)
    assert read(cfg) is None  # an earlier training's end: its checkpoint written again since
    record.write_text(record.read_text())
    (folder / "ep0-ba40-rank0.pt").unlink()
    assert read(cfg) is None  # the checkpoint it finished at is gone: trained again
    (folder / "ep0-ba40").mkdir()  # the same batch's sharded folder, from before the record
    os.utime(folder / "ep0-ba40", (record.stat().st_mtime - 1,) * 2)
    assert read(cfg) is not None
    (folder / "finished.json").write_text(json.dumps({"max_duration": "40ba", "metrics": {}}))  # no batch recorded
    assert read(cfg) is not None
    for p in [*folder.glob("ep0-ba*-rank0.pt"), folder / "ep0-ba40"]:
        p.rmdir() if p.is_dir() else p.unlink()
    assert read(cfg) is None  # no checkpoint at all
    # checkpoints of the user's naming are not listed here (nor chosen among by the task): finished.json stands
    assert read(OmegaConf.merge(cfg, {"save_filename": "step{batch}.pt"})) is not None


@pytest.mark.parametrize("fmt, ranks", [("sharded", 1), ("sharded", 2)])
def test_a_sweep_run_again_verifies_the_final_checkpoint_before_it_reports_a_run_finished(fmt, ranks, tmp_path,
                                                                                          tmp_path_factory):
    """finished.json is no proof that the weights it ended with are still there: a final checkpoint damaged since
    (with its manifest, or without) makes the point one to submit again (its task sets the checkpoint aside and
    trains the last batches again), said by name; a plan only lists it."""
    from omegaconf import OmegaConf

    from train.launch.finished import read

    src = save_folder(finished(ranks, fmt, tmp_path_factory))
    folder = tmp_path / src.name
    shutil.copytree(src, folder, symlinks=True)
    cfg = OmegaConf.create({"max_duration": "40ba", "save_folder": str(folder), "autoresume": True,
                            "run_name": folder.name})
    assert read(cfg, verify=True) is not None
    ckpt = _checkpoint(folder, 40)
    _flip_middle(_largest_file(ckpt))
    assert read(cfg) is not None  # listed: there
    assert read(cfg, verify=True) is None
    (folder / f"{ckpt.name}.manifest.json").unlink()
    assert read(cfg, verify=True) is None  # by its CRCs


def test_the_choice_by_content_on_made_up_folders(tmp_path):
    """Newest complete first; newer incomplete ones set aside only by the run that owns the folder; a conversion
    cut off (hidden partial) removed; at equal batch the format the run reads wins."""
    import torch

    from train.checkpoint import resume

    folder = tmp_path / "ckpts"
    folder.mkdir()
    torch.save({"state": {"model": {"w": torch.ones(1000)}, "note": "x"}}, folder / "ep0-ba10-rank0.pt")
    (folder / "ep0-ba20").mkdir()  # a sharded write that never got its .metadata
    (folder / "ep0-ba20" / "__0_0.distcp").write_bytes(b"x")
    good = (folder / "ep0-ba10-rank0.pt").read_bytes()
    (folder / "ep0-ba30-rank0.pt").write_bytes(good[: len(good) // 2])  # cut off mid-write
    (folder / ".partial-ep0-ba10").mkdir()  # a conversion cut off

    # a reader beside a live run moves nothing
    assert resume.newest_complete(folder).path.name == "ep0-ba10-rank0.pt"
    assert {p.name for p in folder.iterdir()} == {"ep0-ba10-rank0.pt", "ep0-ba20", "ep0-ba30-rank0.pt",
                                                  ".partial-ep0-ba10"}
    # the run that owns the folder tidies it
    assert resume.problem(resume.find(folder)[-1]).startswith("truncated")
    assert resume.newest_complete(folder, tidy=True).path.name == "ep0-ba10-rank0.pt"
    assert {p.name for p in folder.iterdir()} == {"ep0-ba10-rank0.pt", "set-aside"}
    assert sorted(p.name.split(".")[0] for p in (folder / "set-aside").iterdir()) == ["ep0-ba20", "ep0-ba30-rank0"]

    # the same batch in both formats: the one the run reads comes first
    sharded = resume.shard(folder / "ep0-ba10-rank0.pt", folder / "ep0-ba10")
    assert resume.newest_complete(folder, reads_sharded=True).path == sharded
    assert resume.newest_complete(folder, reads_sharded=False).path.name == "ep0-ba10-rank0.pt"
    shard = sharded / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1])
    assert resume.problem(resume.find(folder)[-1]).startswith("shard __0_0.distcp is truncated")


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict:
    return helpers.checkpoint_kinds(tmp_path_factory.mktemp("kinds"))


@pytest.mark.parametrize("kind", helpers.CHECKPOINT_KINDS)
def test_the_task_refuses_a_checkpoint_exactly_where_composer_cannot_load_it(kind, kinds, tmp_path):
    """Each kind of checkpoint (a zip .pt, a legacy-pickle .pt, a cut-off .pt, a sharded folder whole, with a shard
    missing, with an empty .metadata): composer's own loader (torch's for a sharded folder) loads it exactly where
    resume.problem and resume.unreadable accept it, and head_problem (the login node's and export's decision) says
    the same words; in a save folder resume keeps exactly the loadable ones."""
    from composer.utils.checkpoint import safe_torch_load
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from train.checkpoint import resume

    path = kinds[kind]
    try:
        dcp_to_torch_save(str(path), str(tmp_path / "out.pt")) if path.is_dir() else safe_torch_load(str(path))
        loads = True
    except (Exception, CheckpointException):  # noqa: BLE001 -- whatever the loader raises (torch's is no Exception)
        loads = False
    assert loads == helpers.CHECKPOINT_KINDS[kind]
    ckpt = resume.Checkpoint(path, 0, 10, sharded=path.is_dir())
    why = resume.problem(ckpt)
    assert (why is None) == loads and (resume.unreadable(ckpt) is None) == loads, why
    assert resume.head_problem(path) == why
    assert [c.path for c in resume.find(path.parent) if resume.problem(c) is None] == ([path] if loads else [])


@pytest.mark.torch  # makes the checkpoints
@pytest.mark.parametrize("kind", [kind for kind, loads in helpers.CHECKPOINT_KINDS.items() if loads])
def test_the_model_a_checkpoint_holds_is_read_from_every_kind_composer_loads(kind, kinds):
    """The task compares load_path='s model with the run's from the config composer stores in the checkpoint
    (resume.stored_model), read as export reads its weights (resume.read_state): from every kind composer loads. A
    legacy-pickle file, which torch cannot map, raised a traceback there instead of the load."""
    from train.checkpoint import resume

    path = kinds[kind]
    assert resume.stored_model(path) is None  # a state without llm-foundry's Hugging Face metadata
    assert float(resume.read_state(path, {"state.model"})["state"]["model"]["w"].sum()) == sum(range(1000))


@pytest.mark.torch  # makes the checkpoints
def test_a_record_whose_header_is_damaged_is_named_damaged_not_a_traceback(kinds, tmp_path):
    """A flipped bit in a record's header, where the archive's structure is whole (head_problem passes it), makes
    zipfile raise what it raises for an archive it cannot read, not BadZipFile: the content check names the file as
    damaged instead of raising (a traceback on one rank, the others waiting for its answer until dist_timeout)."""
    from train.checkpoint import integrity, resume

    raw = kinds["full"].read_bytes()
    central = raw.index(b"PK\x01\x02")  # the first record's entry in the central directory
    for at, value in ((central + 10, 1), (central + 8, raw[central + 8] | 1)):  # its compression; encrypted
        damaged = tmp_path / str(at) / kinds["full"].name
        damaged.parent.mkdir()
        damaged.write_bytes(raw[:at] + bytes([value]) + raw[at + 1:])
        assert resume.head_problem(damaged) is None
        assert integrity.content_differs(damaged).endswith("(damaged since torch wrote it)")


def test_a_manifest_of_another_checkpoint_beside_a_file_checkpoint_does_not_verify_it(tmp_path):
    """A one-file checkpoint whose manifest is another checkpoint's (copied or renamed beside it): the manifest's
    files were hashed, those of the other checkpoint, and it verified, whatever its own content."""
    import shutil as sh

    from train.checkpoint import integrity

    older, newer = tmp_path / "ep0-ba20-rank0.pt", tmp_path / "ep0-ba40-rank0.pt"
    older.write_bytes(b"twenty" * 100)
    newer.write_bytes(b"forty!" * 100)
    integrity.write_manifest(older)
    assert integrity.share_differs(older, integrity.read_manifest(older), 1, 0) is None
    sh.copy(integrity.manifest_path(older), integrity.manifest_path(newer))
    why = integrity.share_differs(newer, integrity.read_manifest(newer), 1, 0)
    assert why == f"{newer} is not in its manifest"


def test_every_kept_checkpoint_has_its_manifest_and_a_shorter_max_duration_rolls_nothing_back(tmp_path):
    """Twelve checkpoints in one process (composer keeps ten): each kept one has its manifest, none is left of
    the ones composer deleted. (The manifests were found by the count of composer's saved list, which stops at
    ten: from the eleventh on, none was written and nothing was verified.) Then the run named with a shorter
    max_duration than it trained to: nothing to do, nothing set aside (not its final checkpoint, which a run
    stopped before its end would have trained again)."""
    cmd = ["-m", "train", "max_duration=24ba", "save_interval=2ba", "eval_interval=12ba", "progress_bar=false"]
    training(*cmd, root=tmp_path, check=True)
    folder = save_folder(tmp_path)
    kept = sorted(p.name for p in folder.glob("ep0-ba*") if not p.name.endswith(".json"))
    assert len(kept) == 10 and "ep0-ba24-rank0.pt" in kept
    assert sorted(p.name for p in folder.glob("*.manifest.json")) == sorted(f"{k}.manifest.json" for k in kept)
    before = _files(folder, "f")  # the checkpoints and their manifests (each start records identity.json)
    again = training(*cmd, "max_duration=20ba", f"run_name={folder.name}", root=tmp_path, check=True)
    assert "nothing to do" in again.stderr and "cannot be resumed from" not in again.stderr
    assert not (folder / "set-aside").exists() and _files(folder, "f") == before
    assert json.loads((folder / "finished.json").read_text())["max_duration"] == "24ba"


def test_the_plan_says_a_resume_only_where_the_start_goes_on_from_the_runs_checkpoints(tmp_path):
    """The plan and the task read one rule (resume.goes_on): with autoresume=false, or checkpoints of the user's own
    naming, a start does not go on from the newest checkpoint here; the plan said `resumes from ... batch 8` beside
    its own warning that the start trains from batch 0 over them."""
    import torch

    from train.config.compose import compose
    from train.plan.forecast import build_plan

    folder = tmp_path / "ckpts"
    folder.mkdir()
    torch.save({"state": {"model": {"w": torch.ones(8)}}}, folder / "ep0-ba8-rank0.pt")
    base = [f"save_folder={folder}", "max_duration=12ba", "plan=json", f"storage.root={tmp_path}"]
    assert build_plan(compose(base))["resumes"]["batch"] == 8
    assert build_plan(compose([*base, "autoresume=false", "save_overwrite=true"]))["resumes"] is None
    assert build_plan(compose([*base, "+save_filename='ep{epoch}-ba{batch}-rank{rank}.pt'"]))["resumes"] is None
