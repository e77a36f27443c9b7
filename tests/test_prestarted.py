"""A command forked from a prestarted interpreter (tests/prestarted.py) is the command a fresh interpreter runs:
the same answer, exit status, messages and files, the same training to the last digit; and what a fork cannot
make the same goes to a fresh interpreter."""
import fcntl
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import prestarted
import pytest
from helpers import PYTHON, ROOT, command_env, ended, kill_all_with, processes_with, run

TRAIN = ("max_duration=4ba", "save_interval=2ba", "eval_interval=2ba", "progress_bar=false")


def fresh(*args, root) -> subprocess.CompletedProcess:
    return subprocess.run([str(PYTHON), *args], cwd=ROOT, env=command_env(root), capture_output=True, text=True,
                          timeout=600)


def _files(root) -> dict:
    return {p.relative_to(root): p.stat().st_mode & 0o777 for p in sorted(root.rglob("*"))}


@pytest.mark.e2e
@pytest.mark.parametrize("args", [("plan=true",), ("optimizer.lr=abc", "seed=x"), ("--cfg", "job")])
def test_a_look_and_a_refusal_forked_print_and_exit_as_in_a_fresh_interpreter(args, tmp_path):
    assert prestarted.kind_for(["-m", "train", *args], command_env(tmp_path), {}) == (
        "light" if args[0] in ("plan=true", "--cfg") else "heavy")
    forked = run("-m", "train", *args, root=tmp_path / "forked")
    alone = fresh("-m", "train", *args, root=tmp_path / "fresh")
    same = str(tmp_path / "forked"), str(tmp_path / "fresh")
    # the plan's "57.3 GiB free on ... now": what other tests write between the two moves it
    free = re.compile(r"[\d.]+ GiB free on")
    assert (forked.returncode, free.sub("", forked.stdout.replace(*same)), forked.stderr.replace(*same)) \
        == (alone.returncode, free.sub("", alone.stdout), alone.stderr)
    assert not (tmp_path / "forked").exists() and not (tmp_path / "fresh").exists()  # a look writes nothing


@pytest.mark.train
def test_a_training_forked_writes_the_same_files_and_numbers_as_in_a_fresh_interpreter(tmp_path):
    forked = run("-m", "train", *TRAIN, root=tmp_path / "forked", check=True)
    alone = fresh("-m", "train", *TRAIN, root=tmp_path / "fresh")
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert forked.stdout.replace(str(tmp_path / "forked"), str(tmp_path / "fresh")) == alone.stdout
    assert _files(tmp_path / "forked") == _files(tmp_path / "fresh")  # the same files, as private
    [a], [b] = ((tmp_path / r / "outputs").rglob("metrics.json") for r in ("forked", "fresh"))
    got, want = json.loads(a.read_text()), json.loads(b.read_text())
    assert (got["train_loss"], got["eval"]) == (want["train_loss"], want["eval"])


