"""A checkpoint is what was written, or it is not resumed from; a run that cannot be right stops.

Manifests: when a checkpoint is complete, `<checkpoint>.manifest.json` beside it lists every file of it with its
size and xxh3-64 hash, written last and atomically, and carries the run's record (identity.json's content: its
name, settings and training data), so what a checkpoint is travels with it. Each rank hashes the files it wrote
itself (its own `__{rank}_0.distcp`, still in its page cache; rank 0 the rest), so a 128-rank checkpoint is hashed
in parallel. On resume the same split verifies the newest checkpoint against its manifest before the trainer loads
it (train/task/main.py): a flipped block, a truncated or replaced file is named and the checkpoint set aside.

Content: torch writes every record of a checkpoint as a zip archive whose members carry their CRC-32 (the one
`.pt` file; in a sharded folder each item that `.metadata` indexes, at its offset in its `.distcp` file), and
torch.load never checks them. A checkpoint is checked against those CRCs before its manifest is written (a
manifest only ever certifies a checkpoint whose bytes are what torch wrote) and whenever it has no manifest (a
kill between its last file and its manifest, a copy without `*.manifest.json`): one that fails is set aside.

Stops: a non-finite training loss (all ranks see the same all-reduced loss, so all stop together, before the
step's checkpoint), and non-finite weights at a checkpoint, checked just before it is written, so the newest
checkpoint is always the last finite one.
"""
import json
import logging
import time
from pathlib import Path

from common.errors import UserError

log = logging.getLogger(__name__)

SUFFIX = ".manifest.json"
HASH = "xxh3_64"
_CHUNK = 8 << 20


class RunStopped(UserError):
    """A run that cannot go on rightly: it stops, non-zero, naming what and where."""


def diverged(key: str, problem: str, fix: str, bad_from: int | None = None, also: str = "") -> RunStopped:
    """The stop of a run whose numbers went bad (a non-finite loss, weights or evaluation, a divergence): the task
    replaces its fix with the command that continues it from its last good checkpoint (train/task/continuation.py:
    offered). bad_from: the first batch whose checkpoint holds bad weights (a divergence's rise, a final evaluation's
    checkpoint), None where every checkpoint written is good; also: other fixes kept beside that command."""
    err = RunStopped(key, problem, fix)
    err.went_bad, err.bad_from, err.also = True, bad_from, also
    return err


# The fix of a stop where the command to run is not known (the task says it where it is)
CONTINUE = ("continue it from its last good checkpoint as a new run under a lower optimizer.lr (or a longer "
            "scheduler.t_warmup): continue_from=<this run>@ba<N> (docs/resume.md)")


def manifest_path(ckpt) -> Path:
    ckpt = Path(ckpt)
    return ckpt.parent / f"{ckpt.name}{SUFFIX}"


