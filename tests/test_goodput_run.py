"""Goodput on a real run with a known loss (train/task/goodput.py): a one-point local sweep SIGKILLed five batches
or more after its checkpoint, as a node loss or a preemption would, then the same command again, which resumes
from that checkpoint and trains those batches a second time. Its metrics.json counts them as lost, its parts add
up to the allocated time of both starts, and the sweep's table, `python -m train.status` and the summary files
show it. The arithmetic alone, case by case, is in test_goodput.py."""
import csv
import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import kill_run, run, start

from train.task import goodput

pytestmark = pytest.mark.train

# a checkpoint and an evaluation at 20 and 40 only; a progress line (the ledger written with it) every 5 batches
CMD = ("-m", "train", "-m", "cluster.tasks_per_node=1", "max_duration=40ba", "save_interval=20ba",
       "eval_interval=20ba", "console_log_interval=5ba", "progress_bar=false")


def ledger(root: Path) -> list:
    found = list((root / "checkpoints").glob(f"*/{goodput.FILE}"))
    return json.loads(found[0].read_text())["segments"] if found else []


def newest_sweep(root: Path) -> Path:
    return max((root / "outputs" / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime)


def table_row(text: str, header_of: str) -> dict:
    """The table's point 0 as {column: cell}."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = next(line for line in lines if header_of in line)
    row = next(line for line in lines if line.startswith("| 0 |"))
    return dict(zip((c.strip() for c in header.strip("|").split("|")), (c.strip() for c in row.strip("|").split("|"))))


def test_a_run_killed_after_a_checkpoint_counts_the_batches_trained_again_as_lost(tmp_path, cli):
    proc = start(*CMD, root=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (ledger(tmp_path) and ledger(tmp_path)[-1]["batch"] >= 25):  # recorded with the progress line at 25
        assert proc.poll() is None and time.time() < deadline, "the run ended before batch 25"
        time.sleep(0.05)
    kill_run(proc, tmp_path)
    [killed] = ledger(tmp_path)
    [save] = (tmp_path / "checkpoints").iterdir()
    assert (save / "ep0-ba20-rank0.pt").is_file() and not (save / "ep0-ba40-rank0.pt").exists(), "killed too late"
    assert killed["batch"] >= 25 and not killed["finished"]
    # what the status showed of it while it ran: its goodput so far, from its progress.json
    so_far = json.loads((newest_sweep(tmp_path) / "0" / "progress.json").read_text())
    assert 0 < so_far["goodput"] < 1 and so_far["goodput_parts"]["starts"] == 1
    assert so_far["goodput_parts"]["retrained_batches"] == 0

    began = time.time()
    again = run(*CMD, root=tmp_path, check=True)
    wall = time.time() - began
    sweep = newest_sweep(tmp_path)
    [log] = sweep.rglob("*_0_log.err")
    assert "resuming from" in log.read_text() and "ep0-ba20" in log.read_text()
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert metrics["batches"] == 40
    first, second = ledger(tmp_path)
    assert first == killed and second["from_batch"] == 20 and second["finished"]
    [at_20] = [parts for batch, parts in first["checkpoints"] if batch == 20]

    parts = metrics["goodput_parts"]
    # the batches the killed start trained after its checkpoint were trained again: lost, with its other time since
    assert parts["retrained_batches"] == killed["batch"] - 20 >= 5
    assert parts["retrained_s"] == pytest.approx(first["parts"]["train"] - at_20["train"]) and parts["retrained_s"] > 0
    assert parts["lost_to_requeues_s"] == pytest.approx(sum(first["parts"].values()) - first["parts"]["train"]
                                                        - (sum(at_20.values()) - at_20["train"]))
    assert parts["lost_to_requeues_s"] > 0 and parts["lost_to_rollbacks_s"] == 0
    # every batch once: the first start's 1-20, the second's 21-40
    assert parts["trained_s"] == pytest.approx(at_20["train"] + second["parts"]["train"])
    assert parts["startup_s"] == pytest.approx(first["parts"]["startup"] + second["parts"]["startup"])
    assert parts["startup_s"] > 0 and parts["eval_s"] > 0 and parts["checkpoint_s"] > 0
    assert (parts["starts"], parts["rollbacks"], parts["since_batch"]) == (2, 0, 0)
    # the parts add up to the allocated time: both starts, each to its last record
    assert sum(parts[p] for p in goodput.PARTS) == pytest.approx(parts["allocated_s"], rel=1e-9)
    assert parts["allocated_s"] == pytest.approx(sum(s["ended"] - s["began"] for s in (first, second)), abs=5)
    assert metrics["goodput"] == pytest.approx(parts["trained_s"] / parts["allocated_s"])
    assert 0 < metrics["goodput"] < 1
    # the second start lies within the command that ran it (psutil's process start: to the second)
    assert wall / 2 < second["ended"] - second["began"] <= wall + 1

    # the sweep's table, the status command and the summary files
    assert table_row(again.stdout, "goodput")["goodput"] == f"{metrics['goodput']:.4g}"
    status = cli("train.status", str(sweep), check=True)
    assert table_row(status.stdout, "goodput")["goodput"] == f"{metrics['goodput']:.4g}"
    [row] = csv.DictReader((sweep / "summary.csv").open())
    assert float(row["goodput"]) == pytest.approx(metrics["goodput"])
    assert row["goodput_parts"] == goodput.said(parts)
    assert "retrained" in row["goodput_parts"] and f"({killed['batch'] - 20} retrained batches)" in row["goodput_parts"]


def test_a_sweep_folder_reused_by_another_run_counts_only_this_runs_time(tmp_path):
    """checkpoint=none keeps the ledger in the point's report folder: a sweep run again into the same folder
    (hydra.sweep.dir) by another run (another learning rate: another run name) starts its own ledger and its own
    count of starts, where the earlier run, stopped by a NaN, left its own (it counted that run's time as its
    retrained batches and lost to requeues, and 2 starts)."""
    sweep = tmp_path / "sweep"
    common = ("-m", "train", "-m", "cluster.tasks_per_node=1", "checkpoint=none", "console_log_interval=2ba",
              "progress_bar=false", f"hydra.sweep.dir={sweep}")
    run(*common, "max_duration=30ba", "optimizer.lr=1e6", root=tmp_path, check=1)  # a NaN at a few batches
    left = json.loads((sweep / "0" / goodput.FILE).read_text())
    assert len(left["segments"]) == 1 and not left["segments"][0]["finished"], left
    run(*common, "max_duration=8ba", "optimizer.lr=1e-3", root=tmp_path, check=True)
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    parts = metrics["goodput_parts"]
    assert parts["starts"] == 1 and parts["retrained_batches"] == 0 and not parts["lost_to_requeues_s"], parts
    assert json.loads((sweep / "0" / "progress.json").read_text())["starts"] == 1
    ledger = json.loads((sweep / "0" / goodput.FILE).read_text())
    assert ledger["run_name"] == metrics["run_name"] != left.get("run_name") and len(ledger["segments"]) == 1
