"""The checks, run where Hydra lets them run before it writes anything.

Hydra makes a plain run's folder (`.hydra/` with every override, the job log) and a sweep's folder
(`multirun.yaml`) before the task or the launcher starts; its callbacks run earlier. So every check, and `plan`,
happens here: a refused run, a plan (and `--cfg`, `--help`, which never reach a callback) write nothing anywhere.
Hydra's global state is read here, once, into each config's Context.
"""
import sys

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def _context(config: DictConfig, cfg: DictConfig, overrides, sweep: bool):
    from train.checks import Context

    plan = OmegaConf.select(cfg, "plan", default=None)
    mode = "plan" if plan not in (None, False) else "sweep" if sweep else "run"
    return Context(mode=mode, overrides=tuple(overrides), choices=dict(config.hydra.runtime.choices))


class CheckBeforeWriting(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        from common.compose import without_hydra
        from train.checks import check, report

        HydraConfig.instance().set_config(config)  # as run_job does next: `${run_id:...}` reads the overrides
        cfg = without_hydra(config, OmegaConf.select(config, "hydra.run.dir"))
        ctx = _context(config, cfg, config.hydra.overrides.task, sweep=False)
        problems = _checked(lambda: check(cfg, ctx))
        if not report(problems):
            sys.exit(2)
        if ctx.mode == "plan":
            from train.forecast_report import print_plan

            print_plan(cfg, problems)
            sys.exit(0)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig

        from common.compose import CHECKED_POINTS, sweep_points
        from train.checks import ConfigError, check, check_points, errors, report, resolve_all

        HydraConfig.instance().set_config(config)
        loader = GlobalHydra.instance().config_loader()
        sweep_dir = OmegaConf.select(config, "hydra.sweep.dir")

        def points():
            """Each point composed and resolved while its own Hydra context is set (`${run_id:...}` reads the
            point's overrides). A point that does not resolve is checked as it is, so that its problems name
            their keys (storage.tier, not the storage.write_GBps that interpolates it)."""
            cfgs, ctxs, unresolved = [], [], {}
            for num, (overrides, cfg) in enumerate(sweep_points(loader, config, sweep_dir)):
                ctx = _context(config, cfg, overrides, sweep=True)
                try:
                    resolve_all(cfg)
                except ConfigError as err:
                    found = check(cfg, ctx)
                    unresolved[num] = [p.at_point(num) for p in (found if errors(found) else found + err.problems)]
                cfgs.append(cfg)
                ctxs.append(ctx)
            return cfgs, ctxs, unresolved

        cfgs, ctxs, unresolved = _checked(points)
        problems = _checked(lambda: check_points(cfgs, ctxs, unresolved))
        if not report(problems):
            sys.exit(2)
        # checked and resolved: the launcher submits these (each point composed once)
        CHECKED_POINTS[str(sweep_dir)] = [(list(c.overrides), cfg) for c, cfg in zip(ctxs, cfgs)]
        if ctxs and ctxs[0].mode == "plan":
            from train.forecast_report import print_plans

            print_plans(cfgs, problems)
            sys.exit(0)


def _checked(fn):
    """fn(), with a ConfigError (a value missing or unresolvable where checking could not go on) printed as the
    problems it holds, exit 2."""
    from train.checks import ConfigError, report

    try:
        return fn()
    except ConfigError as err:
        report(err.problems)
        sys.exit(2)