@pytest.mark.e2e  # starts the heavy server
@pytest.mark.torch  # llm-foundry's imports in this process, as a test before may have made them
def test_what_a_fork_cannot_make_the_same_goes_to_a_fresh_interpreter(monkeypatch):
    import sklearn  # noqa: F401  (sets KMP_DUPLICATE_LIB_OK here, as llm-foundry's imports in the heavy server do)

    prestarted._server("heavy")
    env = command_env()
    assert env.get("KMP_DUPLICATE_LIB_OK") == "True"  # set by the imports: no difference
    assert prestarted.kind_for(["-m", "train", "-m", "optimizer.lr=1e-3,2e-3"], env, {}) == "light"
    assert prestarted.kind_for(["-m", "train.export", "RUN"], env, {}) == "heavy"
    # read when torch or Hugging Face's libraries are imported: the heavy kind's were imported under another value
    # a training then imports them itself, in a child of the light server
    assert prestarted.kind_for(["-m", "train"], {**env, "HF_HUB_OFFLINE": "1"}, {}) == "light"
    assert prestarted.kind_for(["-m", "train", "plan=true"], {**env, "HF_HUB_OFFLINE": "1"}, {}) == "light"
    assert prestarted.kind_for(["-m", "train", "plan=true"], {**env, "PYTHONHASHSEED": "1"}, {}) is None
    assert prestarted.kind_for(["-m", "train"], {**env, "PYTORCH_JIT": "0"}, {}) == "light"
    assert prestarted.kind_for(["-m", "train"], {**env, "SLURM_CONF": "/elsewhere"}, {}) == "heavy"
    # a command that sets its own variables before it imports the libraries imports them itself
    assert prestarted.kind_for(["-m", "train", "cluster.env.HF_HUB_OFFLINE=1"], env, {}) == "light"
    assert prestarted.kind_for(["-m", "train", "+cluster.env.TMPDIR=/x"], env, {}) == "light"
    assert prestarted.kind_for(["-m", "train"], env, {}, fresh=True) is None
    assert prestarted.kind_for(["-m", "train"], env, {"input": "x"}) is None
    assert prestarted.kind_for(["-m", "data_prep"], env, {}) == "light"
    assert prestarted.kind_for(["-c", "print(1)"], env, {}) is None
    monkeypatch.setenv("PRESTARTED", "0")
    assert prestarted.kind_for(["-m", "train"], env, {}) is None


@pytest.mark.train
def test_a_heavy_fork_whose_command_sets_what_its_imports_read_fails_naming_it(tmp_path):
    """cluster.env applied by the task before it imports torch (train/task/main.py) came too late in a fork of the
    heavy interpreter: loud, never a run under other settings than a fresh one's."""
    proc = prestarted.run("heavy", ["-m", "train", "cluster.env.OMP_NUM_THREADS=2", "max_duration=2ba",
                                    "checkpoint=none", "progress_bar=false"], ROOT, command_env(tmp_path), 600)
    assert proc.returncode == 70, proc.stderr[-2000:]
    assert "this command set OMP_NUM_THREADS" in proc.stderr and "fresh=True" in proc.stderr


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _forked_ranks(root: Path, within: float = 120) -> dict:
    """{pid: its client's pid} of the ranks of the local job under `root` forked from the rank server, once both
    run: found as fresh ones are, by their environment, and shown by their command line as submitit starts them."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        server = prestarted._SERVERS.get("rank", (None,))[0]
        ranks, clients = {}, {}
        for pid in processes_with(f"PRETRAIN_ROOT={root}"):
            try:
                environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if v)
                command = Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")
                parent = _parent(pid)
                started_by = Path(f"/proc/{parent}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if command[-4:-1] != ["-u", "-m", "submitit.core._submit"] or "SUBMITIT_LOCAL_LOCALID" not in environ:
                continue  # the controller, a dataloader worker
            rank = environ["SUBMITIT_LOCAL_LOCALID"]
            if server is not None and parent == server.pid:
                ranks[rank] = pid
            elif b"submitit.local._local" in started_by:  # submitit's controller: not a rank's dataloader worker
                clients[rank] = pid
        if len(ranks) == 2 and ranks.keys() == clients.keys():
            return {ranks[r]: clients[r] for r in ranks}
        time.sleep(0.05)
    raise AssertionError(f"no two forked ranks under {root} within {within} s")


def _in_thread(target) -> tuple:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("proc", target()))
    thread.start()
    return thread, result


@pytest.mark.train
def test_a_local_jobs_ranks_forked_train_as_fresh_ones(tmp_path):
    """The ranks of a `-m` run are forked from the rank server, found by their environment and command line as
    submitit's fresh ones are, and train to the same numbers as ranks started fresh."""
    args = ("-m", "train", "-m", "cluster.tasks_per_node=2", *TRAIN)
    thread, result = _in_thread(lambda: run(*args, root=tmp_path / "forked"))
    _forked_ranks(tmp_path / "forked")
    thread.join()
    assert result["proc"].returncode == 0, result["proc"].stderr[-3000:]
    alone = fresh(*args, root=tmp_path / "fresh")
    assert alone.returncode == 0, alone.stderr[-3000:]
    [a], [b] = ((tmp_path / r / "outputs").rglob("metrics.json") for r in ("forked", "fresh"))
    got, want = json.loads(a.read_text()), json.loads(b.read_text())
    assert (got["train_loss"], got["eval"], got["world_size"]) == (want["train_loss"], want["eval"], 2)