def files_of(ckpt) -> list[str]:
    """The files of a checkpoint, relative to its folder: the one file, or every file of a sharded folder."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return [ckpt.name]
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())


def owner(name: str, world: int) -> int:
    """Which rank hashes a file: the rank that wrote a `__{rank}_0.distcp` shard, rank 0 the rest."""
    if name.startswith("__") and "_" in name[2:]:
        head = name[2:].split("_", 1)[0]
        if head.isdigit():
            return int(head) % world
    return 0


def _base(ckpt: Path) -> Path:
    return ckpt if ckpt.is_dir() else ckpt.parent


def hash_files(ckpt, names) -> dict:
    """{name: {"bytes", "xxh3_64"}} of these files of the checkpoint."""
    import xxhash

    base, out = _base(Path(ckpt)), {}
    for name in names:
        h, size = xxhash.xxh3_64(), 0
        with open(base / name, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        out[name] = {"bytes": size, HASH: h.hexdigest()}
    return out


def write_manifest(ckpt, entries: dict | None = None, timestamp: dict | None = None, run: dict | None = None,
                   job: str | None = None) -> Path:
    """entries: hash_files' of every file of the checkpoint (None: hashed here, in this one process).
    timestamp: where the checkpoint stands ({batch, sample, token, epoch}, and `before`: the same at the start of the
    batch that ended at it), as the trainer counted when it wrote it; a checkpoint hashed later has none.
    run: the record of the run that wrote it (identity.json's content); by default the one in its folder.
    job: the job that trained it, as train/task/distributed.job_id names it (a requeue of a run that does not
    resume continues its own alone)."""
    from common.files import atomic_write
    from train.config.identity import read_record

    path = manifest_path(ckpt)
    entries = hash_files(ckpt, files_of(ckpt)) if entries is None else entries
    run = run or read_record(Path(ckpt).parent)
    atomic_write(path, json.dumps({"checkpoint": Path(ckpt).name, "hash": HASH, "written": time.time(),
                                   **({"timestamp": timestamp} if timestamp else {}),
                                   **({"run": run} if isinstance(run, dict) and run else {}),
                                   **({"job": job} if job else {}),
                                   "files": dict(sorted(entries.items()))}, indent=1).encode())
    return path


def run_of(ckpt) -> dict:
    """The record of the run that wrote this checkpoint, as its manifest carries it ({} where it has none)."""
    run = (read_manifest(ckpt) or {}).get("run")
    return run if isinstance(run, dict) else {}


_COUNTS = {"ba": "batch", "sp": "sample", "tok": "token", "ep": "epoch"}


def stands_at(ckpt, unit: str) -> tuple[int, int] | None:
    """Where the checkpoint stands in a duration's unit (ba, sp, tok, ep), as its manifest records it: (at the start of
    the batch that ended at it, at it); None where the manifest says nothing of it, or another unit."""
    stamp = (read_manifest(ckpt) or {}).get("timestamp")
    key = _COUNTS.get(unit)
    if not key or not isinstance(stamp, dict) or not isinstance(stamp.get("before"), dict):
        return None
    at = (stamp["before"].get(key), stamp.get(key))
    return at if all(isinstance(x, int) and not isinstance(x, bool) for x in at) else None


def read_manifest(ckpt) -> dict | None:
    path = manifest_path(ckpt)
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        manifest["files"].items()
        return manifest
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return {"files": {}, "unreadable": True}


def tidy(folder) -> None:
    """Remove manifests whose checkpoint composer's rotation deleted (save_num_checkpoints_to_keep)."""
    for m in Path(folder).glob(f"*{SUFFIX}"):
        if not (m.parent / m.name[: -len(SUFFIX)]).exists():
            m.unlink(missing_ok=True)


# ---- inside the trainer ----

def check_loss(loss, step: str) -> None:
    import math

    if loss is not None and not math.isfinite(loss):
        raise diverged("loss/train/total", f"the training loss is {loss} at {step}: the run stopped there, before "
                       "that step's checkpoint; its newest checkpoint is the last finite one",
                       f"check the data at that step; {CONTINUE}", also="check the data at that step")


def check_eval(values: dict, step: str, after_fit: bool, batch: int | None) -> None:
    """An evaluation with a metric that is not finite scored a diverged model, whatever the training loss said (a
    finite but huge one gives logits that overflow on the validation data): it stops the run, on every rank (the
    metrics are the same on each). Composer evaluates before it checkpoints a step, and after the fit's last
    checkpoint when the evaluation interval does not end there. The cross-entropy is looked at first; then the rest:
    llm-foundry's LanguagePerplexity is exp(cross-entropy), inf in float32 from a cross-entropy of 88.7 on, and a
    diverged run (lr=100) would otherwise end at perplexity inf, exit 0. `batch`: the one evaluated (`step` says it)."""
    import math

    # the cross-entropy first (sorted is stable: otherwise in the order the evaluation gave them)
    bad = sorted(((k, v) for k, v in values.items() if not math.isfinite(v)), key=lambda kv: not
                 kv[0].endswith("CrossEntropy"))
    if not bad:
        return
    key, v = bad[0]
    what = "cross-entropy" if key.endswith("CrossEntropy") else key.rsplit("/", 1)[-1]
    ce = next((x for k, x in values.items() if k.endswith("CrossEntropy")), None)
    why = f" (its cross-entropy is {ce:.6g}: exp() of it overflows)" if ce is not None and \
        key.endswith("Perplexity") else ""
    said = f"the {'final ' * after_fit}evaluation's {what} is {v} at {step}{why}: the model diverged; "
    if after_fit:
        raise diverged(key, said + "the run's final checkpoint holds these weights", CONTINUE, bad_from=batch)
    raise diverged(key, said + "the run stopped there, before that step's checkpoint", CONTINUE)


