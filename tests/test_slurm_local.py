"""Real jobs through the loopback Slurm cluster of scripts/slurm-local.sh (fixture `slurm`)."""

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-local.sh"


def run(cmd, timeout=30, check=True, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def node_names():
    names = sorted(set(run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()))
    assert len(names) == 2, names
    return names


def sbatch_wait(args, script, workdir: Path, timeout=60):
    """sbatch --wait; returns (job id, stdout of the job). Cancels the job if it overruns."""
    out = workdir / "job.out"
    cmd = ["sbatch", "--wait", "--parsable", "-D", str(workdir), "-o", str(out), *args, "--wrap", script]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        job = stdout.strip().split(";")[0]
        if job:
            run(["scancel", job], check=False)
        state = run(["squeue", "-h", "-j", job, "-o", "%T %r"], check=False).stdout if job else ""
        raise AssertionError(f"job {job or '?'} ({args}) not done within {timeout} s; squeue: {state!r}") from None
    job = stdout.strip().split(";")[0]
    assert proc.returncode == 0, f"sbatch {args} exited {proc.returncode}: {stderr}\n{out.read_text() if out.exists() else ''}"
    return job, out.read_text()


def sacct_state(job, want="COMPLETED", timeout=20):
    """The job's accounting state; records reach slurmdbd a moment after the job ends."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"]).stdout.strip()
        if state == want:
            break
        time.sleep(0.3)
    return state


def test_gpu_preset_job(slurm, tmp_path):
    args = ["-p", "gpu", "--gpus-per-node=8", "--ntasks-per-node=8", "--cpus-per-task=2", "--exclusive"]
    script = 'srun bash -c "echo \\$SLURM_PROCID \\$SLURMD_NODENAME \\$CUDA_VISIBLE_DEVICES"'
    job, out = sbatch_wait(args, script, tmp_path)
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    assert sorted(int(r[0]) for r in rows) == list(range(8)), out
    assert len({r[1] for r in rows}) == 1, f"an 8-task job should fit on one node:\n{out}"
    for r in rows:
        assert len(r) == 3 and r[2].split(",") == [str(i) for i in range(8)], f"task sees {r[2:]}, not 8 GPUs:\n{out}"
    assert sacct_state(job) == "COMPLETED"


def test_two_node_job(slurm, tmp_path):
    job, out = sbatch_wait(["-N", "2", "--ntasks-per-node=2"], 'srun bash -c "echo \\$SLURM_PROCID \\$SLURMD_NODENAME"', tmp_path)
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3], out
    per_node = {}
    for _, n in rows:
        per_node[n] = per_node.get(n, 0) + 1
    assert per_node == {n: 2 for n in node_names()}, out
    assert sacct_state(job) == "COMPLETED"


def result_within(job, seconds):
    """job.result() in a thread, so that a hang fails the test instead of blocking the session."""
    box = {}

    def target():
        try:
            box["result"] = job.result()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    if t.is_alive():
        job.cancel(check=False)
        raise AssertionError(f"submitit job {job.job_id} gave no result or error within {seconds} s (state {job.state})")
    return box, time.monotonic() - t0


def make_executor(folder: Path, **params):
    submitit = pytest.importorskip("submitit")
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(slurm_partition="htc", timeout_min=5, nodes=1, tasks_per_node=1, cpus_per_task=1, **params)
    return executor


def test_submitit_runs_function_on_htc(slurm, tmp_path):
    def where(x):
        import os as _os
        return x * 7, _os.environ["SLURM_JOB_PARTITION"], _os.environ["SLURMD_NODENAME"]

    job = make_executor(tmp_path).submit(where, 6)
    box, _ = result_within(job, 60)
    assert "error" not in box, box.get("error")
    value, partition, node = box["result"]
    assert (value, partition) == (42, "htc")
    assert node in node_names()


def test_submitit_cancelled_job_raises(slurm, tmp_path):
    from submitit.core.utils import UncompletedJobError

    def sleepy():
        import time as _time
        _time.sleep(300)

    job = make_executor(tmp_path).submit(sleepy)
    deadline = time.monotonic() + 30
    while run(["squeue", "-h", "-j", job.job_id, "-o", "%T"]).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, f"job {job.job_id} did not start within 30 s"
        time.sleep(0.2)
    run(["scancel", job.job_id])
    box, _ = result_within(job, 60)
    err = box.get("error")
    assert isinstance(err, UncompletedJobError), f"expected UncompletedJobError, got {box!r}"
    assert "CANCELLED" in str(err), str(err)


def test_status_eval_readies_a_shell(slurm):
    # A shell that knows nothing of the cluster (SLURM_LOCAL_* still choose which cluster it is).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") or k.startswith("SLURM_LOCAL_")}
    proc = run(["bash", "-c", f'eval "$(bash {SCRIPT} status)" && echo "$SLURM_CONF" && squeue -h -o %i'], env=env)
    assert proc.stdout.splitlines()[0] == slurm
    status = run(["bash", str(SCRIPT), "status"])
    assert status.stdout.splitlines()[0].startswith("export SLURM_CONF=")
    assert all(line.startswith("#") for line in status.stdout.splitlines()[1:]), status.stdout


def test_start_is_idempotent(slurm):
    if os.geteuid() != 0:
        pytest.skip("start needs root")
    def daemons() -> list:
        return [line for line in run(["bash", str(SCRIPT), "status"], timeout=120).stdout.splitlines()
                if "running (pid" in line]

    before = daemons()
    proc = run(["bash", str(SCRIPT), "start"], timeout=120)
    assert "already running" in proc.stdout
    assert len(before) == 6 and daemons() == before  # none started again
