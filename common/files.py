"""Writing so that a reader (another rank, a resumed run, a status command) never sees half a file or folder:
write under a hidden temporary name beside the target, then rename, which is atomic on one file system."""
import os
import shutil
import socket
from pathlib import Path


def temp_name(target) -> Path:
    """A hidden sibling of `target`, unique to this host and process (two writers never share one)."""
    target = Path(target)
    return target.parent / f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}"


def atomic_write(target, data: bytes) -> None:
    """Readers see the old file or the whole new one; the temporary file goes on failure too (a full disk)."""
    target = Path(target)
    tmp = temp_name(target)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path) -> dict:
    """A JSON file another process replaces whole (atomic_write) as it goes: {} while it is not there yet."""
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
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
