"""Experiment tracking (conf/logger/): one tracking run per training, continued by every start that resumes it.

Real runs of the tiny model on CPU. MLflow writes to a file store in the test's folder, named through
MLFLOW_TRACKING_URI as users would, and is read back through MLflow's own client; W&B runs offline
(WANDB_MODE=offline) and its run file is read back with W&B's own reader. A run killed right after a checkpoint
and started again with the same command (what a requeue does) must continue the same tracking run. The checks of
the logger settings run in-process in the fast tier.
"""
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from helpers import kill_after_checkpoint, run
from omegaconf import OmegaConf

# 8 batches, a checkpoint at 4, no evaluation: the shortest run that can be killed after a checkpoint and resumed
ARGS = ("max_duration=8ba", "save_interval=4ba", "eval_interval=0", "progress_bar=false")
LOSS = "loss/train/total"


def command(*extra: str) -> list:
    return ["-m", "train", *ARGS, *extra]


def run_name(root: Path) -> str:
    [folder] = (root / "checkpoints").iterdir()  # checkpoint=sharded: <checkpoints>/<run_name>
    return folder.name


@pytest.mark.train
def test_mlflow_one_run_named_by_run_name_continued_after_a_kill(tmp_path):
    root, store = tmp_path / "root", tmp_path / "mlruns"
    env = {"MLFLOW_TRACKING_URI": f"file://{store}", "MLFLOW_EXPERIMENT_NAME": "pretrain-tests"}
    cmd = command("logger=mlflow", "optimizer.lr=1e-3")
    from mlflow import MlflowClient

    client = MlflowClient(f"file://{store}")

    def runs():
        experiment = client.get_experiment_by_name("pretrain-tests")
        return client.search_runs([experiment.experiment_id]) if experiment else []

    kill_after_checkpoint(root, cmd, batch=4, env=env)
    [first] = runs()  # the run exists from the trainer's start on
    name = run_name(root)
    assert first.info.run_name == name and first.data.tags["run_name"] == name
    before = {m.step for m in client.get_metric_history(first.info.run_id, LOSS)}
    # MLflow logs asynchronously, every 10 s: the queue is sent before each checkpoint is written, so the batches
    # up to the checkpoint (steps 0-3) and the parameters are in the store, not lost with the killed process
    assert set(range(4)) <= before <= set(range(5)), before
    assert first.data.params["max_duration"] == "8ba"

    # Another training of the same name (another save folder), started while the first waits to be resumed: the
    # newest MLflow run tagged with the name is now this one's, not the first's
    other = run(*cmd, f"save_folder={tmp_path / 'elsewhere'}", root=root, env=env, check=True)
    assert "a new MLflow run" in other.stderr
    [elsewhere] = [r for r in runs() if r.info.run_id != first.info.run_id]

    resumed_at = int(time.time() * 1000)
    # the same training with another microbatch (how it runs, not what: the same run): resumes from the batch-4
    # checkpoint. Its logged values differ (the microbatch, gradient accumulation, the overrides), which MLflow
    # refuses within a run (a resumed W&B run refuses a changed config value): they are not logged again, and said
    proc = run(*cmd, "device_train_microbatch_size=4", "callbacks.speed_monitor.window_size=5", root=root, env=env,
               check=True)
    assert "resuming from" in proc.stderr
    [said] = [line for line in proc.stderr.splitlines() if "this start's parameters differ from those" in line]
    assert "device_train_microbatch_size" in said and "overrides" in said and "callbacks" in said, said
    assert "loggers" not in said  # how each start found its MLflow run is not a parameter of it
    assert "variables" not in said  # nor where it resumed from (every resume said its parameters differ)
    assert "Changing param values is not allowed" not in proc.stderr, proc.stderr[-3000:]
    assert f"continuing the MLflow run {first.info.run_id}" in proc.stderr  # the id its save folder records
    [again] = [r for r in runs() if r.info.run_id == first.info.run_id]  # the same run, continued
    assert again.info.run_name == name and len(runs()) == 2
    assert sorted(m.step for m in client.get_metric_history(elsewhere.info.run_id, LOSS)) == list(range(8))
    assert again.info.status == "FINISHED"

    params = again.data.params
    overrides = params["overrides"]  # the command line's overrides, as one parameter
    for override in ("logger=mlflow", "optimizer.lr=1e-3", *ARGS):
        assert f"'{override}'" in overrides, overrides
    assert params["max_duration"] == "8ba" and params["run_name"] == name
    assert params["device_train_microbatch_size"] == "8" and "microbatch" not in overrides  # the first start's
    assert "load_path" not in params  # the resume point of a start is not a parameter of the run

    history = client.get_metric_history(again.info.run_id, LOSS)
    after = sorted(m.step for m in history if m.timestamp >= resumed_at)
    # continued from the checkpoint, not from the start: batches 5-8 (composer logs a batch's loss at the count
    # of batches done before it: steps 4-7)
    assert after == [4, 5, 6, 7], after
    assert all(m.value > 0 for m in history)
    metrics = json.loads(next((root / "outputs").rglob("metrics.json")).read_text())
    last = max(history, key=lambda m: (m.step, m.timestamp))
    assert last.value == pytest.approx(metrics["final_train_loss"], rel=1e-6)

    # The same command once the run's checkpoints are deleted: another training from batch 0, in a tracking run of
    # its own (the same name alone would have logged its batches 1-8 into the first one's history)
    shutil.rmtree(root / "checkpoints" / name)
    fresh = run(*cmd, "device_train_microbatch_size=2", root=root, env=env, check=True)
    assert "resuming from" not in fresh.stderr and "a new MLflow run" in fresh.stderr
    assert "parameters differ" not in fresh.stderr  # the values the first training's run logged are not its own
    [second, _, first_again] = runs()  # newest first
    assert first_again.info.run_id == first.info.run_id and second.info.run_name == name
    assert client.get_metric_history(first.info.run_id, LOSS) == history  # the first training's, untouched
    assert sorted(m.step for m in client.get_metric_history(second.info.run_id, LOSS)) == list(range(8))
    assert second.data.params["device_train_microbatch_size"] == "2"  # its own, not the first training's 8


