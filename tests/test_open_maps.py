"""The open maps (train/checks/open_maps.py): a typo in `cluster.sbatch_extra` is refused before anything is made
(sbatch itself would refuse it, after the sweep folder), and a `cluster.env` name one typo away from the preset's
is warned."""
import os
import re
import subprocess

import pytest

import train  # noqa: F401
from train.checks import Context, check
from train.checks.open_maps import SBATCH_HELP, SBATCH_OPTIONS
from train.config.compose import compose


def problems(*overrides):
    return check(compose(list(overrides)), Context(mode="plan", overrides=overrides, choices={"cluster": "ndv5"}, scheduler="slurm"))


def test_a_misspelt_sbatch_option_is_refused_with_the_right_one():
    [p] = [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.resrvation=big") if "sbatch_extra" in p.key]
    assert p.level == "error" and p.key == "cluster.sbatch_extra.resrvation"
    assert "cluster.sbatch_extra.reservation" in p.fix
    assert not [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.reservation=big",
                                    "cluster.sbatch_extra.mail-type=END") if "sbatch_extra" in p.key]


def test_an_option_the_jobs_script_sets_is_refused_naming_its_own_key_in_either_spelling():
    """submitit writes `cluster.sbatch_extra` after the options it sets from cluster.*: `nodes=4` replaced the
    planned node count, `signal=B:USR2@60` the signal that stops and requeues the tasks, with no word."""
    for given, home in [("nodes", "cluster.nodes"), ("signal", "cluster.signal_delay_s"), ("time", "cluster.timeout_min"),
                        ("gpus_per_node", "cluster.gpus_per_node"), ("ntasks-per-node", "cluster.tasks_per_node"),
                        ("no-requeue", "cluster.max_num_timeout")]:
        [p] = [p for p in problems("cluster=ndv5", f"cluster.sbatch_extra.{given}=4") if "sbatch_extra" in p.key]
        assert p.level == "error" and p.key == f"cluster.sbatch_extra.{given}" and p.fix == f"set {home} instead", p
    [p] = [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.array=0-3") if "sbatch_extra" in p.key]
    assert p.level == "error" and "train.status reads" in p.problem
    # only what the script writes: no --account without cluster.account, no --exclusive with cluster.exclusive=false
    # (`--exclusive=user` is then the user's own); with them, refused (exclusive: how to give it a value)
    assert not [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.account=x") if "sbatch_extra" in p.key]
    assert not [p for p in problems("cluster=ndv5", "cluster.exclusive=false", "cluster.sbatch_extra.exclusive=user")
                if "sbatch_extra" in p.key]
    [p] = [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.exclusive=user") if "sbatch_extra" in p.key]
    assert p.fix == "set cluster.exclusive instead, or cluster.exclusive=false to give --exclusive a value of your " \
        "own here"


def test_an_option_sbatch_refuses_beside_the_scripts_own_is_refused_and_more_gpus_warned():
    """Slurm takes --mem-per-cpu/--mem-per-gpu or --mem, --cpus-per-gpu or --cpus-per-task, not both; a second GPU
    request (gres=gpu:4 beside --gpus-per-node=8) passed unsaid."""
    def found(*overrides):
        return [(p.key, p.level) for p in problems("cluster=ndv5", *overrides) if "sbatch_extra" in p.key]

    assert found("cluster.mem_gb=100", "cluster.sbatch_extra.mem-per-cpu=4G") == \
        [("cluster.sbatch_extra.mem-per-cpu", "error")]
    assert found("cluster.sbatch_extra.mem-per-cpu=4G") == []  # no --mem: cluster.mem_gb is null
    assert found("cluster.sbatch_extra.cpus-per-gpu=4") == [("cluster.sbatch_extra.cpus-per-gpu", "error")]
    assert found("cluster.sbatch_extra.gres=gpu:4") == [("cluster.sbatch_extra.gres", "warning")]
    assert found("cluster.sbatch_extra.gres=nvme:1") == []


def test_an_option_in_submitits_spelling_is_one_line_of_the_script():
    """submitit writes `_` as `-`: `wait_all_nodes` and `mail_type` are sbatch's options, and a user's
    `wait-all-nodes` replaces the default rather than standing beside it."""
    from train.launch.spec import sbatch_script

    assert not [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.mail_type=END") if "sbatch_extra" in p.key]
    script = sbatch_script(compose(["cluster=ndv5", "cluster.sbatch_extra.wait-all-nodes=0",
                                    "cluster.sbatch_extra.mail_type=END"]))
    assert [line.strip() for line in script.splitlines() if "wait-all-nodes" in line or "mail" in line] == \
        ["#SBATCH --mail-type=END", "#SBATCH --wait-all-nodes=0"]


def test_an_unknown_option_far_from_any_is_a_warning():
    [p] = [p for p in problems("cluster=ndv5", "cluster.sbatch_extra.frobnicate=1") if "sbatch_extra" in p.key]
    assert p.level == "warning"


def test_an_env_name_one_typo_from_the_presets_is_warned():
    [p] = [p for p in problems("cluster=ndv5", "cluster.env.NCCL_IB_TIMOUT=22") if p.key.startswith("cluster.env")]
    assert p.level == "warning" and "NCCL_IB_TIMEOUT" in p.problem and "cluster.env.NCCL_IB_TIMEOUT=22" in p.fix
    assert not [p for p in problems("cluster=ndv5", "cluster.env.NCCL_IB_TIMEOUT=23", "cluster.env.MY_FLAG=1")
                if p.key.startswith("cluster.env")]


def test_the_option_list_is_what_sbatch_says_and_sbatch_refuses_a_typo(slurm):
    out = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=60).stdout
    listed = set(re.findall(r"^\s+(?:-\w, )?--([a-zA-Z0-9-]+)", out, flags=re.M))
    assert listed == SBATCH_HELP
    typo = subprocess.run(["sbatch", "--test-only", "--resrvation=big", "--wrap=true"], capture_output=True,
                          text=True, timeout=60, env=os.environ)
    assert typo.returncode != 0 and "unrecognized option" in typo.stderr
    for name in sorted(SBATCH_OPTIONS - SBATCH_HELP):  # the manual's: sbatch parses them (no "unrecognized")
        proc = subprocess.run(["sbatch", "--test-only", f"--{name}", "--wrap=true"], capture_output=True, text=True,
                              timeout=60)
        assert "unrecognized option" not in proc.stderr, name


@pytest.mark.parametrize("name", ["reservation", "mail-type", "exclusive"])
def test_real_options_pass(name):
    assert name in SBATCH_OPTIONS
