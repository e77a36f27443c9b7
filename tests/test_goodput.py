"""Goodput's arithmetic (train/task/goodput.py): a run's starts, timed by a clock the test moves, summed into the
share of the allocated time that trained and the parts that add up to it. The same ledger written by real runs
(a kill after a checkpoint, then the same command) is checked in test_goodput_run.py."""
import json

import pytest

from train.task import goodput


class Time:
    """The clock the ledger reads: moved by the test."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def wait(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock():
    goodput._CURRENT.clear()
    yield Time()
    goodput._CURRENT.clear()  # nothing left for the test session's exit to write


def start(path, batch, clock, startup_s):
    """A new process of the run (a requeue, or the same command again) that resumes at `batch`."""
    goodput._CURRENT.clear()
    c = goodput.Clock(path, batch, job="7", began=clock.t, now=clock)
    clock.wait(startup_s)
    return c


def train(c, clock, first, last, checkpoints=(), evals=(), batch_s=1.0, between_s=0.1, ckpt_s=0.5, eval_s=2.0):
    """Batches first..last as composer's events order them: the batch, its evaluation, its checkpoint."""
    for b in range(first, last + 1):
        c.trains(b - 1)
        clock.wait(batch_s)
        c.trained(b)
        clock.wait(between_s)
        if b in evals:
            c.enter("eval")
            clock.wait(eval_s)
            c.enter("other")
        if b in checkpoints:
            c.checkpoint(b, written=False)
            clock.wait(ckpt_s)
            c.checkpoint(b, written=True)
    c.write(force=True)


def adds_up(result: dict, segments: list) -> None:
    parts = result["goodput_parts"]
    assert sum(parts[p] for p in goodput.PARTS) == pytest.approx(parts["allocated_s"])
    assert parts["allocated_s"] == pytest.approx(sum(s["ended"] - s["began"] for s in segments))
    assert result["goodput"] == pytest.approx(parts["trained_s"] / parts["allocated_s"])


def test_one_start_each_second_in_its_phase(tmp_path, clock):
    c = start(tmp_path / goodput.FILE, 0, clock, startup_s=5)
    train(c, clock, 1, 10, checkpoints=(10,), evals=(10,))
    c.finished()
    clock.wait(0.4)
    got = c.account()
    parts = got["goodput_parts"]
    assert parts["startup_s"] == pytest.approx(5)
    assert parts["trained_s"] == pytest.approx(10)
    assert parts["eval_s"] == pytest.approx(2)
    assert parts["checkpoint_s"] == pytest.approx(0.5)
    assert parts["other_s"] == pytest.approx(10 * 0.1 + 0.4)
    assert parts["retrained_s"] == parts["lost_to_requeues_s"] == parts["lost_to_rollbacks_s"] == 0
    assert (parts["starts"], parts["rollbacks"], parts["retrained_batches"], parts["since_batch"]) == (1, 0, 0, 0)
    assert got["goodput"] == pytest.approx(10 / 18.9)
    adds_up(got, c.segments)


def test_killed_after_a_checkpoint_the_batches_since_it_are_trained_twice_and_count_as_lost(tmp_path, clock):
    path = tmp_path / goodput.FILE
    first = start(path, 0, clock, startup_s=5)
    train(first, clock, 1, 25, checkpoints=(10, 20))  # killed at 25: its last record
    clock.wait(100)  # queued: not allocated to the run
    second = start(path, 20, clock, startup_s=7)  # read from the file, as a new process reads it
    assert [s["from_batch"] for s in second.segments] == [0, 20]
    train(second, clock, 21, 40, checkpoints=(30, 40))
    second.finished()
    got = second.account()
    parts = got["goodput_parts"]
    assert parts["trained_s"] == pytest.approx(20 + 20)  # batches 1-20 of the first start, 21-40 of the second
    assert parts["retrained_s"] == pytest.approx(5)  # 21-25, trained by the first start and again
    assert parts["retrained_batches"] == 5
    assert parts["lost_to_requeues_s"] == pytest.approx(5 * 0.1)  # the first start's time after its checkpoint
    assert parts["startup_s"] == pytest.approx(5 + 7)
    assert parts["checkpoint_s"] == pytest.approx(4 * 0.5)
    assert parts["other_s"] == pytest.approx(20 * 0.1 + 20 * 0.1)
    assert parts["allocated_s"] == pytest.approx(33.5 + 30)  # the queue's 100 s are no one's
    assert (parts["starts"], parts["rollbacks"]) == (2, 0)
    adds_up(got, second.segments)
    # what the ledger holds is what the next reader reads
    assert goodput.account(json.loads(path.read_text())["segments"]) == got


