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
- a command given Popen options (stdin, input), a script, `python -c`, `run(..., fresh=True)`, and any command while
  PRESTARTED=0 (every command fresh). (`python -m data_prep` is a light one: Hydra and OmegaConf imported, its
  tokenizer library imported by the command itself.)
A heavy command that sets such a variable anyway before it imports the libraries (a preset's cluster.env) fails
loudly, exit 70, naming it.
Forks share their server's string hash seed where fresh processes each draw one (numpy's global generator is
reseeded in each), and so do a forked job's ranks: the references a run is compared with are made fresh
(helpers.finished), with fresh ranks. A forked command's command line and environment are written over its
server's where /proc shows them (each server starts with room for them): the launcher
(common/sweep/outcomes.py) and the tests (helpers.kill_all_with) find it as a fresh one.

Stand-ins: a command a test must be able to kill (`popen`), and a local `-m` run's ranks, which submitit's local
controller starts as `PYTHON -u -m submitit.core._submit FOLDER` (~8.5 s of CPU each, most of it the imports; a
forked light `-m train` gives submitit's executor the rank kind's stand-in as that interpreter), start a small script
in the interpreter's place (`stand_in`). It has the command forked (a rank from a third server: a rank's imports,
unbuffered as `-u` makes them, CUDA_VISIBLE_DEVICES="" as the controller sets it), stands for it (its pid is the one
the controller or the test waits for and signals), passes on the signals it gets and ends as the command ends; the
command dies with it (SIGKILL, by a pidfd). A rank whose environment differs in what the imports read, or a command
/proc could not show, runs fresh in the stand-in's place (exec). Slurm's ranks are fresh, as is a command a test
stops (SIGSTOP reaches the stand-in alone)."""
import atexit
import contextlib
import gc
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
         "common.sweep.status")
HEAVY = ("train.task.main", "train.checkpoint.resume", "train.hf_model", "transformers")
FOUNDRY = ("composer", "llmfoundry.command_utils")
# A light command's that sweeps with Optuna (`hparams_search=`): the sweeper's library, imported as Hydra makes it.
SWEEPER = ("hydra_plugins.hydra_optuna_sweeper._impl",)
# A rank's: submitit's entry point and what it unpickles (our launcher, which runs the training; its plugin class
# comes with Hydra's plugin scan), then a training's.
RANK = ("submitit.core.submission", "common.sweep.launch")
_MODULES = {"train": None, "train.status": "light", "train.export": "heavy", "train.evaluate": "heavy",
            "train.consolidate": "heavy", "train.sample": "heavy", "data_prep": "light"}
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
# submitit.core._submit FOLDER`, are forked from the rank server instead (`_stand_in`).
_LOOKS_ONLY = re.compile(r"(plan=.*|--cfg|--help|-h|--info|--hydra-help)")
# What submitit's local controller gives every rank it starts (the GPUs it may use: none here).
_RANK_ENV = {"CUDA_VISIBLE_DEVICES": ""}
# Room in a server's initial environment and command line for a command's own, written over them (`_show_as`).
_ROOM = 1 << 16
_SERVERS: dict = {}  # kind -> (its process, its socket, the environment it imported under, what its imports set)
_FOLDER = None  # this worker's servers' sockets
_STARTING = threading.RLock()


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
    # a local `-m` run's ranks: forked from the rank server where they can be (stand_in), started fresh where not
    rank_python = _stand_in("rank") if kind == "light" and _launches_ranks([str(a) for a in args]) else None
    (out, out_w), (err, err_w) = os.pipe(), os.pipe()
    read: dict = {out: b"", err: b""}
    pid = None
    with socket.socket(socket.AF_UNIX) as conn:
        try:
            conn.connect(server)
            request = json.dumps({"args": [str(a) for a in args], "cwd": str(cwd), "env": env, "umask": _umask(),
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


# Popen options that apply to a forked command as to a fresh one: its standard streams (the stand-in passes its own
# on), its session (the stand-in's: killing that kills the command), how its output is read. Any other (preexec_fn,
# limits, ...) would reach the stand-in alone: the command then runs fresh.
_STAND_IN_OPTIONS = {"stdin", "stdout", "stderr", "start_new_session", "text", "encoding", "errors"}


def popen(args: list, cwd, env: dict, **options) -> subprocess.Popen:
    """`python ARGS` as subprocess.Popen(options) starts it, forked from the kind's server where that makes no
    difference: the process started is then its stand-in (stand_in), which the command dies with."""
    from helpers import PYTHON

    args = [str(a) for a in args]
    kind = kind_for(args, env, {}) if set(options) <= _STAND_IN_OPTIONS else None
    return subprocess.Popen([_stand_in(kind) if kind else str(PYTHON), *args], cwd=cwd, env=env, **options)


def _stand_in(kind: str) -> str:
    """A script to start in the place of `python` (stand_in): it has the command forked from this worker's server
    of `kind` and stands for it, or runs it in this interpreter where the server cannot make it the same. The rank
    kind's is the interpreter that forked light commands give submitit's local executor for their ranks."""
    with _STARTING:
        path = _started(kind)
        script = os.path.join(_FOLDER, kind)
        if not os.path.exists(script):
            from helpers import PYTHON

            ranks = _stand_in("rank") if kind == "light" else None  # for a local job the command starts
            # -S: no site-packages to scan; a stand-in needs the standard library alone
            Path(script + ".new").write_text(
                f"#!{PYTHON} -S\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport prestarted\n"
                f"prestarted.stand_in({kind!r}, {path!r}, {str(PYTHON)!r}, {ranks!r})\n")
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
    env, flags = _base_env(), []
    if kind == "rank":  # a rank's: submitit starts it unbuffered (-u), CUDA_VISIBLE_DEVICES set
        env, flags = {**env, **_RANK_ENV}, ["-u"]
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import prestarted; "
            f"prestarted.serve({kind!r}, {path!r}, {os.getpid()})")
    # room for a command's own command line and environment, written over these (_show_as)
    proc = subprocess.Popen([str(PYTHON), *flags, "-c", code, "x" * (_ROOM >> 4)], cwd=ROOT,
                            env={**env, "PRESTARTED_ROOM": "x" * _ROOM}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE)
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
    os.environ.pop("PRESTARTED_ROOM")  # its memory stays, for a command's environment (_show_as)
    before = dict(os.environ)
    from hydra.core.plugins import Plugins

    from common.collector import imported_without_collections

    if kind == "rank":  # submitit's entry point first, as in a fresh rank
        importlib.import_module(RANK[0])
    # in a fresh command's order: `train` (whose exit handler must run after the libraries') before the libraries
    for name in LIGHT + SWEEPER * (kind == "light"):
        importlib.import_module(name)
    if kind in ("heavy", "rank"):
        imported_without_collections(*FOUNDRY)
        for name in HEAVY + RANK[1:] * (kind == "rank"):
            importlib.import_module(name)
    Plugins.instance()  # Hydra's plugin scan, as every command makes first
    # what the imports made lives as long as a command: out of every fork's collections (its teardown's included;
    # Optuna's library alone is 200,000 objects, 0.1 s a collection), as common/collector.py keeps a training's
    gc.freeze()
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
    room = _room()
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
            if request.get("client") and (why := _not_forkable(kind, request, before, set_by_imports, room)):
                with contextlib.suppress(OSError):  # a stand-in killed meanwhile
                    conn.sendall(json.dumps({"fresh": why}).encode() + b"\n")
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in (listener, conn, selector, *running.values()):  # the server's, not the command's
                    other.close()
                _command(kind, request, fds, before, set_by_imports, room)  # never returns
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):  # a stand-in killed meanwhile: its command dies with it (_die_with)
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


def _not_forkable(kind: str, request: dict, imported_under: dict, set_by_imports: dict, room: dict | None) -> list:
    """Why a stand-in's command cannot be forked ([] if it can): /proc could not show it as its own (launchers
    and tests find ranks and killed runs by their environment: common/sweep/outcomes.py,
    helpers.kill_all_with), or, for a rank, an environment its imports or the interpreter's start read otherwise
    (a command's was checked by kind_for)."""
    if room is None:
        return ["/proc/self/mem"]
    return _too_long(_shown(request), room) \
        or (_differences(request["env"], imported_under, set_by_imports, _READ[kind]) if kind == "rank" else [])


def _too_long(shown: dict, room: dict) -> list:
    """What of the command's command line and environment does not fit where the server's lie."""
    return [f"{what} of {len(shown[what])} bytes" for what, (start, end) in room.items()
            if len(shown[what]) > end - start]


def _shown(request: dict) -> dict:
    """The command line and environment /proc shows for the command, as bytes."""
    strings = {"argv": [sys.executable, *request["args"]], "environ": [f"{k}={v}" for k, v in request["env"].items()]}
    return {what: b"".join(s.encode(errors="surrogateescape") + b"\0" for s in those)
            for what, those in strings.items()}


def _show_as(request: dict, room: dict | None) -> None:
    """Write the command's command line and environment over the server's, as /proc shows them: a forked rank or
    command is then found as a fresh one is. Where they do not fit (checked before a stand-in's fork) the server's
    stay."""
    shown = _shown(request)
    if room is None or _too_long(shown, room):
        return
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        for what, (start, end) in room.items():
            mem.seek(start)
            mem.write(shown[what].ljust(end - start, b"\0"))


def _die_with(client: int) -> None:
    """End this command by SIGKILL as soon as its stand-in (the process submitit's controller or a test started)
    has ended: a rank killed with its controller, or a command by a test, is never left running."""
    import select

    try:
        watched = os.pidfd_open(client)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        select.select([watched], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="prestarted-client", daemon=True).start()


def _command(kind: str, request: dict, fds: list, imported_under: dict, set_by_imports: dict,
             room: dict | None) -> None:
    """In the forked child: become `python -m MODULE ARGS` in the request's folder and environment, run as `-m`
    runs a module (runpy._run_module_as_main, in a new __main__), and end as the interpreter ends."""
    import runpy
    import types

    if request.get("client"):
        _die_with(request["client"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])  # a fresh process's is its parent's (the training's command sets 027 for its jobs)
    for sig in request.get("ignored", ()):  # ignored and blocked signals stay so across exec
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked", ()))
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})  # the imports set theirs by setdefault: the command's win
    if kind in ("heavy", "rank"):
        _loud_if_imported_under_other_settings(imported_under, set_by_imports)
    _show_as(request, room)  # after os.environ.clear(): nothing points into the server's initial environment now
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


