"""The preflight check (train/task/preflight.py): its verdicts from figures, its settings refused before anything starts,
and real jobs on the loopback Slurm: the per-node table of both nodes, a bad node excluded and the job completed
on the other with the normal loss, on_fail=stop and the exclusion limit failing with the report."""
import csv
import json
import subprocess
from pathlib import Path

import pytest
from helpers import task_prolog_without_slurm

from train.task.preflight_report import (
    append_report,
    busbw_GBps,
    estimate_seconds,
    exclusions,
    judge,
    latest,
    pair_rounds,
    table,
)

SETTINGS = {"tolerance": 0.75, "expected_busbw_GBps": {"intra": 460.0, "inter": 375.0}, "bytes": 2**30, "iters": 10}


# ------------------------------------------------------------------------------------------- figures, verdicts


def test_bus_bandwidth_is_nccl_tests_figure():
    # AWS's published 2 x p5.48xlarge all_reduce_perf line: 1 GiB over 16 ranks in 4607.6 us -> busbw 436.95
    assert busbw_GBps(1073741824, 16, 4607.6e-6) == pytest.approx(436.95, abs=0.01)


def test_every_node_is_paired_with_two_neighbours_from_three_nodes_on():
    assert pair_rounds(1) == [] and pair_rounds(2) == [[(0, 1)]]
    for n in (3, 4, 5, 16):
        rounds = pair_rounds(n)
        for pairs in rounds:  # a round's pairs are disjoint: they run at once
            flat = [i for p in pairs for i in p]
            assert len(flat) == len(set(flat))
        for node in range(n):
            assert sum(node in p for pairs in rounds for p in pairs) >= 2


def _pairs(nodes, slow_node=None, fast=380.0, slow=90.0):
    return [{"nodes": [nodes[a], nodes[b]], "GBps": slow if slow_node in (nodes[a], nodes[b]) else fast}
            for pairs in pair_rounds(len(nodes)) for a, b in pairs]


def test_a_node_slow_with_every_partner_is_named_and_its_partners_are_not():
    nodes = ["n1", "n2", "n3", "n4"]
    intra = {n: {"GBps": 455.0} for n in nodes}
    report = judge(nodes, {}, {}, intra, _pairs(nodes, "n3"), {"GBps": 300.0, "ranks": 32}, SETTINGS)
    assert not report["ok"] and list(report["bad"]) == ["n3"]
    assert "inter-node busbw" in report["bad"]["n3"][0] and "< 281" in report["bad"]["n3"][0]
    rows = {r["node"]: r for r in report["rows"]}
    assert rows["n3"]["verdict"].startswith("bad: ") and rows["n1"]["verdict"] == "ok"
    assert rows["n3"]["inter_GBps"] == 90.0 and rows["n2"]["inter_GBps"] == 380.0  # its best pair
    assert "| n3 | ok | - | 455 | 90 | bad: " in table(report)


def test_node_check_devices_and_slow_nvlink_are_each_named():
    nodes = ["a", "b", "c"]
    checks = {"a": {"ok": True, "why": "exit 0", "output": ""},
              "b": {"ok": False, "why": "exit 1", "output": "ERROR: check_gpu_ecc: GPU 3 has 12 DBE errors\nmore"}}
    intra = {"a": {"GBps": 455.0}, "b": {"GBps": 450.0}, "c": {"GBps": 120.0}}
    devices = {"a": ["rank 2: cuda:2 has 3.1 of 79.6 GiB free (another process holds memory)"]}
    report = judge(nodes, devices, checks, intra, _pairs(nodes), None, SETTINGS)
    assert set(report["bad"]) == {"a", "b", "c"}
    assert report["bad"]["b"] == ["node check failed (exit 1): ERROR: check_gpu_ecc: GPU 3 has 12 DBE errors"]
    assert "devices: rank 2" in report["bad"]["a"][0] and "intra-node busbw 120" in report["bad"]["c"][0]
    assert [r["node_check"] for r in report["rows"]] == ["ok", "FAILED (exit 1)", "-"]


def test_a_node_check_that_cannot_be_started_blames_no_node():
    """A command missing from the image (or not executable) fails alike on every node: the job's setup, not the
    nodes' fault. Each node was excluded in turn (a requeue each) before the job stopped."""
    checks = {n: {"ok": False, "why": "could not run", "output": "[Errno 2] No such file or directory: 'nhc'"}
              for n in ("a", "b")}
    report = judge(["a", "b"], {}, checks, {}, [], None, SETTINGS)
    assert not report["ok"] and report["bad"] == {}  # nothing to exclude: the job stops instead
    assert report["unattributed"] == [f"{n}: node check failed (could not run): [Errno 2] No such file or "
                                      "directory: 'nhc'" for n in ("a", "b")]
    assert [r["node_check"] for r in report["rows"]] == ["FAILED (could not run)"] * 2


