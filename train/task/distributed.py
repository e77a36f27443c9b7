"""The distributed environment composer reads, from the submitit job this process runs in; and which job that is
and how many times Slurm requeued it, read from the environment here alone (light: the checkpoint code reads them).

One task per device: submitit starts every rank itself (locally or through srun), so there is no torchrun
or composer launcher. CUDA_VISIBLE_DEVICES is left alone: composer picks `cuda:{LOCAL_RANK}`.
"""
import os
import socket
import time
import zlib
from pathlib import Path


def job_id() -> str | None:
    """This job's id, in the one form its records use (progress.json and the time ledger, compared with a sweep's
    sweep.json; a checkpoint's manifest, compared with a requeue's own id; the preflight report; the save folder's
    lock; the node's scratch folder): submitit's, as sweep.json and squeue name it (`A_a` for a task of an array,
    whose SLURM_JOB_ID is its own; the local controller's pid for a local job); a plain run's Slurm allocation
    (salloc, a batch script) by its SLURM_JOB_ID; None outside any job."""
    if "SUBMITIT_EXECUTOR" in os.environ:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    return os.environ.get("SLURM_JOB_ID") or None


def in_slurm_job() -> bool:
    """Whether Slurm runs this process's job (and can requeue it): a submitit Slurm job, or a plain run in an
    allocation; not a local submitit job, even one started inside an allocation, whose variables it inherits."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    return executor == "slurm" if executor else bool(os.environ.get("SLURM_JOB_ID"))


def requeues() -> int:
    """How many times Slurm had requeued this job when this start began (SLURM_RESTART_COUNT; unset or empty on a
    first start: 0); 0 for a job Slurm does not run."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0) if in_slurm_job() else 0


def ranks_on_this_node(world: int) -> int:
    """How many of the job's ranks run on this machine: LOCAL_WORLD_SIZE as setup() sets it (or a launcher of the
    user's), all of them where it is unset or empty (a plain run)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or world)


def node_name() -> str:
    """This node as Slurm names it (what --exclude takes; two slurmd on one machine share a host name); the host
    name outside Slurm."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


_PORTS = range(20000, 32768)  # below Linux's ephemeral ports (net.ipv4.ip_local_port_range: 32768 on)


def master_port(job_id: str) -> int:
    """A port every rank of a job derives alike, and that differs between jobs sharing a node: below Linux's
    ephemeral ports, which a busy node's outgoing connections take."""
    return _PORTS[_derived(job_id)]


def _derived(job_id: str) -> int:
    return zlib.crc32(str(job_id).encode()) % len(_PORTS)


def rendezvous_port(job) -> int:
    """The port rank 0 listens on for the job's rendezvous. A job on several nodes (which holds them whole): derived
    from its id on each node alike. A job on one node, which may share it with other jobs (and a killed job's
    ranks that linger): the first port from the derived one that rank 0 finds free, passed to the node's other
    ranks through a file in the job's submitit folder, named for this start alone."""
    if job.num_nodes > 1:
        return master_port(job.job_id)
    path = Path(job.paths.folder) / f"{job.job_id}_{_this_start()}_port"
    if job.global_rank == 0:
        start = _derived(job.job_id)
        port = next(p for p in (_PORTS[(start + i) % len(_PORTS)] for i in range(len(_PORTS))) if _free(p))
        path.parent.mkdir(parents=True, exist_ok=True)
        (tmp := path.with_name(path.name + ".tmp")).write_text(str(port))
        os.replace(tmp, path)
        return port
    deadline = time.monotonic() + 600
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 of job {job.job_id} did not write its rendezvous port to {path} in 600 s; "
                               "its log says why")
        time.sleep(0.05)
    return int(path.read_text())


def _this_start() -> str:
    """What names this start of the job: a Slurm job's requeue count and step; a local job's controller (every
    rank's parent) by its start time, for its pid (the job id) may be a finished job's again."""
    if in_slurm_job():
        return f"{requeues()}_{os.environ.get('SLURM_STEP_ID', '')}"
    return Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def export_from_submitit() -> dict:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT; return them.

    Outside a submitit job (a plain run) nothing is set: composer then runs as a single process.
    """
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return {}
    import submitit

    job = submitit.JobEnvironment()
    env = {
        "RANK": job.global_rank,
        "WORLD_SIZE": job.num_tasks,
        "LOCAL_RANK": job.local_rank,
        "LOCAL_WORLD_SIZE": job.num_tasks // job.num_nodes,
        "NODE_RANK": job.node,
        "MASTER_ADDR": job.hostnames[0],
        "MASTER_PORT": rendezvous_port(job),
    }
    env = {k: str(v) for k, v in env.items()}
    os.environ.update(env)
    return env


def decided_on_rank_0(decide, *args):
    """What `decide(*args)` returns on global rank 0, on every rank; its error, raised on every rank: a raise on
    rank 0 alone would leave the others waiting in their next collective until dist_timeout."""
    from composer.utils import dist

    box = [None]
    if dist.get_global_rank() == 0:
        try:
            box = [("decided", decide(*args))]
        except Exception as err:
            box = [("failed", err)]
    dist.broadcast_object_list(box)
    kind, value = box[0]
    if kind == "failed":
        raise value  # rank 0's error, on every rank
    return value

