"""The launcher's view of its jobs, with stand-in jobs: a Slurm state of our choosing, and real submitit result
files and logs (written as submitit writes them) in a temporary folder. The real-Slurm tests
(tests/test_slurm_sweeps.py, tests/test_sweep_summary.py) keep the end-to-end path; these cover every state and
outcome, which a real cluster cannot be made to show on demand."""
import contextlib
import json
import os
import shutil
import time
from types import SimpleNamespace

import pytest
from hydra.core.utils import JobReturn, JobStatus
from submitit.core.utils import JobPaths, cloudpickle_dump

from common.sweep.outcomes import (
    bucket,
    ended,
    final_state,
    last_exception,
    log_tail,
    markdown,
    rank_outcomes,
    split_overrides,
)

TRACEBACK = """Traceback (most recent call last):
  File "/work/train/task/main.py", line 45, in run
    train(fcfg).close()
    ^^^^^^^^^^^^^^^^^^^
ValueError: global_train_batch_size 10 is not divisible by 4
"""


class StandInJob:
    """submitit's Job surface as the launcher uses it."""

    def __init__(self, folder, state="RUNNING", num_tasks=2, job_id="4242"):
        self.folder, self._state, self.num_tasks, self.job_id = folder, state, num_tasks, job_id
        folder.mkdir(parents=True, exist_ok=True)  # submitit makes it when it submits (the job's pickle goes there)

    @property
    def paths(self):
        return JobPaths(self.folder, self.job_id)

    @property
    def state(self):
        if isinstance(self._state, Exception):
            raise self._state  # sacct unreachable
        return self._state

    def task(self, k):
        return SimpleNamespace(paths=JobPaths(self.folder, self.job_id, k))

    def result(self, k, outcome, value):
        path = self.task(k).paths.result_pickle
        path.parent.mkdir(parents=True, exist_ok=True)
        cloudpickle_dump((outcome, value), path)

    def log(self, k, text, stream="stderr"):
        path = getattr(self.task(k).paths, stream)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def success(value):
    ret = JobReturn(status=JobStatus.COMPLETED)
    ret._return_value = value
    return ret


@pytest.mark.parametrize("state, expected", [
    ("PENDING", "pending"), ("REQUEUED", "pending"), ("CONFIGURING", "pending"), ("UNKNOWN", "pending"),
    ("RUNNING", "running"), ("COMPLETING", "running"), ("completed", "running"), ("TIMEOUT", "running"),
])
def test_bucket(state, expected):
    assert bucket(state) == expected


@pytest.mark.parametrize("state, is_ended", [
    ("PENDING", False), ("REQUEUED", False), ("RUNNING", False), ("COMPLETING", False),
    ("SUSPENDED", False), ("RESIZING", False), ("STOPPED", False), ("REQUEUE_HOLD", False),  # Slurm resumes them
    ("COMPLETED", True), ("FAILED", True), ("CANCELLED by 0", True), ("TIMEOUT", True),
    (RuntimeError("sacct: error"), True),  # no answer from Slurm: the result file decides
])
def test_a_slurm_job_has_ended_only_in_a_state_slurm_does_not_resume_from(tmp_path, state, is_ended):
    assert ended(StandInJob(tmp_path, state), "slurm") is is_ended


@pytest.mark.parametrize("state, result, over", [
    ("PREEMPTED", False, True),  # preempted and not requeued (PreemptMode=CANCEL): submitit's done() never says so
    ("NODE_FAIL", False, True), ("COMPLETED", True, True), ("FAILED", False, True),
    ("RUNNING", True, False),  # a rank's result written while Slurm tears the step down for a requeue
    ("REQUEUED", False, False), ("PENDING", True, False), ("SUSPENDED", False, False),
    (RuntimeError("sacct: error"), False, False), (RuntimeError("sacct: error"), True, True),  # the result decides
])
def test_the_launchers_wait_for_a_slurm_job_ends_once_slurm_will_not_resume_it(tmp_path, state, result, over):
    """`-m` with cluster.wait=true waits for each point until it has ended (result_decides): a job that ended without a result file
    in a state Slurm does not resume from (PREEMPTED, which submitit's own done() counts as coming back) ends the
    wait, where it used to wait forever."""
    job = StandInJob(tmp_path, state)
    if result:
        job.result(0, "success", None)
    assert ended(job, "slurm", result_decides=True) is over


@pytest.mark.parametrize("state", ["SUSPENDED", "RESIZING", "REQUEUE_HOLD"])
def test_a_suspended_point_is_going_not_a_failure_without_a_result(tmp_path, state):
    """A job Slurm suspended (`scontrol suspend`), resizes or holds for its requeue has not ended: its row shows
    Slurm's state and no error, and the status command watches on. (The row read it as ended, found no result and
    said "no result (killed, ...)" of a job that resumes.)"""
    from common.sweep.status import GOING, rows

    [row] = rows(manifest(tmp_path), [StandInJob(tmp_path / "4242", state)])
    assert (row["state"], row["error"]) == (state, "")
    assert row["state"] in GOING


