"""`python -m train ... -m` on a real Slurm controller (scripts/slurm-local.sh): real jobs, real ranks."""
import csv
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    PYTHON,
    ROOT,
    TRAIN_ARGS,
    finished,
    held_still_and_warned,
    job_log,
    requeue_once_written,
    run,
    start,
    task_prolog_without_slurm,
    train_command,
    wait_for_checkpoint,
)
from submitit.core.utils import pickle_load

from train.task import goodput

TINY = ("cluster=slurm-local", "data=mock", "progress_bar=false")
WAIT = "cluster.wait=true"  # the command waits for its jobs, as it did before submit-and-return


def sweep(root: Path, *overrides: str, **kw) -> subprocess.CompletedProcess:
    return run("-m", "train", "-m", *TINY, WAIT, *overrides, root=root, timeout=900, **kw)


def summary(root: Path) -> list:
    [path] = (root / "outputs" / "sweeps").glob("*/summary.csv")
    assert (path.parent / "summary.md").is_file()
    return list(csv.DictReader(path.open()))


def status(sweep_dir: Path) -> subprocess.CompletedProcess:
    return run("-m", "train.status", sweep_dir, timeout=120)


def shown(stdout: str) -> dict:
    """The status command's table: {point: {column: cell}}."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split(" | ")]  # noqa: E731
    header = cells(lines[0])
    return {int(row[0]): dict(zip(header, row)) for row in map(cells, lines[1:])}


@pytest.fixture
def lustre(slurm, tmp_path):
    """A folder on the file system both loopback nodes share, a tmpfs mounted by scripts/slurm-local.sh before the
    nodes start (each node has its own mount namespace), as docs/cluster-run.md's month-long run has Lustre: the storage
    preset's mount check, the jobs, status, summary and export all go through it."""
    shared = Path(slurm).parent.parent / "shared"
    if subprocess.run(["mountpoint", "-q", str(shared)]).returncode != 0:
        pytest.skip(f"{shared} is not mounted: restart the loopback cluster (scripts/slurm-local.sh stop; start)")
    folder = shared / tmp_path.name
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_sweep_submits_and_returns_is_followed_by_status_and_summarised_by_its_own_job(slurm, tmp_path, lustre):
    """docs/cluster-run.md's month-long run, small: a learning-rate sweep on a mounted shared storage (storage=amlfs
    storage.root=<mount>), submitted and returned; followed with train.status; summarised by its own job; the
    best point exported by name, found on the storage the training command named."""
    storage = ("storage=amlfs", f"storage.root={lustre}", f"storage.mounts=[{lustre.parent}]")
    here = tmp_path / "not-here"
    started = time.time()
    # 80 batches: long enough that a loaded machine's status calls see both points train
    proc = run("-m", "train", "-m", *TINY, *storage, "max_duration=80ba", "save_interval=40ba",
               "console_log_interval=2ba", "optimizer.lr=1e-3,3e-3", root=here, timeout=120)
    returned = time.time() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    [sweep_dir] = (lustre / "outputs" / "sweeps").iterdir()
    jobs = [line.split("-> job ")[1].split(",")[0] for line in proc.stdout.splitlines() if "-> job " in line]
    assert len(jobs) == 2 and f"python -m train.status {sweep_dir} --watch" in proc.stdout
    queued = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout
    assert len({job.split("_")[0] for job in jobs}) == 1  # the two points are one job array
    # it returned while its jobs were queued (`A_[0-1%2]`) or ran (`A_0`)
    assert all(job.split("_")[0] + "_" in queued for job in jobs), (returned, queued)
    assert not (sweep_dir / "summary.md").exists()

    seen, deadline = set(), time.time() + 600  # follow it as a user would, while it trains: both points running,
    while not ({0, 1} <= {n for n, state, _ in seen if state == "RUNNING"}  # one of them with a loss on the way
               and any(state == "RUNNING" and loss for _, state, loss in seen)):
        now = status(sweep_dir)
        assert now.returncode == 0 and time.time() < deadline, (now.stderr, seen)
        rows = shown(now.stdout)
        seen |= {(n, row["state"].split(" ")[0], row["loss"]) for n, row in rows.items()}  # PENDING (Resources)
        assert all(row["state"].split(" ")[0] in ("PENDING", "RUNNING") for row in rows.values()), seen  # too fast
        time.sleep(1)
    # then nobody runs it again: the sweep's own job writes the summary once both points have ended
    summary_job = json.loads((sweep_dir / "sweep.json").read_text())["summary_job"]
    result = sweep_dir / ".submitit" / summary_job / f"{summary_job}_0_result.pkl"
    while not result.exists():
        assert time.time() < deadline, subprocess.run(["squeue"], capture_output=True, text=True).stdout
        time.sleep(2)
    outcome, text = pickle_load(result)
    assert outcome == "success" and (sweep_dir / "summary.md").read_text() == text
    # ... and the files are the summary job's: nobody ran the command after every point ended
    rows = summary(lustre)
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"]
    assert {r["overrides"] for r in rows} == {"optimizer.lr=0.001", "optimizer.lr=0.003"}
    for row in rows:
        assert float(row["final_loss"]) > 0 and float(row["tokens_per_sec"]) > 0 and row["step"] == "step 80/80"
        assert row["world_size"] == "2" and row["requeues"] == "0"
        [final] = Path(row["checkpoint"]).glob("ep*-ba80")  # (the mock data's epoch may end before it)
        shards = sorted(p.name for p in final.iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        job_dir = Path(row["log"]).parent  # every task's log and the submission script
        assert {f"{row['job_id']}_0_log.err", f"{row['job_id']}_1_log.err"} <= {p.name for p in job_dir.iterdir()}
        array = row["job_id"].split("_")[0]  # the array's one script, in its own folder
        assert (job_dir.parent / array / f"{array}_submission.sh").is_file()
    assert (sweep_dir / "0" / ".hydra" / "config.yaml").is_file()  # the composed config of each point
    assert _accounted_state(rows[0]["job_id"]) == "COMPLETED"
    final = shown(status(sweep_dir).stdout)
    assert [final[n]["state"] for n in (0, 1)] == ["COMPLETED", "COMPLETED"] and all(final[n]["loss"] for n in (0, 1))
    # from anywhere, days later: the storage overrides of the training command find the sweep and the run
    newest = run("-m", "train.status", *storage[:2], root=here, cwd=tmp_path, timeout=120)
    assert newest.returncode == 0 and str(sweep_dir) in newest.stdout + newest.stderr, newest.stderr[-2000:]
    assert [row["state"] for row in shown(newest.stdout).values()] == ["COMPLETED", "COMPLETED"]
    best = min(rows, key=lambda r: float(r["eval_loss"] or r["final_loss"]))
    name = Path(best["checkpoint"]).name
    exported = run("-m", "train.export", name, *storage[:2], root=here, cwd=tmp_path, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]
    folder = Path(exported.stdout.strip().splitlines()[-1])
    assert folder.is_relative_to(lustre / "outputs" / name) and (folder / "config.json").is_file()
    assert not (tmp_path / "not-here").exists()  # nothing went to the local root


def test_a_summary_job_slurm_refuses_leaves_the_points_submitted_and_says_how_to_summarise(slurm, tmp_path):
    proc = run("-m", "train", "-m", *TINY, "max_duration=2ba", "checkpoint=none",
               "cluster.summary_partition=no-such-partition", root=tmp_path, timeout=120)
    jobs = [line.split("-> job ")[1].split(",")[0] for line in proc.stdout.splitlines() if "-> job " in line]
    subprocess.run(["scancel", *jobs], check=False)
    assert proc.returncode == 0 and len(jobs) == 1, proc.stderr[-3000:]
    [sweep_dir] = (tmp_path / "outputs" / "sweeps").iterdir()
    assert "the summary job was not submitted" in proc.stderr and "invalid partition" in proc.stderr.lower()
    assert f"python -m train.status {sweep_dir} --watch` writes the summary" in proc.stderr
    assert json.loads((sweep_dir / "sweep.json").read_text())["summary_job"] is None


def test_a_job_slurm_does_not_take_is_said_in_its_words_and_nothing_else_is_submitted(slurm, tmp_path):
    """sbatch failing (here: a slurm.conf naming a controller that is not there) ended `-m` with submitit's
    traceback."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=broken\nSlurmctldHost=nowhere\n")
    proc = run("-m", "train", "-m", *TINY, "max_duration=2ba", "checkpoint=none", root=tmp_path / "root",
               env={"SLURM_CONF": str(conf)}, timeout=300)
    assert proc.returncode == 1 and "error: hydra.launcher: slurm did not take the job of point(s) #0: sbatch: " \
        "error: " in proc.stderr, proc.stderr[-3000:]
    assert "nothing was submitted; fix what it says" in proc.stderr and "Traceback" not in proc.stderr
    assert "-> job " not in proc.stdout


def _accounted_state(job_id: str) -> str:
    """The job's state in Slurm's accounting, once it has caught up with the job's end."""
    deadline = time.time() + 60
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-o", "State", "-j", job_id], capture_output=True, text=True)
        state = (out.stdout.split() or ["?"])[0]
        if state not in ("RUNNING", "PENDING", "COMPLETING", "?") or time.time() > deadline:
            return state
        time.sleep(1)


def test_two_nodes_by_two_tasks_trains_with_world_size_four_and_its_export_scores_its_eval(slurm, tmp_path):
    """2 nodes x 2 tasks, exported at the end. Each rank evaluated its first 2 batches of 4 of its node's half of
    the 64 validation samples (streaming gives each node its own stretch): samples 0-15 and 32-47, not the first
    32, which `--batches eval_subset_num_batches x world size` would read. `train.evaluate RUN` scores the samples
    evaluated (it finds the run's metrics.json in the sweep's folder): the run's own number."""
    proc = sweep(tmp_path, "cluster.nodes=2", "device_train_microbatch_size=4", "max_duration=6ba", "checkpoint=none",
                 "eval_interval=6ba", "eval_subset_num_batches=2", "export=hf", "run_name=four")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = summary(tmp_path)
    assert row["state"] == "COMPLETED" and row["world_size"] == "4"
    nodes = subprocess.run(["sacct", "-n", "-X", "-o", "NNodes", "-j", row["job_id"]], capture_output=True, text=True)
    assert nodes.stdout.split()[0] == "2"
    [metrics] = [json.loads(p.read_text()) for p in (tmp_path / "outputs" / "sweeps").glob("*/*/metrics.json")]
    scored = run("-m", "train.evaluate", "four", "--json", root=tmp_path, check=True,
                 env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    [got] = json.loads(scored.stdout.strip().splitlines()[-1])["evaluators"].values()
    assert (got["nodes"], got["ranks_per_node"], got["samples"]) == (2, 2, 4 * 2 * 4)
    assert got["cross_entropy"] == pytest.approx(metrics["final_eval"]["eval/LanguageCrossEntropy"], rel=1e-6)


def test_a_failing_point_is_reported_with_its_log_and_the_other_completes(slurm, tmp_path):
    # a learning rate of 1e6 passes every check (it is a number llm-foundry takes) and fails in training: the loss
    # is not finite within a few steps, and the run stops there (train/checkpoint/integrity.py)
    proc = sweep(tmp_path, "cluster.tasks_per_node=1", "max_duration=8ba", "checkpoint=none", "optimizer.lr=3e-3,1e6")
    assert proc.returncode == 1
    ok, bad = summary(tmp_path)
    assert ok["state"] == "COMPLETED" and float(ok["final_loss"]) > 0
    assert bad["state"] == "FAILED" and "RunStopped" in bad["error"] and "the training loss is nan" in bad["error"]
    assert Path(bad["log"]).is_file() and bad["log"] in proc.stderr


def test_scancel_of_a_running_job_is_reported_as_cancelled(slurm, tmp_path):
    proc = start("-m", "train", "-m", *TINY, WAIT, "cluster.tasks_per_node=1", "max_duration=100000ba", "checkpoint=none",
                 root=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = None
    for line in proc.stdout:  # "[sweep] #0 ... -> job 123, log ..."
        if "-> job" in line:
            job_id = line.split("-> job ")[1].split(",")[0]
            break
    assert job_id, "the sweep never said which job it submitted"
    deadline = time.time() + 120
    while subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True).stdout.strip() != "RUNNING":
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], check=True)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1
    [row] = summary(tmp_path)
    assert row["job_id"] == job_id and row["state"] == "CANCELLED"
    assert "CANCELLED" in stderr


