"""Shared pytest fixtures."""

# ---------------------------------------------------------------------------------------------------
# Fixture `slurm`: a real Slurm cluster on loopback (scripts/slurm-local.sh), session-scoped.
# It starts the cluster if needed (idempotent), exports SLURM_CONF for this process and everything it
# spawns, and yields the path of slurm.conf. It never stops the cluster: `make test` does that.
# ---------------------------------------------------------------------------------------------------
import os
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

# One thread for torch's CPU work in this process and every command a test starts, as torchrun gives each of its
# ranks: three workers share two cores, each command up to two ranks, and torch's default (a thread per core in every
# process) oversubscribes them. Measured: two two-rank resume tests side by side, 148 s without, 94 s with.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Hydra's plugin scan executes every module of its plugin package again, in place, each time it builds its Plugins
# singleton (first use in a process; again after Singleton.set_state, as Hydra's test fixtures and submitted jobs
# call it). Every real command scans first; so does each test process, so that a test sees what a command sees.
# (So the plugin package holds only what the scan must find: the launcher's work lives in common/sweep/.)
from hydra.core.plugins import Plugins  # noqa: E402

Plugins.instance()

_REPO = Path(__file__).resolve().parents[1]
_SLURM_LOCAL = _REPO / "scripts" / "slurm-local.sh"
_SLURM_HOWTO = f"start it as root with: sudo bash {_SLURM_LOCAL.relative_to(_REPO)} start"


def _slurm_local(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(_SLURM_LOCAL), command],
        cwd=_REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (it suffixes each test id with its group)
def pytest_collection_modifyitems(items):
    for item in items:
        if "slurm" in getattr(item, "fixturenames", ()):  # a test that needs the cluster is a Slurm test
            item.add_marker(pytest.mark.slurm)
        if "cli" in getattr(item, "fixturenames", ()):  # a test that runs a command is an e2e test
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("slurm"):
            # `make test` runs several workers (pytest-xdist, --dist loadgroup): the Slurm tests one after another
            # on one of them, as they share the loopback cluster's two nodes (a test that sees its job pending or
            # its array's tasks side by side would otherwise see another test's jobs)
            item.add_marker(pytest.mark.xdist_group("slurm"))
    # Longest first. The Slurm tests lead: one after another they are the suite's longest chain, often waiting on
    # the cluster (a time limit, the scheduler's tick), so the other workers' tests fill that wait instead of
    # following it. Then trainings, then other whole processes, the quick ones last, where they even out the end.
    def tier(item):
        marks = {m.name for m in item.iter_markers()}
        return next((i for i, m in enumerate(("slurm", "train", "e2e", "torch")) if m in marks), 4)
    items.sort(key=tier)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after xdist's own: what it made of ours
def _grouped_as_asked(config, items):
    """The Slurm tests share the cluster's two nodes: on two workers they would see each other's jobs pending. That
    they run on one is pytest-xdist's loadgroup, which groups by a suffix it writes into each test's id; pytest 9.2
    stopped reading that field (pytest-xdist#1386) and the tests ran side by side, silently. Loud instead."""
    if config.getvalue("loadgroup"):
        lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        assert not lost, (f"pytest-xdist's loadgroup did not group {lost[0]} (pytest-xdist#1386 with pytest 9.2): "
                          "use the pytest pinned in requirements.lock")


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures: a session one made for it (helpers.made_once) counts
def pytest_runtest_setup(item):
    import helpers

    helpers.RUNS_COMMANDS = bool({m.name for m in item.iter_markers()} & {"e2e", "train", "slurm"})


# The tiers keep their meaning (pyproject.toml markers): a test runs a command in a process of its own only when
# marked e2e (or train, slurm), and imports torch into the test process only when marked torch (or train). The fast
# tier is what is left, so a mark missed would silently slow it down: helpers.run and helpers.start refuse such a
# test's command, and a test that leaves torch imported where it was not fails (on a worker that has not imported
# torch yet: once a marked test has, the mark is the declaration alone).
@pytest.fixture(autouse=True)
def _tier(request):
    import helpers

    marks = {m.name for m in request.node.iter_markers()}
    # Only a Slurm test reaches the cluster (`make test` exports SLURM_CONF to every worker): a job submitted from
    # another worker would hold the two nodes while the Slurm tests' own jobs wait, pending, until they time out.
    # Without SLURM_CONF such a test fails at its sbatch, naming itself.
    cluster = None if "slurm" in marks else os.environ.pop("SLURM_CONF", None)
    without_torch = "torch" not in sys.modules and not marks & {"torch", "train"}
    yield
    helpers.RUNS_COMMANDS = True
    if cluster is not None:
        os.environ["SLURM_CONF"] = cluster
    if "slurm" in marks and os.environ.get("SLURM_CONF"):
        _cancel_what_is_left(request.node.nodeid)
    if without_torch and "torch" in sys.modules:
        pytest.fail("this test imported torch into the test process: mark it `torch` (pyproject.toml markers)",
                    pytrace=False)


