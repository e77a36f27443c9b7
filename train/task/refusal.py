"""What a plain run has written when its task refuses it, and taking that back: a refused run writes nothing.

The checks refuse a config before Hydra writes anything (train/checks/gate.py). A few refusals can only come from
the task: a shard whose bytes are not the ones its index.json records (hashing every shard is the job's work,
spread over its ranks: train/task/shards.py), a mount missing on the node, a resume on other data. By then Hydra
has written the run folder's `.hydra/` and opened the run's log, and the run holds its save folder. So the gate,
once every check passed, calls `hold`: it notes what of these exists, then claims the save folder
(train/checkpoint/resume.py), so that a second run of the same name is refused at its own gate, before its Hydra
writes into this run's folder (it would write into the first run's `.hydra/` and log, and be refused only when
its task claims the folder). A task that refuses calls `take_back` first: what this process made is removed, the run
folder's earlier files are as they were (its `.hydra/` files' bytes, its log's length). Light: no torch."""
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from common.paths import is_remote


@dataclass
class Noted:
    run_dir: Path  # Hydra's run folder: `.hydra/` and the log
    run_folders: list = field(default_factory=list)  # run_dir and those above it that did not exist (deepest first)
    paths: set = field(default_factory=set)  # everything under run_dir, as it was
    kept: dict = field(default_factory=dict)  # run_dir's small files Hydra rewrites: their bytes
    log: Path | None = None
    log_size: int = 0
    new_folders: list = field(default_factory=list)  # the folders the claim made (deepest first)
    lock: Path | None = None  # the save folder's .lock, when the claim made it
    claimed: bool = False  # no other run of this name can be writing run_dir meanwhile


_noted: Noted | None = None


def _missing(folder: Path) -> list:
    found = []
    while not folder.exists() and folder != folder.parent:
        found.append(folder)
        folder = folder.parent
    return found


def note(run_dir: Path, subdir: str | None, log: Path | None, save_folder: Path | None) -> Noted:
    """What exists now (before Hydra writes) of what a start writes before its task can refuse it."""
    n = Noted(run_dir, _missing(run_dir), log=log)
    if run_dir.is_dir():
        n.paths = {run_dir, *run_dir.rglob("*")}
        hydra_files = (run_dir / subdir).glob("*") if subdir else ()
        n.kept = {p: p.read_bytes() for p in hydra_files if p.is_file()}
    if log is not None and log.is_file():
        n.log_size = log.stat().st_size
    if save_folder is not None:
        n.new_folders = _missing(save_folder)
        n.lock = None if (save_folder / ".lock").exists() else save_folder / ".lock"
    return n


def hold(config, cfg) -> list:
    """At the gate of a plain run whose checks passed: note, then claim the save folder (the task's own claim is
    then this one). The problems of a claim another run took since the checks; [] otherwise. A rank other than 0
    of a launch that starts several plain runs leaves both to rank 0, as the task does."""
    global _noted
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return []
    from train.checkpoint import resume

    run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute()
    subdir = OmegaConf.select(config, "hydra.output_subdir")
    name = OmegaConf.select(config, "hydra.job.name")
    folder = OmegaConf.select(cfg, "save_folder")
    claims = bool(folder) and not is_remote(folder) and not OmegaConf.select(cfg, "cluster.preflight.only")
    _noted = note(run_dir, subdir, run_dir / f"{name}.log" if name else None, Path(str(folder)) if claims else None)
    if claims:
        try:
            resume.claim(folder)
        except resume.FolderInUse as err:
            _noted = None
            return err.problems
        _noted.claimed = True
    return []


def take_back() -> None:
    """Before a task's refusal: remove what this process made since `hold`, put back what it changed. Nothing
    where `hold` did not run (a sweep's job, a rank other than 0)."""
    global _noted
    n, _noted = _noted, None
    if n is None:
        return
    _close_logs_in(n.run_dir)
    if n.run_dir.is_dir():
        made = sorted((p for p in n.run_dir.rglob("*") if p not in n.paths), key=lambda p: len(p.parts), reverse=True)
        for path in made:
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError:  # not empty: something this process did not make
                pass
    for path, data in n.kept.items():
        path.write_bytes(data)
    if n.claimed and n.log is not None and n.log in n.paths and n.log.is_file():
        # (without a save folder to claim, a run of this name may be writing it too: its lines are kept)
        os.truncate(n.log, n.log_size)
    if n.lock is not None:  # the process ends now, releasing the claim; its file goes first
        n.lock.unlink(missing_ok=True)
    for folders in (n.run_folders, n.new_folders):
        for folder in folders:
            try:
                folder.rmdir()
            except OSError:  # not empty (another run's), or not there
                break


def _close_logs_in(folder: Path) -> None:
    """The run's log file handlers (Hydra's job logging) closed and taken off: nothing more is written there."""
    for logger in [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                          if isinstance(lg, logging.Logger))]:
        for handler in list(logger.handlers):
            path = getattr(handler, "baseFilename", None)
            if path and Path(path).is_relative_to(folder):
                logger.removeHandler(handler)
                handler.close()