def differs(ckpt, manifest: dict | None, world: int = 1, rank: int = 0) -> str | None:
    """How this rank's share of the checkpoint (owner) differs from its manifest or, without one, from the CRCs
    torch wrote into it; None where it does not."""
    return share_differs(ckpt, manifest, world, rank) if manifest is not None else content_differs(ckpt, world, rank)


def differs_on_any_rank(ckpt: Path, manifest: dict | None) -> list:
    """How the checkpoint differs (differs), every rank checking its own share of the files, every rank told every
    answer."""
    from composer.utils import dist

    mine = differs(ckpt, manifest, dist.get_world_size(), dist.get_global_rank())
    return [w for w in dist.all_gather_object(mine) if w]


def check_weights(state, step: str) -> None:
    """Every rank's shard of the weights finite, agreed by all ranks (one flag all-reduced), before a checkpoint."""
    import torch
    from composer.utils import dist

    def local(p):  # FSDP2's parameters are DTensors: this rank's shard, without a collective per parameter
        p = p.detach()
        return p.to_local() if hasattr(p, "to_local") else p

    bad = any(not torch.isfinite(t).all() for t in map(local, state.model.parameters()) if t.numel())
    flag = state.device.tensor_to_device(torch.tensor([1 if bad else 0], dtype=torch.int32))
    dist.all_reduce(flag, reduce_operation="MAX")
    if int(flag.item()):
        raise diverged("model", f"the weights are not finite at {step}, where a checkpoint was due: the run "
                       "stopped without writing it; its newest checkpoint is the last finite one", CONTINUE)


def manifest_collectively(ckpt: Path | None, world: int, rank: int, timestamp: dict | None = None) -> None:
    """Every rank checks the content of the files it owns of the checkpoint just written and hashes them; rank 0
    writes the manifest. A checkpoint whose bytes are not what torch wrote stops the run, on every rank, without a
    manifest (the next start sets it aside). ckpt: the checkpoint's path, known on rank 0 (None elsewhere);
    timestamp: as write_manifest takes it."""
    from composer.utils import dist

    from train.task.distributed import decided_on_rank_0

    told = decided_on_rank_0(lambda: None if ckpt is None else (str(ckpt), files_of(ckpt)))
    if told is None:
        return
    path, names = Path(told[0]), told[1]
    whys = [w for w in dist.all_gather_object(content_differs(path, world, rank)) if w]
    if whys:
        raise RunStopped("save_folder", f"the checkpoint just written is not what was written: {whys[0]}; no "
                         "manifest certifies it, and the next start sets it aside", "check the storage under "
                         "save_folder (a failing disk, a full or flaky file system), then run the same command "
                         "again: it resumes from the checkpoint before")
    mine = hash_files(path, [n for n in names if owner(n, world) == rank])
    gathered = dist.all_gather_object(mine)
    if rank == 0:
        from train.task.distributed import job_id

        entries = {k: v for part in gathered for k, v in part.items()}
        write_manifest(path, entries, timestamp, job=job_id())  # the form a requeue's filter compares (main.py)
        tidy(path.parent)


class _Slice:
    """A read-only view of bytes [start, start + length) of an open file, as zipfile reads an archive."""

    def __init__(self, f, start: int, length: int):
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = max(0, min(self.length, (0, self.pos, self.length)[whence] + offset))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def seekable(self) -> bool:
        return True


