"""Training's side of the sweep launcher (common/sweep/): its points composed and checked, each
point's resources (from its own `cluster` group, so `-m cluster.nodes=1,2` really asks for 1 and 2 nodes), its
objective (the metric `objective` names, for Hydra's sweepers), a point whose run already finished, and what its
summary row shows. data_prep's side is data_prep/sweep_app.py. Light: no torch, no llm-foundry.
"""
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, read_write

from common.sweep.contract import Point, SweepApp


def eval_loss(final_eval: dict) -> float | str | None:
    """The final evaluation's cross-entropy: a number with one evaluator; with several (llm-foundry's eval_loaders,
    reported as eval/<label>/LanguageCrossEntropy) each label's, `a=3.26 b=3.3`, so that no evaluator's is left out
    or passed off as the run's."""
    if "eval/LanguageCrossEntropy" in final_eval:
        return final_eval["eval/LanguageCrossEntropy"]
    labelled = [(k.split("/")[1], v) for k, v in final_eval.items()
                if k.count("/") == 2 and k.startswith("eval/") and k.endswith("/LanguageCrossEntropy")]
    return " ".join(f"{label}={v:.4g}" for label, v in labelled) or None


def _eval_differences(cfg: DictConfig, report) -> list | None:
    """`key: X there, Y here` for each evaluation setting where this point's config and the finished run's (its
    report folder's .hydra/config.yaml) differ, both resolved; None where that config cannot be read or resolved
    here (a resolver of its job's Hydra context): then they may differ."""
    from train.config.identity import EVALUATION

    def value(c, key):
        node = OmegaConf.select(c, key, default=None, throw_on_missing=False)
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node

    try:
        theirs = OmegaConf.load(Path(report) / ".hydra" / "config.yaml")
        return [f"{key}: {value(theirs, key)} there, {value(cfg, key)} here" for key in EVALUATION
                if value(theirs, key) != value(cfg, key)]
    except Exception:  # OSError, a YAML error, an interpolation OmegaConf cannot resolve outside that job
        return None


def _interventions(found) -> dict:
    """The columns of a run's interventions: their count ("" where the run recorded none yet) and each in words."""
    if not found:
        return {"interventions": "" if found is None else 0, "spikes": ""}
    return {"interventions": len(found), "spikes": "; ".join(
        f"{i.get('action')} at batch {i.get('batch')} (loss {i.get('loss', 0):.4g}, window mean "
        f"{i.get('window_mean', 0):.4g})" + (f" to batch {i['resumed_from']}, {i.get('skip_batches')} batches "
                                             f"skipped, lr {i['lr']:.3g}" if i.get("lr") is not None else "")
        for i in found)}