def test_a_timed_out_two_rank_sharded_job_with_evaluations_is_requeued_and_ends_with_the_uninterrupted_loss(
        slurm, tmp_path, tmp_path_factory):
    # The default policy of every Slurm preset: 2 ranks, checkpoint=sharded, evaluations between checkpoints; the
    # resume matrix's reference training (tests/helpers.py), here as a Slurm job that runs out of time once, at a
    # known point. Once its checkpoint after batch 20 is written its ranks are held still (SIGSTOP) and its time
    # limit is cut (scontrol) so that Slurm's own warning (USR2, signal_delay_s ahead, on its 30 s tick) comes
    # within a minute; Slurm continues the ranks (SIGCONT) to deliver it, they answer it, and the batch script on
    # the host requeues the job. (A fixed 1-minute limit raced the start-up: on a loaded machine every allocation ended
    # before its first batch, 20 times, and submitit gave up; an unheld job finished its 40 batches before the tick.)
    # timeout_min <= 10: submitit takes any warning for a time-out (it counts from 80 % of longer limits).
    want = json.loads(next((finished(2, "sharded", tmp_path_factory) / "outputs").rglob("metrics.json")).read_text())
    # The tasks run as in an image without a Slurm client: no scontrol on their PATH. The preflight's node check
    # (run inside the task by local rank 0, at every start) records what the task's PATH offers.
    prolog = task_prolog_without_slurm(tmp_path / "image")
    seen = tmp_path / "task-path.txt"
    probe = tmp_path / "probe.sh"
    probe.write_text(f'#!/bin/bash\necho "scontrol=$(command -v scontrol || echo none) PATH=$PATH" >> {seen}\n')
    probe.chmod(0o755)
    root = tmp_path / "slurm"
    out = (tmp_path / "sweep.log").open("w")  # a file, not a pipe nobody reads while it runs
    proc = start(*train_command(2, "sharded", *TINY, WAIT, "cluster.timeout_min=10", "cluster.signal_delay_s=90",
                                f'cluster.srun_extra=["--task-prolog={prolog}"]',
                                f"cluster.preflight.node_check={probe}"),
                 root=root, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_checkpoint(root, 10, proc)  # training: its tasks are there to find
        with held_still_and_warned(until=lambda: wait_for_checkpoint(root, 20, proc)) as job:
            deadline = time.time() + 200
            while "Restarts=0" in subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True,
                                                 text=True).stdout:
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "sweep.log").read_text()[-3000:]
                time.sleep(0.5)
            subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"], check=True, timeout=30)
            proc.wait(timeout=600)
    finally:
        proc.kill()
    # on failure, each allocation's story from rank 0's log: starts, signals, requeues, the countdown
    story = [line for log in root.rglob("*_0_log.err") for line in log.read_text().splitlines()
             if any(w in line for w in ("Starting with", "timed-out", "remaining timeouts", "not requeued",
                                        "resuming from", "[progress] step"))]
    assert proc.returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:] + "\n".join(story[-60:])
    [row] = summary(root)
    assert row["state"] == "COMPLETED" and row["world_size"] == "2"
    log = job_log(row)
    starts = log.count("Starting with JobEnvironment")
    assert "this job is timed-out" in log and starts == 2, log[-3000:]  # it really hit the limit, and ran again
    # one resume, from the checkpoint at batch 20 (held still right after composer's `latest` link named it, the
    # ranks may not have written its manifest yet: the task then says so and writes it, a second "resuming from")
    assert [Path(p).name for p in re.findall(r"resuming from (/\S+)", log)] == ["ep0-ba20"], log[-3000:]
    # every requeue came from the batch script on the host; none from the task, which had no scontrol to run
    requeued = f"requeued job {row['job_id']} (from the host; "
    assert log.count(requeued) == starts - 1, log[-3000:]
    assert log.count("asked the batch script to requeue job") == starts - 1
    assert "Requeued job" not in log and "scontrol" not in log, log[-3000:]
    # every start saw no scontrol
    checks = seen.read_text().splitlines()
    assert len(checks) == starts and set(checks) == {f"scontrol=none PATH={tmp_path / 'image' / 'bin'}"}
    assert float(row["final_loss"]) == pytest.approx(want["final_train_loss"], rel=1e-6)
    [got] = (root / "outputs").rglob("metrics.json")
    got = json.loads(got.read_text())
    assert [b for b, _ in got["eval"]] == [10, 20, 30, 40]  # every evaluation, across the requeue
    assert got["final_eval"] == pytest.approx(want["final_eval"], rel=1e-6)
    # goodput across the requeue: one segment per allocation, each from Slurm's start of the job; the first's
    # time after its checkpoint at 20 (held still until the warning) was lost to the requeue
    [record] = root.glob(f"checkpoints/*/{goodput.FILE}")
    first, second = json.loads(record.read_text())["segments"]
    assert (first["from_batch"], second["from_batch"], second["finished"]) == (0, 20, True)
    assert first["ended"] <= second["began"] + 1  # Slurm's start time is in whole seconds
    parts = got["goodput_parts"]
    assert (parts["starts"], parts["rollbacks"]) == (2, 0)
    assert parts["lost_to_requeues_s"] > 0 and parts["lost_to_rollbacks_s"] == 0
    assert sum(parts[p] for p in goodput.PARTS) == pytest.approx(parts["allocated_s"], rel=1e-9)
    assert parts["allocated_s"] == pytest.approx(sum(s["ended"] - s["began"] for s in (first, second)), abs=5)
    assert got["goodput"] == pytest.approx(parts["trained_s"] / parts["allocated_s"]) and 0 < got["goodput"] < 1
    assert float(row["goodput"]) == pytest.approx(got["goodput"])


