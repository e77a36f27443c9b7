"""One job at a time registers streaming's shared memory on a node.

Each StreamingDataset's local leader walks streaming's registry in /dev/shm for the first free prefix and then
creates `/<prefix>_locals`; two jobs starting together on one node (points of a local sweep, jobs sharing a node)
can pick the same prefix, and one fails with `FileExistsError: '/000413_locals'` (streaming 0.12,
base/shared/prefix.py: get_shm_prefix has no lock). Here the local leader of each job holds a node-wide lock from
before its datasets are built until composer's INIT event (after llm-foundry built every loader), and its other
ranks wait for it before they look at the registry: a second job then sees the first's prefix taken. A job that
never releases (it hangs elsewhere) holds the others up for WAIT_S at most.
"""
import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)
# Beside the registry it guards (node-wide, whatever TMPDIR a job has), else in the temporary folder.
LOCK = (Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())) / "streaming-registry.lock"
WAIT_S = 300.0
_held = []


def hold() -> None:
    """Before llm-foundry builds the loaders (every rank of the job, after the process group is up)."""
    from composer.utils import dist

    if os.environ.get("LOCAL_RANK", "0") == "0":
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _held.append(fd)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("another job on this node has held %s for %.0f s: registering streaming's shared "
                                "memory without it", LOCK, WAIT_S)
                    os.close(fd)
                    break
                time.sleep(0.2)
    dist.barrier()  # the other ranks look at the registry only once their leader holds the lock


def release() -> None:
    """At composer's INIT: every loader is built, its shared memory registered."""
    while _held:
        fd = _held.pop()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
