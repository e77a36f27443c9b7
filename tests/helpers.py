"""What the test modules share: where the project and the real test data are, the one way to run a command as a
user types it (`run`; the `cli` fixture in conftest.py binds it to a test's folder), and the pieces several
modules read: the problems a refused command prints, a run killed right after a checkpoint, a task PATH without
Slurm's commands. Tests that need ../shared skip with a message when it is absent."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
TOKENIZER = SHARED / "tokenizers" / "gpt-neox-20b"
C4 = SHARED / "c4" / "en"
C4_FIRST = C4 / "c4-train.00000-of-01024.first1000.json.gz"
C4_SECOND = C4 / "c4-train.sample2.1000.json.gz"
SUMMARY = "data_prep_summary.json"  # data_prep's record beside its output
PYTHON = Path(sys.executable)  # the interpreter running the tests: the checkout's .venv under `make test`

# Inherited settings that would change what a command does: a test runs it as from a clean login shell, even when
# the suite itself runs inside a Slurm job or a shell with tracking credentials. (SLURM_CONF stays: it names the
# loopback cluster.)
_NOT_INHERITED = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_API_KEY")


RUNS_COMMANDS = True  # False in a test not marked e2e, train or slurm (conftest.py): its run() is refused


def _may_run():
    assert RUNS_COMMANDS, "this test runs a command in a process of its own: mark it e2e (pyproject.toml markers)"


def made_once(tmp_path_factory, name: str, make) -> Path:
    """A folder that many tests only need to exist (a finished run, prepared data), made once for the whole
    session however many workers run it: the first to ask calls make(folder) under a lock, the others wait for it
    and read the same folder. Tests copy before they change anything in it. Made by commands, so asked for only by
    tests that may run them (marked e2e, train or slurm), whether or not another test made it first."""
    import fcntl

    _may_run()

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above each worker's own
    folder, done = base / f"once-{name}", base / f"once-{name}.done"
    with open(base / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if folder.exists():
                import shutil

                shutil.rmtree(folder)  # a maker that failed before: again, from nothing
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


# The reference training of the resume matrix and the run promises: evaluations at 10, 20, 30, 40, so every
# checkpoint after the first holds the report's evaluation history.
TRAIN_ARGS = ("max_duration=40ba", "save_interval=10ba", "eval_interval=10ba", "progress_bar=false")


def train_command(ranks: int, fmt: str, *extra: str) -> list:
    """`-m train ...` of the reference training at this rank count (2 and more through `-m`) and format."""
    launch = ["-m", f"cluster.tasks_per_node={ranks}"] if ranks > 1 else []
    return ["-m", "train", *launch, f"checkpoint={fmt}", *TRAIN_ARGS, *extra]


def finished(ranks: int, fmt: str, tmp_path_factory) -> Path:
    """The root of the reference training run uninterrupted to its end, made once per session: what a resumed
    run must equal (the checkpoint format does not change training), and checkpoints to damage (copied first)."""
    return made_once(tmp_path_factory, f"finished-{fmt}{ranks}",
                     lambda root: training(*train_command(ranks, fmt), root=root, check=True))


def training(*args, root=None, check=None, env=None) -> subprocess.CompletedProcess:
    """`python -m train ARGS` (a train_command): in this process where it runs one rank (train_here), as a real
    process where it starts ranks (`-m`: our launcher's, a process each)."""
    assert list(args[:2]) == ["-m", "train"], args
    if "-m" in args[2:]:
        return run(*args, root=root, check=check, env=env)
    return train_here(*args[2:], root=root, check=check, env=env)


def need_shared():
    if not (TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"real test data not found at {SHARED} (a checkout beside ../shared is needed)")


def command_env(root=None, env=None) -> dict:
    """The environment a command runs with: this one without the settings above, PRETRAIN_ROOT=root when given,
    then `env` on top."""
    base = {k: v for k, v in os.environ.items()
            if k not in _NOT_INHERITED and not (k.startswith("SLURM_") and k != "SLURM_CONF")}
    if root is not None:
        base["PRETRAIN_ROOT"] = str(root)
    return {**base, **(env or {})}


def run(*args, root=None, check=None, env=None, cwd=ROOT, timeout=600, input=None,
        **popen) -> subprocess.CompletedProcess:
    """`python ARGS...` as a user types it, in the checkout: run("-m", "train", "plan=true", root=tmp_path).
    check=None returns whatever happened, check=True asserts exit 0, an int asserts that exit status; a failed
    check shows the command and the ends of its stdout and stderr. The command runs in a process group of its own,
    as an interactive shell runs each command: one that runs past `timeout` is killed with all it started."""
    _may_run()
    cmd = [str(PYTHON), *map(str, args)]
    options = {"text": True, **popen, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    if input is not None:
        options["stdin"] = subprocess.PIPE
    with start(*args, root=root, env=env, cwd=cwd, **options) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:  # what it printed, and where a Slurm test's jobs stood
            stop(proc)
            out, err = proc.communicate()
            raise AssertionError(f"{' '.join(cmd[1:])}: still running after {timeout} s\n{out[-2000:]}\n"
                                 f"{err[-2000:]}{cluster_state()}") from None
        except BaseException:  # an interrupted test: the command does not outlive it
            stop(proc)
            raise
    return _checked(subprocess.CompletedProcess(cmd, proc.returncode, out, err), check)


def _checked(result: subprocess.CompletedProcess, check, where: str = "") -> subprocess.CompletedProcess:
    """check: True (exit 0), an exit status, or None/False (any): asserted with the ends of the output."""
    want = 0 if check is True else check
    if want is not None and want is not False:
        assert result.returncode == want, (f"{' '.join(result.args[1:])}{where}: exit {result.returncode}, not "
                                           f"{want}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    return result


def cluster_state() -> str:
    """The loopback cluster's queue and nodes with the reasons Slurm gives, where SLURM_CONF is set: what a test
    that waited too long on its jobs shows."""
    if not os.environ.get("SLURM_CONF"):
        return ""
    show = [["squeue", "-o", "%i %j %T %r %M %N"], ["sinfo", "-N", "-o", "%N %T %E"]]
    return "".join("\n$ " + " ".join(c) + "\n" + subprocess.run(c, capture_output=True, text=True, timeout=30).stdout
                   for c in show)


def problems_in(stderr: str) -> list:
    """(level, key, problem line, fix line) for each problem a refused or warned command printed."""
    from train.checks import ERROR, WARNING

    lines = stderr.strip().splitlines()
    found = []
    for i, line in enumerate(lines):
        for level in (ERROR, WARNING):
            if line.startswith(f"{level}: "):
                key = line[len(level) + 2:].split(": ")[0]
                fix = lines[i + 1] if i + 1 < len(lines) else ""
                found.append((level, key, line, fix))
    return found


def wait_for_checkpoint(root: Path, batch: int, proc: subprocess.Popen) -> None:
    """Until the checkpoint at `batch` of the run under `root` is complete (composer points its `latest` link at a
    checkpoint once every file of it is written); the command `proc` must not end before."""
    def points_at_it(link: Path) -> bool:
        try:
            return os.readlink(link).startswith(f"ep0-ba{batch}")
        except OSError:  # composer replaces the link (remove, then symlink): between the two it is not there
            return False

    deadline = time.time() + 300
    while not any(points_at_it(p) for p in root.glob("checkpoints/*/latest-*")):
        assert proc.poll() is None and time.time() < deadline, "the run ended before its checkpoint"
        time.sleep(0.02)


def requeue_once_written(root: Path, pattern: str, proc: subprocess.Popen, log: Path, within: float) -> str:
    """Once a file matching `pattern` is under `root`, the one job in the loopback cluster's queue is preempted at
    that point: its processes are frozen (SIGSTOP), Slurm requeues it (`scontrol requeue`, as a preemption does),
    then they are killed (the SIGKILL Slurm sends KillWait after its SIGTERM, which submitit lets pass), so the job
    trains not one batch past the file whatever the load. The sweep command `proc` (its output in `log`) must not
    end before, nor the file take longer than `within` seconds. -> the job's id."""
    import psutil

    deadline, jobs = time.time() + within, []
    while not jobs or not list(root.glob(pattern)):
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        jobs = jobs or subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                      timeout=30).stdout.split()
        time.sleep(0.05)
    [job] = jobs
    frozen = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("SLURM_JOB_ID") == job:
                p.suspend()
                frozen.append(p)
    assert frozen, f"no process of job {job}"
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    for p in frozen:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return job


def job_log(row: dict) -> str:
    """What a sweep point's job wrote, stderr then stdout (its summary row's `log` names the stderr file)."""
    return Path(row["log"]).read_text() + Path(row["log"].replace("_log.err", "_log.out")).read_text()


def start(*args, root=None, env=None, cwd=ROOT, **options) -> subprocess.Popen:
    """`python ARGS` as subprocess.Popen(options) starts it (PRETRAIN_ROOT=root), for a command a test kills or
    reads while it runs: in a process group of its own (unless start_new_session=True makes a session of its own),
    as an interactive shell starts each command, so that `stop` and `kill_run` reach what it started (a local
    job's controller and ranks, their data loader workers)."""
    _may_run()
    if not options.get("start_new_session"):
        options.setdefault("process_group", 0)
    return subprocess.Popen([str(PYTHON), *map(str, args)], cwd=cwd, env=command_env(root, env), **options)


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a command `start` started: the command and every process it started that
    is still in it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_after_checkpoint(root: Path, args: list, batch: int, env: dict | None = None) -> None:
    """Start `python ARGS` (PRETRAIN_ROOT=root), SIGKILL it as soon as the checkpoint at `batch` is complete
    (wait_for_checkpoint), as a node loss or a preemption would (kill_run)."""
    proc = start(*args, root=root, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
    wait_for_checkpoint(root, batch, proc)
    kill_run(proc, root)


def kill_run(proc: subprocess.Popen, root: Path) -> None:
    """SIGKILL the command `proc` (started by `start`) and everything of it (its process group: a local job's
    controller and ranks, their data loader workers), and wait until they have ended and none holds the run's save
    folder."""
    import fcntl

    import psutil

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGSTOP)  # held at once: listing the family below takes a while under load
    try:
        command = psutil.Process(proc.pid)
        family = [command, *command.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    stop(proc)
    proc.wait()
    wait_ended(family)
    # a process the command started after its family was listed: killed with its group, and gone once it no
    # longer holds the save folder's lock (a POSIX lock: train/checkpoint/resume.py claim)
    deadline = time.monotonic() + 60
    for lock in root.glob("checkpoints/*/.lock"):
        with open(lock, "r+") as f:
            while True:
                try:
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.lockf(f, fcntl.LOCK_UN)
                    break
                except (BlockingIOError, PermissionError):
                    assert time.monotonic() < deadline, f"{lock} still held 60 s after the kill"
                    time.sleep(0.05)


def wait_ended(processes: list, within: float = 60) -> None:
    """Until every one of these psutil processes has ended (`ended`): kill() returns before a process is gone, and
    a rank still exiting holds its save folder's lock for a moment, so a command started at once would be refused
    as a second run of that folder."""
    deadline = time.monotonic() + within
    while exiting := [p.pid for p in processes if not ended(p)]:
        assert time.monotonic() < deadline, f"processes {exiting} still exiting {within} s after SIGKILL"
        time.sleep(0.05)


def ended(process) -> bool:
    """The psutil process is gone, or a zombie all of whose threads have exited: its files are closed, its locks
    free. (A zombie leader alone is not enough: the leader thread of a process with threads, as a rank has, shows
    Z while the others are still exiting, holding the process's files. An orphan's zombie may stay: not every
    init reaps.)"""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE and process.num_threads() <= 1
    except psutil.NoSuchProcess:
        return True


SLURM_COMMANDS = {"scontrol", "sbatch", "srun", "squeue", "sacct", "scancel", "sinfo", "salloc", "sattach", "sstat",
                  "sprio", "sshare", "sacctmgr", "strigger", "sbcast", "sdiag", "sreport", "sview"}


def warn_within_a_minute(job: str, elapsed: str) -> None:
    """Cut the time limit of a job that has run `elapsed` (squeue's %M) so that 60-120 s are left: with
    cluster.signal_delay_s=90, Slurm's warning comes on its next 30 s tick, at least 60 s before the limit."""
    minutes = sum(int(x) * 60 ** i for i, x in enumerate(reversed(elapsed.split(":")))) // 60 + 2
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True, timeout=30)


def step_tasks(job: str, node: str) -> list:
    """The pids of the tasks of the job's first step (srun's) on `node`, as Slurm lists them: not the processes
    the tasks started (data loader workers), which it lists without a task id."""
    rows = subprocess.run(["scontrol", "listpids", f"{job}.0", node], capture_output=True, text=True,
                          check=True, timeout=30).stdout.splitlines()[1:]
    return [int(row.split()[0]) for row in rows if row.split()[-1] != "-"]


@contextlib.contextmanager
def held_still_and_warned(tasks: int = 2, until=None):
    """The one job in the queue, training: its step's tasks held still (SIGSTOP: they would train for nothing while
    they wait) and its time limit cut so that Slurm's warning comes within a minute (warn_within_a_minute); Slurm
    continues them (SIGCONT) to deliver it. until: called once the tasks are found, the moment to hold them at (a
    checkpoint written), so that nothing but the SIGSTOP comes after it. Yields the job's id; the tasks are
    continued on the way out, whatever happened."""
    [job, node] = subprocess.run(["squeue", "-h", "-o", "%i %N"], capture_output=True, text=True,
                                 timeout=30).stdout.split()
    ranks = step_tasks(job, node)
    assert len(ranks) == tasks, ranks
    if until is not None:
        until()
    try:
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        [ran] = subprocess.run(["squeue", "-h", "-j", job, "-o", "%M"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        warn_within_a_minute(job, ran)
        yield job
    finally:
        for pid in ranks:
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(pid, signal.SIGCONT)


def task_prolog_without_slurm(folder: Path) -> Path:
    """An srun task prolog that gives each task a PATH as in a container image without a Slurm client: links to
    everything in /usr/local/bin and /usr/bin but Slurm's commands. (`srun --export=ALL,PATH=...` does not replace
    a PATH the environment already has, seen with Slurm 22.05; a task prolog's `export` does.)"""
    bare = folder / "bin"
    bare.mkdir(parents=True)
    for bin_dir in (Path("/usr/local/bin"), Path("/usr/bin")):
        for cmd in bin_dir.iterdir():
            if cmd.name not in SLURM_COMMANDS and not (bare / cmd.name).exists():
                (bare / cmd.name).symlink_to(cmd)
    prolog = folder / "no-slurm-client.sh"
    prolog.write_text(f"#!/bin/sh\necho export PATH={bare}\n")
    prolog.chmod(0o755)
    return prolog


def prep(*overrides: str, check: bool = True, tokenizer: Path = TOKENIZER, env=None) -> subprocess.CompletedProcess:
    flags = [o for o in overrides if o.startswith("-")]  # Hydra takes -m before the overrides
    return run("-m", "data_prep", *flags, f"tokenizer={tokenizer}", *[o for o in overrides if not o.startswith("-")],
               check=check or None, env=env, timeout=300)


def tree(folder: Path, skip=(SUMMARY,)) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip}


# A checkpoint of each kind a load is asked of, and whether composer loads it: the login node's check of load_path,
# the task's resume.problem and export say the same of each.
CHECKPOINT_KINDS = {"full": True, "legacy pickle": True, "truncated": False, "sharded": True, "shard missing": False,
                    "empty .metadata": False}


def checkpoint_kinds(folder: Path) -> dict[str, Path]:
    """One checkpoint of each CHECKPOINT_KINDS kind, each in a save folder of its own under `folder`, written by torch
    itself (torch.save in its zip and in its legacy format; a distributed checkpoint converted from the zip by
    resume.shard), then cut or emptied as an interrupted write leaves it. No training: a few kilobytes."""
    import shutil

    import torch

    from train.checkpoint.resume import shard

    state = {"state": {"model": {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)},
                       "timestamp": {"batch": 10}}}
    made = {kind: folder / kind.replace(" ", "-") for kind in CHECKPOINT_KINDS}
    for each in made.values():
        each.mkdir(parents=True)
    full = made["full"] / "ep0-ba10-rank0.pt"
    torch.save(state, full)
    torch.save(state, made["legacy pickle"] / full.name, _use_new_zipfile_serialization=False)
    (made["truncated"] / full.name).write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    sharded = shard(full, made["sharded"] / "ep0-ba10")
    for kind in ("shard missing", "empty .metadata"):
        shutil.copytree(sharded, made[kind] / sharded.name)
    (made["shard missing"] / sharded.name / "__0_0.distcp").unlink()
    (made["empty .metadata"] / sharded.name / ".metadata").write_bytes(b"")
    return {kind: at / (sharded.name if kind in ("sharded", "shard missing", "empty .metadata") else full.name)
            for kind, at in made.items()}


def streaming_dataset(local, **kwargs):
    """streaming's StreamingDataset over `local`, built in the test process under the node-wide lock the product's
    jobs take while they register streaming's shared memory (train/task/shm_registry.py): built beside a training
    job of the other worker, both could pick the same prefix (`FileExistsError: '/001771_locals'`, seen in CI)."""
    from streaming import StreamingDataset

    from train.task import shm_registry

    with shm_registry.registering():
        return StreamingDataset(local=str(local), **kwargs)


def train_here(*overrides: str, root=None, check=None, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    """`python -m train OVERRIDES` run in this test process (PRETRAIN_ROOT=root), through the function the command
    runs (train.__main__.cli: the gate, Hydra's main with the run's output folder, job name and log file, then
    train.task.main.run), so that torch and llm-foundry are imported once per worker instead of once per command.
    -> a CompletedProcess as `run` gives: the exit status the command would have (0, 1, 2 from its SystemExit),
    what it printed on stdout and stderr. check as `run`'s. For one rank and a run that ends by itself: a test
    that kills a run, starts ranks (`-m`), or is about the command's own process (its exit at a signal, its
    goodput's start, which counts from the process's) runs a real one (`run`, `start`).

    What a command changes in its process and leaves behind as it exits is undone here: the environment (the
    command's own: command_env, then cluster.env and the distributed variables the task exports), the working
    directory, the umask, sys.argv, signal handlers, warning filters, the logging handlers and levels Hydra and
    the task set (the run's log file closed), torch's process group, the goodput ledger's exit write (made as at
    exit), and what the trainer left for the garbage collector (streaming's shared memory, released by its
    datasets' finalizers)."""
    import gc
    import io
    import logging
    import warnings

    _may_run()
    cmd = [str(PYTHON), "-m", "train", *map(str, overrides)]
    environ, argv, here = dict(os.environ), list(sys.argv), os.getcwd()
    handlers = {signum: signal.getsignal(signum) for signum in signal.valid_signals()
                if signum not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(signum) is not None}
    loggers = {name: (lg.level, lg.propagate, list(lg.handlers), lg.disabled)
               for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
               if isinstance(lg, logging.Logger)}
    raise_exceptions = logging.raiseExceptions
    out, err = io.StringIO(), io.StringIO()
    mask = os.umask(0o027)
    os.umask(mask | 0o027)  # as train/__main__.py sets it
    os.environ.clear()
    os.environ.update(command_env(root, env))
    status = 0
    gc.freeze()  # the worker's own objects, as the command's imports are (common/collector.py): not its garbage
    try:
        os.chdir(cwd)
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            from train.__main__ import cli

            try:
                cli(list(map(str, overrides)))
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
                if not isinstance(exit_.code, (int, type(None))):
                    print(exit_.code, file=sys.stderr)
            finally:
                _as_the_process_exits()
    finally:
        os.chdir(here)
        os.umask(mask)
        sys.argv[:] = argv
        os.environ.clear()
        os.environ.update(environ)
        for signum, handler in handlers.items():
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, handler)
        for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]:
            if isinstance(lg, logging.Logger):  # a logger first made by the command: as a new process has it
                level, propagate, kept, disabled = loggers.get(name, (logging.NOTSET, True, [], False))
                for handler in lg.handlers:
                    if handler not in kept:
                        handler.close()
                lg.setLevel(level)
                lg.propagate, lg.handlers[:], lg.disabled = propagate, kept, disabled
        logging.raiseExceptions = raise_exceptions
        gc.collect()
    return _checked(subprocess.CompletedProcess(cmd, status, out.getvalue(), err.getvalue()), check, " (in-process)")


def _as_the_process_exits() -> None:
    """What the end of a training command's process does that another command in this one must not inherit: its
    datasets' prefetching threads ended (they would hold the datasets and their shared memory), its goodput
    ledger's last write (an exit handler), torch's process group."""
    if "streaming" in sys.modules:
        from common.compat import streaming_threads_ended

        streaming_threads_ended()
    if "train.task.goodput" in sys.modules:
        from train.task import goodput

        goodput._at_exit()
        goodput._CURRENT.clear()
    if "torch" in sys.modules:
        import torch.distributed as torch_dist

        if torch_dist.is_available() and torch_dist.is_initialized():
            # gloo's worker thread frees each finished collective's tensors, which takes the GIL, while the group's
            # destructor holds the GIL and joins that thread: a collective finished just before would deadlock
            # them. A barrier waited on first (the GIL let go) leaves only its own work, which holds no tensor.
            with contextlib.suppress(Exception):
                torch_dist.barrier()
            torch_dist.destroy_process_group()
