"""Writing so that a reader (another rank, a resumed run, a status command) never sees half a file or folder:
write under a hidden temporary name beside the target, then rename, which is atomic on one file system."""
import errno
import logging
import os
import shutil
import socket
from pathlib import Path

from common.errors import UserError


def temp_name(target) -> Path:
    """A hidden sibling of `target`, unique to this host and process (two writers never share one)."""
    target = Path(target)
    return target.parent / f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}"


def atomic_write(target, data: bytes) -> None:
    """Readers see the old file or the whole new one; the temporary file goes on failure too. A full file system
    is one clear error (DiskFull: the path, the bytes needed and free, the fix), not a bare OSError."""
    target = Path(target)
    tmp = temp_name(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if is_disk_full(err):
            raise DiskFull.at(target, len(data)) from None
        raise


def cosmetic_write(target, data: bytes) -> bool:
    """atomic_write for what a run shows but does not need (the loss curve, progress files): a failure (a full
    disk) is a warning, never the end of training. True if written."""
    try:
        atomic_write(target, data)
        return True
    except (OSError, DiskFull) as err:
        logging.getLogger(__name__).warning("could not write %s (%s); training goes on without it", target,
                                            err.problem if isinstance(err, DiskFull) else err)
        return False


_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(err: BaseException | None) -> bool:
    """Whether an error (or any error it was raised from) is a full file system or an exhausted quota."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def free_bytes(path) -> int | None:
    """Free bytes on the file system of `path` (or of its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class DiskFull(UserError):
    """A write that found its file system full: the path, what it needed and what is free, the fix."""

    @classmethod
    def at(cls, path, needed: int | None, what: str = "", fix: str = "") -> "DiskFull":
        free = free_bytes(path)
        need = f"{needed:,} bytes" if needed is not None else "more room"
        return cls(str(path), f"no space left on its file system writing {what or 'it'}: needs {need}, "
                   f"{'unknown' if free is None else f'{free:,} bytes'} free",
                   fix or "free space there (or raise the quota), or point the storage at a file system with room "
                   "(storage.root=...); nothing written before is lost")


def read_json(path, strict: bool = False) -> dict:
    """A JSON file another process replaces whole (atomic_write) as it goes: {} while it is not there yet. One there
    that cannot be read or parsed (damaged) reads as {} too for a reader that shows what it can (a status); with
    strict, it raises, for a reader whose answer it is."""
    import json

    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        if strict:
            raise
        return {}


def publish(tmp, final) -> bool:
    """Rename a finished temporary file or folder into place. When another writer published the same thing
    first (ranks or parts racing to write identical content), keep theirs and remove ours. True if ours won."""
    try:
        os.rename(tmp, final)
        return True
    except OSError:
        remove(tmp)
        return False


def remove(path) -> None:
    """A file or a folder, whichever it is, if it is there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
