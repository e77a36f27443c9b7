"""continue_from=RUN and continue_from=RUN@ba<N> (train/config/continuation.py, train/task/continuation.py): a new
run, under its own name, from another run's checkpoint with its weights, optimizer state, batch count and data
position, under this command's settings; refused on the login node where the checkpoint cannot load; offered by
the stops of a run whose numbers went bad, as a command that works as printed. The run continued is the resume
matrix's 40-batch reference (tests/helpers.py: finished), copied."""
import json
import math
import shlex
import shutil
from pathlib import Path

import pytest
from helpers import TRAIN_ARGS, finished, train_here, tree

from train.config.continuation import parse, spelt
from train.config.identity import identity

pytestmark = pytest.mark.train


def _parent(tmp_path: Path, tmp_path_factory, ranks: int = 1, fmt: str = "sharded") -> str:
    """The reference run's checkpoint folder copied under this test's checkpoint root; its run name."""
    ref = finished(ranks, fmt, tmp_path_factory)
    [folder] = (ref / "checkpoints").iterdir()
    shutil.copytree(folder, tmp_path / "checkpoints" / folder.name, symlinks=True)
    return folder.name


def _metrics(root: Path, run: str | None = None) -> dict:
    found = [json.loads(p.read_text()) for p in (root / "outputs").rglob("metrics.json")]
    return next(m for m in found if run is None or m["run_name"] == run)


def _reference(tmp_path_factory, ranks: int = 1, fmt: str = "sharded") -> dict:
    return _metrics(finished(ranks, fmt, tmp_path_factory))


def _child(root: Path, parent: str) -> Path:
    [child] = [p for p in (root / "checkpoints").iterdir() if p.is_dir() and p.name != parent
               and not p.name.endswith(".continued-from")]
    return child


def test_the_forms_and_their_spelling_in_a_runs_identity():
    """A run under the root named by its folder or by its name is one run; the batch makes another; no
    continue_from leaves every other run's name as it was."""
    assert parse("mpt-tiny-1c6d94ab@ba20") == parse(" mpt-tiny-1c6d94ab@ba20 ")
    assert parse("mpt-tiny-1c6d94ab").batch is None and parse("/x/y@ba3").is_path
    assert parse("a@b@ba3") is None and parse("") is None and parse("..") is None
    assert spelt("/data/ckpt/run-a@ba20", "/data/ckpt") == spelt("run-a@ba20", "/data/ckpt/") == "run-a@ba20"
    assert spelt("/elsewhere//run-a", "/data/ckpt") == "/elsewhere/run-a"
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"optimizer": {"lr": 0.003}, "storage": {"checkpoint_root": "/data/ckpt"},
                            "continue_from": None})
    assert "continue_from" not in identity(cfg)  # a run without it keeps the name it had
    cfg.continue_from = "/data/ckpt/run-a"
    named = identity(cfg)
    cfg.continue_from = "run-a"
    assert identity(cfg) == named and named["continue_from"] == "run-a"


@pytest.mark.torch
@pytest.mark.parametrize("warmup", ["0.033dur", "0.05dur", "4ba"])
def test_the_learning_rate_a_plan_reads_at_a_batch_is_composers(warmup):
    """The schedule a continuation's plan reads (its learning rate where it goes on, where the warmup ends) is
    composer's: a warmup in `dur` ends at that fraction of max_duration, whole batches down (0.033dur of 100ba: 3)."""
    from types import SimpleNamespace

    from composer.core import Time, Timestamp
    from composer.optim import CosineAnnealingWithWarmupScheduler

    from train.checks.continuation import _lr_at, _lr_at_record
    from train.config.compose import compose

    cfg = compose(["max_duration=100ba", f"scheduler.t_warmup={warmup}"])
    assert cfg.scheduler.name == "cosine_with_warmup" and cfg.scheduler.get("t_max", "1dur") == "1dur"
    theirs = CosineAnnealingWithWarmupScheduler(t_warmup=warmup, alpha_f=cfg.scheduler.alpha_f)
    record = {"optimizer.lr": cfg.optimizer.lr, "max_duration": "100ba",
              **{f"scheduler.{k}": v for k, v in cfg.scheduler.items()}}
    for batch in range(101):
        state = SimpleNamespace(max_duration=Time(100, "ba"), timestamp=Timestamp(batch=batch), dataloader_len=None)
        lr = cfg.optimizer.lr * theirs(state)
        assert _lr_at(cfg, batch) == pytest.approx(lr) and _lr_at_record(record, batch) == pytest.approx(lr), batch