def wandb_records(run_file: Path, killed: bool = False) -> dict:
    """{record type: [record]} of a W&B run file, read with W&B's own reader. killed: the writer was SIGKILLed,
    so its last record may be cut short (the reader asserts on it): the records before it are read."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    if killed and run_file.stat().st_size == 0:
        return {}  # killed before W&B's writer wrote anything
    store = datastore.DataStore()
    store.open_for_scan(str(run_file))
    found = {}
    while True:
        try:
            data = store.scan_data()
        except AssertionError:
            if not killed:
                raise
            break
        if data is None:
            break
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        found.setdefault(record.WhichOneof("record_type"), []).append(record)
    return found


def wandb_history(records: dict) -> dict:
    """{step: loss} of the run's history."""
    out = {}
    for record in records.get("history", []):
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        if LOSS in items:
            out[items["_step"]] = items[LOSS]
    return out


def wandb_config(records: dict) -> dict:
    out = {}
    for record in records.get("config", []):
        for item in record.config.update:
            out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    out.pop("_wandb", None)
    return out


@pytest.mark.train
def test_wandb_offline_run_folders_hold_the_history_and_every_start_keeps_the_run_id_and_config(tmp_path):
    root, wandb_dir = tmp_path / "root", tmp_path / "wandb"  # not made yet: the run makes it (W&B would use /tmp)
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_PROJECT": "pretrain-tests"}
    cmd = command("logger=wandb")
    kill_after_checkpoint(root, cmd, batch=4, env=env)
    run(*cmd, root=root, env=env, check=True)  # resumes from the batch-4 checkpoint
    assert "nothing to do" in run(*cmd, root=root, env=env, check=True).stderr  # the run is finished; a start all the same
    name = run_name(root)

    # one offline folder per start, each of the one W&B run of this training (`wandb sync` sends them to it): its
    # id is the run_name and the time its first start began
    folders = sorted((wandb_dir / "wandb").glob("offline-run-*"))
    [wandb_id] = {f.name.split("-", 3)[3] for f in folders}
    assert len(folders) == 3 and re.fullmatch(f"{name}-[0-9]{{8}}-[0-9]{{6}}", wandb_id), folders
    killed = wandb_records(folders[0] / f"run-{wandb_id}.wandb", killed=True)
    resumed, finished = (wandb_records(f / f"run-{wandb_id}.wandb") for f in folders[1:])
    assert resumed["run"][0].run.run_id == wandb_id and resumed["run"][0].run.project == "pretrain-tests"
    assert resumed["run"][0].run.display_name == name

    history = wandb_history(resumed)  # batches 5-8, at composer's steps 4-7: continued from the checkpoint
    assert sorted(history) == [4, 5, 6, 7] and all(v > 0 for v in history.values()), history
    assert set(wandb_history(killed)) <= set(range(5))
    assert not wandb_history(finished)

    config = wandb_config(resumed)
    assert "'logger=wandb'" in str(config["overrides"]) and config["max_duration"] == "8ba"
    # The two starts resumed from different checkpoints (ep0-ba4, ep0-ba8) and log the same config: a resumed
    # W&B run refuses a changed value. (The finished start stops before training: it logs no more than that.)
    later = wandb_config(finished)
    assert "load_path" not in config and later and {k: config.get(k) for k in later} == later

    # its checkpoints deleted, the same command trains from batch 0 again: a W&B run of its own, batches 1-8
    shutil.rmtree(root / "checkpoints" / name)
    run(*cmd, root=root, env=env, check=True)
    [newest] = set(sorted((wandb_dir / "wandb").glob("offline-run-*"))) - set(folders)
    other_id = newest.name.split("-", 3)[3]
    assert other_id != wandb_id and other_id.startswith(f"{name}-")
    assert sorted(wandb_history(wandb_records(newest / f"run-{other_id}.wandb"))) == list(range(8))


