"""Where a run resumes from, decided by content before the trainer starts.

composer's autoresume follows one symbolic link (`latest-rank0.pt` / `latest-sharded-rank0`) that it removes
and creates again at every save. A kill at the wrong moment leaves no link (the run would start from batch 0 and
overwrite every checkpoint), a link to the previous checkpoint beside a newer complete one, or a half-written
newest checkpoint (refused, or unreadable). So the task looks at the files instead: the newest *complete*
checkpoint in the save folder is the one to resume from; incomplete newer ones are moved to `set-aside/` with
a warning naming them (never deleted); and when the newest complete checkpoint is in the other format than this
world size reads (llm-foundry drops FSDP at one rank, so a sharded checkpoint must become one file there, and
the other way round), it is converted beside itself first. The trainer is then given that path as `load_path`.

Only global rank 0 looks and moves files; the other ranks wait for its answer (train/task/main.py).
"""
import fcntl
import logging
import os
import pickle
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from train.checkpoint.head import ZIP_HEAD, head_problem
from train.checks.core import ConfigError, Problem

log = logging.getLogger(__name__)

# composer's default names: llm-foundry's save_filename `ep{epoch}-ba{batch}-rank{rank}.pt` (monolithic, rank 0
# writes it) and composer's sharded prefix `ep{epoch}-ba{batch}/` (one `__{rank}_0.distcp` per rank + `.metadata`).
_NAME = re.compile(r"^ep(\d+)-ba(\d+)(-rank0\.pt)?$")
SET_ASIDE = "set-aside"
_PARTIAL = ".partial-"  # conversions are written under a hidden name, then renamed into place


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    epoch: int
    batch: int
    sharded: bool

    @property
    def stem(self) -> str:
        return f"ep{self.epoch}-ba{self.batch}"


def batch_of(path) -> int | None:
    """The batch a checkpoint's name says (ep0-ba20, ep0-ba20-rank0.pt), None for a name of the user's."""
    m = _NAME.match(Path(str(path)).name)
    return int(m[2]) if m else None


def holding_checkpoint(path) -> Path | None:
    """The checkpoint folder `path` is inside (or is), or None: a file added there fails that checkpoint's manifest,
    and every later resume and export sets it aside."""
    for folder in [Path(path), *Path(path).resolve().parents]:
        if (folder / ".metadata").is_file() or (batch_of(folder.name) is not None and folder.is_dir()):
            return folder
    return None


def goes_on(cfg, job: str | None = None) -> bool:
    """Whether a start of this run goes on from the checkpoints in its save folder, which this tool then chooses
    among and verifies: those of composer's default names (`save_filename`, `save_latest_filename` unset), with
    autoresume, or as a requeued job (`job`: its id; with autoresume=false it continues what its own job trained).
    Otherwise composer decides (its `latest` link), or the run starts at batch 0. cfg: ours or llm-foundry's."""
    named = not cfg.get("save_filename") and not cfg.get("save_latest_filename")
    return named and bool(cfg.get("autoresume") or job is not None)


def find(folder) -> list[Checkpoint]:
    """Every checkpoint in `folder` named as composer names them, oldest first."""
    folder = Path(folder)
    found = []
    if folder.is_dir():
        for p in folder.iterdir():
            m = _NAME.match(p.name)
            if m and not p.is_symlink():
                found.append(Checkpoint(p, int(m[1]), int(m[2]), sharded=m[3] is None))
    return sorted(found, key=lambda c: (c.batch, c.epoch, c.sharded))


def run_record(folder) -> dict:
    """What the run of a save folder is: its identity.json, else the record its newest checkpoint carries (the
    folder copied without identity.json); {} where neither says."""
    from train.checkpoint.integrity import run_of
    from train.config.identity import read_record

    record = read_record(folder)
    if isinstance(record, dict) and isinstance(record.get("identity"), dict):
        return record
    for ckpt in newest_first(folder):
        if carried := run_of(ckpt.path):
            return carried
    return {}