def test_a_slow_pair_of_two_nodes_is_reported_but_blames_neither():
    report = judge(["a", "b"], {}, {}, {}, [{"nodes": ["a", "b"], "GBps": 10.0}], {"GBps": 10.0}, SETTINGS)
    assert not report["ok"] and report["bad"] == {}  # nothing to exclude: the job stops instead
    assert report["unattributed"] == ["pair a+b: 10 GB/s < 281 (no single node to blame)",
                                      "whole-job busbw 10 GB/s < 281"]


def test_figures_without_expected_ones_are_reported_not_judged():
    s = {**SETTINGS, "expected_busbw_GBps": {"intra": None, "inter": None}}
    report = judge(["a"], {}, {}, {"a": {"GBps": 0.001}}, [], {"GBps": 0.001}, s)
    assert report["ok"] and estimate_seconds(s, 1, 8) is None


def test_the_report_file_keeps_every_start_and_a_damaged_one_neither_stops_a_job_nor_shows(tmp_path, caplog):
    """preflight.json, one report per start of the job: written whole (no temporary file left beside it), read
    alike by the status (the newest verdict) and the summary (every exclusion); a damaged file reads as no
    report there and is replaced, with a warning, by the next start's instead of failing that start."""
    folder = tmp_path / "outputs"
    assert latest(folder) == exclusions(folder) == latest(None) == exclusions(None) == ""  # not checked yet
    checks = {"n2": {"ok": False, "why": "exit 1", "output": "ERROR: GPU 3: 12 uncorrectable ECC errors"}}
    failed = judge(["n1", "n2"], {}, checks, {}, [], None, SETTINGS)
    healthy = judge(["n1", "n3"], {}, {}, {}, [], {"GBps": 400.0, "ranks": 16}, SETTINGS)
    path = append_report(folder, {**failed, "excluded": failed["bad"], "job_id": "4242_3", "restart": 0})
    assert append_report(folder, {**healthy, "job_id": "4242_3", "restart": 1}) == path
    assert [a["restart"] for a in json.loads(path.read_text())] == [0, 1]
    assert [p.name for p in folder.iterdir()] == ["preflight.json"]
    assert latest(folder) == f"ok, 2 node(s), whole job 400 GB/s ({path})"
    assert exclusions(folder) == "n2 (node check failed (exit 1): ERROR: GPU 3: 12 uncorrectable ECC errors)"
    for damaged in ('[{"ok": true, "rows"', '{"ok": true}'):  # cut short; not a list of reports
        path.write_text(damaged)
        assert latest(folder) == exclusions(folder) == ""
        caplog.clear()
        with caplog.at_level("WARNING", logger="train.task.preflight_report"):
            append_report(folder, {**failed, "excluded": failed["bad"]})
        assert f"{path} is not a list of reports" in caplog.text
        assert latest(folder).startswith("FAILED: n2: node check failed") and exclusions(folder).startswith("n2 (")
        assert len(json.loads(path.read_text())) == 1


# --------------------------------------------------------------------------------- checks, and looks run nothing


def test_bad_preflight_settings_are_refused_together_before_anything_is_written(tmp_path, cli):
    proc = cli("train", "-m", "cluster=slurm-local", "cluster.wait=true", "data=mock", "cluster.preflight.on_fail=later",
               "cluster.preflight.iters=0", "cluster.preflight.tolerance=1.5",
               "cluster.preflight.expected_busbw_GBps.inter=-3")
    assert proc.returncode == 2, proc.stderr
    for key in ("on_fail: 'later' is not requeue or stop", "iters: must be a positive whole number",
                "tolerance: must be a fraction", "expected_busbw_GBps.inter: must be a bus bandwidth"):
        assert f"error: [sweep point #0] cluster.preflight.{key}" in proc.stderr
    assert not any(tmp_path.iterdir())
    local = cli("train", "cluster.preflight.enabled=true", "cluster.preflight.on_fail=requeue")
    assert local.returncode == 2 and "requeue needs a Slurm job" in local.stderr


def test_a_plan_never_runs_the_node_check(tmp_path, cli):
    marker = tmp_path / "ran"
    script = tmp_path / "check.sh"
    script.write_text(f"#!/bin/bash\ntouch {marker}\n")
    script.chmod(0o755)
    proc = cli("train", "cluster=slurm-local", "data=mock", f"cluster.preflight.node_check={script}",
               "plan=true", root=tmp_path / "root")
    assert proc.returncode == 0, proc.stderr
    assert f"node check {script}" in proc.stdout and not marker.exists() and not (tmp_path / "root").exists()


