"""One job at a time registers streaming's shared memory on a node, after removing what dead jobs left there.

Each StreamingDataset's local leader walks streaming's registry in /dev/shm for the first free prefix and then
creates `/<prefix>_locals`; two jobs starting together on one node (points of a local sweep, jobs sharing a node)
can pick the same prefix, and one fails with `FileExistsError: '/000413_locals'` (streaming 0.12,
base/shared/prefix.py: get_shm_prefix has no lock). Here the local leader of each job holds a node-wide lock from
before its datasets are built until composer's INIT event (after llm-foundry built every loader), and its other
ranks wait for it before they look at the registry: a second job then sees the first's prefix taken. A job that
never releases (it hangs elsewhere) holds the others up for WAIT_S at most.

Under that lock the leader first removes the shared memory of jobs that died without cleaning up (killed at a
time limit, a node failure, SIGKILL): a stale `<prefix>_locals` naming this run's local folder makes streaming
refuse it ("Reused local directory") when the job comes back after a requeue, and the rest only fills /dev/shm.
AWS's MPT sbatch script cleans stale shared memory before training for the same reason, with streaming's
`clean_stale_shared_memory()`; that function (streaming 0.12, base/util.py) unlinks every streaming name from
prefix 0 up whoever holds it, which would pull the memory from under another live job on the node. So here a
prefix is removed only when no process maps or holds open any of its files.

The lock keeps two jobs from registering together, not the registry still: another job's shared memory comes and
goes as it iterates and ends. streaming 0.12 has every rank of a job walk the registry on its own and its
followers open the prefix they found (get_shm_prefix); where a name went away between the leader's walk and a
follower's they part, and the follower fails ("shared memory prefix=378 was not registered by local leader", with
runs of several ranks beside each other on one machine; mosaicml/streaming#901). So the followers take their local
leader's number (common/compat.py: patch_streaming_shm_prefix_from_local_leader).
"""
import contextlib
import fcntl
import logging
import os
import re
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)
SHM = Path("/dev/shm")
# Beside the registry it guards (node-wide, whatever TMPDIR a job has), else in the temporary folder.
LOCK = (SHM if SHM.is_dir() else Path(tempfile.gettempdir())) / "streaming-registry.lock"
WAIT_S = 300.0
_held = []
# streaming's shared memory of one dataset: `<prefix, 6 digits>_<name>` for each name of streaming 0.12's
# base/constant.py SHM_TO_CLEAN (tests/test_shm.py compares them), created with shm_open (files in /dev/shm).
NAMES = ("locals", "barrier", "next_epoch", "cache_usage", "shard_states", "shard_access_times", "resume",
         "epoch_shape", "epoch_data")
_NAME = re.compile(r"^(\d{6})_(%s)$" % "|".join(NAMES))


def hold() -> None:
    """Before llm-foundry builds the loaders (every rank of the job, after the process group is up)."""
    from composer.utils import dist

    from common.compat import patch_streaming_shared_memory_attach_waits, patch_streaming_shm_prefix_from_local_leader

    patch_streaming_shm_prefix_from_local_leader()
    patch_streaming_shared_memory_attach_waits()
    if dist.get_local_rank() == 0:
        lead()
    dist.barrier()  # the other ranks look at the registry only once their leader holds the lock


def lead() -> None:
    """The local leader: take the node's lock (WAIT_S at most), then remove what dead jobs left. Without the
    lock nothing is removed: another job is registering."""
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
                return
            time.sleep(0.2)
    try:
        removed = clean_stale()
    except OSError as err:  # a cleanup that cannot finish must not stop the run: streaming works around leftovers
        log.warning("could not remove stale shared memory of streaming in %s: %s", SHM, err)
        return
    if removed:
        log.info("removed %d stale shared memory file(s) of streaming left by jobs that ended: %s", len(removed),
                 ", ".join(removed))


@contextlib.contextmanager
def registering():
    """Around building streaming datasets in one process outside a job (train.evaluate, the tests and benchmarks):
    the same node-wide lock, so that a job starting beside it does not pick the same prefix."""
    lead()
    try:
        yield
    finally:
        release()


def release() -> None:
    """At composer's INIT: every loader is built, its shared memory registered."""
    while _held:
        fd = _held.pop()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def clean_stale(shm: Path | None = None, proc: Path = Path("/proc")) -> list:
    """Remove streaming's shared memory that no process uses any more: every file of a prefix, when all of them
    are this user's and none is mapped or open in any process. Returns the names removed."""
    shm = shm or SHM
    prefixes: dict = {}
    for entry in os.scandir(shm):
        m = _NAME.match(entry.name)
        if m and entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            prefixes.setdefault(m.group(1), []).append((entry.name, st.st_dev, st.st_ino, st.st_uid))
    if not prefixes:
        return []
    used = in_use({(dev, ino) for files in prefixes.values() for _, dev, ino, _ in files}, proc)
    if used is None:
        return []
    me, removed = os.geteuid(), []
    for files in prefixes.values():
        if any((dev, ino) in used or uid != me for _, dev, ino, uid in files):
            continue
        for name, *_ in files:
            try:
                os.unlink(shm / name)
                removed.append(name)
            except FileNotFoundError:  # its own job's cleanup got there first
                pass
    return sorted(removed)


def in_use(files: set, proc: Path = Path("/proc")):
    """Which of `files` ((st_dev, st_ino) pairs) a process maps or holds open, by the device and inode /proc
    shows (a path would differ inside a container's mount namespace; enroot bind-mounts the host's /proc and
    /dev/shm, its conf/mounts/10-system.fstab, so a container job sees the node's processes). None when a
    Python process of this user cannot be read: then nothing can be known to be stale. Processes of other users
    are read where allowed; they cannot open this user's files (shm_open makes them 0600)."""
    # /proc/PID/maps shows a mapping's device as major:minor in hex, then its inode
    shown = {((os.major(d), os.minor(d)), i): (d, i) for d, i in files}
    me, used = os.geteuid(), set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        base = proc / pid
        try:
            mine = base.stat().st_uid == me
        except FileNotFoundError:  # ended meanwhile
            continue
        try:
            with open(base / "maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[4] != "0":
                        major, _, minor = parts[3].partition(":")
                        hit = shown.get(((int(major, 16), int(minor, 16)), int(parts[4])))
                        if hit:
                            used.add(hit)
            for fd in os.listdir(base / "fd"):
                try:
                    st = os.stat(base / "fd" / fd)
                except OSError:  # closed meanwhile
                    continue
                if (st.st_dev, st.st_ino) in files:
                    used.add((st.st_dev, st.st_ino))
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
        except PermissionError:
            if mine and _python(base):
                log.warning("cannot read %s of this user's Python process %s: leaving streaming's shared memory "
                            "as it is", base / "maps", pid)
                return None
    return used


def _python(base: Path) -> bool:
    """Whether a process that cannot be read may be a Python process (its command line is public). Processes
    this user cannot read are not its jobs' (those are dumpable), but another user namespace's or a
    non-dumpable agent (ssh-agent), or a sandbox init: none of them uses streaming."""
    try:
        argv0 = (base / "cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return b"python" in os.path.basename(argv0).lower()