@pytest.mark.e2e  # starts a Python process of its own
def test_a_local_job_has_ended_once_its_controller_has_also_seen_from_another_process(tmp_path):
    """`python -m train.status` beside a running local sweep holds no process handle of its jobs: a job known by
    its id alone (as sweep.json names it) is running while submitit's controller of it runs, and has ended after;
    so has the submitting process's job (its controller's process handle, common/compat.py)."""
    import submitit

    from common.sweep.outcomes import local_alive

    ex = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(timeout_min=2)
    job = ex.submit(time.sleep, 30)
    seen = submitit.LocalJob(folder=tmp_path / "%j", job_id=job.job_id, tasks=(0,))  # the status command's
    try:
        assert local_alive(seen) is True and ended(seen, "local") is False
        assert local_alive(job) is True and ended(job, "local") is False
    finally:
        job.cancel()  # SIGINT: the controller ends its task and exits
    deadline = time.time() + 60
    while job.state == "RUNNING":  # the launcher's poll reaps it
        assert time.time() < deadline
        time.sleep(0.2)
    assert local_alive(seen) is False and ended(seen, "local") is True
    assert local_alive(job) is False and ended(job, "local") is True
    assert ended(StandInJob(tmp_path, "RUNNING", job_id=str(os.getpid())), "local") is True  # a pid not a controller


@pytest.mark.e2e  # starts Python processes of its own
def test_a_local_job_whose_controller_alone_was_killed_runs_while_its_task_does_also_seen_from_another_process(
        tmp_path):
    """submitit's controller SIGKILLed alone: its task, orphaned, runs on, and the job with it (the task holds the
    job's running lock: outcomes.hold_while_running, as the launcher's job body does in every rank); once the task
    has ended, so has the job. Seen as the status command sees it (a job known by its id alone) and by the process
    that submitted it (its controller's handle)."""
    import psutil
    import submitit

    from common.sweep.outcomes import hold_while_running, local_alive

    ex = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="local")
    ex.update_parameters(timeout_min=2)
    job = ex.submit(lambda: (hold_while_running(), time.sleep(60)))
    seen = submitit.LocalJob(folder=tmp_path / "%j", job_id=job.job_id, tasks=(0,))
    lock = tmp_path / job.job_id / f"{job.job_id}_running"
    controller = psutil.Process(int(job.job_id))
    try:
        deadline = time.time() + 60
        while not lock.exists():  # the task has begun its body
            assert job.state == "RUNNING" and time.time() < deadline, job.stderr()
            time.sleep(0.1)
        [task] = controller.children()
        controller.kill()
        while controller.status() != psutil.STATUS_ZOMBIE:  # ended, not yet reaped (the submitter's poll reaps it)
            assert time.time() < deadline
            time.sleep(0.01)
        assert local_alive(seen) is True and ended(seen, "local") is False
        assert local_alive(job) is True and ended(job, "local") is False
        assert not controller.is_running()  # reaped
        task.kill()
        deadline = time.time() + 30
        while local_alive(seen) is not False:  # its files closed as it exits, its lock with them
            assert time.time() < deadline, "the job still runs 30 s after its task was killed"
            time.sleep(0.1)
    finally:
        for process in (controller, task) if "task" in locals() else (controller,):
            with contextlib.suppress(psutil.Error):
                process.kill()
    assert local_alive(seen) is False and ended(seen, "local") is True
    assert local_alive(job) is False and ended(job, "local") is True


@pytest.mark.parametrize("state, shown", [
    ("CANCELLED by 1000", "CANCELLED"), ("TIMEOUT", "TIMEOUT"), ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
    ("COMPLETED", "FAILED"),  # a point that did not complete although its job did: a rank failed
    ("NODE_FAIL", "NODE_FAIL"), (RuntimeError("sacct: error"), "UNKNOWN"),
    # submitit's local states of a job whose rank died without a result (SIGKILL): FAILED, as the docs promise
    ("NO PROCESS AND NO RESULT", "FAILED"), ("INTERRUPTED", "FAILED"), ("FINISHED", "FAILED"),
])
def test_final_state(tmp_path, state, shown):
    assert final_state(StandInJob(tmp_path, state)) == shown


def test_every_rank_succeeded(tmp_path):
    job = StandInJob(tmp_path, "COMPLETED")
    for k in range(2):
        job.result(k, "success", success({"final_train_loss": 3.3}))
    ranks = rank_outcomes(job, wait_s=0)
    assert [r.ok for r in ranks] == [True, True] and ranks[0].value.return_value == {"final_train_loss": 3.3}