# The settings checks, in-process (fast tier): the values are never echoed.
SECRET = "s3cr3t-value-0123456789"


@pytest.mark.parametrize("overrides,key,words", [
    (["logger=wandb", f"+loggers.wandb.init_kwargs.settings.api_key={SECRET}"],
     "loggers.wandb.init_kwargs.settings.api_key", "looks like a credential"),
    (["logger=mlflow", f"loggers.mlflow.tracking_uri='https://bob:{SECRET}@mlflow.example.com'"],
     "loggers.mlflow.tracking_uri", "a URL with a password"),
    (["logger=mlflow", "loggers.mlflow.tracking_uri=sqlite:////tmp/mlflow.db"], "loggers.mlflow.tracking_uri",
     "database store"),
    (["logger=wandb", "run_name=a:b"], "run_name", "W&B refuses ids"),
])
def test_logger_settings_refused_with_the_key_and_no_secret(overrides, key, words):
    from train.checks import Context, check, errors
    from train.config.compose import compose

    problems = errors(check(compose(overrides), Context(mode="run", overrides=tuple(overrides))))
    assert [p.key for p in problems] == [key] and words in str(problems[0])
    assert not any(SECRET in str(p) for p in problems)


def test_a_tracking_uri_with_a_password_from_the_environment_is_refused_unechoed(monkeypatch):
    from train.checks import Context, check, errors
    from train.config.compose import compose

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"https://bob:{SECRET}@mlflow.example.com")
    problems = errors(check(compose(["logger=mlflow"]), Context(mode="run", overrides=("logger=mlflow",))))
    assert [p.key for p in problems] == ["loggers.mlflow.tracking_uri"]
    assert not any(SECRET in str(p) for p in problems)


