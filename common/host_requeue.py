"""Requeue from the host, not from the task: a container image without a Slurm client has no `scontrol`.

Contract (filled in by the requeue work): `install()` runs at the start of every job body (every rank) and makes
submitit's time-limit / preemption requeue leave a request for the batch script instead of calling scontrol;
`teardown_lines(folder)` are the batch script's lines after srun that honour the request on the host.
"""


def install() -> None:
    """In the job body: submitit's requeue becomes a request to the batch script (see the module docstring)."""
