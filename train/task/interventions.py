"""A run's record of its loss spikes and what was done about each (train/task/spike.py), kept in its save folder
(`spike.json`) across its starts, and read by its reports (train/task/run_report.py: metrics.json, progress.json).

Light: no torch."""
import json
from pathlib import Path

from common import files
from common.paths import is_remote

FILE = "spike.json"


def read(folder) -> list:
    """The run's interventions, oldest first ([] where none, or the folder is not local)."""
    if not folder or is_remote(folder):
        return []
    record = files.read_json(Path(str(folder)) / FILE) or {}
    return list(record.get("interventions") or [])


def rollbacks(found: list) -> list:
    """The rollbacks among a run's interventions, oldest first."""
    return [i for i in found if i.get("action") == "rollback"]


def diverging_from(folder) -> int | None:
    """The batch from which the run's checkpoints hold diverging weights: where its newest intervention is a stop
    (train/task/spike.py), the batch its loss began to rise at; its checkpoints from there on were left in place.
    None where the run did not stop so (a rollback sets such checkpoints aside)."""
    found = read(folder)
    last = found[-1] if found else {}
    return int(last["since"]) if last.get("action") == "stop" and isinstance(last.get("since"), int) else None


def write(folder, interventions: list) -> None:
    files.atomic_write(Path(str(folder)) / FILE, json.dumps({"interventions": interventions}, indent=1).encode())


def shown(folder) -> list:
    """As the reports show them: without the record's bookkeeping."""
    return [{k: v for k, v in i.items() if k not in ("pending", "time", "exports")} for i in read(folder)]
