"""How a sweep's size costs on the login node: planning (`plan=json`) 1, 32 and 128 points, beside Hydra composing
one config in a bare process (the floor any Hydra app pays), and submitting 1 and 128 points to Slurm, beside
hydra-submitit-launcher's own `submitit_slurm` launcher submitting the same sweep of a trivial Hydra app
(bench/trivial_app.py), from one run on this machine.

Submitting needs the loopback Slurm (scripts/slurm-local.sh start; SLURM_CONF exported). Ours: the whole command,
which returns once every point and the sweep's summary job are submitted. The reference waits for its jobs'
results after submitting them: its time is from its start until the last point's job is in Slurm (submitit moves
each point's pickle to its job's folder once sbatch has answered), then it is stopped. Every job of both is
submitted to begin in an hour (`--begin=now+3600`) and cancelled once timed: nothing runs.

    .venv/bin/python bench/bench_sweep.py [--repeats 2] [--no-submit] [--smoke]

--smoke: sweeps of 1 and 4 points, one run each, to see that it runs. It submits only where SLURM_CONF is set
(the loopback cluster is up: `bash scripts/slurm-local.sh start`, then `eval "$(bash scripts/slurm-local.sh
status)"`) and plans only otherwise, so a smoke run works on any machine; --no-submit plans only either way.
tests/test_bench.py runs both: plans only without Slurm, and the submits under its `slurm` fixture.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_plan import best_of  # the same timing as the other look benchmarks (this folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
BARE = ("from hydra import compose, initialize_config_dir\nimport train\n"
        f"with initialize_config_dir({str(ROOT / 'conf')!r}, version_base=None):\n"
        "    compose('train', overrides=['model=mpt-30b', 'cluster=ndv5', 'cluster.nodes=4'])\n")
# 4 x 8 = 32 points, x 4 = 128: node counts, learning rates, seeds
GRIDS = {1: [], 32: ["cluster.nodes=2,4,8,16", "optimizer.lr=1e-4,2e-4,3e-4,4e-4,5e-4,6e-4,7e-4,8e-4"]}
GRIDS[128] = GRIDS[32] + ["seed=1,2,3,4"]
SMOKE_GRIDS = {1: [], 4: ["cluster.nodes=2,4,8,16"]}
SUBMITTED = (1, 128)  # submitted: one learning rate, then 128 (one resource set: one job array of each)
SMOKE_SUBMITTED = (1, 4)
LATER = "now+3600"  # every job submitted begins in an hour at the earliest: cancelled before, nothing runs


def lrs(points: int) -> str:
    return ",".join(f"{(i + 1) * 1e-5:.6g}" for i in range(points))


def submit_seconds(points: int, env) -> float:
    """Seconds until our command returns, every point submitted (with the sweep's summary job); the jobs are
    then cancelled."""
    cmd = [PYTHON, "-m", "train", "-m", "cluster=slurm-local", "data=mock", "checkpoint=none",
           f"cluster.sbatch_extra={{begin: {LATER}}}", f"optimizer.lr={lrs(points)}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    jobs = re.findall(r"-> job (\d+)", proc.stdout) + re.findall(r"written by job (\d+)", proc.stdout)
    subprocess.run(["scancel", *dict.fromkeys(jobs)], env=env, check=False)  # an array's tasks share its id
    if proc.returncode or len(jobs) != points + 1:
        sys.exit(f"{len(jobs)} jobs for {points} points (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return took


def reference_seconds(points: int, env, root: str) -> float:
    """Seconds from the start of hydra-submitit-launcher's `submitit_slurm` sweep of the trivial app until every
    point's job is in Slurm (its last pickle moved to its job's folder), the jobs cancelled then."""
    sweep = Path(tempfile.mkdtemp(dir=root, prefix="reference-"))
    cmd = [PYTHON, str(ROOT / "bench" / "trivial_app.py"), "-m", "hydra/launcher=submitit_slurm",
           f"+hydra.launcher.additional_parameters={{begin: {LATER}}}", "hydra.launcher.name=bench-reference",
           f"hydra.sweep.dir={sweep}", f"lr={lrs(points)}"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=sweep, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    submitted = []
    while len(submitted) < points and proc.poll() is None and time.perf_counter() - start < 600:
        time.sleep(0.01)
        submitted = list((sweep / ".submitit").glob("*/*_submitted.pkl"))
    took = time.perf_counter() - start
    proc.terminate()  # it waits for the jobs' results
    _, err = proc.communicate()
    arrays = dict.fromkeys(p.name.split("_")[0] for p in submitted)
    subprocess.run(["scancel", *arrays], env=env, check=False)
    if len(submitted) != points:
        sys.exit(f"the reference submitted {len(submitted)} of {points} points (exit {proc.returncode}): {err[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-submit", action="store_true", help="plans only (no Slurm needed)")
    parser.add_argument("--smoke", action="store_true",
                        help="1 and 4 points, one run each; submits only where SLURM_CONF is set")
    args = parser.parse_args()
    grids, submitted = GRIDS, SUBMITTED
    if args.smoke:
        grids, submitted, args.repeats = SMOKE_GRIDS, SMOKE_SUBMITTED, 1
        args.no_submit = args.no_submit or not os.environ.get("SLURM_CONF")
    largest = max(grids)
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "PRETRAIN_ROOT": root, "HF_HUB_OFFLINE": "1"}
        bare = best_of([PYTHON, "-c", BARE], env, args.repeats)
        print(f"{'command':34s} {'best s':>8s} {'s/point':>8s} {'x bare compose':>15s}")
        print(f"{'hydra compose, one config (bare)':34s} {bare:8.2f} {bare:8.3f} {1.0:15.2f}")
        planned = {}
        for points, grid in grids.items():
            cmd = [PYTHON, "-m", "train", "-m", "model=mpt-30b", "cluster=ndv5", "data=mock", *grid, "plan=json"]
            s = planned[points] = best_of(cmd, env, args.repeats)
            print(f"{f'plan=json, {points} points':34s} {s:8.2f} {s / points:8.3f} {s / bare:15.2f}")
        print(f"plan, {largest} points / 1 point: {planned[largest] / planned[1]:.1f}x")
        if args.no_submit:
            print("submit: not measured (--no-submit, or --smoke without SLURM_CONF)")
        else:
            took, ref = {}, {}
            for points in submitted:
                s = took[points] = min(submit_seconds(points, env) for _ in range(args.repeats))
                print(f"{f'submit to Slurm, {points} points':34s} {s:8.2f} {s / points:8.3f} {s / bare:15.2f}")
                s = ref[points] = min(reference_seconds(points, env, root) for _ in range(args.repeats))
                print(f"{f'reference submitit_slurm, {points} pts':34s} {s:8.2f} {s / points:8.3f} {s / bare:15.2f}")
            most = max(submitted)
            # points with the same resources go as one job array: the submit hardly grows with the sweep
            print(f"submit, {most} points / 1 point: {took[most] / took[1]:.1f}x; "
                  f"reference: {ref[most] / ref[1]:.1f}x")
            for points in submitted:
                print(f"submit, ours / reference, {points} points: {took[points] / ref[points]:.2f}x")


if __name__ == "__main__":
    main()