def _zip_differs(f, start: int, length: int) -> str | None:
    """Why the zip archive at [start, start + length) of f does not hold what was written, or None."""
    import zipfile

    try:
        with zipfile.ZipFile(_Slice(f, start, length)) as z:
            bad = z.testzip()
    except Exception as err:  # noqa: BLE001 -- a damaged header makes zipfile raise what it raises for an archive it
        # cannot read (NotImplementedError for a compression method, RuntimeError for the encryption flag), not a
        # traceback on one rank while the others wait for its answer
        return f"not a whole torch record ({type(err).__name__}: {err})"
    return None if bad is None else f"its record {bad} does not match its CRC-32"


def content_differs(ckpt, world: int = 1, rank: int = 0) -> str | None:
    """Why this rank's share of a checkpoint's bytes is not what torch wrote, by the CRC-32 of every record
    (module docstring), or None. The shares are integrity.owner's: the `.pt` file and `.metadata` rank 0's, each
    `__{r}_0.distcp` rank r's. Reads every byte of the share."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        if owner(ckpt.name, world) != rank:
            return None
        from train.checkpoint.head import ZIP_HEAD, head_problem

        try:
            with open(ckpt, "rb") as f:
                if f.read(len(ZIP_HEAD)) != ZIP_HEAD:  # torch's legacy format carries no CRCs: its structure is all
                    return None if (why := head_problem(ckpt)) is None else f"{ckpt}: {why}"  # there is to check
                why = _zip_differs(f, 0, ckpt.stat().st_size)
        except OSError as err:
            why = f"unreadable ({err.strerror})"
        return None if why is None else f"{ckpt}: {why} (damaged since torch wrote it)"
    from train.checkpoint.head import shard_items

    try:
        by_file = shard_items(ckpt)
    except Exception as err:  # noqa: BLE001 -- a cut-off or foreign pickle
        return f"{ckpt / '.metadata'} is unreadable ({type(err).__name__}: {err})" if rank == 0 else None
    for name in sorted(n for n in by_file if owner(n, world) == rank):
        path = ckpt / name
        try:
            with open(path, "rb") as f:
                for offset, length, transforms in by_file[name]:
                    if transforms:
                        return (f"{path}: its record at byte {offset} is stored transformed ({transforms}), which "
                                "this check cannot read")
                    why = _zip_differs(f, offset, length)
                    if why:
                        return f"{path}: at byte {offset}, {why} (damaged since torch wrote it)"
        except OSError as err:
            return f"{path} is unreadable ({err.strerror})"
    return None


def share_differs(ckpt, manifest: dict, world: int, rank: int) -> str | None:
    """Why this rank's share of the checkpoint's files does not match its manifest (sizes first, then content),
    or None. Rank 0 also checks that the manifest is readable and lists every file."""
    if manifest.get("unreadable"):
        return f"its manifest {manifest_path(ckpt)} is unreadable" if rank == 0 else None
    base = _base(Path(ckpt))
    mine = {n: e for n, e in manifest["files"].items() if owner(n, world) == rank}
    for name, entry in mine.items():
        path = base / name
        if not path.is_file():
            return f"{path} is missing (its manifest lists it)"
        if path.stat().st_size != entry["bytes"]:
            return f"{path} has {path.stat().st_size} bytes, its manifest says {entry['bytes']}"
    if rank == 0:  # a manifest of another checkpoint (copied or renamed beside this one) lists other files
        extra = set(files_of(ckpt)) - set(manifest["files"])
        if extra:
            return f"{base / sorted(extra)[0]} is not in its manifest"
    got = hash_files(ckpt, list(mine))
    for name, entry in mine.items():
        if got[name][HASH] != entry[HASH]:
            return (f"{base / name} does not match its manifest (xxh3-64 {got[name][HASH]}, written as "
                    f"{entry[HASH]}): its content changed after it was written")
    return None