@pytest.mark.train
def test_a_forked_rank_gets_its_clients_signals_and_ends_with_it(tmp_path):
    """A forked rank is given the signals its client gets (submitit's controller sends them: SIGTERM, SIGUSR2 at a
    time limit); it dies with its client (the controller SIGKILLs its tasks); a test's kill_all_with finds it by
    its environment: no forked rank outlives its job, none holds its save folder."""
    root = tmp_path / "root"
    thread, result = _in_thread(lambda: run("-m", "train", "-m", "cluster.tasks_per_node=2", "max_duration=1000ba",
                                            "save_interval=2ba", "progress_bar=false", root=root))
    ranks = _forked_ranks(root)
    deadline = time.monotonic() + 120
    while not list(root.glob("checkpoints/*/latest-*")):  # training: submitit's handlers are in place
        assert time.monotonic() < deadline and thread.is_alive(), "no checkpoint"
        time.sleep(0.05)
    (first, its_client), (second, client) = sorted(ranks.items())
    os.kill(its_client, signal.SIGTERM)  # submitit's handler in the rank logs it and trains on
    while "Bypassing signal SIGTERM" not in "".join(p.read_text() for p in root.rglob(".submitit/*/*_log.err")):
        assert time.monotonic() < deadline, "the rank was not given its client's SIGTERM"
        time.sleep(0.05)
    assert all(Path(f"/proc/{pid}").exists() for pid in ranks)
    os.kill(client, signal.SIGKILL)  # the client alone: its rank follows
    while not ended(second):
        assert time.monotonic() < deadline, f"rank {second} outlived its client"
        time.sleep(0.05)
    kill_all_with(f"PRETRAIN_ROOT={root}")
    thread.join(timeout=120)
    assert not thread.is_alive() and result["proc"].returncode != 0
    assert not processes_with(f"PRETRAIN_ROOT={root}") and ended(first)
    for lock in root.glob("checkpoints/*/.lock"):
        with open(lock, "a") as f:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free


@pytest.mark.e2e
def test_a_command_started_to_be_killed_is_forked_behind_a_stand_in_that_answers_as_it(tmp_path):
    """prestarted.popen: the process started stands for the forked command (its standard streams, its exit
    status) and the command shows its own command line and environment in /proc."""
    args = ("-m", "train", "plan=true")
    proc = prestarted.popen(args, ROOT, command_env(tmp_path / "forked"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    alone = fresh(*args, root=tmp_path / "fresh")
    same = str(tmp_path / "forked"), str(tmp_path / "fresh")
    assert (proc.returncode, out.replace(*same), err.replace(*same)) == (alone.returncode, alone.stdout, alone.stderr)
    assert Path(prestarted._stand_in("light")).read_text().startswith(f"#!{PYTHON} -S\n")


@pytest.mark.train
def test_a_forked_command_is_found_as_itself_and_dies_with_its_stand_in(tmp_path):
    root = tmp_path / "root"
    proc = prestarted.popen(("-m", "train", "max_duration=1000ba", "save_interval=2ba", "progress_bar=false"), ROOT,
                            command_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(root.glob("checkpoints/*/latest-*")):
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint"
        time.sleep(0.05)
    heavy = prestarted._SERVERS["heavy"][0].pid
    [command] = [pid for pid in processes_with(f"PRETRAIN_ROOT={root}") if _parent(pid) == heavy]
    shown = Path(f"/proc/{command}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    assert shown == [bytes(PYTHON), b"-m", b"train", b"max_duration=1000ba", b"save_interval=2ba",
                     b"progress_bar=false"]
    proc.kill()
    proc.wait()
    while not ended(command):
        assert time.monotonic() < deadline, "the command outlived its stand-in"
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGKILL
