"""The summary a `-m` sweep prints and writes, from real jobs that fail for real reasons."""
import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from helpers import PYTHON, ROOT, command_env, held_still_and_warned, run, start, stop

pytestmark = pytest.mark.train  # the tier (pyproject.toml markers)


# passes our checks, then llm-foundry's own validate_config raises in the task, before any data is read
BAD = "`load_in_8bit` is only supported for evaluation rather than training."


def _sweep(root: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run("-m", "train", "-m", "progress_bar=false", "checkpoint=none", *overrides, root=root)


def _summaries(root: Path) -> tuple:
    """(sweep folder, rows of summary.csv, rows of summary.md)"""
    [sweep_dir] = (root / "outputs" / "sweeps").iterdir()
    text = (sweep_dir / "summary.md").read_text()
    header, _, *lines = text[text.index("| point |"):].splitlines()  # the shared overrides may stand above it
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split(" | ")]  # noqa: E731
    return (sweep_dir, list(csv.DictReader((sweep_dir / "summary.csv").open())),
            [dict(zip(cells(header), cells(line))) for line in lines])


def test_a_failed_point_shows_its_own_error_and_a_good_one_its_metrics_curve_and_world_size(tmp_path):
    proc = _sweep(tmp_path, "cluster=local", "cluster.tasks_per_node=1", "max_duration=4ba",
                  "+model.load_in_8bit=false,true")
    assert proc.returncode == 1, proc.stderr[-3000:]
    sweep_dir, (good, bad), (md_good, md_bad) = _summaries(tmp_path)

    assert bad["state"] == "FAILED"
    assert bad["error"] == f"rank 0: ValueError: {BAD}"  # the task's exception, not submitit's wrapper
    assert md_bad["error"] == bad["error"]
    assert f"| rank 0: ValueError: {BAD} |" in proc.stdout  # the printed summary
    assert f"rank 0: ValueError: {BAD}" in proc.stderr
    assert bad["metrics"] == bad["loss_curve"] == md_bad["loss_curve"] == ""  # it wrote none

    assert good["state"] == "COMPLETED" and good["error"] == ""
    # what was swept in each row; what every point shares once, above the table
    assert (good["overrides"], bad["overrides"]) == ("+model.load_in_8bit=False", "+model.load_in_8bit=True")
    shared = ("shared by every point: progress_bar=False checkpoint=none cluster=local cluster.tasks_per_node=1 "
              "max_duration=4ba\n")
    assert (sweep_dir / "summary.md").read_text().startswith(shared) and shared in proc.stdout
    assert good["world_size"] == bad["world_size"] == md_good["world_size"] == md_bad["world_size"] == "1"
    metrics = json.loads(Path(good["metrics"]).read_text())
    assert metrics["final_train_loss"] == float(good["final_loss"]) and metrics["world_size"] == 1
    assert Path(good["loss_curve"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(good["metrics"]).parent == Path(good["loss_curve"]).parent == sweep_dir / "0"
    assert (md_good["metrics"], md_good["loss_curve"]) == (good["metrics"], good["loss_curve"])
    assert good["loss_curve"] in proc.stdout


def test_a_job_out_of_time_and_not_requeued_says_why(slurm, tmp_path):
    # No requeue allowed: submitit gives up inside the task at Slurm's warning. The limit is cut once the job
    # trains (its first progress line), so that the warning (signal_delay_s ahead, on Slurm's 30 s tick) comes
    # within a minute, during training: a fixed 1-minute limit raced the start-up on a loaded machine. Meanwhile the
    # ranks are held still (SIGSTOP: they would train for nothing); Slurm continues them (SIGCONT) to deliver it.
    log = tmp_path / "sweep.log"
    with log.open("w") as out:
        proc = start("-m", "train", "-m", "progress_bar=false", "checkpoint=none", "cluster=slurm-local",
                     "cluster.wait=true", "data=mock", "max_duration=100000ba", "cluster.timeout_min=10",
                     "cluster.signal_delay_s=90", "cluster.max_num_timeout=0", root=tmp_path, stdout=out,
                     stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 300
            while not any("[progress] step" in err.read_text() for err in tmp_path.rglob("*_0_log.err")):
                assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            with held_still_and_warned():
                proc.wait(timeout=400)
        finally:
            proc.kill()
    assert proc.returncode == 1, log.read_text()[-3000:]
    sweep_dir, [row], [md] = _summaries(tmp_path)
    assert row["state"] in ("FAILED", "TIMEOUT")
    assert row["error"].startswith("rank 0: Job not requeued because: timed-out too many times."), row["error"]
    assert md["error"] == row["error"] and md["world_size"] == row["world_size"] == "2"
    assert "UncompletedJobError" not in (sweep_dir / "summary.md").read_text()
    assert row["metrics"] == row["loss_curve"] == ""


def _training(root: Path, proc: subprocess.Popen) -> Path:
    """The folder of the one-point local sweep `proc` started (its log in root/sweep.log), once its point has
    written a progress line with an ETA."""
    deadline = time.time() + 300
    while not list(root.glob("outputs/sweeps/*/0/progress.json")) or \
            "eta_s" not in next(root.glob("outputs/sweeps/*/0/progress.json")).read_text():
        assert proc.poll() is None and time.time() < deadline, (root / "sweep.log").read_text()[-3000:]
        time.sleep(0.5)
    [sweep_dir] = (root / "outputs" / "sweeps").iterdir()
    return sweep_dir


def test_a_point_whose_controller_alone_was_killed_runs_on_and_status_says_so_until_it_completes(tmp_path):
    """submitit's local controller SIGKILLed alone (its task, orphaned, trains on): `train.status` said FAILED "no
    result" while the point's step still rose, then COMPLETED. The task carries the job's id: RUNNING until it ends."""
    with (tmp_path / "sweep.log").open("w") as out:
        proc = start("-m", "train", "-m", "progress_bar=false", "checkpoint=none", "max_duration=80ba",
                     "eval_loader=null", "console_log_interval=1ba", root=tmp_path, stdout=out,
                     stderr=subprocess.STDOUT)
        try:
            sweep_dir = _training(tmp_path, proc)
            controller = json.loads((sweep_dir / "sweep.json").read_text())["points"][0]["job_id"]
            # the task held still while the status is asked (it holds its running lock): it cannot end first
            tasks = psutil.Process(int(controller)).children()
            for task in tasks:
                task.suspend()
            os.kill(int(controller), signal.SIGKILL)
            now = run("-m", "train.status", str(sweep_dir), root=tmp_path, timeout=120)
            metrics = sweep_dir / "0" / "metrics.json"
            assert not metrics.exists(), "the point ended before the status was asked"
            assert now.returncode == 0 and "| RUNNING |" in now.stdout, now.stdout + now.stderr
            for task in tasks:
                task.resume()
            proc.wait(timeout=300)
        finally:
            stop(proc)  # the command and its job, if the test failed
    assert json.loads(metrics.read_text())["batches"] == 80
    after = run("-m", "train.status", str(sweep_dir), root=tmp_path, timeout=120)
    assert after.returncode == 0 and "| COMPLETED |" in after.stdout, after.stdout + after.stderr


def test_status_beside_a_running_local_sweep_sees_it_running_and_a_killed_point_failed_with_no_eta(tmp_path):
    """`python -m train.status` from another shell holds no process of the local sweep's jobs: a point whose
    controller runs is RUNNING (the command exits 0 and writes that), not a dead point. Its task killed
    (SIGKILL: no result, no traceback), the point is FAILED, as a rank that raised, with no ETA. Run from a
    shell whose umask lets the world read, the summary files it rewrites are still not world-readable."""
    import psutil

    log = tmp_path / "sweep.log"
    with log.open("w") as out:
        proc = start("-m", "train", "-m", "progress_bar=false", "checkpoint=none", "cluster=local",
                     "cluster.tasks_per_node=1", "data=mock", "max_duration=100000ba", "console_log_interval=1ba",
                     root=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        try:
            sweep_dir = _training(tmp_path, proc)

            def status():
                return subprocess.run([str(PYTHON), "-m", "train.status", str(sweep_dir)], cwd=ROOT,
                                      env=command_env(tmp_path), capture_output=True, text=True, timeout=120,
                                      preexec_fn=lambda: os.umask(0o022))

            now = status()
            assert now.returncode == 0, now.stdout + now.stderr
            [row] = csv.DictReader((sweep_dir / "summary.csv").open())
            assert row["state"] == "RUNNING" and row["eta"] and row["error"] == "", row
            for name in ("summary.md", "summary.csv"):
                assert (sweep_dir / name).stat().st_mode & 0o007 == 0, name
            controller = json.loads((sweep_dir / "sweep.json").read_text())["points"][0]["job_id"]
            [task] = psutil.Process(int(controller)).children()
            os.kill(task.pid, signal.SIGKILL)
            proc.wait(timeout=120)
        finally:
            stop(proc)  # the command and its job, if the test failed
    assert proc.returncode == 1, log.read_text()[-3000:]
    _, [row], [md] = _summaries(tmp_path)
    assert row["state"] == md["state"] == "FAILED", row
    assert row["eta"] == row["last_progress"] == "" and row["error"].startswith("rank 0: no result (killed"), row
    assert "job FAILED" in row["error"]
    after = status()
    assert after.returncode == 1 and "| FAILED |" in after.stdout, after.stdout + after.stderr
    [row] = csv.DictReader((sweep_dir / "summary.csv").open())
    assert row["state"] == "FAILED" and row["eta"] == ""


def test_status_of_a_path_that_is_no_sweep_or_of_a_damaged_sweep_json_says_what_it_is_and_writes_nothing(tmp_path):
    """A file, or a sweep.json cut short, a list, or without the launcher's keys: tracebacks (NotADirectoryError,
    JSONDecodeError, KeyError). Each: exit 2, `error: sweep:` naming what the path is, a fix, nothing written."""
    from common.sweep.status import write_manifest

    readme = tmp_path / "README.md"
    readme.write_text("# notes\n")
    whole = tmp_path / "whole"
    whole.mkdir()
    write_manifest(whole, "train.launch.sweep_app.TrainApp", [{"num": 0, "overrides": ["seed=1"], "job_id": None}],
                   [])
    written = (whole / "sweep.json").read_bytes()
    sweeps = {"cut short": written[: len(written) // 2], "a list": b"[1, 2]", "no keys": b"{}",
              "a point without its job": written.replace(b'"job_id"', b'"job"'),
              "another app": written.replace(b"train.launch.sweep_app.TrainApp", b"nope.App")}
    for name, data in sweeps.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "sweep.json").write_bytes(data)
    said = {readme: "is a file, not a sweep folder", tmp_path / "cut short": "cannot be read as the JSON",
            tmp_path / "a list": "holds a JSON list, not an object", tmp_path / "no keys": "has no 'app'",
            tmp_path / "a point without its job": "has point 0 without 'job_id'",
            tmp_path / "another app": "names an app this checkout cannot load, 'nope.App'"}
    before = sorted(tmp_path.rglob("*"))
    for path, words in said.items():
        proc = run("-m", "train.status", path, root=tmp_path / "root", timeout=120)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: sweep: {path}") and words in proc.stderr, \
            proc.stderr[-2000:]
        assert "\n  fix: " in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""
    assert sorted(tmp_path.rglob("*")) == before
