"""Commands started from an interpreter that has already imported what they import.

Every command a test runs is `python -m MODULE ARGS`, as a user types it, and a fresh interpreter pays for its
imports each time: ~0.25 s of CPU for a light command (Hydra, our config and checks: plans, refusals, sweeps
submitted), ~5.5 s for one that imports composer and llm-foundry (a one-process training, export, evaluate). Here
one process per pytest worker and kind imports them once, then forks a child for each command: the child takes the
command's working directory, environment, arguments and standard streams, runs the module as `python -m` does
(runpy, as `__main__`, the working directory first on sys.path) and ends as the interpreter ends (non-daemon
threads joined, exit handlers run, streams flushed).

What a fork cannot make the same runs in a fresh interpreter instead (`kind_for` returns None):
- an environment that differs from the one the imports ran under in a variable read as the interpreter starts
  (PYTHON*, LC_*); one that differs in a variable read as torch or Hugging Face's libraries are imported (HF_*,
  TORCH*, OMP_*, TMPDIR, ...) is forked from the light server, whose command imports them itself; the others are
  set before the command runs, as in a fresh process, and read when the command reads them;
- a command given Popen options (stdin, input), a script, `python -c`, data_prep, and any command while
  PRESTARTED=0 (every command fresh, for a check of this module's fidelity).
A forked command's command line and initial environment in /proc are its server's: nothing reads them for a
synchronous command (tests and the launcher look there for ranks, which submitit starts as fresh interpreters, as
Slurm does; a test that kills a command starts it with Popen)."""
import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# What each kind imports before it forks: a light command's imports (train/__main__.py, Hydra's plugin scan), and
# a training's (train/task/main.py imports the libraries with the GC paused: common/collector.py).
LIGHT = ("hydra", "omegaconf", "train", "train.config.compose", "common.compose", "train.checks.gate",
         "hydra_plugins.pretrain_launcher.sweep_status")
HEAVY = ("train.task.main", "train.checkpoint.resume", "train.hf_model", "transformers")
FOUNDRY = ("composer", "llmfoundry.command_utils")
_MODULES = {"train": None, "train.status": "light", "train.export": "heavy", "train.evaluate": "heavy",
            "train.consolidate": "heavy", "train.sample": "heavy"}
# A look, or a launcher whose ranks are fresh processes: no training in the command's own process.
_LOOK = re.compile(r"(plan=.*|--cfg|--help|-h|--info|--hydra-help|-c|-m|--multirun)")
# Read by the interpreter as it starts (any kind), and by torch and Hugging Face's libraries as they are imported
# (the heavy kind; a light one imports neither: serve() asserts it).
_READ_AT_START = re.compile(r"PYTHON|LD_|MALLOC|LANG$|LC_")
_READ_AT_IMPORT = re.compile(r"HF_|HUGGINGFACE|TRANSFORMERS|TOKENIZERS|TORCH|OMP_|MKL_|KMP_|OPENBLAS|CUDA|NVIDIA|NCCL|"
                             r"GLOO|XDG_CACHE|TMPDIR$|TEMP$|TMP$|HOME$")
_READ = {"light": (_READ_AT_START,), "heavy": (_READ_AT_START, _READ_AT_IMPORT)}
_SERVERS: dict = {}  # kind -> (its process, its socket, the environment it imported under)
_STARTING = threading.Lock()


def kind_for(args: list, env: dict, popen: dict) -> str | None:
    """'light', 'heavy', or None: run `python ARGS` in a fresh interpreter."""
    if popen or os.environ.get("PRESTARTED") == "0" or len(args) < 2 or args[0] != "-m" or args[1] not in _MODULES:
        return None
    wanted = _MODULES[args[1]] or ("light" if any(_LOOK.fullmatch(a) for a in args[2:]) else "heavy")
    # a heavy command under other import-time settings goes to the light server, its command importing them itself
    for kind in dict.fromkeys((wanted, "light")):
        started_under = _SERVERS[kind][2] if kind in _SERVERS else _base_env()
        differ = {k for k in {*env, *started_under} if env.get(k) != started_under.get(k)}
        if not any(p.match(k) for k in differ for p in _READ[kind]):
            return kind
    return None


