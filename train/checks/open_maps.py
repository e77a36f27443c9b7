"""Rules about the two open maps, `cluster.sbatch_extra` and `cluster.env`: any key goes in, so a typo goes in too,
and reaches Slurm (sbatch refuses an unknown option only once the sweep folder is made) or sets a variable that
nothing reads beside the preset's own. Light: the option list is kept here, no Slurm client needed.
"""
from train.checks.core import WARNING, Problem, nearest, override_key, value
from train.launch.executor import sbatch_name

# sbatch's long options: those `sbatch --help` lists (Slurm 22.05, the loopback cluster's; tests/test_open_maps.py
# compares), and those its manual documents beside them.
SBATCH_HELP = frozenset("""
account array bb bbf begin chdir cluster-constraint clusters comment constraint container contiguous core-spec
cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution error exclude
exclusive export export-file get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task
gres gres-flags help hold ignore-pbs input job-name licenses mail-type mail-user mcs-label mem mem-per-cpu
mem-per-gpu mincpus nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-node
ntasks-per-socket output overcommit oversubscribe parsable partition power priority profile propagate qos quiet
reboot requeue reservation signal sockets-per-node spread-job switches thread-spec threads-per-core time time-min
tmp uid usage use-min-nodes verbose version wait wckey wrap
""".split())
SBATCH_MANUAL = frozenset("""
acctg-freq batch extra-node-info hint kill-on-invalid-dep mem-bind network ntasks-per-gpu
open-mode prefer test-only wait-all-nodes
""".split())
SBATCH_OPTIONS = SBATCH_HELP | SBATCH_MANUAL


# Options the job's own script sets from other keys (train/launch/executor.py through submitit). submitit writes
# `cluster.sbatch_extra` after them, so such a key would replace them with no word (`nodes=4` runs 4 nodes' ranks
# of a run planned and checked at another count; `signal=B:USR2@60` signals the batch shell alone, so no task stops
# cleanly or requeues; `time=30` beside the plan's time limit), or, spelt with dashes, stand beside them as a second
# line.
# (`requeue`/`no-requeue`: the job is requeued from its own script, up to cluster.max_num_timeout times.)
ALWAYS = {"nodes": "cluster.nodes", "ntasks-per-node": "cluster.tasks_per_node",
          "ntasks": "cluster.nodes and cluster.tasks_per_node", "cpus-per-task": "cluster.cpus_per_task",
          "time": "cluster.timeout_min", "signal": "cluster.signal_delay_s", "job-name": "run_name",
          "requeue": "cluster.max_num_timeout", "no-requeue": "cluster.max_num_timeout",
          "output": None, "error": None, "open-mode": None, "array": None}  # submitit's logs and arrays
# ...and these where their key sets one (`exclusive=user` with cluster.exclusive=false adds what the script lacks)
WHEN_SET = {"gpus-per-node": "cluster.gpus_per_node", "mem": "cluster.mem_gb", "partition": "cluster.partition",
            "account": "cluster.account", "qos": "cluster.qos", "constraint": "cluster.constraint",
            "exclusive": "cluster.exclusive"}
# sbatch refuses these beside the script's own (Slurm: mutually exclusive with --mem, --cpus-per-task)
EXCLUSIVE_WITH = {"mem-per-cpu": "mem", "mem-per-gpu": "mem", "cpus-per-gpu": "cpus-per-task"}
# a second request of GPUs beside --gpus-per-node: legal, but which Slurm grants is not the plan's
MORE_GPUS = ("gpus", "gpus-per-task", "gres")


def _written(cfg) -> dict:
    """{sbatch option: the key it comes from (None: submitit's own)} of what this config's job script sets."""
    return {**ALWAYS, **{name: key for name, key in WHEN_SET.items() if value(cfg, key) not in (None, False, 0, "")}}


def sbatch_extra(cfg, ctx):
    written = _written(cfg)
    for key, given in (value(cfg, "cluster.sbatch_extra") or {}).items():
        name = sbatch_name(key)
        if name in written:
            home = written[name]
            why = f"from {home}" if home else "submitit's logs and one job per point, which train.status reads"
            fix = (f"set {home} instead" if home else f"leave out cluster.sbatch_extra.{key}") + (
                f", or {home}=false to give --exclusive a value of your own here" if name == "exclusive" else "")
            yield Problem(f"cluster.sbatch_extra.{key}", f"is set by the job's own script ({why}): this would "
                          "replace it, unseen by the checks and the plan", fix)
            continue
        if EXCLUSIVE_WITH.get(name) in written:
            other = EXCLUSIVE_WITH[name]
            yield Problem(f"cluster.sbatch_extra.{key}", f"beside the script's --{other} (from {written[other]}): "
                          "sbatch refuses the two together", f"set {written[other]} alone, or leave out "
                          f"cluster.sbatch_extra.{key}")
            continue
        if name in MORE_GPUS and (name != "gres" or "gpu" in str(given)) and "gpus-per-node" in written:
            yield Problem(f"cluster.sbatch_extra.{key}", "asks for GPUs beside the script's --gpus-per-node (from "
                          "cluster.gpus_per_node): the job may get other GPUs than the plan and the checks count",
                          "set cluster.gpus_per_node alone", WARNING)
            continue
        if name in SBATCH_OPTIONS:
            continue
        close = nearest(name, SBATCH_OPTIONS, cutoff=0.75)
        if close:  # a typo of a real option: sbatch refuses it ("unrecognized option"), after the sweep folder
            yield Problem(f"cluster.sbatch_extra.{key}", f"is not an sbatch option (sbatch would refuse it: "
                          f"unrecognized option '--{name}')", f"did you mean cluster.sbatch_extra.{close}?")
        else:  # perhaps an option of a newer Slurm than the one this list was made from
            yield Problem(f"cluster.sbatch_extra.{key}", "is not an option of sbatch 22.05 (sbatch --help and its "
                          "manual): an older sbatch refuses it", "check `sbatch --help` on the cluster", WARNING)


def env_near_misses(cfg, ctx):
    """A variable the command line adds next to a preset variable of almost the same name."""
    env = value(cfg, "cluster.env") or {}
    given = {override_key(o).removeprefix("cluster.env.") for o in ctx.overrides
             if override_key(o).startswith("cluster.env.")}
    preset = [k for k in env if k not in given]
    for name in sorted(given & set(env)):
        close = nearest(name, preset, cutoff=0.85)
        if close:
            yield Problem(f"cluster.env.{name}", f"is set beside the preset's {close}, a name one typo away: "
                          f"nothing reads {name}", f"did you mean cluster.env.{close}={env[name]}?", WARNING)


RULES = [sbatch_extra, env_near_misses]
