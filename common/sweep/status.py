"""Where every point of a sweep stands, from its folder alone: what `python -m train.status` and
`python -m data_prep.status` print, and the summary files.

At submission the launcher leaves `sweep.json` in the sweep folder: the app that describes the points (a SweepApp,
contract.py: train/launch/sweep_app.py, data_prep/sweep_app.py) and each point's job (none for a point whose run had
already finished: its row shows what that run left). This asks Slurm for the jobs' states (sacct,
one query for all, through submitit), reads what the points' jobs write (the app's columns: files, not logs) and
(re)writes summary.md / summary.csv, replaced whole. The same rows come from the waiting launcher, from this
command, and from the sweep's summary job (`--dependency=afterany` on every point), which writes them once the
last point has ended whether or not anyone follows the sweep. Light: no torch, no llm-foundry.
"""
import argparse
import csv
import io
import json
import logging
import os
import sys
import time
from pathlib import Path

from common import files
from common.errors import UserError
from common.sweep.outcomes import (
    RUNNING,
    SLURM_ENDS,
    WAITING,
    ended,
    final_state,
    first_failure,
    local_alive,
    markdown,
    pending_reasons,
    rank_errors,
    rank_outcomes,
    slurm_requeues,
)

MANIFEST = "sweep.json"
UNSURE = "UNKNOWN"  # a point whose state this command cannot tell (a local sweep's point, seen from another machine)
# a row's states that have not ended (outcomes.ended); a row shows a job Slurm does not know yet as PENDING
GOING = tuple(state for state in (*WAITING, *RUNNING) if state != UNSURE)


def write_manifest(sweep_dir: Path, app: str, points: list, shared: list, summary_job: str | None = None) -> None:
    """points: dicts with num, overrides (the point's own), job_id, scheduler (slurm | local), folder (submitit's,
    with %j), tasks, and the app's own fields (its `record` hook)."""
    body = {"app": app, "points": points, "shared": shared, "summary_job": summary_job, "submitted": time.time()}
    files.atomic_write(sweep_dir / MANIFEST, json.dumps(body, indent=1).encode())


def load(sweep_dir: Path) -> dict:
    """The sweep's manifest, or a UserError naming what the path is instead (a file, a folder of something else, a
    sweep.json cut short or not the launcher's)."""
    fix = "pass the folder the submission printed"
    if not sweep_dir.is_dir():
        raise UserError("sweep", f"{sweep_dir} " + ("is a file, not a sweep folder" if sweep_dir.exists() else
                        "does not exist"), fix)
    path = sweep_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError("sweep", f"{sweep_dir} holds no {MANIFEST}: not a sweep folder", fix) from None
    except (OSError, ValueError) as err:  # a folder named sweep.json, no read access, not JSON (cut short)
        raise UserError("sweep", f"{path} cannot be read as the JSON the launcher writes ("
                        f"{' '.join(str(err).split())}): cut short, or not the launcher's", fix) from None
    why = _not_a_manifest(manifest)
    if why:
        raise UserError("sweep", f"{path} {why}: not a manifest the launcher wrote", fix)
    return manifest


def _not_a_manifest(manifest) -> str | None:
    """What a sweep.json lacks of what the launcher writes (write_manifest), or None."""
    if not isinstance(manifest, dict):
        return f"holds a JSON {type(manifest).__name__}, not an object"
    for key, kind in (("app", str), ("points", list), ("shared", list)):
        if not isinstance(manifest.get(key), kind):
            return f"has no {key!r} ({kind.__name__})"
    for num, point in enumerate(manifest["points"]):
        if not isinstance(point, dict):
            return f"has point {num} as a JSON {type(point).__name__}, not an object"
        needed = ("num", "overrides", "job_id") + (("scheduler", "folder", "tasks") if point.get("job_id") else ())
        lacking = [k for k in needed if k not in point]
        if lacking:
            return f"has point {num} without {', '.join(map(repr, lacking))}"
    said = logging.getLogger("hydra.utils")  # (get_class logs the failure too, before raising it)
    level = said.level
    said.setLevel(logging.CRITICAL + 1)
    try:
        app_of(manifest)
    except Exception as err:  # noqa: BLE001 -- an app that cannot be imported or is not a SweepApp
        return f"names an app this checkout cannot load, {manifest['app']!r} ({' '.join(str(err).split())[:200]})"
    finally:
        said.setLevel(level)
    return None