def test_a_failed_check_alone_is_no_exit_0(tmp_path, cli):
    """cluster.preflight.only=true on this machine: a node check that fails prints the table and exits 1, naming
    what it found (it printed `bad: node check failed` and exited 0)."""
    proc = cli("train", "data=mock", "cluster.preflight.only=true", "cluster.preflight.node_check=/bin/false")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "| FAILED (exit 1) | - | - | bad: node check failed (exit 1) |" in proc.stdout, proc.stdout
    assert "error: cluster.preflight.only: the check failed: " in proc.stderr and "node check failed (exit 1)" in \
        proc.stderr, proc.stderr
    passed = cli("train", "data=mock", "cluster.preflight.only=true", "cluster.preflight.node_check=/bin/true")
    assert passed.returncode == 0 and "| ok | - | - | ok |" in passed.stdout, passed.stdout + passed.stderr[-2000:]


# ------------------------------------------------------------------------------------ real jobs on the loopback


def _summary(root: Path) -> list:
    [path] = (root / "outputs" / "sweeps").glob("*/summary.csv")
    return list(csv.DictReader(path.open()))


def _nodes() -> list:
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N"], capture_output=True, text=True, check=True)
    return sorted(set(out.stdout.split()))


def _job_field(job_id: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith(name + "=")), "")


def test_preflight_only_prints_the_table_of_both_nodes_with_real_bandwidths(slurm, tmp_path, cli):
    proc = cli("train", "-m", "cluster=slurm-local", "cluster.wait=true", "data=mock", "cluster.nodes=2", "cluster.preflight.only=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout[proc.stdout.index("preflight, point #0"):].splitlines()
    assert lines[1].startswith("| node | devices | node check | intra busbw GB/s (expected 0.04) |")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[3:5]]
    assert sorted(r[0] for r in rows) == _nodes()
    for _node, devices, check, intra, inter, verdict in rows:
        assert (devices, check, verdict) == ("ok", "-", "ok")
        assert float(intra) > 0.04 * 0.75 and float(inter) > 0.04 * 0.75  # measured over gloo, above the preset's
    assert "whole job: 4 ranks, busbw " in proc.stdout and "preflight took " in proc.stdout
    [row] = _summary(tmp_path)
    assert row["state"] == "COMPLETED" and row["final_loss"] == "" and row["excluded"] == ""
    log = Path(row["log"]).read_text()
    assert "preflight: 2 node(s), 4 ranks, ok in " in log and "Starting training" not in log
    [kept] = json.loads((Path(row["log"]).parents[2] / row["point"] / "preflight.json").read_text())
    assert kept["ok"] and sorted(r["node"] for r in kept["rows"]) == _nodes()  # the table, kept as a baseline


