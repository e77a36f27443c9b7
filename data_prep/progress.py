"""Progress bar (bytes read, docs/s, tokens/s) and the end-of-run summary, printed and saved as JSON."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from data_prep.facts import SUMMARY_FILE
from data_prep.mds import atomic_write
from data_prep.part import MAX_EXAMPLES

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, total_bytes: int | None, label: str, enabled: bool):
        self.start = time.perf_counter()
        self.docs = self.tokens = 0
        self.bar = None
        if enabled and total_bytes != 0:
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
                            file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30, dynamic_ncols=True)

    def advance(self, raw_bytes: int, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{self.docs / elapsed:,.0f} docs/s, {self.tokens / elapsed / 1e6:.2f}M tokens/s",
                                     refresh=False)
            self.bar.update(raw_bytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _human(n: float) -> str:
    return f"{n:,.0f}"


def print_skipped(examples: list[list], total: int, shown: int = 20) -> None:
    for path, line, reason in examples[:shown]:
        log.warning(f"data_prep: skipped {path}:{line}: {reason}")
    if total > shown:
        log.warning(f"data_prep: ... {total - shown} more skipped lines (listed in {SUMMARY_FILE}, "
                    f"first {MAX_EXAMPLES})")


def summarize(split_dir: Path, totals: dict, facts: dict, run: dict) -> dict:
    """facts: what a training run checks before it starts (data_prep/facts.py reads them back)."""
    summary = {
        "dataset": str(split_dir),
        **facts,
        **{k: totals[k] for k in ("docs", "tokens", "samples", "shards", "skipped_lines", "tokens_in_samples",
                                  "dropped_tail_tokens", "skipped_by_reason")},
        "this_run": run,
        "skipped_examples": totals["skipped_examples"],
    }
    atomic_write(split_dir / SUMMARY_FILE, (json.dumps(summary, indent=1) + "\n").encode())
    return summary


def print_summary(summary: dict, out=None) -> None:
    out = out or sys.stdout  # read when called: the stdout of that moment
    run = summary["this_run"]
    rows = [
        ("dataset", summary["dataset"]),
        ("documents", _human(summary["docs"])),
        ("tokens", f"{_human(summary['tokens'])} ({_human(summary['dropped_tail_tokens'])} in the dropped tail)"),
        ("samples", _human(summary["samples"])),
        ("shards", _human(summary["shards"])),
        ("skipped lines", _human(summary["skipped_lines"])
         + (f"  {summary['skipped_by_reason']}" if summary["skipped_lines"] else "")),
        ("this run" if run.get("part") is None else f"this run (part {run['part']}/{run['num_parts']})",
         f"{_human(run['tokens'])} tokens tokenized in {run['wall_seconds']:.1f} s wall "
                     f"= {run['tokens_per_second'] / 1e6:.2f}M tokens/s, {run['docs_per_second']:,.0f} docs/s "
                     f"({run['blocks_done']} blocks done, {run['blocks_skipped']} already complete)"),
    ]
    if run.get("encoder"):
        rows.append(("encoder", run["encoder"]))
    width = max(len(k) for k, _ in rows)
    print("data_prep summary", file=out)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}", file=out)
