"""Rules for cluster.preflight (train/task/preflight.py, docs/cluster-run.md, "Before a big run"): values the in-job check would
trip over, refused before anything is submitted rather than found inside a job."""
from train.checks.core import Problem, is_int, is_number, positive_int, value
from train.checks.safety import CONTROL
from train.launch.spec import scheduler

ON_FAIL = ("requeue", "stop")


def preflight_settings(cfg, ctx):
    key = "cluster.preflight"
    if not value(cfg, f"{key}.enabled") and not value(cfg, f"{key}.only"):
        return
    on_fail = value(cfg, f"{key}.on_fail")
    if on_fail not in ON_FAIL:
        yield Problem(f"{key}.on_fail", f"{on_fail!r} is not requeue or stop",
                      f"{key}.on_fail=requeue (exclude the bad nodes and requeue) or {key}.on_fail=stop")
    elif on_fail == "requeue" and scheduler(cfg) == "local":
        yield Problem(f"{key}.on_fail", "requeue needs a Slurm job, and cluster=local runs on this machine",
                      f"{key}.on_fail=stop")
    for name, example in (("bytes", 1073741824), ("iters", 10)):
        yield from positive_int(cfg, f"{key}.{name}", example)
    v = value(cfg, f"{key}.max_exclusions")
    if not is_int(v) or v < 0:
        yield Problem(f"{key}.max_exclusions", f"must be a count (0: never exclude), got {v!r}",
                      f"e.g. {key}.max_exclusions=2")
    for name, example in (("tolerance", 0.75), ("min_free_memory_fraction", 0.9)):
        v = value(cfg, f"{key}.{name}")
        if not is_number(v) or not 0 < v <= 1:
            yield Problem(f"{key}.{name}", f"must be a fraction in (0, 1], got {v!r}", f"e.g. {key}.{name}={example}")
    v = value(cfg, f"{key}.node_check_timeout_s")
    if not is_number(v) or v <= 0:
        yield Problem(f"{key}.node_check_timeout_s", f"must be a positive number of seconds, got {v!r}",
                      f"e.g. {key}.node_check_timeout_s=300")
    for kind in ("intra", "inter"):
        v = value(cfg, f"{key}.expected_busbw_GBps.{kind}")
        if v is not None and (not is_number(v) or v <= 0):
            yield Problem(f"{key}.expected_busbw_GBps.{kind}", f"must be a bus bandwidth in GB/s or null, got {v!r}",
                          f"e.g. {key}.expected_busbw_GBps.{kind}=460 (null: report the figure without judging it)")
    check = value(cfg, f"{key}.node_check")
    if check in ("True", "False"):  # a flag given, which the schema's text field holds as a word: no command
        yield Problem(f"{key}.node_check", f"{check.lower()} is a flag, and node_check is the command each node "
                      f"runs (the schema made it the text {check!r}, a command that does not exist)",
                      f"{key}.node_check=null for none, or the command: e.g. {key}.node_check=nhc")
    elif check is not None and (not isinstance(check, str) or not check.strip() or CONTROL.search(check)):
        yield Problem(f"{key}.node_check", f"{check!r} is not a command on one line",
                      f"e.g. {key}.node_check=nhc or {key}.node_check='/shared/bin/gpu-check.sh --quick'")


RULES = [preflight_settings]
