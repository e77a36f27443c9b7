"""How fast a look answers: `plan=json`, a sweep's plan and `--cfg job`, beside Hydra composing the same config
in a bare process (the floor any Hydra app pays), as ratios from one run on this machine.

    .venv/bin/python bench/bench_plan.py [--repeats 3] [--smoke]

--smoke: one run of each command (the same commands: they are already the smallest), to see that it runs.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
BARE = ("from hydra import compose, initialize_config_dir\nimport train\n"
        f"with initialize_config_dir({str(ROOT / 'conf')!r}, version_base=None):\n"
        "    compose('train', overrides=['model=gpt175b', 'cluster=ndv5', 'cluster.nodes=64'])\n")
CASES = {
    "plan=json, gpt175b on 64 nodes": ["-m", "train", "model=gpt175b", "cluster=ndv5", "cluster.nodes=64",
                                      "storage=amlfs", "plan=json"],
    "plan=json, 4-point sweep": ["-m", "train", "-m", "model=mpt-30b", "cluster=ndv5", "data=mock",
                                 "cluster.nodes=2,4,8,16", "plan=json"],
    "--cfg job": ["-m", "train", "model=gpt175b", "cluster=ndv5", "--cfg", "job"],
}


def best_of(cmd, env, repeats) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one run of each, to see that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "PRETRAIN_ROOT": root, "HF_HUB_OFFLINE": "1"}
        bare = best_of([PYTHON, "-c", BARE], env, args.repeats)
        print(f"{'command':40s} {'best s':>8s} {'x bare compose':>15s}")
        print(f"{'hydra compose (bare process)':40s} {bare:8.2f} {1.0:15.2f}")
        for name, cmd in CASES.items():
            s = best_of([PYTHON, *cmd], env, args.repeats)
            print(f"{name:40s} {s:8.2f} {s / bare:15.2f}")


if __name__ == "__main__":
    main()