def _base_env() -> dict:
    from helpers import command_env

    return {k: v for k, v in command_env().items() if k != "PYTEST_CURRENT_TEST"}


def run(kind: str, args: list, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python ARGS` forked from the kind's server: what subprocess.run(capture_output=True, text=True) returns,
    or raises (TimeoutExpired, the child killed)."""
    server = _server(kind)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, socket.socket(socket.AF_UNIX) as conn:
        conn.connect(server)
        request = json.dumps({"args": [str(a) for a in args], "cwd": str(cwd), "env": env}).encode() + b"\n"
        sent = socket.send_fds(conn, [request], [0, out.fileno(), err.fileno()])
        conn.sendall(request[sent:])
        replies = conn.makefile()
        pid = int(json.loads(replies.readline())["pid"])
        conn.settimeout(timeout)
        try:
            status = json.loads(replies.readline())["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            out.seek(0), err.seek(0)
            raise subprocess.TimeoutExpired(args, timeout, out.read(), err.read()) from None
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(status),
                                           out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def _server(kind: str) -> str:
    """The socket of this worker's server of `kind`, started on first use (a heavy one takes its imports' ~6 s)."""
    with _STARTING:  # a test may run commands from threads
        return _started(kind)


def _started(kind: str) -> str:
    if kind in _SERVERS:
        proc, path, _ = _SERVERS[kind]
        assert proc.poll() is None, f"the prestarted {kind} interpreter ended (exit {proc.returncode})"
        return path
    from helpers import PYTHON, ROOT

    path = tempfile.mktemp(prefix=f"prestarted-{kind}-", suffix=".sock", dir="/tmp")
    env = _base_env()
    proc = subprocess.Popen([str(PYTHON), "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                             f"import prestarted; prestarted.serve({kind!r}, {path!r}, {os.getpid()})"],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    ready = proc.stdout.readline()
    assert ready == b"ready\n", f"the prestarted {kind} interpreter did not start (exit {proc.wait()})"
    _SERVERS[kind] = (proc, path, env)
    atexit.register(proc.kill)
    return path


def serve(kind: str, path: str, parent: int) -> None:
    """The server: import, then fork a child per request until the pytest worker that started it is gone."""
    import importlib
    import selectors

    sys.path.pop(0)  # this folder: a command's sys.path starts with its working directory
    from hydra.core.plugins import Plugins

    from common.collector import imported_without_collections

    if kind == "heavy":
        imported_without_collections(*FOUNDRY)
    for name in LIGHT + (HEAVY if kind == "heavy" else ()):
        importlib.import_module(name)
    Plugins.instance()  # Hydra's plugin scan, as every command makes first
    if kind == "light":
        heavy = {"torch", "transformers", "huggingface_hub", "tokenizers"} & set(sys.modules)
        assert not heavy, f"a light command's imports imported {heavy}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    running: dict = {}
    while os.getppid() == parent:
        if selector.select(timeout=0.02):
            conn, _ = listener.accept()
            request, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            while not request.endswith(b"\n"):
                request += conn.recv(1 << 16)
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close(), conn.close()
                _command(json.loads(request), fds)  # never returns
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            running[pid] = conn
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                except OSError:
                    pass  # its test gave up on it (a timeout)
                conn.close()
    os.unlink(path)


def _command(request: dict, fds: list) -> None:
    """In the forked child: become `python -m MODULE ARGS` in the request's folder and environment, run, exit."""
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path.insert(0, os.getcwd())
    _, module, *rest = request["args"]
    sys.argv = [module, *rest]
    # as in a fresh `python -m`: the module runs as __main__ before anything imports it under its name (one the
    # server imported as another's dependency is imported again, as a fresh run's later import would)
    sys.modules.pop(module, None)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        code = code or 0
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # what the interpreter does at its end, in its order
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush(), sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)