def test_each_failed_rank_shows_its_own_exception_and_log_tail(tmp_path):
    job = StandInJob(tmp_path, "FAILED")
    job.result(0, "success", success({}))
    job.result(1, "error", "[rank1]: " + TRACEBACK.replace("\n", "\n[rank1]: "))
    job.log(1, "step 3 loss 5.1\nsubmitit INFO (2026) - Job completed\n" + TRACEBACK)
    ok, bad = rank_outcomes(job, wait_s=0)
    assert ok.ok and not bad.ok
    assert bad.error == "ValueError: global_train_batch_size 10 is not divisible by 4"
    assert bad.tail[0] == "step 3 loss 5.1" and not any("submitit" in line for line in bad.tail)


def test_a_rank_that_raised_inside_hydra_is_failed(tmp_path):
    job = StandInJob(tmp_path, "COMPLETED", num_tasks=1)
    ret = JobReturn(status=JobStatus.FAILED)
    ret._return_value = KeyError("tokenizer")
    job.result(0, "success", ret)
    [rank] = rank_outcomes(job, wait_s=0)
    assert not rank.ok and rank.error == "KeyError: 'tokenizer'"


def test_out_of_time_and_not_requeued_says_why_not_what_type(tmp_path):
    job = StandInJob(tmp_path, "TIMEOUT", num_tasks=1)
    job.result(0, "error", 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
                           "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many "
                           "times.\n")
    [rank] = rank_outcomes(job, wait_s=0)
    assert rank.error == "Job not requeued because: timed-out too many times."


def test_out_of_time_while_a_library_imports_says_why_not_the_librarys_wrapper(tmp_path):
    """Slurm's warning can come while the task still imports llm-foundry: submitit's handler raises inside the
    import, and transformers' lazy import wraps it in its own error; the traceback submitit stores has both."""
    import traceback

    from submitit.core.utils import UncompletedJobError

    def importing():
        try:
            raise UncompletedJobError("Job not requeued because: timed-out too many times.")
        except UncompletedJobError as e:
            raise RuntimeError("Failed to import transformers.models.auto because of the following error (look "
                               f"up to see its traceback):\n{e}") from e
    try:
        importing()
    except RuntimeError:
        stored = "[rank0]: " + traceback.format_exc().replace("\n", "\n[rank0]: ")
    job = StandInJob(tmp_path, "TIMEOUT", num_tasks=1)
    job.result(0, "error", stored)
    [rank] = rank_outcomes(job, wait_s=0)
    assert rank.error == "Job not requeued because: timed-out too many times."


DATALOADER_KILLED = """Traceback (most recent call last):
  File "/work/train/task/main.py", line 45, in run
    train(fcfg).close()
RuntimeError: DataLoader worker (pid 25635) is killed by signal: Terminated.
"""
VERDICT = "Job not requeued because: timed-out too many times."


@pytest.mark.parametrize("stored", [True, False], ids=["verdict-stored", "killed-before-storing-it"])
def test_out_of_time_leads_with_submitits_verdict_not_what_followed_from_it(tmp_path, stored):
    """Rank 0 raises submitit's verdict at Slurm's warning; the step ends, rank 1's dataloader workers die of the
    SIGTERM and rank 1 stores that, maybe first. When Slurm's time limit comes before rank 0 stores its result
    (a loaded machine), what is left of the verdict is submitit's line in rank 0's stdout."""
    import os
    import time

    from common.sweep.status import rows

    job = StandInJob(tmp_path / "4242", "TIMEOUT")
    job.log(0, f"submitit WARNING (2026-11-25 18:39:40,070) - Caught signal SIGUSR2 on vm: this job is timed-out.\n"
               f"submitit INFO (2026-11-25 18:39:40,162) - {VERDICT}\n", stream="stdout")
    job.log(0, "Traceback (most recent call last):\n  File \"resource_tracker.py\", line 239, in main\n"
               "KeyError: '/001030_locals'\n")
    job.result(1, "error", DATALOADER_KILLED)
    if stored:  # after rank 1's, as a loaded machine may order them: which stored first does not decide
        job.result(0, "error", 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
                               f"submitit.core.utils.UncompletedJobError: {VERDICT}\n")
        os.utime(job.task(0).paths.result_pickle, (time.time() + 5,) * 2)
    [row] = rows(manifest(tmp_path), [job], all_ended=True)
    assert row["state"] == "TIMEOUT"
    assert row["error"].startswith(f"rank 0: {VERDICT}"), row["error"]
    assert row["error"].endswith("rank 1: RuntimeError: DataLoader worker (pid 25635) is killed by signal: "
                                 "Terminated."), row["error"]
    if not stored:
        assert "no result (killed, or stopped responding; job TIMEOUT); KeyError: '/001030_locals'" in row["error"]