def problem(ckpt: Checkpoint) -> str | None:
    """Why this checkpoint cannot be loaded, or None when it is complete: head_problem, then what only torch can
    tell (a `.metadata` whose classes this torch has)."""
    p = ckpt.path
    if not ckpt.sharded and not p.is_file():
        return "not a file"
    if ckpt.sharded and not p.is_dir():
        return "no .metadata: not a sharded checkpoint, or its sharded write did not finish"
    why = head_problem(p)
    if why or not ckpt.sharded:
        return why
    try:
        with open(p / ".metadata", "rb") as f:
            pickle.load(f)
    except Exception as err:  # noqa: BLE001 -- torch's classes missing or changed: named, not a traceback
        return f".metadata unreadable by this torch ({type(err).__name__}: {str(err)[:200]})"
    return None


def set_aside(ckpt: Checkpoint, why: str, what: str = "checkpoint") -> Path:
    """Move a checkpoint that cannot be loaded out of composer's way, keeping it for inspection (what="export": a
    run's Hugging Face folder, out of the way of sample and evaluate, train/hf_model.py)."""
    dest_dir = ckpt.path.parent / SET_ASIDE
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / f"{ckpt.path.name}.{time.strftime('%Y%m%d-%H%M%S')}"
    while dest.exists():
        dest = dest.with_name(dest.name + "_")
    os.replace(ckpt.path, dest)
    from train.checkpoint.integrity import manifest_path

    if manifest_path(ckpt.path).is_file():  # its manifest goes with it
        os.replace(manifest_path(ckpt.path), manifest_path(dest))
    log.warning("%s %s cannot be %s: %s. Moved to %s (kept, not deleted); looking at the previous one.", what,
                ckpt.path, "resumed from" if what == "checkpoint" else "used", why, dest)
    return dest


def consolidate(src: Path, out: Path) -> Path:
    """A sharded checkpoint folder -> one monolithic file composer loads at any world size (written atomically),
    with its manifest: a file damaged later is refused by name wherever it is read (train/checkpoint/integrity.py)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    tmp = out.parent / f"{_PARTIAL}{out.name}"
    dcp_to_torch_save(str(src), str(tmp))
    os.replace(tmp, out)
    return _with_manifest(out, src)


def shard(src: Path, out: Path) -> Path:
    """A monolithic checkpoint file -> a sharded checkpoint folder (written under a hidden name, then renamed)."""
    from torch.distributed.checkpoint.format_utils import torch_save_to_dcp

    tmp = out.parent / f"{_PARTIAL}{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    torch_save_to_dcp(str(src), str(tmp))
    os.replace(tmp, out)
    return _with_manifest(out, src)


def _with_manifest(ckpt: Path, src: Path) -> Path:
    """ckpt's manifest, with where the checkpoint it was converted from stands and the run it carries (the same
    training state), once its bytes are what torch wrote."""
    from train.checkpoint import integrity

    why = integrity.content_differs(ckpt)
    if why:
        raise integrity.RunStopped("save_folder", f"the conversion of {src} is not what was written: {why}",
                                   f"check the storage under {ckpt.parent}, then run the same command again")
    stamp, job = ((integrity.read_manifest(src) or {}).get(k) for k in ("timestamp", "job"))
    integrity.write_manifest(ckpt, None, stamp, integrity.run_of(src) or None, job)
    return ckpt


def unreadable(ckpt: Checkpoint) -> str | None:
    """Why one process cannot read this checkpoint as it was written (export, consolidate, a load_path):
    incomplete by its structure, or a file that does not match its manifest, or, where it has none, a record
    whose bytes do not match their CRC-32 (train/checkpoint/integrity.py)."""
    from train.checkpoint import integrity

    return problem(ckpt) or integrity.differs(ckpt.path, integrity.read_manifest(ckpt.path))


def read_state(path: Path, keys: set) -> dict:
    """What a checkpoint holds under `keys` (`state.model`, `state.integrations`) and whatever a file holds beside
    them: from a sharded folder those entries alone (torch's own reader, whatever the number of ranks that wrote
    it), from a file the pickle, its tensors mapped, not read, where torch can map them (its zip format; the
    legacy one, which composer loads too, is read whole)."""
    import torch

    from common.compat import torch_dcp_read_keys

    if path.is_dir():
        return torch_dcp_read_keys(keys, checkpoint_id=str(path))
    with open(path, "rb") as f:
        zipped = f.read(len(ZIP_HEAD)) == ZIP_HEAD
    return torch.load(path, map_location="cpu", mmap=zipped, weights_only=False)


def stored_model(path: Path) -> dict | None:
    """The model a checkpoint holds, as identity keys (`model.d_model`, `model.attn_config.alibi`, ...): composer
    stores the model's Hugging Face config in every checkpoint (state.integrations.huggingface), as built and
    without the keys left at MPT's defaults. Read alone (read_state). None where there is none (not an llm-foundry
    model's checkpoint)."""
    try:
        state = read_state(path, {"state.integrations"})["state"]
        content = state["integrations"]["huggingface"]["model"]["config"]["content"]
    except (KeyError, TypeError):
        return None
    if not isinstance(content, dict):
        return None
    if content.get("model_type") != "mpt":  # a Hugging Face architecture's (hf_causal_lm): its config's attributes,
        from train.config import hf_arch  # compared with the run's config_overrides where both name one

        if content.get("model_type") not in hf_arch.MIRRORS:
            return None
        return {"model.name": hf_arch.NAME, **{f"model.config_overrides.{k}": v for k, v in content.items()}}
    return {**model_keys(content), "model.name": "mpt_causal_lm"}


