"""Commands started from an interpreter that has already imported what they import.

Every command a test runs is `python -m MODULE ARGS`, as a user types it, and a fresh interpreter pays for its
imports each time: ~0.25 s of CPU for a light command (Hydra, our config and checks: plans, refusals, sweeps
submitted), ~5.5 s for one that imports composer and llm-foundry (a one-process training, export, evaluate). Here
one process per pytest worker and kind imports them once, in a fresh command's order, then forks a child for each
command: the child takes the command's working directory, environment, arguments and standard streams, runs the
module as `python -m` does (runpy's `_run_module_as_main` in a new `__main__`, the working directory first on
sys.path) and ends as the interpreter ends (non-daemon threads joined, exit handlers run, `__main__`'s globals
cleared and garbage collected, streams flushed; an uncaught exception through sys.excepthook, an interrupt by the
signal). Its output is read through pipes to their end, as subprocess.run reads it.

What a fork cannot make the same runs in a fresh interpreter instead (`kind_for` returns None):
- an environment that differs from the one the imports ran under in a variable read as the interpreter starts
  (PYTHON*, LC_*, TZ); one that differs in a variable read as torch or Hugging Face's libraries are imported (HF_*,
  (PY)TORCH*, OMP_*, TMPDIR, ...), or a command that sets its own (cluster.env), is forked from the light server and
  imports them itself; the others are set before the command runs, as in a fresh process, and read when read;
- a command given Popen options (stdin, input), a script, `python -c`, data_prep, `run(..., fresh=True)`, and any
  command while PRESTARTED=0 (every command fresh).
A heavy command that sets such a variable anyway before it imports the libraries (a preset's cluster.env) fails
loudly, exit 70, naming it.
Forks share their server's string hash seed where fresh processes each draw one (numpy's global generator is
reseeded in each): references a run is compared with are made fresh (helpers.finished). A forked command's command
line and initial environment in /proc are its server's: nothing reads them for a synchronous command (a test that
kills a command starts it with Popen).

Ranks. A local `-m` run's ranks are what submitit's local controller starts as `PYTHON -u -m submitit.core._submit
FOLDER`, ~8.5 s of CPU each, most of it the imports. A forked light `-m train` command gives submitit `as_rank`'s
script as that interpreter: it stands for the rank (the controller's child, with the rank's pid to wait for and
signal, its environment and command line), has the rank forked from a third server (the rank's imports, unbuffered
as `-u` makes them, CUDA_VISIBLE_DEVICES="" as the controller sets it), passes on the signals it gets, and ends as the
rank ends; the rank dies with it (SIGKILL, by a pidfd). The rank's command line and environment are written over the
server's initial ones, which /proc shows (the server starts with room for them): the launcher
(hydra_plugins/pretrain_launcher/outcomes.py) and the tests (helpers.kill_all_with) find it as they find a fresh
one. A rank whose environment differs in what the imports read, or that does not fit, runs fresh in the client's
place (exec). Ranks started by a Popen'd command, and Slurm's, are fresh."""
import atexit
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What each kind imports before it forks: a light command's imports (train/__main__.py, Hydra's plugin scan), and
# a training's (train/task/main.py imports the libraries with the GC paused: common/collector.py).
LIGHT = ("hydra", "omegaconf", "train", "train.config.compose", "common.compose", "train.checks.gate",
         "hydra_plugins.pretrain_launcher.sweep_status")
HEAVY = ("train.task.main", "train.checkpoint.resume", "train.hf_model", "transformers")
FOUNDRY = ("composer", "llmfoundry.command_utils")
# A rank's: submitit's entry point and what it unpickles (our launcher, which runs the training), then a training's.
RANK = ("submitit.core.submission", "hydra_plugins.pretrain_launcher.pretrain_launcher")
_MODULES = {"train": None, "train.status": "light", "train.export": "heavy", "train.evaluate": "heavy",
            "train.consolidate": "heavy", "train.sample": "heavy"}
# A look, or a launcher whose ranks are fresh processes: no training in the command's own process.
_LOOK = re.compile(r"(plan=.*|--cfg|--help|-h|--info|--hydra-help|-c|-m|--multirun)")
# Read by the interpreter as it starts (any kind), and by torch and Hugging Face's libraries as they are imported
# (the heavy kind; a light one imports neither: serve() asserts it).
_READ_AT_START = re.compile(r"PYTHON|LD_|MALLOC|LANG$|LC_|TZ$|COLOREDLOGS|SETUPTOOLS")
_READ_AT_IMPORT = re.compile(r"HF_|HUGGINGFACE|TRANSFORMERS|TOKENIZERS|(PY)?TORCH|USE_|OMP_|MKL_|KMP_|OPENBLAS|CUDA|"
                             r"NVIDIA|NCCL|GLOO|XDG_CACHE|TMPDIR$|TEMP$|TMP$|HOME$")