def test_a_killed_rank_without_a_result_shows_the_job_state_and_its_last_traceback(tmp_path):
    job = StandInJob(tmp_path, "CANCELLED by 0", num_tasks=1)
    job.log(0, "loading\n" + TRACEBACK)
    [rank] = rank_outcomes(job, wait_s=0)
    assert not rank.ok and rank.outcome is None
    assert rank.error == ("no result (killed, or stopped responding; job CANCELLED); "
                          "ValueError: global_train_batch_size 10 is not divisible by 4")
    silent = StandInJob(tmp_path / "silent", "NODE_FAIL", num_tasks=1)
    silent.log(0, "step 7 loss 4.2\n")
    [rank] = rank_outcomes(silent, wait_s=0)
    assert rank.error.endswith("job NODE_FAIL); last log line: step 7 loss 4.2")


def test_a_wide_job_that_failed_one_way_is_one_short_cell_first_failure_first(tmp_path):
    from common.sweep.outcomes import rank_errors

    job = StandInJob(tmp_path, "CANCELLED by 0", num_tasks=128)  # cancelled while pending: no rank ever ran
    ranks = rank_outcomes(job, wait_s=0)
    assert rank_errors(ranks, ranks[0]) == (
        "rank 0: no result (killed, or stopped responding; job CANCELLED); last log line: (empty log); "
        "ranks 1-127: no result (killed, or stopped responding; job CANCELLED); last log line: (empty log)")
    job = StandInJob(tmp_path / "one", "FAILED", num_tasks=8)
    job.log(5, TRACEBACK)  # rank 5 raised; the others were ended by srun
    for k in range(8):
        job.log(k, TRACEBACK if k == 5 else "step 3 loss 5.1\n")
    ranks = rank_outcomes(job, wait_s=0)
    assert rank_errors(ranks, ranks[5]).startswith(
        "rank 5: no result (killed, or stopped responding; job FAILED); ValueError: global_train_batch_size 10 is "
        "not divisible by 4; ranks 0-4,6-7: ")


def test_last_exception_keeps_a_multi_line_message_and_drops_frames():
    text = TRACEBACK.replace("by 4\n", "by 4\n  hint: pick 8\n")
    assert last_exception(text) == "ValueError: global_train_batch_size 10 is not divisible by 4 / hint: pick 8"
    assert last_exception("no traceback here") == ""


def test_log_tail_of_a_missing_log_is_empty(tmp_path):
    assert log_tail(tmp_path / "none.err") == []


def test_summary_table_keeps_every_value_in_its_cell():
    table = markdown([{"point": 0, "state": "FAILED", "final_loss": 3.14159, "error": "a | b\nc"},
                      {"point": 1, "state": "COMPLETED", "final_loss": None, "error": ""}])
    lines = table.splitlines()
    assert lines[0] == "| point | state | final_loss | error |" and lines[1] == "|---|---|---|---|"
    assert lines[2] == "| 0 | FAILED | 3.142 | a \\| b c |" and lines[3] == "| 1 | COMPLETED |  |  |"


def test_the_summary_shows_what_each_point_was_swept_over_and_what_they_share_once():
    points = [["model=mpt-125m", "cluster=ndv5", "optimizer.lr=1e-4", "cluster.nodes=8"],
              ["model=mpt-125m", "cluster=ndv5", "optimizer.lr=1e-4", "cluster.nodes=16"],
              ["model=mpt-125m", "cluster=ndv5", "optimizer.lr=2e-4", "cluster.nodes=8"]]
    shared, own = split_overrides(points)
    assert shared == ["model=mpt-125m", "cluster=ndv5"]
    assert own == [["optimizer.lr=1e-4", "cluster.nodes=8"], ["optimizer.lr=1e-4", "cluster.nodes=16"],
                   ["optimizer.lr=2e-4", "cluster.nodes=8"]]


def test_an_override_only_some_points_have_is_theirs_alone():
    shared, own = split_overrides([["data=c4", "+model.load_in_8bit=true"], ["data=c4"]])
    assert shared == ["data=c4"] and own == [["+model.load_in_8bit=true"], []]


def test_a_single_point_shows_all_its_overrides_and_shares_none():
    assert split_overrides([["model=mpt-7b", "cluster=p5"]]) == ([], [["model=mpt-7b", "cluster=p5"]])
    assert split_overrides([[]]) == ([], [[]])


# ------------------------------------------------------------------------- a sweep's status from its folder


