"""Mounted means mounted: a storage preset's mount point must have a file system on it, on the login node (the
checks) and on every node as a job starts (train/task/shards.py). Tested with a real empty folder and a real tmpfs
(root only: `mount -t tmpfs`)."""
import contextlib
import os
import subprocess

import pytest
from helpers import ROOT, run

from train.checks import ERROR, Context, check
from train.config.compose import compose
from train.task.shards import NotMounted, check_mounts


@contextlib.contextmanager
def tmpfs(folder):
    """A real 5 MB tmpfs mounted at folder for the duration; skips where mounting is not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _amlfs(data):
    return ["storage=amlfs", f"storage.root={data}", f"storage.mounts=[{data}]"]


def _mount_problems(data, mode="run"):
    overrides = _amlfs(data)
    return [p for p in check(compose(overrides), Context(mode=mode, overrides=tuple(overrides)))
            if p.key == "storage.mounts"]


@pytest.mark.e2e  # starts a Python process of its own
def test_an_empty_mount_point_is_refused_on_the_login_node_and_nothing_is_written(tmp_path):
    data, root = tmp_path / "data", tmp_path / "root"
    data.mkdir()
    root.mkdir()
    proc = run("-m", "train", *_amlfs(data), "max_duration=2ba", root=root, env={"HF_HUB_OFFLINE": "1"}, cwd=tmp_path,
               timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: storage.mounts: {data} is not a mount point on this node" in proc.stderr
    assert "fix: mount the amlfs file system at" in proc.stderr
    assert list(data.iterdir()) == [] and list(root.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "root"]  # nothing in the working directory


def test_a_real_tmpfs_passes_and_the_same_folder_unmounted_is_refused(tmp_path):
    data = tmp_path / "data"
    with tmpfs(data):
        assert os.path.ismount(data)
        assert _mount_problems(data) == []
        check_mounts(compose(_amlfs(data)))  # a job starting on this node: nothing raised
    assert not os.path.ismount(data)
    [p] = _mount_problems(data)
    assert p.level == ERROR and str(data) in p.problem
    [p] = _mount_problems(data, mode="plan")  # a plan is made away from the cluster: a warning
    assert p.level != ERROR


def test_a_job_refuses_to_start_on_a_node_without_the_mount(tmp_path, monkeypatch):
    """The node is named as Slurm names it, the name its fix (--exclude) takes, as the preflight report names it:
    two slurmd on one machine share its host name."""
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(NotMounted) as caught:
        check_mounts(compose(_amlfs(data)))
    [p] = caught.value.problems
    assert p.key == "storage.mounts" and f"{data} is not a mount point on {os.uname().nodename}" in p.problem
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-7")
    with pytest.raises(NotMounted) as caught:
        check_mounts(compose(_amlfs(data)))
    assert f"{data} is not a mount point on gpu-node-7 " in caught.value.problems[0].problem
    assert list(data.iterdir()) == []
    check_mounts(compose(["storage.mounts=[/]"]))  # the root file system is a mount point
    assert ROOT.exists()
