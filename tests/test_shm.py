"""Stale shared memory of streaming is removed at task start by the node's local leader, under the registry lock
(train/task/shm_registry.py): what a dead process left goes, what a live process maps or holds open stays, whole
prefixes at a time. Real processes, real /dev/shm (at prefixes streaming does not reach in these tests)."""
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


@needs_shm
def test_the_leader_removes_what_a_dead_job_left_and_keeps_a_live_jobs(tmp_path, monkeypatch):
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