def test_continue_from_a_batch_goes_on_as_the_run_did_under_its_own_name(tmp_path, tmp_path_factory):
    """@ba30 of the 40-batch reference under the same settings: the last 10 batches trained again give the
    reference's own final loss exactly (weights, Adam's moments, the schedule's point, the data position); a run of
    its own (its name, folder, identity.json and metrics.json say where it came from), the run continued untouched."""
    parent = _parent(tmp_path, tmp_path_factory)
    before = tree(tmp_path / "checkpoints" / parent)
    proc = train_here("checkpoint=sharded", *TRAIN_ARGS, f"continue_from={parent}@ba30", root=tmp_path, check=True)
    child = _child(tmp_path, parent)
    assert child.name != parent and child.name in proc.stdout
    got, want = _metrics(tmp_path, child.name), _reference(tmp_path_factory)
    assert got["final_train_loss"] == want["final_train_loss"]
    assert got["final_eval"] == want["final_eval"]
    assert [b for b, _ in got["train_loss"]] == list(range(1, 41))  # the history up to batch 30 came with it
    assert got["continued_from"] == f"{parent}@ba30"
    record = json.loads((child / "identity.json").read_text())
    assert record["continued_from"]["run"] == parent and record["continued_from"]["batch"] == 30
    assert record["identity"]["continue_from"] == f"{parent}@ba30"
    assert tree(tmp_path / "checkpoints" / parent) == before  # only read
    # the same command again: the run's own checkpoint, nothing to do
    again = train_here("checkpoint=sharded", *TRAIN_ARGS, f"continue_from={parent}@ba30", root=tmp_path, check=True)
    assert "nothing to do" in again.stderr
    assert json.loads((child / "identity.json").read_text())["continued_from"] == record["continued_from"]  # kept


def test_continue_from_under_another_learning_rate_and_data_keeps_the_optimizer_state_and_takes_the_new_rate(
        tmp_path, tmp_path_factory, cli):
    """The newest checkpoint (batch 40) continued for 2 batches at optimizer.lr=0.001 and max_duration=42ba, on
    the data in another order: the plan says what the schedule and the data do; the run trains at this command's
    rate (composer's loaded param groups and scheduler would have brought the old one back) with the run's Adam
    moments and step counts (at 42, not 2), and reads the other data from its beginning (2 batches into it)."""
    import torch

    parent = _parent(tmp_path, tmp_path_factory)
    args = ("checkpoint=sharded", "max_duration=42ba", "save_interval=2ba", "eval_interval=2ba", "optimizer.lr=0.001",
            "train_loader.dataset.shuffle_seed=99", f"continue_from={parent}")
    plan = cli("train", *args, "plan=true", check=True)
    [line] = [x for x in plan.stdout.splitlines() if x.startswith("continues")]
    assert f"from {parent} at batch 40 (its newest checkpoint now" in line
    assert "optimizer.lr 0.003 -> 0.001" in plan.stdout and "max_duration '40ba' -> '42ba'" in plan.stdout
    assert "read at batch 40: the learning rate goes on at " in plan.stdout
    assert "data: other than the run continued read (train_loader.dataset.shuffle_seed): read from its beginning" \
        in plan.stdout
    proc = train_here(*args, root=tmp_path, check=True)
    assert f"continuing {parent} from batch 40" in proc.stderr
    child = _child(tmp_path, parent)
    state = torch.load(child / "ep0-ba42-rank0.pt", map_location="cpu", weights_only=False)["state"]
    [group] = state["optimizers"]["DecoupledAdamW"]["param_groups"]
    assert group["initial_lr"] == 0.001 and state["schedulers"]["LambdaLR"]["base_lrs"] == [0.001]
    assert 0 < group["lr"] < 0.001
    steps = {float(s["step"]) for s in state["optimizers"]["DecoupledAdamW"]["state"].values()}
    assert steps == {42.0}  # the moments' step counts went on from the run's 40
    gbs = 16  # the tiny preset's global batch
    assert state["dataset_state"]["train"]["sample_in_epoch"] == 2 * gbs  # the other data from its beginning
    assert json.loads((child / "identity.json").read_text())["continued_from"]["batch"] == 40
    assert math.isfinite(_metrics(tmp_path, child.name)["final_train_loss"])


def test_a_model_of_another_shape_is_refused_before_anything_is_written(tmp_path, tmp_path_factory, cli):
    parent = _parent(tmp_path, tmp_path_factory)
    before = tree(tmp_path)
    proc = cli("train", "max_duration=50ba", "model.n_layers=3", f"continue_from={parent}", check=2)
    assert proc.stderr.startswith("error: model.n_layers: continue_from=") and "model.n_layers=2 there, 3 here" \
        in proc.stderr, proc.stderr
    assert tree(tmp_path) == before  # nothing written: no run folder, no outputs
    assert not (tmp_path / "outputs").exists()


