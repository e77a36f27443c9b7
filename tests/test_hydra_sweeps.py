"""Sweeps are Hydra's: a grid declared as config (the basic sweeper's `hydra.sweeper.params`) and an Optuna search
(conf/hparams_search/) go through the same launcher, every point checked before anything is written, each
point's objective returned to the sweeper, and a sweep run again submits nothing for the points that finished."""
import csv
import json
from pathlib import Path

import pytest
import yaml

FAST = ("max_duration=4ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=1")


def _sweeps(root: Path) -> list:
    return sorted((root / "outputs" / "sweeps").glob("*"))


def test_a_grid_declared_as_config_is_every_combination_planned_and_nothing_is_written(tmp_path, cli):
    proc = cli("train", "-m", "plan=json", "hparams_search=mpt_tiny_grid", "seed=1,2", timeout=900)
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)
    assert len(plans) == 8 and len({p["run_name"] for p in plans}) == 8  # 2 lr x 2 warmups x 2 seeds
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_bad_point_of_a_config_grid_refuses_the_sweep_with_every_problem_and_writes_nothing(tmp_path, cli):
    proc = cli("train", "-m", "hparams_search=mpt_tiny_grid", "cluster.tasks_per_node=2", "global_train_batch_size=16,15",
               timeout=900)
    assert proc.returncode == 2
    bad = [line for line in proc.stderr.splitlines() if line.startswith("error: [sweep point #")]
    # the four points with a batch of 15 (over 2 ranks), each named (the grid's own keys come first in each point)
    assert [line.split("]")[0] for line in bad] == [f"error: [sweep point #{n}" for n in (1, 3, 5, 7)], proc.stderr
    assert all("global_train_batch_size: 15 is not divisible" in line for line in bad)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_hydra_sweeper_basic_is_checked_first_and_a_plan_of_batches_says_it_shows_the_first(tmp_path, cli):
    """`hydra/sweeper=basic` (Hydra's name for its grid sweeper) checks and plans every point before anything is
    written, as the default does: Hydra's own wrote multirun.yaml first, so a plan wrote a sweep folder, and with
    max_batch_size it gave the launcher one batch at a time: the plan said `sweep of 2 points` for 3. A sweeper
    that does launch in batches (Optuna's trials) gets a plan of its first batch, saying so."""
    grid = ("-m", "optimizer.lr=1e-3,2e-3,3e-3", "hydra.sweeper.max_batch_size=2", "plan=true")
    for sweeper in ("hydra/sweeper=basic", "sweeper=checked"):
        proc = cli("train", *grid, sweeper, check=True)
        assert "sweep of 3 points:" in proc.stdout and "note:" not in proc.stderr, sweeper
    proc = cli("train", "-m", "optimizer.lr=1e-3,2e-3", "cluster.tasks_per_node=2", "global_train_batch_size=16,15",
               "hydra/sweeper=basic")
    assert proc.returncode == 2 and "error: [sweep point #1] global_train_batch_size" in proc.stderr
    proc = cli("train", "-m", "hparams_search=mpt_tiny_lr", "plan=json", check=True)
    assert len(json.loads(proc.stdout)) == 1  # the answer stays one JSON list; the note is a message
    assert "note: this plan is of the first batch the OptunaSweeper launched (1 point)" in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("launcher", ["submitit_local", "basic"])