def manifest(tmp_path, report=None):
    report = report or tmp_path / "0"
    return {"app": "train.launch.sweep_app.TrainApp", "shared": ["data=mock"], "summary_job": "4243", "points": [
        {"num": 0, "overrides": ["optimizer.lr=0.001"], "job_id": "4242", "scheduler": "slurm", "tasks": 2,
         "folder": str(tmp_path / "%j"), "world_size": 2, "checkpoint": str(tmp_path / "ckpt"),
         "report": str(report)}]}


def test_a_running_point_shows_what_its_rank_0_last_wrote(tmp_path):
    from common.sweep.status import console, rows

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "progress.json").write_text('{"starts": 3, "progress": "step 20/40", "step": 20, "loss": 5.5,'
                                                  ' "tokens_per_sec": 1234.5, "eta_s": 65, "goodput": 0.625}')
    [row] = rows(manifest(tmp_path), [StandInJob(tmp_path / "4242", "RUNNING")])
    assert (row["state"], row["requeues"], row["step"], row["loss"], row["eta"]) == \
        ("RUNNING", 2, "step 20/40", 5.5, "0:01:05")
    assert row["final_loss"] is None and row["tokens_per_sec"] == 1234.5 and row["error"] == ""
    assert row["log"].endswith("4242_0_log.err")
    shown = console(manifest(tmp_path), [row])
    assert "| 0 | optimizer.lr=0.001 | 4242 | RUNNING | 2 | step 20/40 | 5.5 | 1234 |  | 0.625 | 0:01:05 |" in shown
    assert "checkpoint" not in shown and "error" not in shown  # the files hold every column
    # training's columns said only where a point has one (TrainApp.shown_where_set)
    assert not {"preflight", "continued_from", "interventions"} & set(shown.split("\n")[0].strip("| ").split(" | "))
    assert "| continued_from |" in console(manifest(tmp_path), [{**row, "continued_from": "other-run@ba20"}])


def test_a_completed_point_shows_the_whole_runs_rates_from_its_metrics(tmp_path):
    """Once a point completes, tokens/s and MFU are the whole run's (metrics.json), both over the batches alone,
    never the last progress line's stretch beside the whole run's other figure; so is its goodput, with its parts
    in the summary files."""
    from common.sweep.status import rows

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "progress.json").write_text('{"starts": 1, "progress": "step 40/40", "step": 40, "loss": 3.5,'
                                                  ' "tokens_per_sec": 900.0, "mfu": 0.30, "eta_s": 0, "goodput": 0.9}')
    parts = {"allocated_s": 100.0, "trained_s": 75.0, "startup_s": 20.0, "retrained_s": 5.0, "retrained_batches": 2}
    (tmp_path / "0" / "metrics.json").write_text('{"final_train_loss": 3.4, "tokens_per_sec": 1000.0, "mfu": 0.25,'
                                                 ' "wall_tokens_per_sec": 800.0, "goodput": 0.75, "goodput_parts": '
                                                 + json.dumps(parts) + '}')
    job = StandInJob(tmp_path / "4242", "COMPLETED")
    for k in (0, 1):
        job.result(k, "success", success({"final_train_loss": 3.4}))
    [row] = rows(manifest(tmp_path), [job])
    assert (row["state"], row["final_loss"], row["tokens_per_sec"], row["mfu"]) == ("COMPLETED", 3.4, 1000.0, 0.25)
    assert row["goodput"] == 0.75
    assert row["goodput_parts"] == "allocated 0:01:40: trained 75.0%, startup 20.0%, retrained 5.0% (2 retrained batches)"


def test_a_job_not_yet_in_slurms_accounting_is_pending(tmp_path):
    from common.sweep.status import rows

    [row] = rows(manifest(tmp_path), [StandInJob(tmp_path / "4242", "UNKNOWN")])
    assert row["state"] == "PENDING" and row["step"] == "" and row["requeues"] == 0


@pytest.mark.parametrize("outcome, state", [("success", "COMPLETED"), ("error", "FAILED")])
def test_the_summary_job_needs_no_slurm_client(tmp_path, outcome, state):
    """It runs after every point (afterany), maybe in a container without sacct: the result files decide."""
    from common.sweep.status import rows, write_summary

    job = StandInJob(tmp_path / "4242", RuntimeError("sacct: command not found"))
    for k in (0, 1):
        job.result(k, outcome, success({"final_train_loss": 5.0}) if outcome == "success" else TRACEBACK)
    [row] = rows(manifest(tmp_path), [job], all_ended=True)
    assert row["state"] == state
    assert row["error"] == ("" if outcome == "success" else
                            "rank 0: ValueError: global_train_batch_size 10 is not divisible by 4; rank 1: "
                            "ValueError: global_train_batch_size 10 is not divisible by 4")
    text = write_summary(tmp_path, manifest(tmp_path), [row])
    assert text.startswith("shared by every point: data=mock\n\n| point | overrides | job_id | state |")
    assert (tmp_path / "summary.md").read_text() == text and (tmp_path / "summary.csv").is_file()