def model_keys(model: dict, prefix: str = "model") -> dict:
    """A model config as identity keys, as train/config/identity.py flattens it: `model.<key>`, into its sections
    at any depth (`model.attn_config.alibi`, `model.ffn_config.ffn_act_fn.name`)."""
    flat = {}
    for key, val in model.items():
        if isinstance(val, dict) and val:
            flat.update(model_keys(val, f"{prefix}.{key}"))
        else:
            flat[f"{prefix}.{key}"] = val
    return flat


def newest_first(folder, reads_sharded: bool | None = None) -> list[Checkpoint]:
    """The checkpoints of `folder`, newest first; at equal batch, the format this run reads (`reads_sharded`) first:
    the order in which a run takes its own checkpoints and a continue_from= another run's."""
    return sorted(find(folder), key=lambda c: (c.batch, c.sharded == reads_sharded))[::-1]


def differs_everywhere(ckpt: Checkpoint) -> list:
    """Why `ckpt` must not be loaded, on every rank ([] where it may): its structure (problem, rank 0's look), else
    its content against its manifest or, without one, the CRCs torch wrote into it (each rank checking its share).
    A load_path=, a continue_from= and a rollback's checkpoint are verified so, as a resume verifies its own."""
    from train.checkpoint import integrity
    from train.task.distributed import decided_on_rank_0

    why = decided_on_rank_0(problem, ckpt)
    return [why] if why else integrity.differs_on_any_rank(ckpt.path, integrity.read_manifest(ckpt.path))


