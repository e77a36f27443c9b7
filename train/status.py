"""`python -m train.status [SWEEP_FOLDER] [--watch [SECONDS]]`: where every point of a sweep stands, from anywhere.

A sweep on Slurm submits and returns (hydra_plugins/pretrain_launcher/): it leaves `sweep.json` in its folder, the
points and their jobs. This reads that, asks Slurm for each job's state (sacct, one query for all), and reads what
each point's rank 0 writes as it trains (`progress.json`, then `metrics.json`: train/run_report.py), so it reads
files, not logs. It prints one row per point and (re)writes summary.md / summary.csv: the same rows the waiting
launcher writes, and the sweep's summary job (submitted after every point, `--dependency=afterany`) writes when
the last point ends, whether or not anyone runs this. Light: no torch, no llm-foundry.
"""
import argparse
import csv
import io
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from common import files
from common.errors import UserError

log = logging.getLogger("sweep")

MANIFEST = "sweep.json"
GOING = ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED")


def write_manifest(sweep_dir: Path, points: list, shared: list, summary_job: str | None = None) -> None:
    """points: dicts with num, overrides (the point's own), job_id, scheduler (slurm | local), folder (submitit's,
    with %j), tasks, world_size, checkpoint, report (the run's output folder)."""
    body = {"points": points, "shared": shared, "summary_job": summary_job, "submitted": time.time()}
    files.atomic_write(sweep_dir / MANIFEST, json.dumps(body, indent=1).encode())


def load(sweep_dir: Path) -> dict:
    try:
        return json.loads((sweep_dir / MANIFEST).read_text())
    except FileNotFoundError:
        raise UserError("sweep", f"{sweep_dir} holds no {MANIFEST}: not a sweep folder",
                        "pass the folder the submission printed (under <output_root>/sweeps/)") from None


def latest(root: Path) -> Path:
    found = sorted((root / "sweeps").glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise UserError("sweep", f"no sweep under {root / 'sweeps'}",
                        "pass the sweep folder the submission printed, or set PRETRAIN_ROOT as it was then")
    return found[-1].parent


def jobs(manifest: dict) -> list:
    """submitit's job objects for the points, from their ids: the same surface the launcher's own jobs have."""
    import submitit

    out = []
    for p in manifest["points"]:
        kind = submitit.SlurmJob if p["scheduler"] == "slurm" else submitit.LocalJob
        out.append(kind(folder=p["folder"], job_id=str(p["job_id"]), tasks=tuple(range(int(p["tasks"])))))
    return out


def rows(manifest: dict, point_jobs: list, wait_s: float = 0) -> list:
    """One row per point: Slurm's state, what the point's files say, and for an ended point that failed, each
    failed rank's own error (hydra_plugins/pretrain_launcher/outcomes.py)."""
    from hydra_plugins.pretrain_launcher.outcomes import SLURM_ENDS, ended, final_state, rank_outcomes

    out = []
    for p, job in zip(manifest["points"], point_jobs):
        report = Path(p["report"])
        progress, metrics = _read(report / "progress.json"), _read(report / "metrics.json")
        error, excluded = "", _exclusions(report)
        if ended(job, p["scheduler"]):
            ranks = rank_outcomes(job, wait_s=wait_s)
            bad = [r for r in ranks if not r.ok]
            state = "COMPLETED" if not bad else final_state(job)
            if bad and state not in SLURM_ENDS and any(r.outcome for r in ranks):
                state = "FAILED"  # a rank raised; Slurm's own state is kept where it says more (TIMEOUT, ...)
            # the rank that failed first, then every failed rank's own error
            first = min(bad, key=lambda r: (r.outcome != "error", r.mtime, r.rank)) if bad else ranks[0]
            bad.sort(key=lambda r: r.rank != first.rank)
            error = "; ".join(f"rank {r.rank}: {r.error}" for r in bad)
            log_path = first.log
        else:
            state = job.state.upper()
            state = "PENDING" if state == "UNKNOWN" else state  # not in Slurm's accounting yet
            log_path = Path(str(job.task(0).paths.stderr))
        done = state == "COMPLETED"
        eta = progress.get("eta_s")
        out.append({
            "point": p["num"],
            "overrides": " ".join(p["overrides"]),
            "job_id": p["job_id"],
            "state": state,
            "requeues": max(0, int(progress.get("starts", 1)) - 1),
            "step": progress.get("progress") or ("" if "step" not in progress else f"step {progress['step']}"),
            "loss": progress.get("loss"),
            "final_loss": metrics.get("final_train_loss") if done else None,
            "eval_loss": (metrics.get("final_eval") or {}).get("eval/LanguageCrossEntropy") if done else None,
            "tokens_per_sec": metrics.get("tokens_per_sec") if done else progress.get("tokens_per_sec"),
            "mfu": progress.get("mfu"),
            "eta": "" if eta is None or done or state in SLURM_ENDS else str(timedelta(seconds=int(eta))),
            "world_size": p["world_size"],
            "checkpoint": p["checkpoint"],
            "metrics": _existing(report / "metrics.json"),
            "loss_curve": _existing(report / "loss_curve.png"),
            "log": str(log_path),
            "error": error[:1000],
            # nodes the job's preflight check excluded before it requeued itself (train/preflight.py)
            "excluded": excluded,
        })
    return out


def write_summary(sweep_dir: Path, shared: list, table_rows: list) -> str:
    """summary.md and summary.csv, each replaced whole; returns the markdown (the shared overrides, the table)."""
    from hydra_plugins.pretrain_launcher.outcomes import markdown

    text = (f"shared by every point: {' '.join(shared)}\n\n" if shared else "") + markdown(table_rows)
    files.atomic_write(sweep_dir / "summary.md", text.encode())
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(table_rows[0]))
    writer.writeheader()
    writer.writerows(table_rows)
    files.atomic_write(sweep_dir / "summary.csv", out.getvalue().encode())
    return text