def test_a_plan_handed_to_another_plugins_launcher_is_refused_and_nothing_is_written(tmp_path, cli, launcher):
    """hydra-submitit-launcher's `submitit_local` and Hydra's `basic` run the points as they are handed: `-m
    plan=true` with one of them trained the point (measured: a finished run's checkpoints, exit 0). Refused before
    anything is written (train.checks.validate, as the sweep starts): no task is started with plan set."""
    proc = cli("train", "-m", "plan=true", f"hydra/launcher={launcher}", "max_duration=1ba", check=2)
    assert f"error: plan: set, but hydra/launcher={launcher} runs the points: only this project's launcher shows " \
        "a sweep's plan" in proc.stderr, proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_the_launchers_resource_keys_are_refused_for_training_naming_the_cluster_key(tmp_path, cli):
    """data_prep's parts take their resources from hydra.launcher.*; a training point's from its cluster group:
    `hydra.launcher.partition=other` was taken and the job went to the preset's partition."""
    proc = cli("train", "-m", "cluster=ndv5", "model=mpt-125m", "data=mock", "hydra.launcher.partition=other",
               "hydra.launcher.timeout_min=10", "hydra.launcher.array_parallelism=1", "plan=true", check=2)
    said = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "  fix:"))]
    assert said == ["error: hydra.launcher.partition: is not read by training: a training point's job takes its "
                    "resources from its cluster group", "  fix: set cluster.partition instead",
                    "error: hydra.launcher.timeout_min: is not read by training: a training point's job takes its "
                    "resources from its cluster group", "  fix: set cluster.timeout_min instead",
                    "error: hydra.launcher.array_parallelism: is not read by training: a training point's job takes "
                    "its resources from its cluster group", "  fix: leave out hydra.launcher.array_parallelism"], said
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_an_objective_no_trial_reports_is_refused_before_anything_is_written(tmp_path, cli):
    """Optuna reads `objective` from each trial's metrics: with eval_loader=null, or several evaluators (metrics
    eval/<label>/...), the default eval/LanguageCrossEntropy is in none, and every trial would train, then fail."""
    proc = cli("train", "-m", "hparams_search=mpt_tiny_lr", "eval_loader=null")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "objective: eval/LanguageCrossEntropy is no metric of this run (it evaluates nothing" in proc.stderr
    evaluators = ("+eval_loaders=[{label:a,name:text,dataset:{local:${variables.data_local},split:val,shuffle:false,"
                  "max_seq_len:${max_seq_len}},drop_last:false,num_workers:1}]")
    proc = cli("train", "-m", "hparams_search=mpt_tiny_lr", "eval_loader=null", evaluators)
    assert proc.returncode == 2 and "fix: objective=eval/a/LanguageCrossEntropy" in proc.stderr, proc.stderr[-2000:]
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    # the fixes: a metric the run reports (plan=json: checked the same, nothing started)
    for fix in (["eval_loader=null", "objective=loss/train/total"],
                ["eval_loader=null", evaluators, "objective=eval/a/LanguageCrossEntropy"]):
        assert cli("train", "-m", "hparams_search=mpt_tiny_lr", *fix, "plan=json").returncode == 0, fix
    # an objective higher of which is better, with the direction that says so (minimized, it is refused: the fuzz
    # table, tests/test_gate_fuzz.py)
    assert cli("train", "-m", "hparams_search=mpt_tiny_lr", "objective=eval/TokenAccuracy",
               "hydra.sweeper.direction=maximize", "plan=json").returncode == 0
    # a grid sweep reads no result: nothing to refuse
    assert cli("train", "-m", "eval_loader=null", "seed=1,2", "plan=json").returncode == 0


def _trials(sweep_dir: Path) -> dict:
    """Each trial's final evaluation loss, from what its run wrote (metrics.json in its own folder)."""
    out = {}
    for metrics in sweep_dir.glob("*/metrics.json"):
        out[int(metrics.parent.name)] = json.loads(metrics.read_text())["final_eval"]["eval/LanguageCrossEntropy"]
    return out