def test_a_start_that_wrote_no_checkpoint_lost_all_it_did(tmp_path, clock):
    path = tmp_path / goodput.FILE
    train(start(path, 0, clock, startup_s=5), clock, 1, 4)  # killed before its first checkpoint
    train(start(path, 0, clock, startup_s=6), clock, 1, 3, checkpoints=(3,))  # and again after its checkpoint
    third = start(path, 3, clock, startup_s=7)
    train(third, clock, 4, 10, checkpoints=(10,))
    third.finished()
    got = third.account()
    parts = got["goodput_parts"]
    assert parts["trained_s"] == pytest.approx(3 + 7)
    assert parts["retrained_s"] == pytest.approx(4) and parts["retrained_batches"] == 4
    assert parts["lost_to_requeues_s"] == pytest.approx(5 + 4 * 0.1)  # the first start's start-up too
    assert parts["startup_s"] == pytest.approx(6 + 7)
    assert parts["starts"] == 3
    adds_up(got, third.segments)


def test_a_rollback_in_the_same_process_throws_away_the_batches_since_its_checkpoint(tmp_path, clock):
    c = start(tmp_path / goodput.FILE, 0, clock, startup_s=5)
    train(c, clock, 1, 100, checkpoints=(50, 80))
    clock.wait(3)  # going back to the checkpoint of batch 80
    train(c, clock, 81, 120, checkpoints=(100, 120))
    c.finished()
    got = c.account()
    parts = got["goodput_parts"]
    assert [(s["kind"], s["from_batch"]) for s in c.segments] == [("start", 0), ("rollback", 80)]
    assert parts["trained_s"] == pytest.approx(120)
    assert parts["retrained_s"] == pytest.approx(20) and parts["retrained_batches"] == 20
    assert parts["lost_to_rollbacks_s"] == pytest.approx(20 * 0.1) and parts["lost_to_requeues_s"] == 0
    assert parts["startup_s"] == pytest.approx(5 + 3)
    assert (parts["starts"], parts["rollbacks"]) == (1, 1)
    adds_up(got, c.segments)


def test_a_second_fit_in_one_process_goes_on_from_the_last_record(tmp_path, clock):
    """A trainer built again in the same process (back to a checkpoint): one segment ends where the other begins."""
    path = tmp_path / goodput.FILE
    c = start(path, 0, clock, startup_s=5)
    train(c, clock, 1, 30, checkpoints=(20,))
    clock.wait(4)
    again = goodput.Clock(path, 20, job="7", now=clock)  # no began: the process's own start is not looked up
    train(again, clock, 21, 40, checkpoints=(40,))
    again.finished()
    got = again.account()
    assert again.segments[1]["kind"] == "rollback" and again.segments[1]["began"] == again.segments[0]["ended"]
    assert got["goodput_parts"]["startup_s"] == pytest.approx(5 + 4)
    assert got["goodput_parts"]["retrained_batches"] == 10
    adds_up(got, again.segments)