# Signals a stand-in passes on to the command it had forked (submitit's controller sends SIGUSR2 at a time limit,
# SIGTERM, SIGINT then SIGKILL to stop its tasks); SIGKILL and SIGSTOP cannot be caught: the rank dies with its client
# (_die_with), and a stopped stand-in leaves its command running.
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGCONT, signal.SIGALRM)


def stand_in(kind: str, path: str, python: str, rank_python: str | None) -> None:
    """In the place of `python` (_stand_in): `python ARGS` forked from the kind's server at `path` (for the rank
    kind, only `-u -m submitit.core._submit FOLDER`), this process standing for it: its pid, environment and command
    line are what submitit's controller and the tests see (the command's are written to match), it passes signals
    on and ends as the command ends, which dies with it. A command the server cannot make the same (another
    environment, no room to show it) runs in `python` itself."""
    args = sys.argv[1:]
    if kind != "rank" or args[:3] == ["-u", "-m", "submitit.core._submit"]:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            ignored = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
                       and signal.getsignal(s) == signal.SIG_IGN]
            request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ), "client": os.getpid(),
                                  "umask": _umask(), "ignored": ignored,
                                  "blocked": list(signal.pthread_sigmask(signal.SIG_BLOCK, ())),
                                  "rank_python": rank_python if _launches_ranks(args) else None}).encode() + b"\n"
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


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _pass_on(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