def test_every_logger_composes_to_llm_foundry_keys_and_a_tracking_location():
    from train.checks import resolve_all
    from train.checks.values import FOUNDRY_KEYS, PRODUCT_KEYS
    from train.config.compose import compose

    for logger in ("none", "mlflow", "wandb"):
        cfg = compose([f"logger={logger}"])
        resolve_all(cfg)
        assert set(cfg) <= FOUNDRY_KEYS | PRODUCT_KEYS
        assert sorted(cfg.get("loggers") or {}) == ([] if logger == "none" else [logger])
    cfg = compose(["logger=mlflow"])
    resolve_all(cfg)
    # no MLFLOW_TRACKING_URI: a file store beside the outputs, not the working directory (a -m task's is removed)
    if "MLFLOW_TRACKING_URI" not in os.environ:
        assert cfg.loggers.mlflow.tracking_uri == f"file://{cfg.storage.output_root}/mlruns"
        # a relative output root too: `file://out/mlruns` is host `out`, path /mlruns, to MLflow
        cfg = compose(["logger=mlflow", "storage.output_root=out"])
        resolve_all(cfg)
        assert cfg.loggers.mlflow.tracking_uri == f"file://{Path('out').resolve()}/mlruns"
    assert cfg.loggers.mlflow.run_name == cfg.run_name and cfg.loggers.mlflow.resume is True
    cfg = compose(["logger=wandb"])
    resolve_all(cfg)
    assert cfg.loggers.wandb.init_kwargs.id == cfg.run_name and cfg.loggers.wandb.init_kwargs.resume == "allow"


@pytest.mark.torch  # train/task/tracking.py imports composer
@pytest.mark.parametrize("logger, resumed, env, want", [
    # a start from batch 0 opens a tracking run of its own and starts the record afresh
    ("mlflow", None, {}, (False, None, None, "a new MLflow run", "deleted")),
    ("wandb", None, {}, (None, None, "RUN-*", "a new W&B run, id RUN-", "deleted")),
    ("none", None, {}, (None, None, None, None, "deleted")),  # a later start with a logger must not find the old run
    # a start that resumes continues its training's, by the id its save folder records
    ("wandb", "ckpt", {}, (None, None, "RUN-20261128-010203", "continuing the W&B run", "kept")),
    ("mlflow", "ckpt", {}, (None, "0a1b2c", None, "continuing the MLflow run 0a1b2c", "kept")),
    # a tracking run the configuration names stays as configured, with its record
    ("wandb:my-id", None, {}, (None, None, None, None, "kept")),
    ("wandb:my-id", "ckpt", {}, (None, None, None, None, "kept")),
    ("wandb:set-as-RUN", None, {}, (None, None, None, None, "kept")),  # ++loggers.wandb.init_kwargs.id=<run_name>
    ("wandb:must", None, {}, (None, None, None, None, "kept")),
    ("mlflow", None, {"MLFLOW_RUN_ID": "abc"}, (None, None, None, None, "kept")),
    ("mlflow", "ckpt", {"MLFLOW_RUN_ID": "abc"}, (None, None, None, None, "kept")),
])
def test_a_start_from_batch_0_opens_its_own_tracking_run_and_a_resumed_one_continues_its_trainings(
        tmp_path, monkeypatch, logger, resumed, env, want):
    from train.task.tracking import RECORD, _choose

    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    name, _, how = logger.partition(":")
    loggers = {"mlflow": {"resume": True, "run_name": "RUN"},
               "wandb": {"init_kwargs": {"id": "my-id" if how == "my-id" else "RUN",
                                         "resume": "must" if how == "must" else "allow"}}}
    loggers = OmegaConf.create({name: loggers[name]} if name in loggers else {})
    record = tmp_path / RECORD
    tracker = "wandb RUN-20261128-010203" if name == "wandb" else "mlflow  RUN"
    record.write_text(json.dumps({"tracker": tracker, "values": {}, "run_id": "0a1b2c"}))
    *chosen, said = _choose(loggers, resumed, record, record, "RUN", wandb_default=how != "set-as-RUN")
    *wanted, want_said, want_record = want
    if str(wanted[2]).endswith("*"):
        assert re.fullmatch(r"RUN-\d{8}-\d{6}", chosen[2]), chosen
        chosen[2] = wanted[2]
    assert chosen == wanted
    assert (said is None) if want_said is None else want_said in said
    assert record.exists() == (want_record == "kept")


