"""Training throughput: `python -m train` against llm-foundry's own `train()` on the identical composed config.

Both run as whole processes on this machine, alternating, with the same model, data, batch and seed; the
reference gets exactly the config our command composes (minus our report callback). Throughput is what
composer's speed monitor logs (tokens/s over its last window of batches), read from each process's console log:
the one instrument on both sides. Our config turns composer's console logger off (log_to_console: false; our
progress line replaces it), so the bench turns it back on for both (log_to_console=true), at
console_log_interval, which then also paces the speed monitor's lines.

    .venv/bin/python bench/bench_train.py [--repeats 2] [--smoke] [overrides ...]

--smoke: one run of each side, 4 batches with a 2-batch speed window and one evaluation batch, to see that the
comparison still runs (the figures mean little: the walls are mostly start-up, the rates two batches each).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PYTHON = sys.executable
THROUGHPUT = re.compile(r"throughput/tokens_per_sec: ([0-9.]+)")
DEFAULT = ["max_duration=200ba", "checkpoint=none", "eval_interval=200ba", "progress_bar=false",
           "console_log_interval=10ba"]
# Smallest run that still logs a windowed rate: the speed monitor needs window_size + 1 batch ends.
SMOKE = ["max_duration=4ba", "checkpoint=none", "eval_interval=4ba", "eval_subset_num_batches=1",
         "progress_bar=false", "console_log_interval=1ba", "callbacks.speed_monitor.window_size=2"]
REFERENCE = ("import sys\nfrom omegaconf import OmegaConf\nfrom llmfoundry.command_utils import train\n"
             "train(OmegaConf.load(sys.argv[1]))\n")


def timed(cmd, env) -> tuple:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
    rates = [float(x) for x in THROUGHPUT.findall(proc.stdout + proc.stderr)]
    if not rates:  # a clear message, not an IndexError, when the console line's wording or cadence changes
        sys.exit(f"{cmd[:3]} logged no throughput/tokens_per_sec (composer's speed monitor through its console "
                 f"logger: log_to_console=true, a run longer than the speed window):\n{proc.stderr[-3000:]}")
    return wall, rates[-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one tiny run of each side, to see that it runs")
    parser.add_argument("overrides", nargs="*", help=f"train overrides (default: {' '.join(DEFAULT)})")
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    args.overrides = args.overrides or (SMOKE if args.smoke else DEFAULT)
    if not any(o.startswith("log_to_console=") for o in args.overrides):
        args.overrides = [*args.overrides, "log_to_console=true"]  # both sides then print the speed monitor

    from omegaconf import OmegaConf

    from train.config.compose import compose
    from train.task.foundry import foundry_config

    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    env = {**os.environ, "PRETRAIN_ROOT": str(root)}
    os.environ["PRETRAIN_ROOT"] = str(root)
    reference_cfg = foundry_config(compose(args.overrides))
    del reference_cfg.callbacks["run_report"]
    cfg_path = root / "reference.yaml"
    OmegaConf.save(reference_cfg, cfg_path)

    ours, theirs = [], []
    for _ in range(args.repeats):  # ours first: it also writes the mock data both read
        ours.append(timed([PYTHON, "-m", "train", *args.overrides], env))
        theirs.append(timed([PYTHON, "-c", REFERENCE, str(cfg_path)], env))

    best = lambda runs: (min(w for w, _ in runs), max(r for _, r in runs))  # noqa: E731
    (ow, orate), (tw, trate) = best(ours), best(theirs)
    print(f"config: {' '.join(args.overrides)}; {reference_cfg.max_duration} of "
          f"{reference_cfg.global_train_batch_size} x {reference_cfg.max_seq_len} tokens; "
          f"{os.cpu_count()} CPUs; best of {args.repeats}, alternating")
    print(f"{'':44}{'wall s':>9}{'tokens/s':>12}")
    print(f"{'llm-foundry train(), whole process':44}{tw:9.1f}{trate:12,.0f}")
    print(f"{'python -m train, whole process':44}{ow:9.1f}{orate:12,.0f}")
    print(f"ours / llm-foundry: tokens/s {orate / trate:.3f}x, wall {tw / ow:.3f}x (above 1: ours faster)")


if __name__ == "__main__":
    main()
