"""A run that reached its end, and the number a sweep reports for it.

At the end of a run (trained to max_duration, or found already there) rank 0 writes `<save_folder>/finished.json`:
the max_duration reached, where its report is, and its final metrics. A sweep run again reads it before
submitting a point: a point whose run already finished is not submitted (no allocation, no preflight), and the
sweep reports that run's numbers. A run continued to a longer max_duration (`run_name=` of it) is not finished
until it gets there. Light: json and OmegaConf only.
"""
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import files
from common.paths import is_remote

FILE = "finished.json"
DEFAULT_OBJECTIVE = "eval/LanguageCrossEntropy"
TRAIN_LOSS = "loss/train/total"  # composer's name of the training loss: the last logged value
_HISTORIES = ("train_loss", "eval")  # kept in metrics.json only


def _folder(save_folder) -> Path | None:
    """The save folder when it is on a file system here (an object store URI is not read)."""
    return Path(save_folder) if save_folder and not is_remote(save_folder) else None


def write(save_folder, max_duration, report: Path, metrics: dict, batch: int | None = None) -> None:
    """batch: the batch the run ended at (what its max_duration came to, at the batch sizes it trained with)."""
    folder = _folder(save_folder)
    if folder is None or not folder.is_dir():
        return
    body = {"max_duration": str(max_duration), "report": str(report), **({"batch": batch} if batch else {}),
            "metrics": {k: v for k, v in metrics.items() if k not in _HISTORIES}}
    files.cosmetic_write(folder / FILE, json.dumps(body, indent=1).encode())


def read(cfg: DictConfig, verify: bool = False) -> dict | None:
    """The finished run of this config ({where, report, value}: value as the task returns it), or None: it has
    not reached this max_duration (or keeps no checkpoint folder here, or is a preflight-only job). verify (a sweep
    deciding not to submit it): its final checkpoint must still be what was written (read whole: a plan only
    lists it)."""
    if OmegaConf.select(cfg, "cluster.preflight.only", default=False):
        return None
    from train.config.identity import same_time

    folder = _folder(OmegaConf.select(cfg, "save_folder"))
    body = _body(folder)
    if (body is None or not same_time(body.get("max_duration"), str(cfg.max_duration))
            or not _kept(folder, body, cfg, verify)):
        return None
    return {"where": str(folder / FILE), "report": body.get("report"), "value": body.get("metrics") or {}}


def _kept(folder: Path, body: dict, cfg: DictConfig, verify: bool = False) -> bool:
    """Whether the checkpoint the run finished at is still there, and the run's end (ended_at_checkpoint): with it
    deleted by hand, the plain command trains the batches since the one before, so a sweep must submit the point
    too (else it would say "finished earlier" while the run's newest export is the checkpoint before's); written
    again since by a start stopped before its end, the same (it said "finished earlier" with the deleted
    training's objective). verify: and still what was written (its
    manifest, else its CRCs): a damaged one is submitted, and the task sets it aside and trains its last batches
    again. Checkpoints named otherwise than composer's default (save_filename, save_latest_filename) or not
    resumed from (autoresume=false) are not this tool's to list, as the task does not choose among them
    (train/task/main.py): their finished.json is taken as it stands."""
    import logging

    from train.checkpoint.resume import find, goes_on, unreadable

    if not goes_on(cfg):
        return True
    batch = ended_at_checkpoint(folder, cfg)
    if batch is None:
        return False
    final = [c for c in find(folder) if c.batch == batch]
    if verify:
        why = unreadable(final[-1])
        if why:
            logging.getLogger("sweep").warning(
                f"[sweep] {cfg.run_name} finished earlier, but its final checkpoint {final[-1].path} is no longer "
                f"what was written ({why}): submitted again, it sets that checkpoint aside and trains the batches "
                "since the one before")
            return False
    return True


def last(save_folder) -> dict | None:
    """The run's finished.json ({max_duration, report, batch, metrics}), whatever max_duration it finished at."""
    return _body(_folder(save_folder))


def ended_at(save_folder) -> int | None:
    """The batch the run of this save folder last finished at, where its finished.json says (one written
    without it says nothing), else None."""
    body = _body(_folder(save_folder))
    batch = body.get("batch") if body else None
    return batch if isinstance(batch, int) and not isinstance(batch, bool) else None


def ended_at_checkpoint(folder: Path, cfg) -> int | None:
    """The batch of the checkpoint the run of this save folder ended at, or None where it ended at none here: its
    finished.json records the batch (one without: its max_duration, in batches at `cfg`'s batch sizes) and a
    checkpoint of that batch is here, and it was not written before every checkpoint of that batch. One written
    before is of an earlier training that ended there (its checkpoint deleted by hand to go back, then a later start
    stopped after writing it again, before its end): resuming from it, or reporting it finished, would give the
    earlier training's numbers for this one. The checkpoints' own files are compared, not their manifests (a later
    start writes one for a checkpoint without), and the oldest format of the batch (a conversion written beside it
    since is of the same checkpoint). The one test of a run's end, for the task's choice of where to resume and
    for a sweep's of what to submit."""
    from train.checkpoint.resume import find
    from train.checks.core import batches_in

    body, folder = _body(folder), Path(folder)
    batch = ended_at(folder)
    if batch is None and body:
        batch = batches_in(cfg, str(body.get("max_duration")).strip())
    try:
        written = (folder / FILE).stat().st_mtime
        times = [c.path.stat().st_mtime for c in find(folder) if c.batch == batch]
    except OSError:
        return None
    return batch if times and not written < min(times) else None


def _body(folder: Path | None) -> dict | None:
    if folder is None:
        return None
    try:
        body = json.loads((folder / FILE).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def objective(cfg: DictConfig, metrics) -> float:
    """The metric `objective` names, from the run's final metrics: an evaluation metric (`eval/<metric>`, the
    last evaluation's) or `loss/train/total` (the last logged training loss)."""
    name = OmegaConf.select(cfg, "objective") or DEFAULT_OBJECTIVE
    if OmegaConf.select(cfg, "cluster.preflight.only", default=False):
        raise ValueError(f"objective={name}: a preflight-only job trains nothing")
    if not isinstance(metrics, dict):
        raise ValueError(f"objective={name}: the point reported no metrics (a preflight-only job trains nothing)")
    from train.checks.core import batches_in

    # a run trained on past this point's max_duration (run_name= with a longer one) reports its numbers there: the
    # score of a longer training than the point asked for
    end, trained = batches_in(cfg, OmegaConf.select(cfg, "max_duration")), metrics.get("batches")
    if isinstance(end, int) and isinstance(trained, int) and trained != end:
        raise ValueError(f"objective={name}: the run's numbers are of batch {trained}, and this point's max_duration="
                         f"{OmegaConf.select(cfg, 'max_duration')} ends at batch {end} (its run was trained on past "
                         "it): the score of another training than the point's")
    found = metrics.get("final_train_loss") if name == TRAIN_LOSS else (metrics.get("final_eval") or {}).get(name)
    if found is None:
        have = [TRAIN_LOSS, *(metrics.get("final_eval") or {})]
        raise ValueError(f"objective={name}: the run reported no such metric (it has: {', '.join(have)})")
    return float(found)
