"""A checkpoint is what was written, or it is not resumed from; a run that cannot be right stops.

Manifests: when a checkpoint is complete, `<checkpoint>.manifest.json` beside it lists every file of it with its
size and xxh3-64 hash, written last and atomically. Each rank hashes the files it wrote itself (its own
`__{rank}_0.distcp`, still in its page cache; rank 0 the rest), so a 128-rank checkpoint is hashed in parallel.
On resume the same split verifies the newest checkpoint against its manifest before the trainer loads it
(train/task/main.py): a flipped block, a truncated or replaced file is named and the checkpoint set aside.

A checkpoint without a manifest (written before manifests existed, or the run ended between its last file and
its manifest, after composer's `latest` link pointed at it) is resumed from on the structural checks of
train/checkpoint/resume.py, as before, and hashed then: losing a complete checkpoint to a kill at the wrong moment would
cost more than it protects.

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


def write_manifest(ckpt, entries: dict, timestamp: dict | None = None) -> Path:
    """timestamp: where the checkpoint stands ({batch, sample, token}, and `before`: the same at the start of the
    batch that ended at it), as the trainer counted when it wrote it; a checkpoint hashed later has none."""
    from common.files import atomic_write

    path = manifest_path(ckpt)
    atomic_write(path, json.dumps({"checkpoint": Path(ckpt).name, "hash": HASH, "written": time.time(),
                                   **({"timestamp": timestamp} if timestamp else {}),
                                   "files": dict(sorted(entries.items()))}, indent=1).encode())
    return path


_COUNTS = {"ba": "batch", "sp": "sample", "tok": "token"}


def stands_at(ckpt, unit: str) -> tuple[int, int] | None:
    """Where the checkpoint stands in a duration's unit (ba, sp, tok), as its manifest records it: (at the start of
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
        raise RunStopped("loss/train/total", f"the training loss is {loss} at {step}: the run stopped there, before "
                         "that step's checkpoint; its newest checkpoint is the last finite one",
                         "lower optimizer.lr (or lengthen scheduler.t_warmup), check the data at that step, then run "
                         "the same command again: it resumes from the newest checkpoint")


def check_eval(values: dict, step: str, after_fit: bool) -> None:
    """An evaluation whose cross-entropy is not finite scored a diverged model, whatever the training loss said (a
    finite but huge one gives logits that overflow on the validation data): it stops the run, on every rank (the
    metric is the same on each). Composer evaluates before it checkpoints a step, and after the fit's last
    checkpoint when the evaluation interval does not end there."""
    import math

    bad = [(k, v) for k, v in values.items() if k.endswith("CrossEntropy") and not math.isfinite(v)]
    if not bad:
        return
    key, v = bad[0]
    if after_fit:
        raise RunStopped(key, f"the final evaluation's cross-entropy is {v} at {step}: the model diverged; the run's "
                         "final checkpoint holds these weights", "lower optimizer.lr (or lengthen "
                         "scheduler.t_warmup) and train again under another run_name (or delete the checkpoints)")
    raise RunStopped(key, f"the evaluation's cross-entropy is {v} at {step}: the model diverged; the run stopped "
                     "there, before that step's checkpoint", "lower optimizer.lr (or lengthen scheduler.t_warmup), "
                     "then run the same command again: it resumes from the newest checkpoint")


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
        raise RunStopped("model", f"the weights are not finite at {step}, where a checkpoint was due: the run "
                         "stopped without writing it; its newest checkpoint is the last finite one",
                         "lower optimizer.lr (or lengthen scheduler.t_warmup), then run the same command again: it "
                         "resumes from the newest checkpoint")


def manifest_collectively(ckpt: Path | None, world: int, rank: int, timestamp: dict | None = None) -> None:
    """Every rank hashes the files it owns of the checkpoint just written; rank 0 writes the manifest. ckpt: the
    checkpoint's path, known on rank 0 (None elsewhere); timestamp: as write_manifest takes it."""
    from composer.utils import dist

    box = [(str(ckpt), files_of(ckpt)) if rank == 0 and ckpt is not None else None]
    dist.broadcast_object_list(box)
    if box[0] is None:
        return
    path, names = Path(box[0][0]), box[0][1]
    mine = hash_files(path, [n for n in names if owner(n, world) == rank])
    gathered = dist.all_gather_object(mine)
    if rank == 0:
        entries = {k: v for part in gathered for k, v in part.items()}
        write_manifest(path, entries, timestamp)
        tidy(path.parent)


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