def test_a_requeued_job_that_does_not_resume_continues_its_own_checkpoints_to_the_uninterrupted_loss(
        slurm, tmp_path, tmp_path_factory):
    """autoresume=false beside save_overwrite=true, as llm-foundry's own examples set them: each allocation of a
    requeued job trained the same first batches again with the same losses, exit 0. Requeued by Slurm (here
    `scontrol requeue`, as a preemption does) once its checkpoint at batch 20 is certified, the job continues the
    checkpoints its own job trained, says so, and ends at the uninterrupted run's loss."""
    want = json.loads(next((finished(1, "sharded", tmp_path_factory) / "outputs").rglob("metrics.json")).read_text())
    out = (tmp_path / "sweep.log").open("w")
    proc = start("-m", "train", "-m", "cluster.tasks_per_node=1", "checkpoint=sharded", *TRAIN_ARGS, *TINY, WAIT,
                 "autoresume=false", "save_overwrite=true", root=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_checkpoint(tmp_path, 20, proc)
        job = requeue_once_written(tmp_path, "checkpoints/*/ep0-ba20*.manifest.json", proc, tmp_path / "sweep.log",
                                   within=120)
        proc.wait(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    [row] = summary(tmp_path)
    assert row["state"] == "COMPLETED", row
    log = job_log(row)
    assert log.count("Starting with JobEnvironment") == 2, log[-3000:]
    assert f"autoresume=false, but this start is a requeue of job {job} (SLURM_RESTART_COUNT=1): it continues the " \
           "checkpoints its own job trained, from " in log, log[-3000:]
    assert [Path(p).name for p in re.findall(r"resuming from (/\S+)", log)] == ["ep0-ba20-rank0.pt"], log[-3000:]
    assert float(row["final_loss"]) == pytest.approx(want["final_train_loss"], rel=1e-6)
    [got] = (tmp_path / "outputs").rglob("metrics.json")
    got = json.loads(got.read_text())
    assert got["final_eval"] == pytest.approx(want["final_eval"], rel=1e-6)
    assert [b for b, _ in got["eval"]] == [10, 20, 30, 40]


def test_data_prep_parts_run_as_a_slurm_array_on_the_cpu_partition(slurm, tmp_path):
    from helpers import C4, TOKENIZER, need_shared

    need_shared()
    common = ["dataset=c4", f"input={C4}", f"tokenizer={TOKENIZER}", "num_parts=2", "progress=false"]

    def run(*extra):
        return subprocess.run([str(PYTHON), "-m", "data_prep", *extra, *common], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)

    array = run("-m", "part=range(0,2)", "hydra/launcher=htc", "hydra.launcher.cpus_per_task=2",
                f"out_root={tmp_path / 'array'}")
    assert array.returncode == 0, array.stderr[-3000:]  # submitted, and returned
    [sweep_dir] = [line.split(": ", 1)[1] for line in array.stdout.splitlines() if line.startswith("sweep: ")]
    single = run(f"out_root={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-3000:]
    follow = subprocess.run([str(PYTHON), "-m", "data_prep.status", sweep_dir, "--watch", "2"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert follow.returncode == 0, follow.stdout[-3000:] + follow.stderr[-3000:]

    scripts = {p.read_text(): p for p in (tmp_path / "array").rglob("*_submission.sh")}
    [submission] = [p for text, p in scripts.items() if "#SBATCH --array=0-1" in text]  # and the summary job's
    assert "#SBATCH --partition=htc" in submission.read_text() and len(scripts) == 2
    job_id = submission.name.split("_")[0]
    assert _accounted_state(f"{job_id}_0") == _accounted_state(f"{job_id}_1") == "COMPLETED"
    assert f"dataset {tmp_path / 'array' / 'train'}: merged, " in follow.stdout

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
                and p.suffix in (".mds", ".json") and "summary" not in p.name and ".data_prep_jobs" not in str(p)}

    assert files(tmp_path / "array" / "train") == files(tmp_path / "single" / "train")


def test_a_pending_point_shows_why_it_waits(slurm, tmp_path):
    # held back by Slurm itself (a begin time an hour away): the status says so, not a bare PENDING; two points
    # with the same resources, one array: each task has the reason. The plan shows that array's script (it showed
    # each point's own job, with another name and log paths, which was not what was submitted)
    line = ["-m", "train", "-m", *TINY, "max_duration=4ba", "optimizer.lr=1e-3,2e-3",
            "cluster.sbatch_extra={begin: now+3600}"]
    planned = json.loads(run(*line, "plan=json", root=tmp_path, check=True, timeout=120).stdout)
    assert [p["sbatch_array"] for p in planned] == [{"task": 0, "points": [0, 1]}, {"task": 1, "points": [0, 1]}]
    assert planned[0]["sbatch_script"] == planned[1]["sbatch_script"]
    run(*line, root=tmp_path, check=True, timeout=120)
    [sweep_dir] = (tmp_path / "outputs" / "sweeps").iterdir()
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    [submitted] = [p for p in sweep_dir.rglob("*_submission.sh") if "#SBATCH --array=0-1" in p.read_text()]
    script = planned[0]["sbatch_script"]
    assert submitted.read_text() == script.replace(script.split("--error=")[1].split("/.submitit/")[0], str(sweep_dir))
    try:
        deadline = time.time() + 60  # Slurm gives a new job its reason at its next scheduling pass
        while True:
            now = status(sweep_dir)
            assert now.returncode == 0, now.stderr
            rows = shown(now.stdout)
            if [rows[n]["state"] for n in (0, 1)] == ["PENDING (BeginTime)"] * 2 or time.time() > deadline:
                break
            time.sleep(2)
        assert [rows[n]["state"] for n in (0, 1)] == ["PENDING (BeginTime)"] * 2, now.stdout
    finally:
        subprocess.run(["scancel", str(manifest["points"][0]["job_id"]).split("_")[0], str(manifest["summary_job"])],
                       check=False)


def test_requeues_before_training_began_are_counted_and_a_restart_shows_no_figures_of_the_start_before(
        slurm, tmp_path):
    """Slurm's count of a point's requeues, whenever they came: each of these two comes while the job is still
    starting (held in its preflight's node check), before its rank 0 ever wrote progress.json, where counting the
    starts that reached training saw none. While the job starts again, the status shows no progress line of a start before it."""
    # each start waits in its preflight's node check (before training) while `hold` exists: requeued there, it
    # never trains, however fast it restarts; let go after the second requeue
    hold = tmp_path / "hold"
    hold.touch()
    check = tmp_path / "hold.sh"
    check.write_text(f"#!/bin/bash\nwhile [ -e {hold} ]; do sleep 0.2; done\n")
    check.chmod(0o755)
    out = (tmp_path / "sweep.log").open("w")
    proc = start("-m", "train", "-m", *TINY, WAIT, "max_duration=4ba", "checkpoint=none",
                 f"cluster.preflight.node_check={check}", root=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while not list(tmp_path.glob("outputs/sweeps/*/sweep.json")):
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "sweep.log").read_text()[-3000:]
            time.sleep(0.2)
        [sweep_dir] = (tmp_path / "outputs" / "sweeps").iterdir()
        [point] = json.loads((sweep_dir / "sweep.json").read_text())["points"]
        job = str(point["job_id"])
        for n in (1, 2):
            while subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                 text=True).stdout.strip() != "RUNNING":
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "sweep.log").read_text()[-3000:]
                time.sleep(0.2)
            # before its rank 0 began training: what a record of the starts that trained cannot see
            assert not (Path(point["report"]) / "progress.json").exists()
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
            now = shown(status(sweep_dir).stdout)[0]
            settle = time.time() + 30  # Slurm's accounting (slurmdbd) may record the requeue a moment later
            while now["requeues"] != str(n) and time.time() < settle:
                time.sleep(1)
                now = shown(status(sweep_dir).stdout)[0]
            assert now["requeues"] == str(n) and now["loss"] == "" and now["eta"] == "", now
        hold.unlink()
        proc.wait(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    [row] = summary(tmp_path)
    assert row["state"] == "COMPLETED" and row["requeues"] == "2", row
    # rank 0 recorded Slurm's own count (SLURM_RESTART_COUNT) as its third start began training
    progress = json.loads((Path(point["report"]) / "progress.json").read_text())
    assert (progress["job"], progress["requeues"], progress["starts"]) == (job, 2, 1)
    assert shown(status(sweep_dir).stdout)[0]["requeues"] == "2"