def app_of(manifest: dict):
    from common.sweep.contract import load_app

    return load_app(manifest["app"])


def jobs(manifest: dict) -> list:
    """submitit's job objects for the points, from their ids: the surface the launcher's own jobs have (None for
    a point that was not submitted: its run had finished before)."""
    import submitit

    out = []
    for p in manifest["points"]:
        if p.get("job_id") is None:
            out.append(None)
            continue
        kind = submitit.SlurmJob if p["scheduler"] == "slurm" else submitit.LocalJob
        out.append(kind(folder=p["folder"], job_id=str(p["job_id"]), tasks=tuple(range(int(p["tasks"])))))
    return out


def rows(manifest: dict, point_jobs: list, wait_s: float = 0, all_ended: bool = False) -> list:
    """One row per point: Slurm's state, the app's columns, and for an ended point that failed, each failed
    rank's own error (outcomes.py), the one that failed first first. all_ended: known to have ended (the
    summary job runs after every point), whatever Slurm's accounting says or whether it can be asked at all
    (a container without a Slurm client)."""
    import socket

    app = app_of(manifest)
    # how many times Slurm requeued each point's job, from its accounting (one query): what the app's requeues
    # column shows (the app falls back on what the job's rank 0 recorded, where Slurm cannot be asked)
    requeues = slurm_requeues([p["job_id"] for p, job in zip(manifest["points"], point_jobs)
                               if job is not None and p["scheduler"] == "slurm"])
    out = []
    for p, job in zip(manifest["points"], point_jobs):
        error, local = "", job is not None and p["scheduler"] == "local"
        here = not local or p.get("host") in (None, socket.gethostname())
        alive = local_alive(job) if local and here and not all_ended else None  # outcomes.ended's answer, asked once
        gone = job is not None and not Path(str(job.paths.folder)).is_dir()
        log = Path(str(job.task(0).paths.stderr)) if job is not None else "(finished earlier: nothing submitted)"
        if job is None:  # finished before this sweep: nothing was submitted
            state = "COMPLETED"
        elif gone:  # its ranks' results and logs were deleted: no result would read as FAILED, a finished run too
            state = f"{UNSURE} (its job folder {job.paths.folder} is gone)"
        elif not here or (local and not all_ended and alive is None):
            # a local point's processes are on the machine that ran the sweep (their ids mean nothing elsewhere),
            # or not ours to inspect: neither running nor ended can be said (the summary files are not rewritten)
            where = f"on {p['host']}" if not here else "its process cannot be inspected"
            state = f"{UNSURE} ({where})"
        elif all_ended or (alive is False if local else ended(job, p["scheduler"])):
            ranks = rank_outcomes(job, wait_s=wait_s)
            bad = [r for r in ranks if not r.ok]
            state = "COMPLETED" if not bad else final_state(job)
            if bad and state not in SLURM_ENDS and (any(r.outcome for r in ranks) or state == "UNKNOWN"):
                state = "FAILED"  # a rank raised; Slurm's own state is kept where it says more (TIMEOUT, ...)
            first = first_failure(bad) if bad else ranks[0]
            error = rank_errors(bad, first)
            log = first.log
        elif local:  # its controller runs (submitit's own state says so only in the process that started it)
            state = "RUNNING"
        else:
            state = job.state.upper()
            state = "PENDING" if state == "UNKNOWN" else state  # not in Slurm's accounting yet
        seen = {**p, "slurm_requeues": requeues.get(str(p["job_id"]))}  # None: not asked, or not known to Slurm
        out.append({"point": p["num"], "overrides": " ".join(p["overrides"]), "job_id": p["job_id"], "state": state,
                    **app.columns(seen, state), "log": str(log), "error": error[:1000]})
    # why a pending point waits (a point stuck on PartitionConfig would look queued forever): one squeue call
    waiting = [r for r, p in zip(out, manifest["points"]) if r["state"] == "PENDING" and p["scheduler"] == "slurm"]
    reasons = pending_reasons([r["job_id"] for r in waiting])
    for r in waiting:
        if reasons.get(str(r["job_id"])) not in (None, "", "None"):
            r["state"] = f"PENDING ({reasons[str(r['job_id'])]})"
    return out