def _cancel_what_is_left(test: str) -> None:
    """A Slurm test leaves the cluster as it found it: jobs it left (points a test submitted and returned from, a
    summary job waiting on them) would hold the two nodes while the next test's jobs wait, pending. A job the test
    ended itself may still be completing (its tasks exiting): waited for, not warned about."""
    def queue():
        return dict(line.split() for line in subprocess.run(["squeue", "-h", "-o", "%i %t"], capture_output=True,
                                                            text=True, timeout=60).stdout.splitlines())
    left = [job for job, state in queue().items() if state != "CG"]
    if left:
        warnings.warn(f"{test} left jobs {' '.join(left)} in the queue: cancelled", stacklevel=1)
        subprocess.run(["scancel", *left], capture_output=True, timeout=60)
    deadline = time.time() + 120
    while queue() and time.time() < deadline:
        time.sleep(1)


@pytest.fixture(scope="session")
def slurm():
    """Path of the loopback cluster's slurm.conf, with os.environ["SLURM_CONF"] set to it."""
    status = _slurm_local("status", timeout=60)
    if status.returncode != 0:
        # Starting needs root (slurmd) and, on a fresh machine, apt-get to install the packages.
        if os.geteuid() != 0:
            pytest.skip(f"the loopback Slurm cluster is not running and needs root; {_SLURM_HOWTO}")
        if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
            pytest.skip(f"Slurm is not installed and apt-get is unavailable; {_SLURM_HOWTO}")
        # A cold start includes apt-get update + install (about 15 s here, longer on slow mirrors).
        start = _slurm_local("start", timeout=900)
        if start.returncode != 0:
            pytest.fail(
                f"{_SLURM_LOCAL.name} start failed (exit {start.returncode}):\n"
                f"{start.stdout}\n{start.stderr}",
                pytrace=False,
            )
        status = _slurm_local("status", timeout=60)
        if status.returncode != 0:
            pytest.fail(f"cluster not up right after start:\n{status.stdout}\n{status.stderr}", pytrace=False)
    first = status.stdout.splitlines()[0] if status.stdout else ""
    words = shlex.split(first)
    if len(words) != 2 or words[0] != "export" or not words[1].startswith("SLURM_CONF="):
        pytest.fail(f"unexpected first line of `{_SLURM_LOCAL.name} status`: {first!r}", pytrace=False)
    conf = words[1].split("=", 1)[1]
    os.environ["SLURM_CONF"] = conf
    yield conf


# ---------------------------------------------------------------------------------------------------
# End of fixture `slurm`.
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# Fixture `c4_mds`: real MDS data made once per session by data_prep from the shared C4 excerpts, with the
# shared gpt-neox-20b tokenizer, in 128-token samples (model=mpt-tiny's max_seq_len): train and val splits.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def c4_mds(tmp_path_factory):
    from helpers import C4, TOKENIZER, made_once, need_shared, run

    need_shared()

    def make(out):
        for split, name in (("train", "c4-train.00000-of-01024.first1000.json.gz"),
                            ("val", "c4-train.sample2.1000.json.gz")):
            run("-m", "data_prep", "dataset=c4", f"input={C4 / name}", f"out_root={out}", f"split={split}",
                f"tokenizer={TOKENIZER}", "concat_tokens=128", "num_parts=1", "progress=false", check=True,
                timeout=300)
    return made_once(tmp_path_factory, "c4-mds", make)


# ---------------------------------------------------------------------------------------------------
# Fixture `cli`: run a command as a user types it, in the checkout, with PRETRAIN_ROOT in the test's folder.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path):
    """cli("train", "plan=true") is `python -m train plan=true` with PRETRAIN_ROOT=tmp_path (root= for another)
    -> the CompletedProcess; check=True asserts exit 0, check=2 that status (helpers.run)."""
    from helpers import run

    def cli(module: str, *args, root=tmp_path, **kw) -> subprocess.CompletedProcess:
        return run("-m", module, *args, root=root, **kw)
    return cli