# The command sets environment variables of its own before it imports the libraries (train/task/main.py): forked
# from the light server, it imports them after, as a fresh one does.
_SETS_ENV = re.compile(r"[+~]*(cluster\.env|hydra\.job\.env_set)\b.*")
_READ = {"light": (_READ_AT_START,), "heavy": (_READ_AT_START, _READ_AT_IMPORT),
         "rank": (_READ_AT_START, _READ_AT_IMPORT)}
# A `-m` run on this machine: its ranks, which submitit's local controller starts as `PYTHON -u -m
# submitit.core._submit FOLDER`, are forked from the rank server instead (`_rank_python`).
_LOOKS_ONLY = re.compile(r"(plan=.*|--cfg|--help|-h|--info|--hydra-help)")
# What submitit's local controller gives every rank it starts (the GPUs it may use: none here).
_RANK_ENV = {"CUDA_VISIBLE_DEVICES": ""}
# Room in the rank server's initial environment and command line for a rank's own, written over them (`_show_as`).
_ROOM = 1 << 16
_SERVERS: dict = {}  # kind -> (its process, its socket, the environment it imported under, what its imports set)
_FOLDER = None  # this worker's servers' sockets
_STARTING = threading.Lock()


def kind_for(args: list, env: dict, popen: dict, fresh: bool = False) -> str | None:
    """'light', 'heavy', or None: run `python ARGS` in a fresh interpreter."""
    if fresh or popen or os.environ.get("PRESTARTED") == "0" or len(args) < 2 or args[0] != "-m" \
            or args[1] not in _MODULES:
        return None
    wanted = _MODULES[args[1]] or ("light" if any(_LOOK.fullmatch(a) or _SETS_ENV.fullmatch(a) for a in args[2:])
                                   else "heavy")
    # a heavy command under other import-time settings goes to the light server, its command importing them itself
    for kind in dict.fromkeys((wanted, "light")):
        started_under, set_by_imports = _SERVERS[kind][2:] if kind in _SERVERS else (_base_env(), {})
        if not _differences(env, started_under, set_by_imports, _READ[kind]):
            return kind
    return None


def _differences(env: dict, started_under: dict, set_by_imports: dict, read: tuple) -> list:
    """The variables, read as the interpreter starts or as the server's imports ran (`read`), whose value in `env`
    differs from the one the server started under. A value the server's imports set themselves (scikit-learn under
    llm-foundry sets KMP_DUPLICATE_LIB_OK) is no difference: a fresh command's imports set it too."""
    return sorted(k for k in {*env, *started_under} if env.get(k) != started_under.get(k)
                  and not (k in set_by_imports and env.get(k) == set_by_imports[k]) and any(p.match(k) for p in read))


def _base_env() -> dict:
    from helpers import command_env

    return {k: v for k, v in command_env().items() if k != "PYTEST_CURRENT_TEST"}