# what a terminal shows; the files hold every column
SHOWN = ("point", "overrides", "job_id", "state", "requeues", "step", "loss", "tokens_per_sec", "mfu", "eta", "log",
         "error")


def console(table_rows: list) -> str:
    from hydra_plugins.pretrain_launcher.outcomes import markdown

    errors = any(r["error"] for r in table_rows)
    return markdown([{k: r[k] for k in SHOWN if k != "error" or errors} for r in table_rows])


def summarise(sweep_dir: str) -> str:
    """The sweep's summary job: runs once every point has ended (afterany), writes the summary files."""
    sweep_dir = Path(sweep_dir)
    manifest = load(sweep_dir)
    return write_summary(sweep_dir, manifest["shared"], rows(manifest, jobs(manifest), wait_s=15))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.status", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", nargs="?", help="the sweep folder (default: the newest under the output root)")
    parser.add_argument("--watch", nargs="?", type=float, const=30.0, metavar="SECONDS",
                        help="refresh every SECONDS (30) until every point has ended")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        sweep_dir = Path(args.sweep) if args.sweep else latest(_output_root())
        manifest = load(sweep_dir)
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    point_jobs = jobs(manifest)
    while True:
        table_rows = rows(manifest, point_jobs)
        write_summary(sweep_dir, manifest["shared"], table_rows)
        print(f"{sweep_dir} ({time.strftime('%H:%M:%S')}; every column: summary.md, summary.csv)\n"
              f"{console(table_rows)}", flush=True)
        going = [r for r in table_rows if r["state"] in GOING]
        if args.watch is None or not going:  # 1 once a point has ended without completing
            return int(any(r["state"] not in (*GOING, "COMPLETED") for r in table_rows))
        time.sleep(args.watch)


def _output_root() -> Path:
    """The local storage preset's output root (conf/storage/local.yaml), where sweeps are when no folder is given."""
    return Path(os.path.abspath(os.environ.get("PRETRAIN_ROOT", "runs"))) / "outputs"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _existing(path: Path) -> str:
    return str(path) if path.is_file() else ""


def _exclusions(report: Path) -> str:
    from train.preflight_report import exclusions

    return exclusions(str(report))


if __name__ == "__main__":
    sys.exit(main())
