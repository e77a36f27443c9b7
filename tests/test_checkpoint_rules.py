"""A run that resumes must keep something, write it before its time limit, fit its kept checkpoints on the storage,
and be told about the run it may have meant to continue (train/checks/checkpoints.py)."""
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import train  # noqa: F401
from train.checks import Context, check, errors
from train.config.compose import compose
from train.config.identity import identity, write_record
from train.launch.spec import scheduler
from train.plan.forecast import build_plan


@pytest.fixture(autouse=True)
def _root(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_ROOT", str(tmp_path / "root"))


def found(overrides, mode="run"):
    choices = {o.split("=")[0]: o.split("=")[1] for o in overrides if o.split("=")[0] in ("model", "cluster")}
    cfg = compose(overrides)
    ctx = Context(mode=mode, overrides=tuple(overrides), choices={"model": "mpt-tiny", **choices},
                  scheduler=scheduler(cfg))
    return check(cfg, ctx)


def keyed(problems, key):
    return [p for p in problems if p.key == key]


@pytest.mark.parametrize("override, key", [
    ("save_interval=0ba", "save_interval"), ("save_interval=0ep", "save_interval"), ("save_interval=0", "save_interval"),
    ("save_interval=0e3ba", "save_interval"),
    ("save_num_checkpoints_to_keep=0", "save_num_checkpoints_to_keep")])
@pytest.mark.parametrize("ckpt", ["checkpoint=sharded", "checkpoint=full"])
def test_settings_that_keep_nothing_are_refused(override, key, ckpt):
    bad = [p for p in keyed(errors(found([ckpt, override])), key) if "writes no checkpoint" in p.problem
           or "deletes every checkpoint" in p.problem]
    assert len(bad) == 1 and bad[0].fix


@pytest.mark.parametrize("overrides", [["save_interval=0.0dur"], ["eval_interval=0dur"],
                                       ["export=hf", "export.interval=0dur"]])
def test_an_interval_of_0dur_is_refused_as_the_division_by_zero_it_is(overrides):
    """composer's interval scheduler never fires an interval of 0 in a unit, and divides by a 0dur one at the first
    batch (test_composer_divides_by_a_0dur_interval): refused as that, whichever key holds it."""
    key = overrides[-1].split("=")[0]
    [p] = keyed(errors(found(overrides)), key)
    assert "ZeroDivisionError" in p.problem and "never fires" not in p.problem and f"{key}=1000ba" in p.fix


@pytest.mark.torch
def test_composer_divides_by_a_0dur_interval():
    """What the rule above says of composer's create_interval_scheduler (save_interval, eval_interval and
    hf_checkpointer's interval all go through it), shown on composer itself."""
    from types import SimpleNamespace

    from composer.core import Event, Time, Timestamp
    from composer.utils.misc import create_interval_scheduler

    state = SimpleNamespace(previous_timestamp=Timestamp(), timestamp=Timestamp(batch=1),
                            get_elapsed_duration=lambda: Time(0.1, "dur"), max_duration=Time(10, "ba"),
                            dataloader_len=Time(10, "ba"))
    with pytest.raises(ZeroDivisionError):
        create_interval_scheduler("0dur")(state, Event.BATCH_CHECKPOINT)
    assert not create_interval_scheduler("0ba")(state, Event.BATCH_CHECKPOINT)  # never fires
    assert create_interval_scheduler("0.1dur")(state, Event.BATCH_CHECKPOINT)


@pytest.mark.torch  # composer
def test_a_negative_interval_is_refused_in_words_true_of_composer():
    """A negative `dur` interval fires in composer (rounded toward zero, or divides by zero); one of another unit
    never does (its check is `<= 0`). Each refusal says which, and composer shows it."""
    from composer.core import Event, Time, Timestamp
    from composer.utils.misc import create_interval_scheduler

    def fires(interval: str, end: int = 10) -> list:
        check = create_interval_scheduler(interval)
        return [b for b in range(1, end + 1) if check(SimpleNamespace(
            previous_timestamp=Timestamp(batch=b - 1), timestamp=Timestamp(batch=b), max_duration=Time(end, "ba"),
            get_elapsed_duration=lambda: Time(0.1, "dur"), dataloader_len=Time(end, "ba")), Event.BATCH_CHECKPOINT)]

    assert (fires("-0.33dur"), fires("0.33dur"), fires("-5ba")) == ([3, 6, 9], [4, 8], [])
    with pytest.raises(ZeroDivisionError):
        fires("-0.05dur")
    [p] = keyed(errors(found(["save_interval=-0.33dur"])), "save_interval")
    assert "rounds it otherwise than 0.33dur" in p.problem and p.fix == "save_interval=0.33dur"
    [p] = keyed(errors(found(["eval_interval=-5ba"])), "eval_interval")
    assert "never fires" in p.problem


def test_keeping_one_checkpoint_is_warned_it_leaves_none_to_fall_back_to():
    """Resuming sets a damaged newest checkpoint aside and takes the one before (tests/test_resume.py): with one
    kept there is none, and the run stops."""
    from train.checks import WARNING

    [p] = keyed(found(["save_num_checkpoints_to_keep=1"]), "save_num_checkpoints_to_keep")
    assert p.level == WARNING and "none before it" in p.problem and "=2" in p.fix
    assert not keyed(found(["save_num_checkpoints_to_keep=2"]), "save_num_checkpoints_to_keep")
    assert not keyed(found(["checkpoint=none", "save_num_checkpoints_to_keep=1"]), "save_num_checkpoints_to_keep")


def test_weights_only_checkpoints_that_a_restart_cannot_resume_from_are_refused():
    """`+save_weights_only=true`: measured, the run trained and exited 0, and the same command again resumed from
    its final checkpoint at batch 0 and failed with composer's FileExistsError traceback (as any requeue would)."""
    [p] = keyed(errors(found(["+save_weights_only=true"])), "save_weights_only")
    assert "cannot resume from" in p.problem and "export=hf" in p.fix
    assert not keyed(found(["+save_weights_only=true", "autoresume=false"]), "save_weights_only")
    assert not keyed(found(["+save_weights_only=false"]), "save_weights_only")


def test_without_checkpoints_an_interval_of_zero_is_nobodys_business():
    assert not keyed(found(["checkpoint=none", "save_interval=0ba"]), "save_interval")
    assert not keyed(found([]), "save_num_checkpoints_to_keep")  # the default run fits


def test_retention_is_bounded_by_default_and_the_plan_shows_what_is_kept():
    cfg = compose(["model=mpt-30b", "cluster=ndv5", "storage=amlfs", "data=c4"])
    assert cfg.save_num_checkpoints_to_keep == 10
    plan = build_plan(cfg)
    # every save_interval and once more at the end, as composer writes them (the plan said 143, one short)
    assert plan["checkpoints_to_max_duration"] == 144 and plan["checkpoints_kept"] == 10
    assert plan["checkpoints_kept_bytes"] == 10 * plan["checkpoint_bytes"]
    assert plan["storage_root"] == "/data" and plan["storage_free_bytes"] is None  # not mounted on this node
    every = build_plan(compose(["model=mpt-30b", "cluster=ndv5", "storage=amlfs", "data=c4",
                                "save_num_checkpoints_to_keep=-1"]))
    assert every["checkpoints_kept"] == 144 and every["checkpoints_kept_bytes"] > 50e12  # ~51 TB


def test_a_save_interval_longer_than_the_time_limit_is_warned():
    line = ["model=mpt-30b", "cluster=ndv5", "storage=amlfs", "data=c4", "cluster.nodes=16"]
    assert not keyed(found(line, "plan"), "save_interval")
    warned = keyed(found([*line, "save_interval=20000ba", "cluster.timeout_min=240"], "plan"), "save_interval")
    assert len(warned) == 1 and warned[0].level == "warning" and "save_interval=" in warned[0].fix
    # composer's wall-clock interval compares with no throughput to go on (slurm-local has none)
    slow = keyed(found(["cluster=slurm-local", "save_interval=3h", "cluster.timeout_min=60"], "plan"), "save_interval")
    assert len(slow) == 1 and slow[0].level == "warning" and "save_interval=2880sec" in slow[0].fix, slow
    assert not keyed(found(["cluster=slurm-local", "save_interval=45m", "cluster.timeout_min=60"], "plan"),
                     "save_interval")


# Intervals that come at no batch before the tiny model's max_duration=40ba (16 samples of 128 tokens a batch; the
# mock set's 1024 samples are 64 batches an epoch): the final checkpoint is the only one
NEVER_BEFORE_THE_END = ["save_interval=1ep", "save_interval=99999tok", "save_interval=1000sp", "save_interval=1dur",
                        "save_interval=40ba"]


@pytest.mark.parametrize("every", NEVER_BEFORE_THE_END)
def test_a_save_interval_that_never_comes_before_the_end_is_refused_on_a_gpu_cluster_and_warned_here(every):
    """Measured before: save_interval=1ep on a 40-batch run wrote ep0-ba40 alone, and the plan gave no count (each
    requeue would have started again at batch 0)."""
    [refused] = keyed(found(["cluster=ndv5", every], "plan"), "save_interval")
    assert refused.level == "error" and "no batch before max_duration=40ba (40 batches" in refused.problem, refused
    assert "batch 0" in refused.problem and "save_interval=4ba" in refused.fix and "checkpoint=none" in refused.fix
    for line in (["cluster=slurm-local", every], [every]):  # the CPU clusters, and a plain run here
        [warned] = keyed(found(line, "plan" if len(line) > 1 else "run"), "save_interval")
        assert warned.level == "warning" and warned.problem == refused.problem, (line, warned)
    assert not keyed(found(["checkpoint=none", "cluster=ndv5", every], "plan"), "save_interval")


def test_an_epoch_interval_is_counted_in_the_train_splits_batches(tmp_path):
    [p] = keyed(found(["save_interval=1ep"]), "save_interval")
    assert "an epoch is about 64: data.train_samples=1024 samples / global_train_batch_size=16" in p.problem, p
    assert not keyed(found(["save_interval=1ep", "max_duration=70ba"]), "save_interval")
    assert not keyed(found(["save_interval=1ep", "data.train_samples=512"]), "save_interval")  # 32 batches
    # an MDS folder: its train split's index.json counts
    data = tmp_path / "mds"
    (data / "train").mkdir(parents=True)
    (data / "train" / "index.json").write_text('{"version": 2, "shards": [{"samples": 600}, {"samples": 40}]}')
    line = ["data=mds", f"variables.data_local={data}", "model.vocab_size=320"]
    [p] = keyed(found([*line, "save_interval=1ep"]), "save_interval")
    assert f"an epoch is about 40: 640 samples in {data}/train/index.json" in p.problem, p
    assert not keyed(found([*line, "save_interval=1ep", "max_duration=41ba"]), "save_interval")


def test_a_wall_clock_interval_is_counted_at_the_plans_speed_where_it_is_known():
    [p] = keyed(found(["cluster=ndv5", "save_interval=30sec"], "plan"), "save_interval")
    assert p.level == "error" and "s/step" in p.problem
    assert not keyed(found(["save_interval=30sec"]), "save_interval")  # the CPU's speed is not known: no count


@pytest.mark.parametrize("line, count, at", [
    (["save_interval=20ba"], 2, [20, 40]),
    (["save_interval=40ba"], 1, [40]),
    (["save_interval=7ba"], 6, [7, 14, 21, 40]),
    (["save_interval=1ep"], 1, [40]),
    (["save_interval=1ep", "max_duration=70ba"], 2, [64, 70]),  # measured: ep1-ba64, ep1-ba70
    (["save_interval=3ep", "max_duration=4ep"], 2, [192, 256]),
    (["save_interval=99999tok"], 1, [40]),
    (["save_interval=4096tok"], 20, [2, 4, 6, 40]),
    (["save_interval=1000sp"], 1, [40]),
    (["save_interval=100sp", "max_duration=20ba"], 4, [7, 13, 19, 20]),  # measured: ba7, ba13, ba19, ba20
    (["save_interval=1dur"], 1, [40]),
    (["save_interval=0.5dur"], 2, [20, 40]),
    (["checkpoint=none"], 0, []),
])
def test_the_plan_counts_the_checkpoints_and_their_batches_whatever_the_unit(line, count, at):
    p = build_plan(compose([*line, "plan=json"]))
    assert (p["checkpoints_to_max_duration"], p["checkpoint_batches"]) == (count, at), p["checkpoint_batches_unknown"]
    assert p["checkpoints_before_end"] == max(0, count - 1)
    from train.plan.forecast_report import render

    said = [ln.strip() for ln in render(p).splitlines() if ln.strip().startswith("every ")]
    if count:
        assert said and f"{count} checkpoint" in said[0] and f"{at[-1]} (the end)" in said[0], said
        assert ("none before it" in said[0]) == (count == 1), said
    # where it cannot be told, the plan says so and why
    clock = build_plan(compose(["save_interval=1h", "plan=json"]))
    assert clock["checkpoints_to_max_duration"] is None and "speed" in clock["checkpoint_batches_unknown"]
    assert "is not known here" in render(clock)


def test_checkpoints_on_a_folder_each_node_has_its_own_of_are_warned_on_slurm():
    """A requeued job lands on whichever nodes are free: checkpoints under /tmp stay behind on the old ones, and
    the run trained again from batch 0 as if new."""
    line = ["cluster=ndv5", "data=c4", "cluster.nodes=2"]
    [warned] = keyed(found([*line, "save_folder=/tmp/ckpt"], "plan"), "save_folder")
    assert warned.level == "warning" and "under /tmp" in warned.problem and "shards" in warned.problem, warned
    assert not keyed(found([*line, "save_folder=/shared/ckpt"], "plan"), "save_folder")
    assert not keyed(found([*line, "save_folder=/tmp/ckpt", "cluster.node_local=[]"], "plan"), "save_folder")
    # the loopback cluster's nodes are this machine; a plain run has no requeue
    assert not keyed(found(["cluster=slurm-local", "save_folder=/tmp/ckpt"], "plan"), "save_folder")
    assert not keyed(found(["save_folder=/tmp/ckpt"], "plan"), "save_folder")


@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_kept_checkpoints_that_cannot_fit_are_refused_and_a_plan_warns(tiny_fs, monkeypatch):
    monkeypatch.setenv("PRETRAIN_ROOT", str(tiny_fs))
    line = ["save_num_checkpoints_to_keep=-1", "max_duration=400ba"]  # 20 checkpoints of ~5 MiB on 4 MiB
    bad = keyed(errors(found(line)), "save_num_checkpoints_to_keep")
    assert len(bad) == 1 and str(tiny_fs) in bad[0].problem and "storage" in bad[0].fix
    # not one ~5 MiB checkpoint fits in 4 MiB: said so (the fix offered save_num_checkpoints_to_keep=-1, which
    # keeps every one)
    assert "not one checkpoint fits" in bad[0].fix and "=-1" not in bad[0].fix, bad[0].fix
    assert keyed(found(line, "plan"), "save_num_checkpoints_to_keep")[0].level == "warning"


def test_a_new_run_beside_one_of_the_same_model_and_data_names_it(tmp_path):
    first = compose([])
    os.makedirs(first.save_folder)
    write_record(first.save_folder, first.run_name, "mpt-tiny", identity(first))
    (tmp_path / "root" / "checkpoints" / first.run_name / "ep0-ba20-rank0.pt").write_bytes(b"x")
    warned = keyed(found(["optimizer.lr=1e-3"]), "run_name")
    assert len(warned) == 1 and warned[0].level == "warning"
    assert first.run_name in warned[0].problem and "optimizer.lr" in warned[0].problem
    assert "batch 20" in warned[0].problem and f"run_name={first.run_name}" in warned[0].fix
    assert not keyed(found([]), "run_name")  # the same run resumes: nothing to say
    assert not keyed(found(["optimizer.lr=1e-3", f"run_name={first.run_name}"]), "run_name")
    assert not keyed(found(["optimizer.lr=1e-3", "max_seq_len=64"]), "run_name")  # other data: mock-seq64


def test_save_ignore_keys_that_leave_out_what_a_resume_reads_are_refused():
    """`+save_ignore_keys=[state/optimizers]`: measured, a run killed after a checkpoint resumed with Adam's moments
    at zero and ended at another loss than the uninterrupted run (4.8189 against 5.2075), exit 0."""
    for pattern, part in [("state/optimizers", ""), ("state/optimizers/*", ""), ("state/*", ""),
                          ("state/model/transformer.wte.*", "part of "), ("*exp_avg*", "part of "),
                          ("state/optimizers/*/param_groups/*/lr", "part of ")]:
        [p] = keyed(errors(found([f"+save_ignore_keys=[{pattern}]"])), "save_ignore_keys")
        assert f"leaves {part}state/" in p.problem and "export=hf" in p.fix, (pattern, p)
    [rng] = keyed(found(["+save_ignore_keys=[rng]"]), "save_ignore_keys")
    assert rng.level == "warning" and "random draws" in rng.problem
    assert not keyed(found(["+save_ignore_keys=[state/optimizers]", "autoresume=false"]), "save_ignore_keys")
    assert not keyed(found(["+save_ignore_keys=[]"]), "save_ignore_keys")


def test_a_continuation_under_other_optimizer_settings_is_refused_since_the_checkpoint_restores_its_own():
    """run_name=<run> optimizer.lr=1e-12: measured, composer's resume restored the optimizer's param groups (lr
    0.003) and the scheduler's base_lrs, the weights moved as before, and the run's record said 1e-12. The
    schedule's shape is rebuilt from the command, so scheduler keys and a longer max_duration continue as asked."""
    first = compose([])
    os.makedirs(first.save_folder)
    write_record(first.save_folder, first.run_name, "mpt-tiny", identity(first))
    folder = Path(first.save_folder)
    (folder / "ep0-ba40-rank0.pt").write_bytes(b"x")
    go_on = [f"run_name={first.run_name}", "max_duration=80ba"]
    [p] = keyed(errors(found([*go_on, "optimizer.lr=1e-12"])), "optimizer.lr")
    assert "restores over this command's" in p.problem and "0.003 there, 1e-12 here" in p.problem, p
    assert "load_weights_only" in p.fix and str(folder) in p.problem
    [p] = keyed(errors(found([*go_on, "optimizer.betas=[0.9,0.99]"])), "optimizer.betas")
    assert not errors(found(go_on)) and not errors(found([*go_on, "scheduler.alpha_f=0.5"]))
    assert not errors(found(["optimizer.lr=1e-12"]))  # without run_name: another run, from step 0


def test_a_mock_set_already_written_with_other_counts_is_refused_naming_the_count(tmp_path):
    """The mock data is written once into its folder and kept: data.train_samples=4096 over a folder of 1024
    trained on 1024 under a name that said 4096 (measured, exit 0)."""
    import json

    folder = tmp_path / "root" / "datasets" / "mock-seq128"
    for split, n in (("train", 1024), ("val", 64)):
        (folder / split).mkdir(parents=True)
        shards = [{"samples": n - 24}, {"samples": 24}]
        (folder / split / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    assert not keyed(found([]), "data.train_samples") and not keyed(found([]), "data.val_samples")
    [p] = keyed(errors(found(["data.train_samples=4096"])), "data.train_samples")
    assert "holds 1024" in p.problem and str(folder) in p.problem and "data.train_samples=1024" in p.fix
    [p] = keyed(errors(found(["data.val_samples=128"])), "data.val_samples")
    assert "holds 64" in p.problem
    assert "storage.data_local_root=" in p.fix and f"delete {folder}" in p.fix
    # a sweep's points asking other counts of one folder pass the checks (none is there yet): the task stops
    from common.errors import UserError
    from train.task.mock_data import ensure

    with pytest.raises(UserError) as err:
        ensure(str(folder), 128, 1024, 128)
    assert err.value.key == "data.val_samples" and "holds 64" in err.value.problem
    assert ensure(str(folder), 128, 1024, 64) == folder
    assert not keyed(found(["data.train_samples=4096", f"storage.data_local_root={tmp_path / 'other'}"]),
                     "data.train_samples")  # another folder: written with those counts


def test_a_new_run_beside_earlier_ones_is_said_once_per_command_and_not_beside_an_error(tmp_path):
    """Each sweep point said it for each earlier run of the same model and data (four lines for a 2-point sweep
    beside two runs), also when the command was refused. Now: one line per point naming every earlier run, one for
    the command naming the other points, none beside an error."""
    from train.checks import ERROR, WARNING, validate

    root = tmp_path / "root" / "checkpoints"
    for lr in ("1e-3", "2e-3"):  # two earlier runs with checkpoints
        cfg = compose([f"optimizer.lr={lr}"])
        folder = root / cfg.run_name
        folder.mkdir(parents=True)
        (folder / "ep0-ba40-rank0.pt").write_bytes(b"x")
        write_record(folder, cfg.run_name, "mpt-tiny", identity(cfg))
    points = [[f"optimizer.lr={lr}"] for lr in ("4e-3", "5e-3")]
    cfgs = [compose(p) for p in points]
    ctxs = [Context(mode="sweep", overrides=tuple(p), choices={"model": "mpt-tiny"}) for p in points]
    said = [p for p in validate(cfgs, ctxs, first=0) if p.key.endswith("run_name")]
    assert len(said) == 1 and said[0].level == WARNING, [str(p) for p in said]
    assert said[0].problem.count("trains mpt-tiny on the same data") == 2  # both earlier runs, in one line
    assert "(so are [sweep point #1" not in said[0].problem and "so are sweep point #1:" in said[0].problem
    # beside a real error, only the error
    bad = [compose([*p, "optimizer.lr=-1"]) for p in points]
    found = validate(bad, ctxs, first=0)
    assert any(p.level == ERROR for p in found) and not [p for p in found if p.key.endswith("run_name")]


def test_a_point_run_alone_is_told_of_the_sweep_points_run_that_trains_the_same(tmp_path):
    """`-m device_train_microbatch_size=1,2` names its points apart (`<name>-<mark>`: they train the same thing); one
    of them run again alone is named as a plain run is, a new run from step 0. It said the earlier point's run
    "differs in " (nothing) and offered the newest of them; now it names the one that trains the same, first."""
    from train.checks import WARNING, validate

    root = tmp_path / "root" / "checkpoints"
    other = compose(["optimizer.lr=2e-3"])
    for cfg, name in ((compose([]), "-3483a2"), (other, "")):
        folder = root / f"{cfg.run_name}{name}"
        folder.mkdir(parents=True)
        (folder / "ep0-ba40-rank0.pt").write_bytes(b"x")
        write_record(folder, folder.name, "mpt-tiny", identity(cfg))
    cfg = compose(["device_train_microbatch_size=1"])
    ctx = Context(mode="sweep", overrides=("device_train_microbatch_size=1",), choices={"model": "mpt-tiny"})
    [said] = [p for p in validate([cfg], [ctx], first=0) if p.key.endswith("run_name")]
    assert said.level == WARNING and said.problem.split(", but ")[1].startswith(
        f"{cfg.run_name}-3483a2 trains the same (checkpoints up to batch 40: named apart by a sweep of points that "
        "train the same thing); and "), said.problem
    assert f"{other.run_name} trains mpt-tiny on the same data" in said.problem and "differs in ;" not in said.problem
    assert said.fix.startswith(f"to continue {cfg.run_name}-3483a2 under this command's settings instead, add "
                               f"run_name={cfg.run_name}-3483a2")