def test_a_finished_run_continued_from_its_final_checkpoint_lost_nothing(tmp_path, clock):
    path = tmp_path / goodput.FILE
    first = start(path, 0, clock, startup_s=5)
    train(first, clock, 1, 10, checkpoints=(10,))
    first.finished()
    clock.wait(1)  # its end: metrics, the exit
    first.write(force=True)
    second = start(path, 10, clock, startup_s=5)  # max_duration longer, run_name= of it
    train(second, clock, 11, 20, checkpoints=(20,))
    parts = second.account()["goodput_parts"]
    assert parts["retrained_s"] == parts["lost_to_requeues_s"] == 0
    assert parts["trained_s"] == pytest.approx(20) and parts["starts"] == 2


def test_a_finished_run_trained_again_from_scratch_is_a_new_account(tmp_path, clock):
    """checkpoint=none: the same command trains again from batch 0; the earlier training was a whole run."""
    path = tmp_path / goodput.FILE
    first = start(path, 0, clock, startup_s=5)
    train(first, clock, 1, 10)
    first.finished()
    first.write(force=True)
    again = start(path, 0, clock, startup_s=5)
    assert len(again.segments) == 1
    assert again.account()["goodput_parts"]["starts"] == 1


def test_a_run_begun_from_another_runs_checkpoint_says_where_its_account_begins(tmp_path, clock):
    c = start(tmp_path / goodput.FILE, 30, clock, startup_s=5)  # load_path= another run's checkpoint at 30
    train(c, clock, 31, 40, checkpoints=(40,))
    got = c.account()
    assert got["goodput_parts"]["since_batch"] == 30
    assert got["goodput_parts"]["trained_s"] == pytest.approx(10)
    assert "since batch 30" in goodput.said(got["goodput_parts"])


def test_an_unreadable_ledger_is_said_and_the_account_begins_with_this_start(tmp_path, clock, caplog):
    path = tmp_path / goodput.FILE
    path.write_text('{"segments": [{"kind": "start"}]}')
    c = start(path, 20, clock, startup_s=1)
    assert "cannot be read as this run's time ledger" in caplog.text
    train(c, clock, 21, 22)
    assert c.account()["goodput_parts"]["since_batch"] == 20


def test_said_names_the_allocated_time_and_each_part_that_is_not_zero():
    parts = {"allocated_s": 3600.0, "trained_s": 2880.0, "startup_s": 360.0, "eval_s": 0.0, "checkpoint_s": 180.0,
             "other_s": 36.0, "retrained_s": 108.0, "lost_to_requeues_s": 36.0, "lost_to_rollbacks_s": 0.0,
             "starts": 2, "rollbacks": 0, "retrained_batches": 12, "since_batch": 0}
    assert goodput.said(parts) == ("allocated 1:00:00: trained 80.0%, startup 10.0%, checkpoint 5.0%, other 1.0%, "
                                   "retrained 3.0%, lost to requeues 1.0% (12 retrained batches)")
    assert goodput.said({}) == ""


@pytest.mark.parametrize("env, from_job", [
    ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "7"}, True),
    ({"SLURM_JOB_ID": "7"}, True),  # a plain run in an allocation (salloc, a batch script)
    ({"SUBMITIT_EXECUTOR": "local", "SLURM_JOB_ID": "7"}, False),  # a local job inherits the allocation's variables
    ({}, False),
], ids=["submitit slurm", "plain run in an allocation", "local job in an allocation", "no job"])
def test_a_start_begins_at_slurms_job_start_in_every_job_slurm_runs(env, from_job, monkeypatch):
    """began_at counts the job's time before this process started wherever distributed.in_slurm_job says Slurm
    runs the job: a plain run inside an allocation too, not only a submitit Slurm job."""
    import psutil

    for name in ("SUBMITIT_EXECUTOR", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started = psutil.Process().create_time()
    monkeypatch.setenv("SLURM_JOB_START_TIME", str(int(started) - 600))
    assert goodput.began_at() == (int(started) - 600 if from_job else started)