@pytest.mark.torch  # train/task/tracking.py imports composer
def test_a_recorded_mlflow_run_is_continued_only_where_mlflow_can_continue_it(tmp_path):
    """A resumed start continues the run its save folder records, unless this store cannot (the run deleted, or
    the tracking URI is another store): composer's start_run would raise on rank 0 alone."""
    from mlflow import MlflowClient

    from train.task.tracking import _not_continuable

    uri = f"file://{tmp_path / 'mlruns'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("pretrain-tests")
    kept, deleted = (client.create_run(experiment).info.run_id for _ in range(2))
    client.delete_run(deleted)
    assert _not_continuable(uri, kept) is None
    assert _not_continuable(uri, deleted) == "is deleted in MLflow"
    assert "is not in this tracking store" in _not_continuable(f"file://{tmp_path / 'other'}", kept)


@pytest.mark.torch  # train/task/tracking.py imports composer
def test_a_resumed_start_continues_its_recorded_mlflow_run_and_leaves_no_trace_for_the_next_run(tmp_path,
                                                                                               monkeypatch):
    """The run id reaches composer through $MLFLOW_RUN_ID for this start's trainer only: a next run in the same
    process (a sweep's next point under Hydra's basic launcher) would otherwise continue this one's."""
    from mlflow import MlflowClient

    from train.task import tracking

    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    uri = f"file://{tmp_path / 'mlruns'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("pretrain-tests")).info.run_id
    (tmp_path / tracking.RECORD).write_text(json.dumps({"tracker": "mlflow  RUN", "values": {}, "run_id": run_id}))
    fcfg = OmegaConf.create({"run_name": "RUN", "save_folder": str(tmp_path), "autoresume": False,
                             "loggers": {"mlflow": {"resume": True, "tracking_uri": uri}},
                             "callbacks": {"tracking": {"tracker": "mlflow  RUN"}}})
    tracking.for_this_training(fcfg, f"{tmp_path}/ep0-ba4-rank0.pt")
    assert os.environ["MLFLOW_RUN_ID"] == run_id and fcfg.loggers.mlflow.resume is True
    tracking.after_the_trainer()
    assert "MLFLOW_RUN_ID" not in os.environ
    # its own checkpoint named by hand (autoresume=false load_path=...): this training goes on, in its run
    tracking.for_this_training(OmegaConf.merge(fcfg, {"load_path": f"{tmp_path}/ep0-ba4-rank0.pt"}), None)
    assert os.environ["MLFLOW_RUN_ID"] == run_id and (tmp_path / tracking.RECORD).exists()
    tracking.after_the_trainer()
    client.delete_run(run_id)  # a run MLflow cannot continue: composer's search by name instead, said
    tracking.for_this_training(fcfg, f"{tmp_path}/ep0-ba4-rank0.pt")
    assert "MLFLOW_RUN_ID" not in os.environ


