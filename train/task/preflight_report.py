"""What the preflight check's figures mean: the verdict per node, the report a job writes, the per-node table and
the plan's cost estimate. Light (no torch): the launcher and the plan import it; train/task/preflight.py measures.

Bus bandwidth is nccl-tests' figure for an all-reduce of S bytes over n ranks taking t seconds:
busbw = S / t x 2(n-1)/n, in GB/s (1e9 bytes), so that it compares with the published tables.
"""
import json
import logging
from pathlib import Path

from common import files

GB = 1e9
FILE = "preflight.json"

log = logging.getLogger(__name__)


def busbw_GBps(nbytes: int, ranks: int, seconds: float) -> float:
    return nbytes / seconds * 2 * (ranks - 1) / ranks / GB


def pair_rounds(n: int) -> list:
    """Disjoint pairs of node ranks, in rounds, so that every node is paired with two neighbours when there are
    three nodes or more: a node slow with every partner is to blame, a pair slow only together is not identified."""
    if n < 2:
        return []
    rounds = [[(i, i + 1) for i in range(0, n - 1, 2)]]
    if n > 2:
        rounds.append([(i, i + 1) for i in range(1, n - 1, 2)])
        if n % 2:
            rounds.append([(n - 1, 0)])
        else:
            rounds[-1].append((n - 1, 0))
    return rounds


def _threshold(settings: dict, kind: str):
    expected = (settings.get("expected_busbw_GBps") or {}).get(kind)
    return None if expected is None else expected * settings["tolerance"]


def judge(nodes: list, devices: dict, node_checks: dict, intra: dict, pairs: list, job: dict | None,
          settings: dict) -> dict:
    """The verdict. nodes: names in node-rank order; devices: {node: [problems]}; node_checks: {node: {"ok", "rc",
    "output", "seconds"}} (absent: no node check); intra: {node: {"GBps"} or {"error"}}; pairs: [{"nodes": [a, b],
    "GBps" or "error"}]; job: the whole job's {"GBps"} or {"error"}, None on one rank.
    Returns {"ok", "bad": {node: [why]}, "rows": [...], "job": {...}, "unattributed": [...]}."""
    bad, unattributed = {n: [] for n in nodes}, []
    for n in nodes:
        bad[n] += [f"devices: {p}" for p in devices.get(n, [])]
        check = node_checks.get(n)
        if check and not check["ok"]:
            first = (check.get("output") or "").strip().splitlines()[:1]
            said = f"node check failed ({check['why']})" + (f": {first[0]}" if first else "")
            # a command that cannot be started (not there, not executable) is the job's setup, not this node's
            # fault: excluding the node would not help
            if check["why"] == "could not run":
                unattributed.append(f"{n}: {said}")
            else:
                bad[n].append(said)
        low = _threshold(settings, "intra")
        m = intra.get(n)
        if m and "error" in m:
            bad[n].append(f"intra-node all-reduce failed: {m['error']}")
        elif m and low is not None and m["GBps"] < low:
            bad[n].append(f"intra-node busbw {m['GBps']:.3g} GB/s < {low:.3g} (expected "
                          f"{settings['expected_busbw_GBps']['intra']} x tolerance {settings['tolerance']})")
    low = _threshold(settings, "inter")
    slow = [p for p in pairs if "error" in p or (low is not None and p["GBps"] < low)]
    fast = [p for p in pairs if p not in slow]
    with_fast = {n for p in fast for n in p["nodes"]}
    for p in slow:
        what = p["error"] if "error" in p else f"{p['GBps']:.3g} GB/s < {low:.3g}"
        # a node is to blame when it has no good pair while its partner has one elsewhere
        blamed = [(n, partner) for n, partner in zip(p["nodes"], p["nodes"][::-1])
                  if n not in with_fast and partner in with_fast]
        for n, partner in blamed:
            bad[n].append(f"inter-node busbw with {partner}: {what}")
        if not blamed:
            unattributed.append(f"pair {'+'.join(p['nodes'])}: {what} (no single node to blame)")
    job_low = _threshold(settings, "inter" if len(nodes) > 1 else "intra")
    if job and "error" in job:
        unattributed.append(f"whole-job all-reduce failed: {job['error']}")
    elif job and job_low is not None and job["GBps"] < job_low and not any(bad.values()):
        unattributed.append(f"whole-job busbw {job['GBps']:.3g} GB/s < {job_low:.3g}")
    rows = []
    for n in nodes:
        check = node_checks.get(n)
        best = [p["GBps"] for p in pairs if n in p["nodes"] and "GBps" in p]
        rows.append({
            "node": n,
            "devices": "; ".join(devices.get(n, [])) or "ok",
            "node_check": "-" if check is None else "ok" if check["ok"] else f"FAILED ({check['why']})",
            "intra_GBps": (intra.get(n) or {}).get("GBps"),
            "inter_GBps": max(best) if best else None,  # its best pair: a bad node has no good one
            "verdict": "bad: " + "; ".join(bad[n]) if bad[n] else "ok",
        })
    bad = {n: why for n, why in bad.items() if why}
    return {"ok": not bad and not unattributed, "bad": bad, "unattributed": unattributed, "rows": rows,
            "job": job, "expected_busbw_GBps": settings.get("expected_busbw_GBps"),
            "tolerance": settings["tolerance"]}