def newest_complete(folder, reads_sharded: bool | None = None, tidy: bool = False,
                    verify: bool = False, job: str | None = None) -> Checkpoint | None:
    """The newest complete checkpoint. At equal batch, the format this run reads (`reads_sharded`) comes first.

    `tidy` (only for the run that owns the folder, about to write into it): newer incomplete checkpoints are set
    aside and a cut-off conversion is removed. A reader beside a live run must not: the newest folder may be
    one the run is writing right now. `verify` (a reader in one process: export, consolidate): a checkpoint with
    a manifest must match it (train/checkpoint/integrity.py); one that does not is skipped with a warning naming the file.
    `job`: only the checkpoints that Slurm job trained, as their manifests record it (the others are left as they are).
    """
    folder = Path(folder)
    if tidy and folder.is_dir():
        for leftover in folder.glob(f"{_PARTIAL}*"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    order = newest_first(folder, reads_sharded)
    if job is not None:
        from train.checkpoint.integrity import read_manifest

        order = [c for c in order if (read_manifest(c.path) or {}).get("job") == job]
    for ckpt in order:
        why = unreadable(ckpt) if verify else problem(ckpt)
        if why is None:
            return ckpt
        if tidy:
            set_aside(ckpt, why)
        else:
            log.warning("skipping %s: %s", ckpt.path, why)
    return None


def at_path(path: Path, reads_sharded: bool | None = None, any_file: bool = False):
    """(the checkpoint `path` names, why it cannot be read or None) for a reader in one process (export,
    consolidate): a checkpoint named by its path is verified too (never read damaged weights); `any_file`: so is a
    file of the user's naming (`train.consolidate --out`: its batch unknown, -1); a save folder gives its newest
    checkpoint that verifies (nothing is moved: a run may be writing). (None, None): none there."""
    [ckpt] = [c for c in find(path.parent) if c.path == path] or [None]
    if ckpt is None and any_file and path.is_file():
        ckpt = Checkpoint(path, epoch=-1, batch=-1, sharded=False)
    if ckpt is None:
        return newest_complete(path, reads_sharded, verify=True), None
    return ckpt, unreadable(ckpt)


def in_format(ckpt: Checkpoint, reads_sharded: bool, into: Path | None = None) -> str:
    """The path this run loads to continue from `ckpt`, in the format it reads: converted beside it (with a
    manifest of its own, train/checkpoint/integrity.py) when it is in the other one; into `into` instead where given
    (another run's checkpoint, continue_from=: its folder is only read)."""
    if ckpt.sharded == reads_sharded:
        return str(ckpt.path)
    into = Path(into) if into is not None else ckpt.path.parent
    if ckpt.sharded:
        out = into / f"{ckpt.stem}-rank0.pt"
        log.warning("resuming %s at one rank (no FSDP): consolidating its shards into %s first", ckpt.path, out)
        consolidate(ckpt.path, out)
    else:
        out = into / ckpt.stem
        log.warning("resuming %s with sharded checkpoints: converting it into %s first", ckpt.path, out)
        shard(ckpt.path, out)
    return str(out)


class FolderInUse(ConfigError):
    """Another live run holds this save folder."""


def in_use(folder, who: str) -> Problem:
    """The problem of a save folder another run is writing, found before a run starts or when it claims it."""
    return Problem("save_folder", f"{folder} is in use by another run ({who}): two runs writing one folder would "
                   "overwrite each other's checkpoints", "let that run end (or cancel it) first, or give this run "
                   "another run_name")


_held = {}  # folder -> open lock file: the lock lives as long as this process (a crash releases it)


def holder(folder) -> str | None:
    """Who holds `folder`'s claim now (the holder line claim wrote), or None; takes nothing and creates nothing."""
    try:
        f = open(Path(folder) / ".lock", "r+")
    except OSError:
        return None
    with f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            return f.read().strip() or "another process"
        except OSError:
            return None
        fcntl.lockf(f, fcntl.LOCK_UN)
    return None


def claim(folder) -> None:
    """One run writes a save folder at a time: two would overwrite each other's checkpoints. A POSIX record
    lock on `<folder>/.lock` (as data_prep's), released by the kernel when the holding process ends however it
    ends (SIGKILL, a job killed at its time limit, a requeue), so no stale lock is ever left to clear by hand;
    unlike flock it is not inherited by the dataloader workers, which may outlive a killed rank briefly."""
    folder = Path(folder)
    if str(folder) in _held:
        return
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / ".lock", "a+")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held by another process
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise FolderInUse(problems=[in_use(folder, holder)]) from None
    except OSError as err:  # a filesystem without locks: run unguarded rather than not at all
        log.warning("cannot lock %s (%s): nothing stops a second run from writing into it", folder, err)
        f.close()
        return
    f.seek(0)
    f.truncate()
    from train.task.distributed import job_id

    job = job_id()
    f.write(f"host {socket.gethostname()}, pid {os.getpid()}" + (f", job {job}" if job else "") +
            f", since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    _held[str(folder)] = f