def test_a_point_whose_job_folder_is_gone_cannot_be_told_and_the_summary_files_stay(tmp_path, capsys):
    """A completed local sweep's `.submitit/` deleted by hand takes its ranks' results with it: the point read as
    FAILED ("no result") though its run had finished, and status rewrote summary.csv so. Its state cannot be told:
    UNKNOWN with the folder named, the summary files left as they were, exit 1 (a point not known to be done)."""
    import socket

    from common.sweep.status import main, rows, write_manifest

    sweep = tmp_path / "sweep"
    job = StandInJob(sweep / ".submitit" / "4242", "COMPLETED")
    for k in (0, 1):
        job.result(k, "success", success({"final_train_loss": 5.0}))
    point = {**manifest(tmp_path)["points"][0], "scheduler": "local", "host": socket.gethostname(),
             "folder": str(sweep / ".submitit" / "%j")}
    write_manifest(sweep, "train.launch.sweep_app.TrainApp", [point], ["data=mock"])
    assert main("status", None, [str(sweep)]) == 0  # the controller (pid 4242: not submitit's) has ended
    assert "| COMPLETED |" in capsys.readouterr().out
    written = {name: (sweep / name).read_text() for name in ("summary.md", "summary.csv")}

    shutil.rmtree(sweep / ".submitit")
    [row] = rows(json.loads((sweep / "sweep.json").read_text()), [job])
    assert row["state"] == f"UNKNOWN (its job folder {sweep / '.submitit' / '4242'} is gone)" and row["error"] == ""
    assert main("status", None, [str(sweep)]) == 1
    assert f"| UNKNOWN (its job folder {sweep / '.submitit' / '4242'} is gone) |" in capsys.readouterr().out
    assert {name: (sweep / name).read_text() for name in written} == written


def test_an_app_imported_before_hydras_plugin_scan_runs_again_is_still_a_sweep_app():
    """Hydra's plugin scan executes its plugin package's modules again in place whenever it builds its Plugins singleton
    (Singleton.set_state does, as a submitted job and Hydra's test fixtures do): a SweepApp defined there was then a
    new class, and the training app imported before it was refused as 'not a SweepApp'. The contract lives in
    common/sweep/, which the scan does not execute: the launcher class the scan defines again still loads the app.
    A class that is none is still refused."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton

    from common.sweep import contract
    from common.sweep.launch import SweepLaunch
    from train.launch.sweep_app import TrainApp

    target = ConfigStore.instance().load("hydra/launcher/pretrain.yaml").node._target_
    before = Plugins.instance().class_name_to_class[target]
    Singleton.set_state(Singleton.get_state())  # a fresh Plugins singleton: the scan runs again
    after = Plugins.instance().class_name_to_class[target]
    assert after is not before and issubclass(after, SweepLaunch)  # the scan did run again: the case reproduced
    assert issubclass(TrainApp, contract.SweepApp)
    assert type(contract.load_app("train.launch.sweep_app.TrainApp")) is TrainApp
    with pytest.raises(TypeError, match="collections.OrderedDict: not a SweepApp"):
        contract.load_app("collections.OrderedDict")


def test_a_start_that_has_not_begun_training_shows_slurms_requeues_and_no_figures_of_the_start_before(tmp_path):
    """progress.json as the first start's rank 0 left it; Slurm has requeued the job since (its count from
    sacct): the new start is importing or loading its checkpoint. Its row counts the requeue and shows none of
    the start before's line as where the run is now."""
    from train.launch.sweep_app import TrainApp

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "progress.json").write_text('{"starts": 1, "job": "4242", "requeues": 0, "progress": '
                                                  '"step 20/40", "step": 20, "loss": 5.5, "tokens_per_sec": 1234.5,'
                                                  ' "mfu": 0.3, "eta_s": 65}')
    [point] = manifest(tmp_path)["points"]
    row = TrainApp().columns({**point, "slurm_requeues": 1}, "RUNNING")
    assert (row["requeues"], row["step"], row["loss"], row["tokens_per_sec"], row["mfu"], row["eta"]) == \
        (1, "starting again (before: step 20/40)", None, None, None, "")
    # once the new start trains, its own record: Slurm's count and its rank 0's agree
    (tmp_path / "0" / "progress.json").write_text('{"starts": 2, "job": "4242", "requeues": 1, "step": 20}')
    row = TrainApp().columns({**point, "slurm_requeues": 1}, "RUNNING")
    assert (row["requeues"], row["step"]) == (1, "step 20")
    # where Slurm cannot be asked, the count its rank 0 recorded (SLURM_RESTART_COUNT), not its starts - 1
    (tmp_path / "0" / "progress.json").write_text('{"starts": 2, "job": "4242", "requeues": 5, "step": 20}')
    assert TrainApp().columns({**point, "slurm_requeues": None}, "COMPLETED")["requeues"] == 5
    # a record of another job (an earlier sweep's run in this folder) is not this job's
    (tmp_path / "0" / "progress.json").write_text('{"starts": 2, "job": "99", "requeues": 5, "progress": "step 9"}')
    row = TrainApp().columns({**point, "slurm_requeues": 0}, "PENDING")
    assert (row["requeues"], row["step"]) == (0, "starting again (before: step 9)")


