"""Stale shared memory of streaming is removed at task start by the node's local leader, under the registry lock
(train/task/shm_registry.py): what a dead process left goes, what a live process maps or holds open stays, whole
prefixes at a time. Real processes, real /dev/shm (at prefixes streaming does not reach in these tests)."""
import fcntl
import mmap
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from train.task import shm_registry

SHM = Path("/dev/shm")
needs_shm = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")

# A process that makes streaming's shared memory as streaming does (shm_open through Python's SharedMemory,
# `<prefix>_<name>`), says so, and then either dies without cleaning up (SIGKILL, its resource tracker told to
# forget: as when Slurm kills the whole job) or holds it until told to leave (then removes it, as streaming does).
MAKER = textwrap.dedent("""
    import os, signal, sys
    from multiprocessing import resource_tracker
    from multiprocessing.shared_memory import SharedMemory

    prefix, how = int(sys.argv[1]), sys.argv[2]
    made = [SharedMemory(f"{prefix:06}_{name}", create=True, size=64) for name in ("locals", "barrier")]
    for shm in made:
        resource_tracker.unregister(shm._name, "shared_memory")
    made[1].close()  # streaming keeps some open and mapped, not necessarily all: the prefix stays whole
    print("ready", flush=True)
    if how == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()
    for shm in made:
        shm.unlink()
""")