def test_preflight_only_submitted_and_returned_says_where_its_table_will_be_and_status_shows_the_verdict(
        slurm, tmp_path, cli):
    proc = cli("train", "-m", "cluster=slurm-local", "data=mock", "cluster.preflight.only=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [note] = [line for line in proc.stdout.splitlines() if line.startswith("[sweep] #0 preflight table: ")]
    report = Path(note.split("preflight table: ")[1].split()[0])
    sweep = Path(proc.stdout.split("\nsweep: ")[1].splitlines()[0])
    status = cli("train.status", str(sweep), "--watch", "2", timeout=300)
    assert status.returncode == 0, status.stderr[-2000:]
    last = status.stdout.split(f"{sweep} (")[-1]
    assert "ok, 1 node(s), whole job " in last and str(report) in last
    [kept] = json.loads(report.read_text())
    assert kept["ok"]


def test_preflight_only_that_fails_submitted_and_returned_is_a_failed_point_for_the_status(slurm, tmp_path, cli):
    """The job of a failed check alone fails (its summary row said COMPLETED and `train.status` exited 0)."""
    proc = cli("train", "-m", "cluster=slurm-local", "data=mock", "cluster.preflight.only=true",
               "cluster.preflight.node_check=/bin/false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = Path(proc.stdout.split("\nsweep: ")[1].splitlines()[0])
    status = cli("train.status", str(sweep), "--watch", "2", timeout=300)
    assert status.returncode == 1, status.stdout[-3000:] + status.stderr[-2000:]
    [row] = list(csv.DictReader((sweep / "summary.csv").open()))
    assert row["state"] == "FAILED" and "the check failed: " in row["error"], row
    assert "node check failed (exit 1)" in row["error"], row


def test_a_bad_node_is_excluded_and_the_job_completes_on_the_other_with_the_normal_loss(slurm, tmp_path, cli):
    # The node check fails on whichever node it first runs on (as NHC would on a node with ECC errors). Point 0
    # runs it; point 1, the same training without it, gives the normal loss (and holds the other node a while).
    marker = tmp_path / "bad-node"
    script = tmp_path / "node-check.sh"
    script.write_text(f'#!/bin/bash\n[ -s {marker} ] || echo "$SLURMD_NODENAME" > {marker}\n'
                      f'if [ "$(cat {marker})" = "$SLURMD_NODENAME" ]; then\n'
                      '  echo "ERROR: GPU 3: 12 uncorrectable ECC errors"; exit 1\nfi\necho ok\n')
    script.chmod(0o755)
    # the tasks have no Slurm client (as in a container image): the exclusion and the requeue run on the host
    prolog = task_prolog_without_slurm(tmp_path / "image")
    proc = cli("train", "-m", "cluster=slurm-local", "cluster.wait=true", "data=mock", "max_duration=6ba", "checkpoint=none",
               f"cluster.preflight.node_check={script},null", f'cluster.srun_extra=["--task-prolog={prolog}"]', root=tmp_path / "root")
    assert proc.returncode == 0, proc.stderr[-3000:]
    checked, plain = _summary(tmp_path / "root")
    bad = marker.read_text().strip()
    assert checked["state"] == plain["state"] == "COMPLETED"
    assert checked["excluded"] == f"{bad} (node check failed (exit 1): ERROR: GPU 3: 12 uncorrectable ECC errors)"
    assert plain["excluded"] == ""
    assert float(checked["final_loss"]) == pytest.approx(float(plain["final_loss"]), rel=1e-6)
    job = checked["job_id"]
    assert _job_field(job, "ExcNodeList") == bad and _job_field(job, "Restarts") == "1"
    used = subprocess.run(["sacct", "-n", "-X", "-o", "NodeList", "-j", job], capture_output=True, text=True)
    assert used.stdout.split()[0] == [n for n in _nodes() if n != bad][0]
    # every start leaves its report: the failed one that excluded the node, then the healthy one after the requeue
    attempt, healthy = json.loads((Path(checked["metrics"]).parent / "preflight.json").read_text())
    assert attempt["excluded"] == {bad: ["node check failed (exit 1): ERROR: GPU 3: 12 uncorrectable ECC errors"]}
    assert attempt["job_id"] == job and attempt["restart"] == 0
    assert healthy["ok"] and healthy["job_id"] == job and healthy["restart"] == 1 and not healthy.get("excluded")
    [baseline] = json.loads((Path(plain["metrics"]).parent / "preflight.json").read_text())
    assert baseline["ok"] and baseline["rows"]  # a healthy first start is recorded too
    log = Path(checked["log"]).read_text()
    assert f"preflight: excluding {bad} and requeuing job {job} from the host" in log
    assert log.count("preflight: 1 node(s), 2 ranks, ") == 2 and "ok in " in log
    out = Path(checked["log"].replace("_log.err", "_log.out")).read_text()
    assert out.count(f"requeued job {job} excluding {bad} (from the host)") == 1, out[-2000:]


def test_on_fail_stop_and_the_exclusion_limit_fail_the_job_with_the_report(slurm, tmp_path, cli):
    script = tmp_path / "node-check.sh"
    script.write_text('#!/bin/bash\necho "ERROR: mlx5_ib3: port down"\nexit 1\n')
    script.chmod(0o755)
    proc = cli("train", "-m", "cluster=slurm-local", "cluster.wait=true", "data=mock", "max_duration=6ba", "checkpoint=none",
               f"cluster.preflight.node_check={script}", "cluster.preflight.on_fail=stop,requeue",
               "cluster.preflight.max_exclusions=0", root=tmp_path / "root")
    assert proc.returncode == 1
    stop, limit = _summary(tmp_path / "root")
    for row, why in ((stop, "not requeued: cluster.preflight.on_fail=stop"),
                     (limit, "more than cluster.preflight.max_exclusions=0")):
        assert row["state"] == "FAILED" and row["excluded"] == ""
        assert row["error"].startswith("rank ") and ": train.task.preflight.PreflightFailed: preflight failed: " in row["error"]
        assert "node check failed (exit 1): ERROR: mlx5_ib3: port down" in row["error"] and why in row["error"]
        assert _job_field(row["job_id"], "Restarts") == "0" and _job_field(row["job_id"], "ExcNodeList") == "(null)"
        folder = Path(row["log"]).parents[2] / row["point"]
        [attempt] = json.loads((folder / "preflight.json").read_text())
        assert not attempt["ok"] and "excluded" not in attempt
        assert "Starting training" not in Path(row["log"]).read_text()
