"""The one error type users see: a message naming the key and the fix, never a stack trace."""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.errors import UserError


class DataPrepError(UserError):
    """Bad input or settings (the shared error type, its lines starting `data_prep:`). __main__ prints it and
    exits non-zero."""

    prefix = "data_prep"


def gather(problems: list, step, *args):
    """step(*args), or None with its DataPrepError's problems added to `problems`: each check runs, and every
    problem is reported at once."""
    try:
        return step(*args)
    except DataPrepError as err:
        problems.extend(err.problems)
        return None


RERUN = "run the same command again (finished blocks are kept)"


def write_error(path: str | os.PathLike, err: OSError) -> DataPrepError | None:
    """A write that failed for lack of room (a full file system or quota, common.files.is_disk_full, or the
    file-size limit), as a message naming the file; None for any other error."""
    from common.files import free_bytes, is_disk_full

    full = is_disk_full(err)
    if full:
        fix = f"free space (or raise the quota) on that file system and {RERUN}, or choose another out_root"
    elif err.errno == errno.EFBIG:
        fix = (f"raise the file-size limit (ulimit -f, or the file system's largest file) and {RERUN}, "
               f"or choose another out_root")
    else:
        return None
    free = free_bytes(Path(path).parent) if full else None
    room = f" ({free:,} bytes free there)" if free is not None else ""
    return DataPrepError("out_root", f"cannot write {path}: {err.strerror}{room}", fix)


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Wrap the writes (and close) of one file: write() and close() raise OSError without a file name."""
    from common.files import DiskFull

    try:
        yield
    except DiskFull:  # common.files.atomic_write's own word for it: said here in data_prep's terms
        raise write_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from None
    except OSError as err:
        full = write_error(path, err)
        if full is None:
            raise
        raise full from None
