"""What both apps share (common/): one error type, atomic writes, publishing a finished folder, the signal reset."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common import files
from common.errors import Problem, UserError
from data_prep.errors import DataPrepError
from train.checks import ConfigError


def test_one_error_type_for_both_apps_each_with_its_prefix():
    for cls, prefix in ((ConfigError, "error"), (DataPrepError, "data_prep")):
        err = cls("out_root", "is required", "pass out_root=<folder>")
        assert isinstance(err, UserError) and err.problems == [Problem("out_root", "is required", "pass out_root=<folder>")]
        assert str(err) == f"{prefix}: out_root: is required\n  fix: pass out_root=<folder>"
    both = ConfigError(problems=[Problem("a", "bad", "fix a"), Problem("b", "odd", "fix b").as_warning()])
    assert str(both) == "error: a: bad\n  fix: fix a\nwarning: b: odd\n  fix: fix b"
    assert str(DataPrepError("strict", "must be true or false")) == "data_prep: strict: must be true or false"


def test_an_error_survives_a_job_result_file():
    import pickle

    from train.checkpoint.resume import FolderInUse, in_use

    err = FolderInUse(problems=[in_use("/ckpt/run", "host a, pid 1")])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is FolderInUse and back.problems == err.problems and str(back) == str(err)


@pytest.mark.e2e  # starts a Python process of its own
def test_atomic_write_replaces_whole_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "metrics.json"
    files.atomic_write(target, b"old")
    files.atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["metrics.json"]
    # a write that fails half way (the file-size limit, a real EFBIG from the kernel) leaves no temporary file
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10)); from common import files; "
            f"files.atomic_write({str(target)!r}, b'x' * 100)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["metrics.json"]


def test_a_json_file_not_there_yet_reads_empty_and_a_damaged_one_raises_only_where_it_is_the_answer(tmp_path):
    path = tmp_path / "metrics.json"
    assert files.read_json(path) == files.read_json(path, strict=True) == {}  # not written yet
    files.atomic_write(path, b'{"final_train_loss": 3.9}')
    assert files.read_json(path) == files.read_json(path, strict=True) == {"final_train_loss": 3.9}
    path.write_text('{"final_train_loss": 3.')  # damaged
    assert files.read_json(path) == {}  # a status shows what it can
    with pytest.raises(ValueError):
        files.read_json(path, strict=True)


def test_publish_keeps_the_first_of_two_identical_writers(tmp_path):
    final = tmp_path / "data"
    for n in (1, 2):
        tmp = tmp_path / f".data.tmp-{n}"
        tmp.mkdir()
        (tmp / "index.json").write_text(str(n))
        assert files.publish(tmp, final) is (n == 1)
        assert not tmp.exists()
    assert (final / "index.json").read_text() == "1"


@pytest.mark.e2e  # starts a Python process of its own
def test_a_forked_worker_leaves_signals_to_the_task():
    code = ("import os, signal; from common import signals\n"
            "signal.signal(signal.SIGUSR2, lambda *a: None); signal.signal(signal.SIGTERM, lambda *a: None)\n"
            "signals.leave_to_the_task_in_every_fork()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    ok = signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN and "
            "signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
            "    os._exit(0 if ok else 1)\n"
            "_, status = os.waitpid(pid, 0); print(os.WEXITSTATUS(status))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "0", out.stderr
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN  # this process is untouched


@pytest.mark.parametrize("enabled", [True, False])
def test_libraries_are_imported_with_no_collection_then_frozen_and_the_gc_left_as_it_was(tmp_path, monkeypatch,
                                                                                          enabled):
    """common/collector.py: an import that makes many objects (as composer's and llm-foundry's do) runs no
    collection; what exists afterwards is frozen; the GC is as it was, also when the import fails."""
    import gc

    from common.collector import imported_without_collections

    (tmp_path / "many_objects.py").write_text("KEPT = [[i] for i in range(300_000)]\n")
    (tmp_path / "broken_library.py").write_text("KEPT = [[i] for i in range(1_000)]\nraise ImportError('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(info) if phase == "start" else None)
    try:
        (gc.enable if enabled else gc.disable)()
        imported_without_collections("json", "many_objects")
        assert not collections and gc.isenabled() == enabled
        frozen = gc.get_freeze_count()
        assert frozen > 300_000 and sys.modules["many_objects"].KEPT[-1] == [299_999]
        with pytest.raises(ImportError, match="broken"):
            imported_without_collections("broken_library")
        assert not collections and gc.isenabled() == enabled
        # without the pause, the same number of new objects is collected as it is made
        gc.enable()
        KEPT = [[i] for i in range(300_000)]  # noqa: N806
        assert collections and len(KEPT) == 300_000
    finally:
        gc.callbacks.pop()
        gc.unfreeze()
        gc.enable()
        sys.modules.pop("many_objects", None)


@pytest.mark.e2e  # starts a Python process of its own
def test_a_process_of_ours_ends_with_garbage_finalized_then_the_gc_frozen():
    """common/collector.py: at exit, after every handler registered later (logging's, the trackers'), what is garbage
    is collected (a cycle's finalizer runs) and the GC is frozen for the modules' teardown."""
    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen' if gc.get_freeze_count() else 'not frozen'))\n"
            "import train\n"
            "class Cycle:\n"
            "    def __del__(self): print('finalized')\n"
            "c = Cycle(); c.me = c; del c\n"
            "gc.disable()  # the cycle is still there at exit\n"
            "atexit.register(lambda: print('a later handler'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split("\n") == ["a later handler", "finalized", "frozen", ""], out.stderr


@pytest.mark.parametrize("module", ["train", "data_prep"])
def test_both_apps_read_the_same_conf(module, cli):
    """The folder each app's Hydra searches first, as the command itself reports it, is this checkout's conf/."""
    from common.paths import CONF

    out = cli(module, "--info", "searchpath", check=True).stdout
    [main] = [line for line in out.splitlines() if line.startswith("| main ")]
    assert main.split("|")[2].strip() == f"file://{CONF}", out


class _Checkpointable:
    """A job function submitit can checkpoint: its resubmission is itself."""

    def __call__(self):
        return 0

    def checkpoint(self):
        import submitit

        return submitit.helpers.DelayedSubmission(self)


@pytest.mark.e2e  # starts a Python process of its own
def test_a_repeated_usr2_requeues_once_and_a_cut_short_dump_does_not_fail_the_next_allocation(tmp_path):
    # submitit's own handler, as it stands in a job: registered before the job body, then our install().
    code = ("import os, signal, sys, time\n"
            "from submitit.core.utils import DelayedSubmission\n"
            "from submitit.slurm.slurm import SlurmJobEnvironment\n"
            "from tests.test_common import _Checkpointable\n"
            "from common import host_requeue\n"
            "env = SlurmJobEnvironment()\n"
            "delayed = DelayedSubmission(_Checkpointable()); delayed.set_timeout(1, 5)\n"
            "env._handle_signals(env.paths, delayed)\n"
            "host_requeue.install()\n"
            "for n in range(2):\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGUSR2); time.sleep(0.1)\n"
            "    except SystemExit as e:\n"
            "        print('exit', e.code)\n"
            "signal.alarm(0)\n")
    stale = tmp_path / "7_submitted.pkl.save_tmp"
    stale.write_bytes(b"half a pickle")  # an earlier allocation killed while dumping
    env = {**os.environ, "SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_FOLDER": str(tmp_path), "SLURM_JOB_ID": "7",
           "SLURM_PROCID": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n").count("exit -1") == 1, proc.stdout + proc.stderr  # answered once
    assert "already checkpointing and requeueing, ignored" in proc.stderr
    assert "did not finish writing" in proc.stderr and not stale.exists()
    assert (tmp_path / "7_requeue").read_text() == "4\n"  # one timeout counted, not two
    assert (tmp_path / "7_submitted.pkl").is_file()


def test_an_object_store_is_told_from_a_local_folder_in_one_place():
    """common/paths.py's is_remote is the one test of a folder, load path or data location for an object store's
    URL: no other product module asks `"://" in ...` or compiles a pattern of its own for it."""
    import ast
    from urllib.parse import urlparse

    from common.paths import PROJECT, is_remote

    remote = ("s3://bucket/ckpt", "gs://b/x", "oci://b@ns/x", "azure://container/x", "hf://datasets/a", " s3://b/x",
              "AZURE_BLOBS://container/x")
    local = ("/data/ckpt", "runs/checkpoints/mpt-tiny-1c6d94ab", Path("/data/ckpt"), None, "", "s3:/typo",
             "/data/a://b", "runs/a://b")
    assert [is_remote(p) for p in remote + local] == [True] * len(remote) + [False] * len(local)
    # as composer (parse_uri) and streaming read a location: a scheme is a remote, none a local path
    assert [bool(urlparse(str(p).replace("AZURE_BLOBS", "azure")).netloc) for p in remote + local] == [True] * len(remote) + [False] * len(local)
    spelling = [str(p.relative_to(PROJECT)) for folder in ("train", "common", "data_prep", "hydra_plugins")
                for p in sorted((PROJECT / folder).rglob("*.py"))
                for node in ast.walk(ast.parse(p.read_text()))
                if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and node.left.value == "://"
                and isinstance(node.ops[0], (ast.In, ast.NotIn))
                or isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "compile"
                and any(isinstance(a, ast.Constant) and str(a.value).endswith("://") for a in node.args)]
    assert spelling == ["common/paths.py"]