def write_summary(sweep_dir: Path, manifest: dict, table_rows: list) -> str:
    """summary.md and summary.csv, each replaced whole; returns the markdown: the app's heading, the overrides
    every point shares (once), the table."""
    heading = app_of(manifest).heading(manifest)
    shared = manifest["shared"]
    text = (f"{heading}\n\n" if heading else "") + \
           (f"shared by every point: {' '.join(shared)}\n\n" if shared else "") + markdown(table_rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(table_rows[0]))
    writer.writeheader()
    writer.writerows(table_rows)
    for name, data in (("summary.md", text), ("summary.csv", out.getvalue())):
        try:
            files.atomic_write(sweep_dir / name, data.encode())
        except files.DiskFull as err:  # write what can be written; the table and each rank's error still show
            logging.getLogger("sweep").error(f"[sweep] {err} (`python -m train.status {sweep_dir}` writes it again)")
    return text


def console(manifest: dict, table_rows: list) -> str:
    """What a terminal shows: the app's heading and its columns (its `shown`), those of `shown_where_set` only
    where a point has one."""
    app = app_of(manifest)
    shown = [k for k in app.shown if k not in app.shown_where_set or any(r.get(k) for r in table_rows)]
    heading = app.heading(manifest)
    return (f"{heading}\n" if heading else "") + markdown([{k: r[k] for k in shown} for r in table_rows])


def summarise(sweep_dir: str) -> str:
    """The sweep's summary job: runs once every point has ended (afterany) and writes the summary files."""
    sweep_dir = Path(sweep_dir)
    manifest = load(sweep_dir)
    return write_summary(sweep_dir, manifest, rows(manifest, jobs(manifest), wait_s=15, all_ended=True))


def main(prog: str, latest, argv=None) -> int:
    """`prog [SWEEP_FOLDER] [--watch [SECONDS]]`; latest(): the newest sweep folder, when none is given.
    Exits 1 once a point has ended without completing, 2 when there is no such sweep."""
    parser = argparse.ArgumentParser(prog=prog, description="Where every point of a sweep stands; (re)writes "
                                     "its summary.md and summary.csv.")
    parser.add_argument("sweep", nargs="?", help="the sweep folder (default: the newest)")
    parser.add_argument("--watch", nargs="?", type=float, const=30.0, metavar="SECONDS",
                        help="refresh every SECONDS (30) until every point has ended")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        sweep_dir = Path(args.sweep) if args.sweep else latest()
        manifest = load(sweep_dir)
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    # what the training command (train/__main__.py) and its jobs write with: the summary files this rewrites are
    # not world-readable, whatever the shell's umask
    os.umask(os.umask(0o027) | 0o027)
    point_jobs = jobs(manifest)
    while True:
        table_rows = rows(manifest, point_jobs)
        unsure = [r for r in table_rows if r["state"].startswith(UNSURE)]
        if unsure:  # a table that guessed would replace a right one: the files stay as they are
            logging.getLogger("sweep").warning(
                f"the state of point{'s' * (len(unsure) > 1)} {', '.join(str(r['point']) for r in unsure)} cannot "
                f"be told here: summary.md and summary.csv are left as they were")
        else:
            write_summary(sweep_dir, manifest, table_rows)
        print(f"{sweep_dir} ({time.strftime('%H:%M:%S')}; every column: summary.md, summary.csv)\n"
              f"{console(manifest, table_rows)}", flush=True)
        states = [r["state"].split(" ")[0] for r in table_rows]  # "PENDING (Resources)": pending
        if args.watch is None or not any(state in GOING for state in states):
            return int(any(state not in (*GOING, "COMPLETED") for state in states))
        time.sleep(args.watch)


def newest(folder: Path) -> Path:
    """The newest sweep folder under `folder` (one level down), for `latest`."""
    found = sorted(folder.glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise UserError("sweep", f"no sweep under {folder}", "pass the sweep folder the submission printed")
    return found[-1].parent