JOBS = {  # what a task's environment holds -> its job's id, whether Slurm runs it, the requeues it counts
    "a task of a Slurm array": ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242",
                                 "SLURM_ARRAY_TASK_ID": "3", "SLURM_RESTART_COUNT": "2"}, "4242_3", True, 2),
    "a Slurm job's first start": ({"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": ""},
                                  "4242", True, 0),
    "a local job inside an allocation": ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "31337",
                                          "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}, "31337", False, 0),
    "a plain run in a requeued allocation": ({"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}, "4242", True, 1),
    "a plain run": ({}, None, False, 0),
}
VARIABLES = {k for env, *_ in JOBS.values() for k in env}


@pytest.mark.parametrize("where", JOBS)
def test_a_task_names_its_job_as_sweep_json_does_and_counts_only_slurms_requeues(where, monkeypatch):
    """The one reading of this job's id and requeue count (train/task/distributed.py) in each environment a task
    runs in: submitit's id (`A_a` for a task of an array, whose own SLURM_JOB_ID differs), which sweep.json
    records; an empty SLURM_RESTART_COUNT is a first start; a local job inherits an allocation's variables but is
    no Slurm job and never a requeue."""
    from submitit import JobEnvironment

    from train.task.distributed import in_slurm_job, job_id, requeues

    env, job, slurm, count = JOBS[where]
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (job_id(), in_slurm_job(), requeues()) == (job, slurm, count)
    if "SUBMITIT_EXECUTOR" in env:
        assert job_id() == str(JobEnvironment().job_id)  # submitit's own name for it


@pytest.mark.parametrize("local, ranks", [(None, 8), ("", 8), ("4", 4)])
def test_the_ranks_on_this_node_are_local_world_size_or_every_rank(local, ranks, monkeypatch):
    """One reading of LOCAL_WORLD_SIZE (train/task/distributed.py: ranks_on_this_node) for the memory checks and
    the preflight: unset or empty (a plain run) is every rank of the job (the preflight raised on an empty one)."""
    from train.task.distributed import ranks_on_this_node

    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    assert ranks_on_this_node(8) == ranks


def test_a_record_of_an_array_task_is_its_points_own(tmp_path, monkeypatch):
    """progress.json's job, as rank 0 records it in a task of an array, is what sweep.json names the point's job:
    its requeues count and its line shows (with SLURM_JOB_ID, the task's own id, it was another job's record)."""
    from train.launch.sweep_app import TrainApp
    from train.task.distributed import job_id, requeues

    env, job, _, _ = JOBS["a task of a Slurm array"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "progress.json").write_text(json.dumps({"starts": 1, "job": job_id(), "requeues": requeues(),
                                                              "step": 20}))
    [point] = manifest(tmp_path)["points"]
    row = TrainApp().columns({**point, "job_id": job, "slurm_requeues": None}, "RUNNING")
    assert (row["requeues"], row["step"]) == (2, "step 20")


def test_an_ended_point_shows_no_eta(tmp_path):
    from train.launch.sweep_app import TrainApp

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "progress.json").write_text('{"starts": 1, "progress": "step 20/40", "step": 20, "eta_s": 65}')
    [point] = manifest(tmp_path)["points"]
    for state in ("FAILED", "CANCELLED", "NODE_FAIL", "NO PROCESS AND NO RESULT"):  # whatever ended it
        row = TrainApp().columns(point, state)
        assert row["eta"] == row["last_progress"] == "" and row["step"] == "step 20/40"