def test_continue_from_on_two_ranks_sharded_goes_on_as_the_run_did(tmp_path, tmp_path_factory, cli):
    """The 1-rank reference's one-file checkpoint at batch 30 continued on 2 ranks with sharded checkpoints (real
    processes): converted into shards beside the new run's folder (the run continued is only read), the last 10
    batches give the reference's loss (the ranks' sums add in another order: within 1e-5), and the conversion is
    removed at the end."""
    parent = _parent(tmp_path, tmp_path_factory)
    before = tree(tmp_path / "checkpoints" / parent)
    cli("train", "-m", "cluster.tasks_per_node=2", "checkpoint=sharded", *TRAIN_ARGS, f"continue_from={parent}@ba30",
        check=True)
    child = _child(tmp_path, parent)
    assert (child / "ep0-ba40" / "__1_0.distcp").is_file()
    assert not list((tmp_path / "checkpoints").glob("*.continued-from"))
    got, want = _metrics(tmp_path, child.name), _reference(tmp_path_factory)
    assert got["world_size"] == 2 and got["continued_from"] == f"{parent}@ba30"
    assert abs(got["final_train_loss"] - want["final_train_loss"]) < 1e-5
    assert tree(tmp_path / "checkpoints" / parent) == before


def test_a_stop_offers_a_continue_from_command_that_works_as_printed(tmp_path, cli):
    """A run whose loss goes non-finite stops naming its last good checkpoint in a command: this one's, under half
    the learning rate, as a new run. Run as printed, it continues from that checkpoint."""
    proc = cli("train", "optimizer.lr=1e6", "max_duration=8ba", "save_interval=2ba")
    assert proc.returncode == 1, proc.stderr[-3000:]
    [fix] = [x for x in proc.stderr.splitlines() if x.startswith("  fix: ")]
    command = fix.split(", as a new run of its own: ", 1)[1]
    [run] = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    stopped = int(proc.stderr.split(" at step ")[1].split("/")[0])
    good = max(int(p.name.split("-ba")[1].split("-")[0]) for p in (tmp_path / "checkpoints" / run).glob("ep*.pt"))
    assert good < stopped
    assert command == (f"python -m train max_duration=8ba save_interval=2ba continue_from={run}@ba{good} "
                       "optimizer.lr=500000"), command
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "train"]
    again = cli("train", *words[3:])
    assert f"continuing {run} from batch {good}" in again.stderr, again.stderr[-3000:]
    child = _child(tmp_path, run)
    assert json.loads((child / "identity.json").read_text())["continued_from"]["batch"] == good
    # its loss goes non-finite at the same batch (the weights it continues from give it there): its own stop names
    # the same good checkpoint, the run it continued's, as it wrote none of its own before
    assert again.returncode == 1, again.stderr[-3000:]
    assert f"continue_from={run}@ba{good} optimizer.lr=250000" in again.stderr, again.stderr[-3000:]


def test_a_sweep_of_learning_rates_continues_one_run_in_slurm_jobs(slurm, tmp_path, tmp_path_factory):
    """`-m` on the loopback Slurm: two learning rates continuing the 1-rank reference from batch 30, each a job of
    2 ranks with sharded checkpoints (the one-file checkpoint converted in the job): the point at the reference's own
    rate ends at its loss; each point's lineage is in the summary and in train.status."""
    from helpers import run

    parent = _parent(tmp_path, tmp_path_factory)
    proc = run("-m", "train", "-m", "cluster=slurm-local", "data=mock", "cluster.wait=true", "checkpoint=sharded", *TRAIN_ARGS,
               f"continue_from={parent}@ba30", "optimizer.lr=0.003,0.002", root=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [sweep] = (tmp_path / "outputs" / "sweeps").iterdir()
    import csv

    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    assert [r["continued_from"] for r in rows] == [f"{parent}@ba30"] * 2
    want = _reference(tmp_path_factory)["final_train_loss"]
    same, lower = (json.loads((sweep / str(n) / "metrics.json").read_text()) for n in (0, 1))
    assert same["world_size"] == 2 and abs(same["final_train_loss"] - want) < 1e-5
    assert lower["final_train_loss"] != same["final_train_loss"]
    status = run("-m", "train.status", sweep, root=tmp_path, timeout=120, check=True)
    assert "continued_from" in status.stdout and f"{parent}@ba30" in status.stdout
