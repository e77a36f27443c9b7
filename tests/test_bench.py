"""Every benchmark in bench/ still runs: each script's --smoke mode (one run, the smallest size) exits 0 and prints
its ratio lines, ours beside the reference. The figures are never checked: one tiny run on a shared machine says
nothing about speed, and a bound would fail on a busy machine while the code is fine."""
import re

import pytest
from helpers import C4, need_shared, run

pytestmark = pytest.mark.e2e  # the tier (pyproject.toml markers): whole processes, llm-foundry imports

NUMBER = r"[0-9][0-9,]*\.?[0-9]*"


def smoke(script: str, *args: str, timeout: float = 300) -> str:
    return run(f"bench/{script}", "--smoke", *args, check=True, timeout=timeout).stdout


def has(pattern: str, out: str) -> None:
    assert re.search(pattern, out, re.MULTILINE), f"no line matching {pattern!r} in:\n{out}"


def test_checkpoint_integrity():
    out = smoke("bench_checkpoint_integrity.py")
    has(rf"^  hash .*= {NUMBER}% of the save", out)
    has(rf"^  resume .*: {NUMBER}x a load alone$", out)


def test_data_prep():
    need_shared()
    if not C4.is_dir():
        pytest.skip(f"the C4 excerpts are not at {C4}")
    out = smoke("bench_data_prep.py")
    has(rf"^data_prep / llm-foundry, whole processes: {NUMBER}x \(median {NUMBER}x\); "
        rf"with tokenizers: {NUMBER}x", out)
    has(r"^identical samples: True", out)


def test_plan():
    out = smoke("bench_plan.py")
    for name in ("plan=json, gpt175b on 64 nodes", "plan=json, 4-point sweep", "--cfg job"):
        has(rf"^{re.escape(name)} +{NUMBER} +{NUMBER}$", out)  # seconds, then the ratio to a bare compose


def test_sweep_plans():
    out = smoke("bench_sweep.py", "--no-submit")  # `make test` exports SLURM_CONF: plans only, explicitly
    has(rf"^plan=json, 4 points +{NUMBER} +{NUMBER} +{NUMBER}$", out)
    has(rf"^plan, 4 points / 1 point: {NUMBER}x$", out)


def test_sweep_submits(slurm):
    out = smoke("bench_sweep.py")  # the fixture exported SLURM_CONF: --smoke then submits
    has(rf"^submit to Slurm, 4 points +{NUMBER} +{NUMBER} +{NUMBER}$", out)
    has(rf"^reference submitit_slurm, 4 pts +{NUMBER} +{NUMBER} +{NUMBER}$", out)  # hydra-submitit-launcher's
    has(rf"^submit, 4 points / 1 point: {NUMBER}x; reference: {NUMBER}x$", out)
    has(rf"^submit, ours / reference, 4 points: {NUMBER}x$", out)


@pytest.mark.train  # trains twice, ours and llm-foundry's
def test_train():
    out = smoke("bench_train.py", timeout=600)
    has(rf"^ours / llm-foundry: tokens/s {NUMBER}x, wall {NUMBER}x", out)