def _make(prefix: int, how: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", MAKER, str(prefix), how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _files(prefix: int) -> list:
    return sorted(p.name for p in SHM.glob(f"{prefix:06}_*"))


@pytest.mark.torch  # streaming imports torch
def test_the_names_are_streamings():
    from streaming.base.constant import SHM_TO_CLEAN
    from streaming.base.shared.prefix import _get_path

    assert shm_registry.NAMES == tuple(SHM_TO_CLEAN)
    assert _get_path(7, "locals") == "000007_locals" and shm_registry._NAME.match(_get_path(413, "epoch_data"))
    assert not shm_registry._NAME.match(shm_registry.LOCK.name)


@pytest.mark.e2e  # starts a Python process of its own
@needs_shm
def test_the_leader_removes_what_a_dead_job_left_and_keeps_a_live_jobs(tmp_path, monkeypatch):
    # the machine's registry held throughout, as a registering job holds it: a training of another test that leads
    # meanwhile removes nothing (the dead files are this test's to find), while this leader takes its own lock
    held = os.open(shm_registry.LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(held, fcntl.LOCK_EX)
    monkeypatch.setattr(shm_registry, "LOCK", tmp_path / "registry.lock")
    dead, live = random.sample(range(990000, 999999), 2)
    died = _make(dead, "die")
    assert died.wait(timeout=30) == -9
    alive = _make(live, "hold")
    try:
        assert _files(dead) == [f"{dead:06}_barrier", f"{dead:06}_locals"]  # left behind
        shm_registry.lead()
        shm_registry.release()
        assert _files(dead) == []
        assert _files(live) == [f"{live:06}_barrier", f"{live:06}_locals"]  # mapped by a live process: kept whole
    finally:
        os.close(held)
        alive.communicate("", timeout=30)
        for name in _files(dead) + _files(live):
            (SHM / name).unlink(missing_ok=True)


@needs_shm
def test_nothing_is_removed_without_the_lock(tmp_path, monkeypatch):
    """Another job holds the registry (it is registering): the leader waits WAIT_S, then goes on without the
    lock and removes nothing."""
    import fcntl

    monkeypatch.setattr(shm_registry, "LOCK", tmp_path / "registry.lock")
    monkeypatch.setattr(shm_registry, "WAIT_S", 0.3)
    monkeypatch.setattr(shm_registry, "SHM", tmp_path)
    (tmp_path / "000001_locals").write_bytes(b"x" * 64)  # no process holds it: stale
    holder = os.open(tmp_path / "registry.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        shm_registry.lead()
        assert shm_registry._held == [] and (tmp_path / "000001_locals").exists()
    finally:
        os.close(holder)
    shm_registry.lead()  # free now: it takes the lock and cleans
    shm_registry.release()
    assert not (tmp_path / "000001_locals").exists()


@pytest.mark.e2e  # starts a Python process of its own
def test_a_file_in_use_is_known_by_its_mapping_or_its_open_descriptor(tmp_path):
    """By device and inode, as /proc shows them: a mapping, or only an open descriptor (between shm_open and
    mmap), keeps a prefix; other names and other files are left alone."""
    for name in ("000001_locals", "000001_barrier", "000002_locals", "000003_epoch_data", "000004_locals",
                 "000004_mine", "streaming-registry.lock", "1_locals"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import mmap, os, sys
        fd = os.open({str(tmp_path / "000001_locals")!r}, os.O_RDWR)
        mapped = mmap.mmap(fd, 4096)
        os.close(fd)  # the mapping alone holds it
        held = os.open({str(tmp_path / "000002_locals")!r}, os.O_RDONLY)  # open, not mapped
        print("ready", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with open(tmp_path / "000003_epoch_data", "r+b") as f:  # this process maps one too
            mine = mmap.mmap(f.fileno(), 4096)
            removed = shm_registry.clean_stale(tmp_path)
            mine.close()
    finally:
        holder.communicate("", timeout=30)
    assert removed == ["000004_locals"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "000001_barrier", "000001_locals", "000002_locals", "000003_epoch_data", "000004_mine", "1_locals",
        "streaming-registry.lock"]
    assert shm_registry.clean_stale(tmp_path) == ["000001_barrier", "000001_locals", "000002_locals",
                                                  "000003_epoch_data"]  # their processes are gone


def test_an_unreadable_python_process_of_this_user_stops_the_cleanup(tmp_path, monkeypatch):
    """What cannot be read cannot be known unused: the leader leaves everything. A process that cannot be read
    and is no Python (a sandbox's init, ssh-agent) uses no streaming: it does not count."""
    proc = tmp_path / "proc"
    for pid, argv0 in (("11", b"/usr/bin/python3.11"), ("12", b"/usr/bin/ssh-agent")):
        (proc / pid / "fd").mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(argv0 + b"\0-u\0")
        (proc / pid / "maps").write_text("")
    target = tmp_path / "000001_locals"
    target.write_bytes(b"\0")
    st = target.stat()
    unreadable = {"12"}

    def guarded(path, *args, **kwargs):  # as the kernel answers for a process this user may not read
        if Path(path).parent.name in unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(shm_registry, "open", guarded, raising=False)
    assert shm_registry.in_use({(st.st_dev, st.st_ino)}, proc) == set()
    unreadable.add("11")
    assert shm_registry.in_use({(st.st_dev, st.st_ino)}, proc) is None
    assert shm_registry.clean_stale(tmp_path, proc) == [] and target.exists()


@pytest.mark.parametrize("argv0,python", [(b"python3", True), (b"/opt/venv/bin/python", True),
                                          (b"/usr/sbin/sshd", False), (b"", False)])
def test_which_unreadable_processes_count(tmp_path, argv0, python):
    (tmp_path / "cmdline").write_bytes(argv0 + b"\0x\0")
    assert shm_registry._python(tmp_path) is python


# Two ranks of one job on one node register one dataset's prefix while a third job's shared memory goes away
# between their scans (it ended). Each rank runs streaming's own get_shm_prefix, as StreamingDataset calls it,
# scanning from a high base (other tests and runs use the low prefixes; the walk itself is streaming's).
RANK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch.distributed as dist
    from streaming.base import dataset
    from streaming.base.shared import prefix as shared
    from streaming.base.world import World

    base, gone, ready, fix = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "fix"

    def from_base():
        n = base
        while True:
            yield n
            n += 1

    shared._each_prefix_int = from_base
    dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=int(os.environ["RANK"]), world_size=2)
    if fix:
        from common.compat import patch_streaming_shm_prefix_from_local_leader
        patch_streaming_shm_prefix_from_local_leader()
    if os.environ["RANK"] == "1":  # the leader has scanned; the other job ends; then this rank scans
        while not ready.exists():
            time.sleep(0.05)
        time.sleep(1.0)
        gone.unlink()
    else:
        ready.touch()
    try:
        prefix, shm = dataset.get_shm_prefix(["/data/train"], [None], World.detect())
        print("prefix", prefix, flush=True)
        dist.barrier()
        if os.environ["RANK"] == "0":
            shm.cleanup()
    except RuntimeError as err:
        print(err, flush=True)
        sys.exit(3)
""")


@needs_shm
@pytest.mark.torch
@pytest.mark.e2e  # starts a Python process of its own
@pytest.mark.parametrize("fix", [True, False])
def test_the_ranks_of_a_job_take_their_leaders_prefix(tmp_path, fix):
    """streaming 0.12 has every rank scan the registry on its own (base/shared/prefix.py) and the followers open
    the prefix they found: where another job's shared memory went away between the leader's scan and a
    follower's, they part ("shared memory prefix=378 was not registered by local leader", seen with two 2-rank
    runs on one machine). Patched (common/compat.py), every rank takes its local leader's number."""
    import socket

    # not the module's generator: a training in this worker seeds it (composer's seed_all), and another worker
    # seeded alike would draw the same base and remove this test's files
    base = random.SystemRandom().randrange(900000, 990000, 10)
    other = SHM / f"{base:06}_epoch_data"  # another job's, at the first prefix free of `locals`
    other.write_bytes(b"\0" * 64)
    # held open, as its job would: a task starting beside this test removes streaming's memory no process holds
    held = os.open(other, os.O_RDONLY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "INIT": f"tcp://127.0.0.1:{port}", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    try:
        ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(base), str(other), str(tmp_path / "ready"),
                                   "fix" if fix else "as-is"], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
        out = [p.communicate(timeout=120)[0] for p in ranks]
    finally:
        os.close(held)
        for p in SHM.glob(f"{base // 10:05}*"):
            p.unlink(missing_ok=True)
    if fix:
        assert [p.returncode for p in ranks] == [0, 0], out
        assert all(f"prefix {base + 1}" in o for o in out), out  # the leader found `base` taken when it scanned
    else:  # streaming as it is: the follower found `base` free and looks for a registration there
        assert ranks[1].returncode == 3 and f"prefix={base} was not registered by local leader" in out[1], out


@pytest.mark.torch  # streaming imports torch
@needs_shm
@pytest.mark.parametrize("patched", [True, False])
def test_a_rank_that_attaches_before_the_block_is_sized_waits_for_it(monkeypatch, patched):
    """A dataset's `_resume` block at a resume: every rank asks streaming's SharedMemory to create it, and those
    that find it made attach one tick later; the creator had not sized it yet (a loaded machine), and the rank
    failed ('cannot mmap an empty file'). With the patch the attach waits until the block is sized."""
    import threading

    from streaming.base.shared import SharedMemory, memory

    from common.compat import patch_streaming_shared_memory_attach_waits

    # unpatched to begin with (a training in this worker may have patched it), and restored after the test
    builtin = memory.BuiltinSharedMemory
    monkeypatch.setattr(memory, "BuiltinSharedMemory",
                        builtin.__mro__[1] if getattr(builtin, "waits_to_be_sized", False) else builtin)
    if patched:
        patch_streaming_shared_memory_attach_waits()
    name = f"{random.SystemRandom().randrange(990000, 999999):06d}_resume"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)  # made, not sized yet
    sized = threading.Timer(0.3, os.ftruncate, (fd, mmap.PAGESIZE))
    sized.start()
    try:
        if not patched:
            with pytest.raises(ValueError, match="cannot mmap an empty file"):
                SharedMemory(name=name, size=mmap.PAGESIZE, auto_cleanup=False)
            return
        shm = SharedMemory(name=name, size=mmap.PAGESIZE, auto_cleanup=False)
        assert shm.buf.nbytes >= mmap.PAGESIZE
        shm.shm.close()
    finally:
        sized.join()
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")