def test_a_point_shows_only_its_own_runs_numbers(tmp_path):
    """A point's folder of a sweep run again into the same sweep folder (hydra.sweep.dir) holds the files of the
    run that had that number before: none of them is shown as this point's (measured: a failed point with another
    run's metrics and loss curve). A point finished earlier (nothing submitted) shows its finished.json's numbers
    where its run's report folder now holds a later stretch's (the run continued to 40 batches under run_name=)."""
    from train.launch.sweep_app import TrainApp

    folder = tmp_path / "0"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({"run_name": "other", "batches": 40, "final_train_loss": 3.9,
                                                     "final_eval": {"eval/LanguageCrossEntropy": 3.8}}))
    (folder / "progress.json").write_text('{"run_name": "other", "starts": 1, "progress": "step 40/40", "step": 40}')
    (folder / "loss_curve.png").write_bytes(b"png")
    [point] = manifest(tmp_path)["points"]
    row = TrainApp().columns({**point, "run": "mine"}, "COMPLETED")
    assert (row["step"], row["final_loss"], row["eval_loss"], row["metrics"], row["loss_curve"]) == \
        ("", None, None, "", "")
    row = TrainApp().columns({**point, "run": "other"}, "COMPLETED")  # its own files: shown
    assert (row["step"], row["final_loss"], row["eval_loss"]) == ("step 40/40", 3.9, 3.8)
    assert row["metrics"] == str(folder / "metrics.json")
    # a run killed there before its end left progress.json and its loss curve, no metrics.json
    (folder / "metrics.json").unlink()
    row = TrainApp().columns({**point, "run": "mine"}, "PENDING")
    assert (row["step"], row["loss_curve"], row["last_progress"]) == ("", "", "")
    assert TrainApp().columns({**point, "run": "other"}, "RUNNING")["loss_curve"] == str(folder / "loss_curve.png")
    before = {"batches": 20, "final_train_loss": 5.2, "final_eval": {"eval/LanguageCrossEntropy": 5.23}}
    (folder / "metrics.json").write_text(json.dumps({"run_name": "other", "batches": 40, "final_train_loss": 3.9}))
    row = TrainApp().columns({**point, "run": "other", "finished": before}, "COMPLETED")
    assert (row["step"], row["final_loss"], row["eval_loss"]) == ("step 20", 5.2, 5.23)

    # a point submitted with nothing to train (its run already trained past this max_duration) writes no report of
    # its own: the numbers the task reported, from its run's finished.json (the row was blank)
    empty, ckpt = tmp_path / "1", tmp_path / "ckpt"
    empty.mkdir()
    ckpt.mkdir()
    (ckpt / "finished.json").write_text(json.dumps({"max_duration": "40ba", "batch": 40, "metrics": {
        "run_name": "other", "batches": 40, "final_train_loss": 3.9}}))
    row = TrainApp().columns({**point, "report": str(empty), "run": "other"}, "COMPLETED")
    assert (row["step"], row["final_loss"]) == ("step 40", 3.9)
    assert TrainApp().columns({**point, "report": str(empty), "run": "mine"}, "COMPLETED")["final_loss"] is None
    # a node check alone (cluster.preflight.only) trains nothing: no run's numbers
    row = TrainApp().columns({**point, "report": str(empty), "run": "other", "preflight_only": True}, "COMPLETED")
    assert (row["step"], row["final_loss"]) == ("", None)


def test_a_jobs_rendezvous_port_is_its_own_and_below_the_ephemeral_ports():
    """Job ids spread over ports, none in Linux's default ephemeral range (net.ipv4.ip_local_port_range: 32768 on),
    where a busy node's own outgoing connections would take it (EADDRINUSE at the rendezvous)."""
    from train.task.distributed import master_port

    ports = [master_port(str(j)) for j in range(5000)] + [master_port(f"{j}_3") for j in range(5000)]
    assert all(20000 <= p < 32768 for p in ports) and len(set(ports)) > 5000


def test_a_one_node_jobs_rendezvous_port_is_one_rank_0_found_free_and_every_rank_reads(tmp_path, monkeypatch):
    """A port derived from the job id can be held by another job on the node, or by a killed job's rank that
    lingers (EADDRINUSE at the rendezvous): rank 0 takes the first free one from it, the other ranks read it."""
    import socket

    import submitit

    from train.task.distributed import master_port, rendezvous_port

    job_id = str(os.getpid())
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_FOLDER": str(tmp_path), "SUBMITIT_LOCAL_JOB_ID": job_id,
           "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)

    def port_of(rank):
        monkeypatch.setenv("SUBMITIT_LOCAL_GLOBALID", str(rank))
        monkeypatch.setenv("SUBMITIT_LOCAL_LOCALID", str(rank))
        return rendezvous_port(submitit.JobEnvironment())

    with socket.socket() as held:
        held.bind(("", master_port(job_id)))
        held.listen()
        leader = port_of(0)
    assert leader != master_port(job_id) and 20000 <= leader < 32768
    assert port_of(1) == leader
    # a file an earlier controller of the same pid left (another start) is not this start's
    (file,) = tmp_path.glob(f"{job_id}_*_port")
    file.rename(tmp_path / f"{job_id}_1_port")
    assert port_of(0) == master_port(job_id) == port_of(1)