class TrainApp(SweepApp):
    status_command = "python -m train.status"
    wait_key = "cluster.wait"
    failed_exit = 1  # a point that did not complete
    log_tail = True  # a failed rank's last log lines beside its error: a training failure may need them
    # what a terminal shows (python -m train.status); the summary files hold every column
    shown = ("point", "overrides", "job_id", "state", "requeues", "step", "loss", "tokens_per_sec", "mfu", "goodput",
             "interventions", "eta", "last_progress", "continued_from", "preflight", "log", "error")
    shown_where_set = ("error", "preflight", "continued_from", "interventions")

    def configs(self, launcher, job_overrides: list, first: int) -> list:
        """Every point given, composed as its job will compose it and resolved while its own Hydra context is
        set (`${run_id:...}` reads the point's overrides), then checked together (train/checks/): every problem
        of every point at once, raised as one ConfigError. Points that train the same thing get a run name each
        (train/config/identity.py). With plan=true: every point's plan, then exit 0; nothing is written."""
        from hydra.core.hydra_config import HydraConfig

        from common.compat import hydra_context_again, hydra_context_now
        from common.compose import kept_points, sweep_points
        from train.checks import ConfigError, errors, report, resolve_all, validate
        from train.checks.gate import context
        from train.config.identity import distinct_names, run_name

        config, loader = launcher.config, launcher.hydra_context.config_loader
        HydraConfig.instance().set_config(config)
        sweep_dir = config.hydra.sweep.dir

        # Each point composed once (its Hydra context set while it is made) and named; then the points that train
        # the same thing get a name each (distinct_names); then each is resolved and its context made, under its
        # own Hydra context again. A point that does not resolve is checked as it is, so that its problems name
        # their keys (storage.tier, not the storage.write_GBps that interpolates it).
        made, cfgs, ctxs, checked = [], [], [], {}
        with kept_points():
            for overrides, cfg in sweep_points(loader, config, sweep_dir, job_overrides, first):
                made.append((overrides, cfg, hydra_context_now(), run_name(cfg)))
            renamed = distinct_names([m[0] for m in made], [m[3] for m in made])
            for num, ((overrides, cfg, hydra_node, name), new) in enumerate(zip(made, renamed)):
                hydra_context_again(hydra_node)
                if new is not None:  # a point that trains what another does, run differently: a run of its own
                    overrides = [*overrides, f"run_name={new}"]
                if new or name:  # the name its interpolation gives, made once
                    with read_write(cfg):
                        cfg.run_name = new or name
                ctx = context(config, cfg, overrides, sweep=True)
                try:
                    resolve_all(cfg)
                except ConfigError as err:  # checked now, while its Hydra context is set (its run name reads it)
                    checked[num] = validate([cfg], [ctx], first=first + num, unresolved={0: err.problems})
                cfgs.append(cfg)
                ctxs.append(ctx)
            problems = validate(cfgs, ctxs, first=first, checked=checked)
        if errors(problems):
            raise ConfigError(problems=problems)
        report(problems)  # the warnings
        if ctxs and ctxs[0].mode == "plan":
            from train.plan.forecast_report import print_plans

            if launcher.batch_of:  # Optuna's trials, or the basic sweeper's max_batch_size: more points come later
                print(f"note: this plan is of the first batch the {launcher.batch_of} launched ({len(cfgs)} point{'s' * (len(cfgs) != 1)}): "
                      "it launches the others later, each batch checked as it is launched (the default "
                      "hydra/sweeper=checked checks and plans every point of a grid at once)", file=sys.stderr)
            print_plans(cfgs, problems, batch_of=launcher.batch_of)
            sys.exit(0)
        return [(list(c.overrides), cfg) for c, cfg in zip(ctxs, cfgs)]

    def job_overrides(self, overrides: list, sweep_dir) -> list:
        """`yaml=PATH` becomes a copy of the recipe as this command read and checked it, in the sweep's
        .recipes/<hash>/ (train/config/recipe_yaml.py): a job composes from it when it starts, after the queue,
        and again after each requeue, whatever the file holds by then. The copy keeps the file's name, which the
        run's name starts with; the summary still shows the path given."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from train.config.compose import quoted_path
        from train.config.recipe_yaml import pinned

        parser = OverridesParser.create()
        out = []
        for o in overrides:
            parsed = parser.parse_override(o) if o.lstrip("+").startswith("yaml=") else None
            if parsed is not None and isinstance(parsed.value(), str):
                o = "yaml=" + quoted_path(pinned(parsed.value(), Path(sweep_dir) / ".recipes"))
            out.append(o)
        return out

    def report(self, err) -> None:
        from train.checks import report

        report(err.problems)

    def spec(self, cfg: DictConfig, params):
        """The point's run spec (train/launch/spec.py): its resources from its own cluster group, whether the
        sweep waits (a local one always does; on Slurm, cluster.wait), the summary job's resources."""
        from train.launch import spec

        return spec.of(cfg, params["submitit_folder"])

    def finished(self, cfg: DictConfig):
        """A finished run of this point (nothing is submitted for it): its numbers are reported, from its own
        evaluation. Evaluation settings are not part of a run's identity (train/config/identity.py), so this
        point may ask for others: said, as the single run says it (train/task/main.py)."""
        from train.launch.finished import read

        found = read(cfg, verify=True)
        if found is not None:
            differ = _eval_differences(cfg, found.get("report"))
            if differ != []:  # None: the run's own settings cannot be read, so they may differ
                said = (f" ({'; '.join(differ)})" if differ else
                        " (its config, .hydra/config.yaml in its report folder, is not there to compare)")
                logging.getLogger("sweep").warning(
                    f"[sweep] {cfg.run_name} finished earlier: the numbers reported for it (eval_loss, the "
                    f"objective) are that run's, from its own evaluation settings{said}; settings of evaluation do "
                    f"not make another run: to score it under others, python -m train.evaluate {cfg.run_name} "
                    f"--data <MDS folder>")
        return found

    def objective(self, cfg: DictConfig, value):
        from train.launch.finished import objective

        return objective(cfg, value)

    def record(self, point: Point) -> dict:
        """What the status needs of a point besides its job: its shape and folders."""
        cfg, spec = point.cfg, point.spec
        report, world, done = spec.report_folder, spec.world_size, {}
        if point.finished is not None:  # nothing submitted: the row shows what the finished run left, and its
            # numbers from finished.json where its report folder is gone; its world size, not this command's
            report, done = point.finished.get("report") or report, point.finished.get("value") or {}
            world = done.get("world_size") or world
        return {"world_size": world, "checkpoint": spec.save_folder, "run": spec.run_name,
                # train/task/run_report.py writes progress.json, metrics.json and the loss curve there
                "report": report, **({"finished": done} if done else {}),
                # said once the point is submitted: where what the job is for will be
                **({"note": f"preflight table: {report}/preflight.json (and in its log; `python -m train.status` "
                            "shows the verdict)", "preflight_only": True} if cfg.cluster.preflight.only else {})}

    def columns(self, point: dict, state: str) -> dict:
        """A point's columns from what its rank 0 wrote (train/task/run_report.py): progress.json as it trains,
        metrics.json at the end."""
        from common.files import read_json
        from common.sweep.outcomes import existing
        from common.sweep.status import GOING
        from train.task.goodput import said
        from train.task.preflight_report import exclusions, latest

        report = Path(point["report"])
        found = [read_json(report / name) for name in ("progress.json", "metrics.json")]
        progress, metrics = (of_run(f, point.get("run")) for f in found)
        # another run's report files in this point's folder (see of_run): nothing of its files either (its loss
        # curve, progress age, preflight verdicts), and the folder is read as holding none of this point's yet
        others = any(f and not ours for f, ours in zip(found, (progress, metrics)))
        done_before = point.get("finished")
        if not done_before and not metrics and state == "COMPLETED" and not point.get("preflight_only"):
            # a point submitted with nothing to train (its run already past this max_duration: the task says so
            # and reports the checkpoint's numbers) writes no report of its own: those, from the run's finished.json
            from train.launch.finished import last

            done_before = of_run((last(point.get("checkpoint")) or {}).get("metrics") or {}, point.get("run"))
        # a run finished earlier (nothing submitted): its finished.json's numbers where its report folder is gone,
        # or holds a later stretch's since (the run continued to a longer max_duration under run_name=)
        if done_before and metrics.get("batches") != done_before.get("batches"):
            metrics, progress = done_before, (
                {"progress": f"step {done_before['batches']}"} if done_before.get("batches") else {})
        done = state == "COMPLETED"
        try:  # how long ago rank 0 last wrote a progress line: a point that stopped moving shows it
            age = None if others else time.time() - (report / "progress.json").stat().st_mtime
        except OSError:
            age = None
        going = state.split(" ")[0] in GOING  # "PENDING (Resources)"; an ended point has no ETA
        # Requeues of the point's job: Slurm's count (its accounting: status.rows) where it could be asked,
        # else what rank 0 recorded of SLURM_RESTART_COUNT as its latest start began training (a file
        # without that record: its starts after the first). A record of another job (an earlier sweep's, in
        # this report folder) says nothing of this one's.
        own = progress.get("job") in (None, str(point.get("job_id"))) or point.get("job_id") is None
        recorded = int(progress.get("requeues", max(0, int(progress.get("starts", 1)) - 1))) if own else 0
        slurm = point.get("slurm_requeues")
        requeues = recorded if slurm is None else max(slurm, recorded)  # accounting may lag a moment
        # A start after the one that wrote progress.json has not begun training yet (importing, its preflight
        # check, loading its checkpoint; or it is queued again): that record's line is no longer where the run is
        if going and (not own or recorded < requeues) and progress:
            last = progress.get("progress") or (f"step {progress['step']}" if "step" in progress else "")
            progress = {"progress": f"starting again (before: {last})" if last else "starting again"}
        eta = progress.get("eta_s")
        return {
            "requeues": requeues,
            "step": progress.get("progress") or ("" if "step" not in progress else f"step {progress['step']}"),
            "loss": progress.get("loss"),  # the mean train loss of the latest progress line
            "final_loss": metrics.get("final_train_loss") if done else None,
            "eval_loss": eval_loss(metrics.get("final_eval") or {}) if done else None,
            "tokens_per_sec": metrics.get("tokens_per_sec") if done else progress.get("tokens_per_sec"),
            "mfu": metrics.get("mfu") if done else progress.get("mfu"),  # both over the batches alone
            # the share of the run's allocated time that trained, all its starts (train/task/goodput.py): the whole
            # run's once it completed, else to its latest progress line; and where the rest went
            "goodput": (metrics if done else progress).get("goodput"),
            "goodput_parts": said((metrics if done else progress).get("goodput_parts") or {}),
            "eta": "" if eta is None or not going else str(timedelta(seconds=int(eta))),
            "last_progress": "" if age is None or not going else f"{timedelta(seconds=int(age))} ago",
            "world_size": point["world_size"],
            # where a run with continue_from= came from (train/task/continuation.py): RUN@ba<N>
            "continued_from": metrics.get("continued_from") or progress.get("continued_from") or "",
            # loss spikes and what was done about each (train/task/spike.py): how many, and each in words
            **_interventions(metrics.get("interventions", progress.get("interventions"))),
            "checkpoint": point["checkpoint"],
            "metrics": "" if others else existing(report, "metrics.json"),
            "loss_curve": "" if others else existing(report, "loss_curve.png"),
            # nodes the job's preflight check excluded before it requeued itself (train/task/preflight.py)
            "excluded": "" if others else exclusions(str(report)),
            "preflight": "" if others else latest(str(report)),  # the newest start's verdict and its report file
        }

    def finish(self, results: list, rows: list) -> bool:
        """After a waited-for sweep's summary: the per-node tables of cluster.preflight.only's passed checks (a
        failed one fails its job, naming what it found: train/task/main.py). results: each point's task value
        (None where it did not complete)."""
        from train.task.preflight_report import table

        for r, row in zip(results, rows):
            if isinstance(r, dict) and r.get("preflight"):
                print(f"\npreflight, point #{row['point']} (job {row['job_id']}):\n{table(r['preflight'])}", flush=True)
        return False


def of_run(report: dict, run: str | None) -> dict:
    """A report file (progress.json, metrics.json) of the point's run, or {}: a point folder of a sweep run again
    into the same sweep folder holds the files of whatever run had that number before (a failed point would show
    another run's metrics and loss curve). Files and points that do not record their run: kept."""
    return {} if run and report.get("run_name") not in (None, run) else report