@pytest.mark.train
def test_an_optuna_search_here_gets_each_trials_eval_loss_and_run_again_submits_nothing(tmp_path, cli):
    line = ("-m", "hparams_search=mpt_tiny_lr", "hydra.sweeper.n_trials=2", *FAST)
    first = cli("train", *line, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    [sweep_dir] = _sweeps(tmp_path)
    trials = _trials(sweep_dir)
    assert sorted(trials) == [0, 1], first.stdout
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    # what Optuna was told is what each run reported: the best value is the smaller of the two eval losses
    assert result["best_value"] == pytest.approx(min(trials.values()), rel=1e-6)
    # the same search again: the seeded sampler proposes the same trials, which are the same runs, finished; their
    # first sweep's folder (their reports) moved away: the rows show the numbers finished.json kept (were blank)
    moved = tmp_path / "moved"
    sweep_dir.rename(moved)
    again = cli("train", *line, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": nothing to submit") == 2 and "-> job" not in again.stdout, again.stdout
    newest = _sweeps(tmp_path)[-1]
    assert newest != sweep_dir and not (newest / ".submitit").exists()  # no job at all
    rows = list(csv.DictReader((newest / "summary.csv").open()))
    assert sorted(float(r["eval_loss"]) for r in rows) == pytest.approx(sorted(trials.values()), rel=1e-4), rows
    assert all(r["state"] == "COMPLETED" and r["world_size"] == "1" for r in rows), rows
    assert yaml.safe_load((newest / "optimization_results.yaml").read_text())["best_value"] == \
        pytest.approx(result["best_value"], rel=1e-6)


@pytest.mark.train
def test_an_optuna_batch_that_proposes_one_trial_twice_trains_it_once_and_tells_both_its_value(tmp_path, cli):
    """Optuna's sampler over a small space proposes the same trial twice in a batch (n_jobs=2, one value each):
    one run. The batch was refused as two points writing one save_folder, its plan too, so a search stopped
    mid-way after the batches before had trained."""
    line = ("-m", "hparams_search=mpt_tiny_lr", "optimizer.lr=choice(0.002)", "scheduler.t_warmup=choice(2ba)",
            "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2", *FAST)
    proc = cli("train", *line, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of this batch's 2 points repeat another: each is launched once" in proc.stderr
    [sweep_dir] = _sweeps(tmp_path)
    assert list(_trials(sweep_dir)) == [0]  # one run
    assert len(list((tmp_path / "checkpoints").iterdir())) == 1
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(_trials(sweep_dir)[0], rel=1e-6)


def test_a_sweeper_that_needs_results_is_refused_a_submit_and_return_sweep(slurm, tmp_path, cli):
    proc = cli("train", "-m", "cluster=slurm-local", "data=mock", "hparams_search=mpt_tiny_lr", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: cluster.wait: OptunaSweeper needs each point's result" in proc.stderr
    assert "fix: add cluster.wait=true" in proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_an_optuna_search_on_slurm_waits_for_each_trial_and_run_again_submits_nothing(slurm, tmp_path, cli):
    line = ("-m", "cluster=slurm-local", "data=mock", "cluster.wait=true", "cluster.tasks_per_node=1",
            "hparams_search=mpt_tiny_lr", "hydra.sweeper.n_trials=2", *FAST)
    first = cli("train", *line, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    [sweep_dir] = _sweeps(tmp_path)
    trials = _trials(sweep_dir)
    assert sorted(trials) == [0, 1] and first.stdout.count("-> job") == 2, first.stdout
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())["best_value"]
    assert best == pytest.approx(min(trials.values()), rel=1e-6)
    summary = (sweep_dir / "summary.md").read_text()
    assert summary.count("| COMPLETED |") == 2  # one summary of both batches
    again = cli("train", *line, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": nothing to submit") == 2 and "-> job" not in again.stdout, again.stdout


@pytest.mark.train
def test_a_finished_point_run_again_with_other_evaluation_settings_says_its_numbers_are_the_earlier_runs(tmp_path,
                                                                                                          cli):
    """Evaluation settings are not a run's identity: the point is the finished run, nothing is submitted, and its
    numbers (the summary's eval_loss, a sweeper's objective) are that run's own evaluation's: said, with what
    differs. The same settings again: nothing to say."""
    line = ("-m", "max_duration=4ba", "eval_interval=4ba", "save_interval=4ba", "progress_bar=false")
    first = cli("train", *line, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    same = cli("train", *line, timeout=900)
    assert same.returncode == 0 and ": nothing to submit" in same.stdout, same.stderr[-3000:]
    assert "from its own evaluation settings" not in same.stderr
    other = cli("train", *line, "eval_subset_num_batches=1", timeout=900)
    assert other.returncode == 0 and ": nothing to submit" in other.stdout, other.stderr[-3000:]
    assert "are that run's, from its own evaluation settings (eval_subset_num_batches: " in other.stderr, \
        other.stderr[-3000:]
    assert ", 1 here" in other.stderr


@pytest.mark.parametrize("app", [("train", "plan=true"), ("data_prep", "--help")])
def test_a_hydra_plugin_that_fails_to_import_is_named_with_the_fix_not_hydras_scan_traceback(tmp_path, cli, app):
    """hydra-nevergrad-sweeper 1.2.0 on Python 3.11 fails as Hydra imports it (not with an ImportError, which Hydra
    only warns about): every command ended in Hydra's plugin-scan traceback. A plugin of the same kind, on the path."""
    plugin = tmp_path / "plugins" / "hydra_plugins" / "broken_sweeper"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("from dataclasses import dataclass, field\n\n\n@dataclass\nclass Conf:\n"
                                        "    params: dict = {}  # a mutable default: ValueError on Python 3.11\n")
    root = tmp_path / "root"
    root.mkdir()
    proc = cli(*app, root=root, env={"PYTHONPATH": str(tmp_path / "plugins")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: hydra_plugins.broken_sweeper: a Hydra plugin installed here fails to import "
                                  "(ValueError: mutable default"), proc.stderr[-2000:]
    assert f"from {plugin / '__init__.py'}" in proc.stderr and "\n  fix: pip uninstall" in proc.stderr
    assert "Traceback" not in proc.stderr and list(root.iterdir()) == []


def test_a_trials_objective_is_of_the_training_it_asked_for():
    """A trial proposed again after its run was continued to a longer max_duration (run_name=) found nothing to
    train and reported the longer run's score as its own: a sweeper that reads results compared trainings of
    different lengths (the launcher fails such a point for it; the basic sweeper warns)."""
    from train.config.compose import compose
    from train.launch.finished import objective

    cfg = compose(["max_duration=8ba"])
    metrics = {"batches": 8, "final_train_loss": 6.3, "final_eval": {"eval/LanguageCrossEntropy": 6.29}}
    assert objective(cfg, metrics) == pytest.approx(6.29)
    with pytest.raises(ValueError) as err:
        objective(cfg, {**metrics, "batches": 12})
    assert "the run's numbers are of batch 12, and this point's max_duration=8ba ends at batch 8" in str(err.value)
    assert objective(compose(["max_duration=1ep"]), {**metrics, "batches": 12}) == pytest.approx(6.29)  # not known
