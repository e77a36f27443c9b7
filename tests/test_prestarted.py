"""A command forked from a prestarted interpreter (tests/prestarted.py) is the command a fresh interpreter runs:
the same answer, exit status, messages and files, the same training to the last digit; and what a fork cannot
make the same goes to a fresh interpreter."""
import json
import subprocess

import prestarted
import pytest
from helpers import PYTHON, ROOT, command_env, run

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
    assert (forked.returncode, forked.stdout.replace(*same), forked.stderr.replace(*same)) \
        == (alone.returncode, alone.stdout, alone.stderr)
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
    assert prestarted.kind_for(["-m", "data_prep"], env, {}) is None
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