def _cell(v) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


def table(report: dict) -> str:
    """The per-node table `cluster.preflight.only=true` prints (markdown, one row per node)."""
    exp = report.get("expected_busbw_GBps") or {}
    cols = ("node", "devices", "node check", f"intra busbw GB/s (expected {_cell(exp.get('intra'))})",
            f"inter busbw GB/s (expected {_cell(exp.get('inter'))})", "verdict")
    keys = ("node", "devices", "node_check", "intra_GBps", "inter_GBps", "verdict")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_cell(r[k]).replace("|", "\\|") for k in keys) + " |" for r in report["rows"]]
    job = report.get("job") or {}
    if job:
        out.append(f"\nwhole job: {job.get('ranks', '?')} ranks, busbw "
                   + (f"{job['GBps']:.3g} GB/s" if "GBps" in job else f"failed: {job.get('error')}"))
    out += [f"not attributed to one node: {u}" for u in report.get("unattributed", [])]
    if "seconds" in report:
        out.append(f"preflight took {report['seconds']:.1f} s")
    return "\n".join(out)


def problem_lines(report: dict) -> list:
    return [f"{n}: {'; '.join(why)}" for n, why in report["bad"].items()] + list(report["unattributed"])


def _attempts(folder) -> list:
    """The starts <folder>/preflight.json records, oldest first; [] where there is no folder or file yet, or a
    file that cannot be read as such a list (a damaged one: the status shows nothing of it, the next start's
    report replaces it)."""
    attempts = files.read_json(Path(folder) / FILE) if folder else []
    return attempts if isinstance(attempts, list) and all(isinstance(a, dict) for a in attempts) else []


def append_report(folder, attempt: dict) -> Path:
    """Add this attempt to <folder>/preflight.json (a list: one entry per start of the job, requeues included)."""
    path = Path(folder) / FILE
    attempts = _attempts(folder)
    if not attempts and path.exists():  # written with one report at least: damaged, yet no reason to stop the job
        log.warning("preflight: %s is not a list of reports (damaged?): this start's report replaces it", path)
    files.atomic_write(path, json.dumps([*attempts, attempt], indent=2, default=str).encode())
    return path


def latest(folder) -> str:
    """The newest start's verdict from <folder>/preflight.json, for the status: `ok, 2 node(s), whole job 3.1 GB/s`
    or `FAILED: <what>`, and the file; "" when the job has not checked yet."""
    attempts = _attempts(folder)
    if not attempts:
        return ""
    path = Path(folder) / FILE
    last, job = attempts[-1], attempts[-1].get("job") or {}
    busbw = f", whole job {job['GBps']:.3g} GB/s" if "GBps" in job else ""
    verdict = (f"ok, {len(last.get('rows', []))} node(s){busbw}" if last.get("ok") else
               "FAILED: " + "; ".join(problem_lines(last)))
    return f"{verdict} ({path})"


def exclusions(folder) -> str:
    """The nodes the point's job excluded and why, for the sweep summary: `vm (node check failed ...)`."""
    out = [f"{n} ({why[0]})" for a in _attempts(folder) for n, why in (a.get("excluded") or {}).items()]
    return "; ".join(out)


def estimate_seconds(settings: dict, nodes: int, tasks: int) -> float | None:
    """The all-reduces' time at the expected bus bandwidths (warm-up included): within each node, two or three
    rounds of node pairs, the whole job. None when the preset names no figures. The node check and the
    communicators' set-up come on top."""
    exp = settings.get("expected_busbw_GBps") or {}
    nbytes, iters = settings["bytes"], settings["iters"] + 1

    def one(ranks, kind):
        bw = exp.get(kind)
        if ranks < 2:
            return 0.0
        return None if not bw else nbytes * 2 * (ranks - 1) / ranks / (bw * GB) * iters

    parts = [one(tasks, "intra")] + [one(2 * tasks, "inter") for _ in pair_rounds(nodes)]
    parts.append(one(nodes * tasks, "inter" if nodes > 1 else "intra"))
    return None if any(p is None for p in parts) else sum(parts)
