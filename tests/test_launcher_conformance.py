"""Hydra's own launcher conformance suites (hydra.test_utils.launcher_common_tests), as hydra-submitit-launcher's
tests run them, against our launcher with no app (any Hydra task function): it launches exactly the points the
sweeper gives it, composes each as Hydra does, and returns their JobReturns in order. Local mode here; the Slurm
mode runs the same suite on the loopback cluster (marked slurm)."""
import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite


@pytest.fixture(autouse=True)
def _as_in_a_fresh_process(hydra_restore_singletons):
    """Hydra's version base is process state (a singleton): a test that composed with version_base=None before
    would make the suite's app run without changing into its output folder, as no fresh process does."""
    from hydra.version import _UNSPECIFIED_, VersionBase

    VersionBase.instance().version_base = _UNSPECIFIED_


@pytest.mark.e2e  # real job processes
@pytest.mark.parametrize("launcher_name, overrides", [("sweep_local", ["hydra.launcher.poll_s=0.2"])])
class TestSweepLauncherLocal(LauncherTestSuite):
    pass


@pytest.mark.e2e
@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [(
    {"defaults": [{"override hydra/launcher": "sweep_local"}], "hydra": {"launcher": {"poll_s": 0.2}}}, ["-m"])])
class TestSweepLauncherLocalIntegration(IntegrationTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.parametrize("launcher_name, overrides", [
    ("sweep_slurm", ["hydra.launcher.partition=htc", "hydra.launcher.poll_s=0.5"])])
class TestSweepLauncherSlurm(LauncherTestSuite):
    @pytest.fixture(autouse=True)
    def _cluster(self, slurm):
        """The loopback cluster (scripts/slurm-local.sh), its CPU partition."""
