"""The summary a `-m` sweep prints and writes: real local jobs, one of which fails inside llm-foundry."""
import csv
import json
import os
import subprocess
from pathlib import Path

from paths import PYTHON, ROOT

# passes our checks, then llm-foundry's own validate_config raises in the task, before any data is read
BAD = "`load_in_8bit` is only supported for evaluation rather than training."


def _markdown_rows(path: Path) -> list:
    header, _, *rows = path.read_text().splitlines()
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split(" | ")]  # noqa: E731
    return [dict(zip(cells(header), cells(row))) for row in rows]


def test_a_failed_point_shows_its_own_error_and_a_good_one_its_metrics_curve_and_world_size(tmp_path):
    proc = subprocess.run([str(PYTHON), "-m", "train", "-m", "cluster=local", "cluster.tasks_per_node=1",
                           "max_duration=4ba", "checkpoint=none", "progress_bar=false",
                           "+model.load_in_8bit=false,true"],
                          cwd=ROOT, env={**os.environ, "PRETRAIN_ROOT": str(tmp_path)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    [sweep_dir] = (tmp_path / "outputs" / "sweeps").iterdir()
    good, bad = csv.DictReader((sweep_dir / "summary.csv").open())
    md_good, md_bad = _markdown_rows(sweep_dir / "summary.md")

    assert bad["state"] == "FAILED"
    assert bad["error"] == f"rank 0: ValueError: {BAD}"  # the task's exception, not submitit's wrapper
    assert md_bad["error"] == bad["error"]
    assert f"| rank 0: ValueError: {BAD} |" in proc.stdout  # the printed summary
    assert f"rank 0: ValueError: {BAD}" in proc.stderr
    assert bad["metrics"] == bad["loss_curve"] == md_bad["loss_curve"] == ""  # it wrote none

    assert good["state"] == "COMPLETED" and good["error"] == ""
    assert good["world_size"] == bad["world_size"] == md_good["world_size"] == md_bad["world_size"] == "1"
    metrics = json.loads(Path(good["metrics"]).read_text())
    assert metrics["final_train_loss"] == float(good["final_loss"]) and metrics["world_size"] == 1
    assert Path(good["loss_curve"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(good["metrics"]).parent == Path(good["loss_curve"]).parent == sweep_dir / "0"
    assert (md_good["metrics"], md_good["loss_curve"]) == (good["metrics"], good["loss_curve"])
    assert good["loss_curve"] in proc.stdout