@pytest.mark.torch  # train/task/tracking.py imports composer
def test_a_tracking_server_that_does_not_answer_delays_a_checkpoint_by_a_bounded_wait_said(monkeypatch, caplog):
    """MLflow retries a request to an unreachable server for minutes; the checkpoint waits FLUSH_WAIT_S for the
    queue, says so, and training goes on (the queue's send stands in for the server: a run against a server that
    never answers would hang first where it opens its MLflow run)."""
    import mlflow

    from train.task import tracking

    started = []
    monkeypatch.setattr(tracking, "_mlflow_run_id", lambda: "0a1b2c")
    monkeypatch.setattr(tracking, "FLUSH_WAIT_S", 1)
    monkeypatch.setattr(mlflow, "flush_async_logging", lambda: started.append(1) or time.sleep(5))
    t0 = time.monotonic()
    tracking.flush_queued("step 4/8")
    assert started and 1 <= time.monotonic() - t0 < 5  # not the 5 s the flush takes
    assert "not sent within 1 s before the checkpoint at step 4/8" in caplog.text
    caplog.clear()
    monkeypatch.setattr(mlflow, "flush_async_logging", lambda: started.append(2))
    tracking.flush_queued("step 8/8")
    assert started[-1] == 2 and "not sent" not in caplog.text


@pytest.mark.torch  # train/task/tracking.py imports composer
def test_a_wandb_id_the_user_sets_is_told_from_the_presets_run_name_even_when_equal():
    from train.config.compose import compose
    from train.task.tracking import _wandb_id_is_the_run_name

    assert _wandb_id_is_the_run_name(compose(["logger=wandb"]))
    cfg = compose(["logger=wandb", "run_name=foo", "loggers.wandb.init_kwargs.id=foo"])
    assert cfg.loggers.wandb.init_kwargs.id == "foo" and not _wandb_id_is_the_run_name(cfg)
    assert not _wandb_id_is_the_run_name(compose(["logger=mlflow"]))


@pytest.mark.parametrize("args", [
    ["logger=wandb", "loggers.wandb.init_kwargs.id=my-id"],
    ["logger=mlflow", "loggers.mlflow.resume=false", "loggers.mlflow.experiment_name=mine"],
    ["-m", "logger=wandb", "loggers.wandb.project=a,b"],
])
def test_the_keys_a_chosen_logger_sets_are_overrides_as_the_docs_write_them(args):
    """docs/tracking.md's `loggers.<name>.<key>=...` beside `logger=<name>`: keys of the composed config, which the
    check before Hydra refused as keys of no config (the logger presets add `loggers` at the top)."""
    from train.checks.gate import hydra_problems
    from train.config.compose import compose

    assert hydra_problems(args) == []
    cfg = compose([a for a in args if a != "-m" and "," not in a])
    assert OmegaConf.select(cfg, args[-1].split("=")[0], default="absent") != "absent"
    # without the preset, refused here, by key, with the preset to choose and no secret (Hydra's error echoes it)
    [problem] = hydra_problems([f"loggers.mlflow.tracking_uri=https://u:{SECRET}@h"])
    assert problem.key == "loggers.mlflow.tracking_uri" and "logger=mlflow or logger=wandb" in problem.fix
    assert SECRET not in problem.render()


PROBE = ("import atexit, runpy, sys\n"
         "atexit.register(lambda: print('HEAVY', sorted(m for m in ('torch', 'llmfoundry', 'composer', 'mlflow', "
         "'wandb') if m in sys.modules), file=sys.stderr))\n"
         "sys.argv = ['train'] + sys.argv[1:]\n"
         "runpy.run_module('train', run_name='__main__')\n")


@pytest.mark.parametrize("args", [
    ["logger=mlflow", "plan=json"],
    ["-m", "logger=wandb", "cluster=slurm-local", "optimizer.lr=1e-4,2e-4", "plan=true"],
    ["logger=mlflow", "--cfg", "job"],
], ids=["mlflow-plan", "wandb-sweep-plan", "cfg"])
@pytest.mark.e2e
def test_a_look_imports_no_tracker_and_writes_nothing(tmp_path, args):
    root = tmp_path / "root"
    root.mkdir()
    # WANDB_MODE=offline: never reached, nothing may start a W&B run here
    proc = run("-c", PROBE, *args, root=root, env={"WANDB_MODE": "offline"}, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "HEAVY []" in proc.stderr, proc.stderr[-2000:]
    assert list(root.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["root"]