def run(kind: str, args: list, cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python ARGS` forked from the kind's server: what subprocess.run(capture_output=True, text=True) returns,
    or raises (TimeoutExpired, the command killed). As communicate() does, its output is read through pipes to their
    end, so a process it left holding them (a launcher's job) is waited for."""
    deadline = time.monotonic() + timeout
    server = _server(kind)
    # a local `-m` run's ranks: forked from the rank server where they can be (as_rank), started fresh where not
    rank_python = _rank_python() if kind == "light" and _launches_ranks([str(a) for a in args]) else None
    (out, out_w), (err, err_w) = os.pipe(), os.pipe()
    read: dict = {out: b"", err: b""}
    pid = None
    with socket.socket(socket.AF_UNIX) as conn:
        try:
            conn.connect(server)
            request = json.dumps({"args": [str(a) for a in args], "cwd": str(cwd), "env": env,
                                  "rank_python": rank_python}).encode() + b"\n"
            sent = socket.send_fds(conn, [request], [0, out_w, err_w])
            conn.sendall(request[sent:])
            os.close(out_w), os.close(err_w)
            replies = conn.makefile("rb")
            pid = int(json.loads(replies.readline())["pid"])
            _read_to_the_end(read, deadline)
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            status = json.loads(replies.readline())["status"]
        except BaseException as error:  # a timeout, an interrupted test: the command does not outlive its call
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if isinstance(error, TimeoutError):
                raise subprocess.TimeoutExpired(args, timeout, read[out], read[err]) from None
            raise
        finally:
            for fd in (out, err):
                os.close(fd)
    return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(status), read[out].decode(errors="replace"),
                                       read[err].decode(errors="replace"))


def _read_to_the_end(read: dict, deadline: float) -> None:
    import selectors

    with selectors.DefaultSelector() as selector:
        for fd in read:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for key, _ in selector.select(timeout=left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    read[key.fd] += chunk
                else:
                    selector.unregister(key.fd)


def _server(kind: str) -> str:
    """The socket of this worker's server of `kind`, started on first use (a heavy one takes its imports' ~6 s)."""
    with _STARTING:  # a test may run commands from threads
        return _started(kind)


def _launches_ranks(args: list) -> bool:
    """`-m train -m ...` that is no look and sets no variables of its own: it starts ranks on this machine (a Slurm
    one starts none here, and its executor ignores the interpreter this names)."""
    rest = args[2:]
    return args[:2] == ["-m", "train"] and ("-m" in rest or "--multirun" in rest) \
        and not any(_LOOKS_ONLY.fullmatch(a) or _SETS_ENV.fullmatch(a) for a in rest)


def _rank_python() -> str:
    """The interpreter this worker's light commands give submitit's local executor for their ranks: a script that
    has a rank forked from the rank server (as_rank), and runs any other command with this interpreter."""
    with _STARTING:
        path = _started("rank")
        script = os.path.join(_FOLDER, "python")
        if not os.path.exists(script):
            from helpers import PYTHON

            # -S: no site-packages to scan; the client needs the standard library alone
            Path(script + ".new").write_text(
                f"#!{PYTHON} -S\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport prestarted\n"
                f"prestarted.as_rank({path!r}, {str(PYTHON)!r})\n")
            os.chmod(script + ".new", 0o700)
            os.rename(script + ".new", script)
        return script


def _started(kind: str) -> str:
    if kind in _SERVERS:
        proc, path, *_ = _SERVERS[kind]
        assert proc.poll() is None, f"the prestarted {kind} interpreter ended (exit {proc.returncode})"
        return path
    from helpers import PYTHON, ROOT

    global _FOLDER
    if _FOLDER is None:  # private to this user (0700): whoever reaches a socket runs any command as them
        _FOLDER = tempfile.mkdtemp(prefix="prestarted-")
        atexit.register(shutil.rmtree, _FOLDER, True)
    path = os.path.join(_FOLDER, f"{kind}.sock")
    env, room, flags = _base_env(), {}, []
    if kind == "rank":  # a rank's: submitit starts it unbuffered (-u); room for its environment and command line
        env, room, flags = {**env, **_RANK_ENV}, {"PRESTARTED_ROOM": "x" * _ROOM}, ["-u"]
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import prestarted; "
            f"prestarted.serve({kind!r}, {path!r}, {os.getpid()})")
    proc = subprocess.Popen([str(PYTHON), *flags, "-c", code, *(["x" * (_ROOM >> 4)] if room else [])],
                            cwd=ROOT, env={**env, **room}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    ready = proc.stdout.readline()
    assert ready.startswith(b"ready "), f"the prestarted {kind} interpreter did not start (exit {proc.wait()})"
    _SERVERS[kind] = (proc, path, env, json.loads(ready[len(b"ready "):]))
    atexit.register(proc.kill)  # registered after the folder's removal, so run before it
    return path


def serve(kind: str, path: str, parent: int) -> None:
    """The server: import, then fork a child per request until the pytest worker that started it is gone."""
    import importlib
    import selectors

    # this folder and `-c`'s '': a command's sys.path starts with its working directory alone
    del sys.path[:2]
    room = os.environ.pop("PRESTARTED_ROOM", None)  # its memory stays, for a rank's environment (_show_as)
    before = dict(os.environ)
    from hydra.core.plugins import Plugins

    from common.collector import imported_without_collections

    if kind == "rank":  # submitit's entry point first, as in a fresh rank
        importlib.import_module(RANK[0])
    # in a fresh command's order: `train` (whose exit handler must run after the libraries') before the libraries
    for name in LIGHT:
        importlib.import_module(name)
    if kind in ("heavy", "rank"):
        imported_without_collections(*FOUNDRY)
        for name in HEAVY + RANK[1:] * (kind == "rank"):
            importlib.import_module(name)
    Plugins.instance()  # Hydra's plugin scan, as every command makes first
    # what the imports themselves set (KMP_DUPLICATE_LIB_OK, ...): a fresh command's imports set it too
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    if kind == "light":
        heavy = {"torch", "transformers", "huggingface_hub", "tokenizers"} & set(sys.modules)
        assert not heavy, f"a light command's imports imported {heavy}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    room = _room() if room else None
    sys.stdout.write(f"ready {json.dumps(set_by_imports)}\n")
    sys.stdout.flush()
    running: dict = {}
    while os.getppid() == parent:
        if selector.select(timeout=0.02):
            conn, _ = listener.accept()
            request, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            while not request.endswith(b"\n"):
                request += conn.recv(1 << 16)
            request = json.loads(request)
            if kind == "rank" and (why := _not_forkable(request, before, set_by_imports, room)):
                conn.sendall(json.dumps({"fresh": why}).encode() + b"\n")
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close(), conn.close()
                _command(kind, request, fds, before, set_by_imports)  # never returns
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


def _room() -> dict | None:
    """Where this process's initial command line and environment lie in its memory, which /proc shows
    (/proc/PID/cmdline, /proc/PID/environ: fields 48-51 of /proc/PID/stat), if it can write over them."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(fields[i]) for i in range(45, 49))
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:  # written over with what is there: may it?
            mem.seek(env_start)
            same = mem.read(env_end - env_start)
            mem.seek(env_start)
            mem.write(same)
    except OSError:
        return None
    return {"argv": (arg_start, arg_end), "environ": (env_start, env_end)}


def _shown(strings: list) -> bytes:
    return b"".join(s.encode(errors="surrogateescape") + b"\0" for s in strings)


def _not_forkable(request: dict, imported_under: dict, set_by_imports: dict, room: dict | None) -> list:
    """Why this rank cannot be forked from the rank server ([] if it can): an environment its imports or the
    interpreter's start read otherwise, or one /proc could not show as its own (launchers and tests find ranks by
    their environment: hydra_plugins/pretrain_launcher/outcomes.py, helpers.kill_all_with)."""
    if room is None:
        return ["/proc/self/mem"]
    shown = {"argv": [sys.executable, *request["args"]], "environ": [f"{k}={v}" for k, v in request["env"].items()]}
    return [f"{what} of {len(_shown(shown[what]))} bytes" for what, (start, end) in room.items()
            if len(_shown(shown[what])) > end - start] \
        or _differences(request["env"], imported_under, set_by_imports, _READ["rank"])


def _show_as(request: dict) -> None:
    """Write the rank's command line and environment over the server's, as /proc shows them: a rank forked from
    the rank server is then found as a fresh one is (_not_forkable checked that they fit)."""
    room = _room()
    shown = {"argv": [sys.executable, *request["args"]], "environ": [f"{k}={v}" for k, v in request["env"].items()]}
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        for what, (start, end) in room.items():
            mem.seek(start)
            mem.write(_shown(shown[what]).ljust(end - start, b"\0"))


def _die_with(client: int) -> None:
    """End this rank by SIGKILL as soon as its client (as_rank, the process submitit started) has ended: a rank
    killed with its controller or by a test is never left running."""
    import select

    try:
        watched = os.pidfd_open(client)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        select.select([watched], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="prestarted-client", daemon=True).start()


def _command(kind: str, request: dict, fds: list, imported_under: dict, set_by_imports: dict) -> None:
    """In the forked child: become `python -m MODULE ARGS` in the request's folder and environment, run as `-m`
    runs a module (runpy._run_module_as_main, in a new __main__), and end as the interpreter ends."""
    import gc
    import runpy
    import types

    if kind == "rank":
        _die_with(request["client"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})  # the imports set theirs by setdefault: the command's win
    if kind in ("heavy", "rank"):
        _loud_if_imported_under_other_settings(imported_under, set_by_imports)
    if kind == "rank":  # after os.environ.clear(): nothing points into the server's initial environment any more
        _show_as(request)
    if request.get("rank_python"):
        _ranks_forked(request["rank_python"])
    tempfile.tempdir = None  # found again from this environment when asked
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS (`random` reseeds itself)
        sys.modules["numpy"].random.seed()
    sys.path.insert(0, os.getcwd())
    # a rank's `-u`: the rank server runs unbuffered from its start, as its import-time streams must
    args = request["args"][1:] if kind == "rank" else request["args"]
    _, module, *rest = args
    sys.argv = [module, *rest]
    # as in a fresh `python -m`: the module runs as __main__ before anything imports it under its name (one the
    # server imported as another's dependency is imported again, as a fresh run's later import would)
    sys.modules.pop(module, None)
    sys.modules["__main__"] = types.ModuleType("__main__")
    code, interrupted = 0, False
    try:
        runpy._run_module_as_main(module)
    except SystemExit as exit_:  # as the interpreter reads it
        code = exit_.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        code = code or 0
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
        code, interrupted = 1, isinstance(error, KeyboardInterrupt)
    try:  # what the interpreter does at its end, in its order: threads, exit handlers, __main__'s globals, garbage
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.modules["__main__"].__dict__.clear()
        gc.collect()
        sys.stdout.flush(), sys.stderr.flush()
    finally:
        if interrupted:  # a fresh interpreter ends by the signal
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def _loud_if_imported_under_other_settings(imported_under: dict, set_by_imports: dict) -> None:
    """Where a fresh command imports the libraries (common.collector.imported_without_collections, after the task
    applied cluster.env), their import-time settings must be those this server imported them under: otherwise the
    fork would run under other settings than a fresh command. Exit 70 naming them."""
    import common.collector
    import train.task.main

    imported = common.collector.imported_without_collections

    def checked(*modules: str) -> None:
        changed = sorted(k for k in {*os.environ, *imported_under} if _READ_AT_IMPORT.match(k)
                         and k not in set_by_imports and os.environ.get(k) != imported_under.get(k))
        if changed:
            print(f"prestarted: this command set {', '.join(changed)} before importing {', '.join(modules)}, which "
                  "read it as they are imported, and the heavy interpreter had imported them already: run it fresh "
                  "(helpers.run(..., fresh=True))", file=sys.stderr, flush=True)
            os._exit(70)
        imported(*modules)

    common.collector.imported_without_collections = checked  # the exports' and evaluations' imports
    train.task.main.imported_without_collections = checked  # the task's, imported by name


def _ranks_forked(rank_python: str) -> None:
    """In a light command that starts a local job: submitit's local executor starts its ranks with `rank_python`
    (its `python`, when the command gives none: a container's is "python3"), which has them forked."""
    from submitit.local import local

    init = local.LocalExecutor.__init__

    def __init__(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        if self.python == shlex.quote(sys.executable):  # the default: none given
            self.python = shlex.quote(rank_python)

    local.LocalExecutor.__init__ = __init__


# Signals a rank's client passes on to the rank it had forked (submitit's controller sends SIGUSR2 at a time limit,
# SIGTERM, SIGINT then SIGKILL to stop its tasks); SIGKILL and SIGSTOP cannot be caught: the rank dies with its client
# (_die_with), and a stopped client leaves its rank running.
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGCONT, signal.SIGALRM)


def as_rank(path: str, python: str) -> None:
    """The rank's interpreter as submitit starts it (`_rank_python`): `-u -m submitit.core._submit FOLDER` forked
    from the rank server at `path`, this process standing for it (its pid, environment and command line are what
    submitit and the tests see; the rank's are written to match), passing signals on and ending as it ends. Any
    other command, or a rank the server cannot make the same (another environment), runs in `python` itself."""
    args = sys.argv[1:]
    if args[:3] == ["-u", "-m", "submitit.core._submit"]:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ),
                                  "client": os.getpid()}).encode() + b"\n"
            sent = socket.send_fds(conn, [request], [0, 1, 2])
            conn.sendall(request[sent:])
            replies = conn.makefile("rb")
            reply = json.loads(replies.readline() or b"{}")
            if "pid" in reply:
                for sig in _PASSED_ON:
                    signal.signal(sig, lambda sig, _, pid=reply["pid"]: _pass_on(pid, sig))
                status = json.loads(replies.readline() or b'{"status": 256}')["status"]  # none: the server ended
                if os.WIFSIGNALED(status):
                    with contextlib.suppress(OSError, ValueError):
                        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
                    os.kill(os.getpid(), os.WTERMSIG(status))
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    os.execv(python, [python, *args])


def _pass_on(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
