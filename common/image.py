"""The training image's contract: what a job needs inside `cluster.container.image`, the marker an image built
from this project's Dockerfile carries, and the check every task runs before submitit's bootstrap.

A job needs, inside the image: a `python3` this project supports (pyproject.toml's requires-python), the packages
pinned in requirements.lock / pyproject.toml, and this project's checkout, which jobs mount at its own path and
run from (the code is not baked into the image: a job runs the checkout it was submitted from, never a stale
copy). The Dockerfile writes MARKER at build time (project, version, the lock's hash, the interpreter and every
installed package's version), so that a login node can tell one of ours from the image file or a sidecar copy of
the marker beside it (`<image>.json`), and say what a job would miss before it is submitted.

The job's check (`srun_prefix`) runs in the container as srun's command, then hands over to submitit's
bootstrap (`exec`): a task in an image that lacks Python, the pinned packages or this project stops in its first
seconds, saying what is missing and how to build the image, instead of failing later with an import error.

Standard library only, and runnable by any `python3` (no syntax newer than the oldest it must speak to): it runs
in images that lack everything else. It is `common.image`, not `train.image`: importing `train` needs Hydra, which
such an image may not have.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
NAME = "slurm-pretrain"  # pyproject.toml's project name, as the marker records it
MARKER = "/etc/slurm-pretrain-image.json"
FORMAT = 1  # of the marker's fields, for a reader of a later version
EXIT = 78  # sysexits' EX_CONFIG: the task's environment is wrong, not the run
# The Dockerfile's steps (docs/cluster-run.md: The image); every message saying how to build the image quotes them.
STEPS = "docker build -t pretrain:latest . && enroot import -o /data/images/pretrain.sqsh dockerd://pretrain:latest"
BUILD = f"build it from the Dockerfile of this checkout: {STEPS} (docs/cluster-run.md: The image)"
# ... and, for a login node without unsquashfs, a copy of its marker beside the .sqsh (read_marker)
SIDECAR = f"docker run --rm pretrain:latest cat {MARKER} > /data/images/pretrain.sqsh.json"
# flash attention: llm-foundry's `gpu` extra, installed by the Dockerfile; the GPU presets train with it.
FLASH = "flash-attn"


# ----------------------------------------------------------------------------------------- reading the pins


def norm(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503): `Mosaicml_Streaming` is `mosaicml-streaming`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict:
    """requirements.lock's `name==version` lines: {name: version}."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)", line)
        if m:
            pins[norm(m.group(1))] = m.group(2)
    return pins


def _strip_comment(line: str) -> str:
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            return line[:i]
    return line


def _project_table(text: str) -> str:
    """pyproject.toml's [project] table, comments removed (tomllib is 3.11+; images may have an older python3)."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\s*\[", line) and not line.strip().startswith("[["):
            inside = line.strip() == "[project]"
            continue
        if inside:
            out.append(_strip_comment(line))
    return "\n".join(out)


def requires_python(pyproject: str) -> str:
    m = re.search(r'^requires-python\s*=\s*"([^"]*)"', _project_table(pyproject), re.M)
    return m.group(1) if m else ""


def direct_requirements(pyproject: str) -> dict:
    """pyproject.toml's `dependencies`: {name: version specifier ("" for any)}."""
    table = _project_table(pyproject)
    m = re.search(r"^dependencies\s*=\s*\[", table, re.M)
    if not m:
        return {}
    strings, quoted, current = [], False, []
    for ch in table[m.end():]:
        if quoted:
            if ch == '"':
                strings.append("".join(current))
                quoted, current = False, []
            else:
                current.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == "]":
            break
    out = {}
    for req in strings:
        r = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)", req)
        if r:
            out[norm(r.group(1))] = r.group(3).strip()
    return out


# ------------------------------------------------------------------------------------------------ versions


def _release(version: str):
    """(release numbers without trailing zeros, rank, rest): rank 0 for a pre-release, 1 final, 2 post. Local
    versions (`2.7.0+cu126`) are the version they build, as PEP 440 compares them with a plain specifier."""
    m = re.match(r"^v?(\d+(?:\.\d+)*)(.*)$", version.split("+", 1)[0].strip().lower())
    if not m:
        return None
    rel = [int(x) for x in m.group(1).split(".")]
    while len(rel) > 1 and rel[-1] == 0:
        rel.pop()
    rest = m.group(2).lstrip(".-_")
    rank = 1 if not rest else 2 if re.match(r"^(post|rev|r(?!c))", rest) else 0
    return tuple(rel), rank, rest


def same_version(a: str, b: str) -> bool:
    ka, kb = _release(a), _release(b)
    return ka == kb if ka and kb else a.strip() == b.strip()


def satisfies(version: str, spec: str) -> bool:
    """Whether `version` meets a specifier of the forms pyproject.toml uses (`==2.7.0`, `>=3.10,<3.12`, `!=`,
    `~=`, `==1.2.*`); a clause it cannot read counts as met (the lock's exact pins are compared as well)."""
    key = _release(version)
    if key is None:
        return True
    padded = list(key[0]) + [0] * 8
    for clause in (c.strip() for c in spec.split(",")):
        m = re.match(r"^(==|!=|~=|>=|<=|>|<)\s*(\S+)$", clause)
        if not m:
            continue
        op, want = m.groups()
        if want.endswith(".*"):
            prefix = [int(x) for x in want[:-2].split(".") if x.isdigit()]
            if (padded[:len(prefix)] == prefix) != (op == "=="):
                return False
            continue
        other = _release(want)
        if other is None:
            continue
        mine, theirs = key[:2], other[:2]
        if op == "~=":  # ~=X.Y.Z: >= X.Y.Z and == X.Y.*
            head = [int(x) for x in re.match(r"^v?(\d+(?:\.\d+)*)", want).group(1).split(".")][:-1]
            ok = mine >= theirs and padded[:len(head)] == head
        else:
            # PEP 440: `<V` leaves out V's pre-releases, `>V` its post-releases
            same = key[0] == other[0] and other[1] == 1
            ok = {"==": key == other, "!=": key != other, ">=": mine >= theirs, "<=": mine <= theirs,
                  ">": mine > theirs and not (same and key[1] == 2),
                  "<": mine < theirs and not (same and key[1] == 0)}[op]
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------------------- what an image has


def installed() -> dict:
    """{name: version} of every distribution this interpreter imports from, the first on sys.path winning (as an
    import would)."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(norm(name), dist.version)
    return found


def lock_sha256(root: Path = PROJECT) -> str:
    return hashlib.sha256((Path(root) / "requirements.lock").read_bytes()).hexdigest()


def project_version(root: Path = PROJECT) -> str:
    m = re.search(r'^version\s*=\s*"([^"]*)"', _project_table((Path(root) / "pyproject.toml").read_text()), re.M)
    return m.group(1) if m else ""


def marker(root: Path = PROJECT) -> dict:
    """What the Dockerfile writes to MARKER once the packages are installed (root: where it copied
    requirements.lock and pyproject.toml)."""
    return {"project": NAME, "format": FORMAT, "version": project_version(root), "lock_sha256": lock_sha256(root),
            "python": "%d.%d.%d" % sys.version_info[:3], "interpreter": sys.executable,
            "packages": dict(sorted(installed().items()))}


def verdict(python: str, packages: dict, root: Path = PROJECT, flash=None):
    """(errors, warnings) of an environment (a Python version and {package: version}) for this checkout's
    pins. Errors surely fail a task: a Python outside requires-python, a dependency of pyproject.toml missing or
    outside its pin. Warnings may not: a pin of requirements.lock that differs (the versions the project is
    tested with). flash=None: say that flash-attn is missing (a warning: the run's attention is not known here);
    False: leave it to the caller, who knows."""
    root = Path(root)
    pyproject = (root / "pyproject.toml").read_text()
    lock = lock_pins((root / "requirements.lock").read_text())
    direct = direct_requirements(pyproject)
    errors, warnings = [], []
    need = requires_python(pyproject)
    if need and not satisfies(python, need):
        errors.append(f"Python {python}, where this project needs {need} (pyproject.toml requires-python)")
    missing = [n for n in direct if n not in packages]
    if missing:
        errors.append("missing " + ", ".join(missing) + " (this project's dependencies, pyproject.toml)")
    wrong = [f"{n} {packages[n]} (pyproject.toml: {spec})" for n, spec in direct.items()
             if n in packages and spec and not satisfies(packages[n], spec)]
    if wrong:
        errors.append("not the pinned versions: " + ", ".join(wrong))
    reported = set(missing) | {w.split(" ", 1)[0] for w in wrong}
    off = [f"{n} missing" if n not in packages else f"{n} {packages[n]} (lock: {v})" for n, v in lock.items()
           if n not in reported and (n not in packages or not same_version(packages[n], v))]
    if off:
        shown = ", ".join(off[:8]) + (f" and {len(off) - 8} more" if len(off) > 8 else "")
        warnings.append(f"{len(off)} of requirements.lock's {len(lock)} pins differ (the versions this project is "
                        f"tested with): {shown}")
    if FLASH not in packages and flash is None:
        warnings.append(f"{FLASH} is not installed: model.attn_config.attn_impl=flash (the GPU presets' setting) "
                        "needs it; the Dockerfile installs it (or train with model.attn_config.attn_impl=torch)")
    return errors, warnings


# ------------------------------------------------------------------------------------------ the job's check


# srun's command in a container job: `sh -c SCRIPT image-check python3 -u -m submitit.core._submit DIR`. Constant
# text (no value of a config is put into it: they arrive as arguments), one line (the sbatch script stays one
# command a line), ending in `exec "$@"`: once the check passes, submitit's bootstrap is the task itself (its
# signals, its exit status).
SCRIPT = " ".join([
    'fix="@BUILD@";',
    'command -v "$1" >/dev/null 2>&1 || { echo "image check: no $1 in this container image, which cannot run the',
    'jobs of this project; $fix" >&2; exit @EXIT@; };',
    '[ -f common/image.py ] || { echo "image check: the checkout of this project is not at $PWD in the container:',
    'jobs mount it at its own path and run from it (put it on a file system every node has)" >&2; exit @EXIT@; };',
    '"$1" -m common.image check; rc=$?;',
    '[ "$rc" -eq 0 ] || { [ "$rc" -eq @EXIT@ ] || echo "image check: $1 could not run the check (exit status $rc,',
    'above), so this image cannot run the jobs of this project; $fix" >&2; exit "$rc"; };',
    'exec "$@"']).replace("@BUILD@", BUILD).replace("@EXIT@", str(EXIT))


def srun_prefix() -> list:
    """srun's command before submitit's: the check, in the container, which then execs the rest."""
    return ["sh", "-c", SCRIPT, "image-check"]


def check(stream=None) -> int:
    """The task's check, inside its image: 0, or EXIT after saying what is missing (every task, in its own log:
    the sweep's summary shows each failed rank's last line). Warnings are printed by the first task only."""
    stream = stream or sys.stderr
    python = "%d.%d.%d" % sys.version_info[:3]
    errors, warnings = verdict(python, installed(), PROJECT)
    try:
        with open(MARKER) as f:
            ours = json.load(f)
    except (OSError, ValueError):
        ours = None
    ours = ours if isinstance(ours, dict) else None
    if errors:
        for e in errors:
            print(f"image check: {e}", file=stream)
        if ours is None:
            where = f"this image has no {MARKER}: it was not built from this project's Dockerfile"
        # by path, not by the file it links to: a venv's python3 and the system's are one binary
        elif ours.get("interpreter") and os.path.normpath(ours["interpreter"]) != os.path.normpath(sys.executable):
            where = (f"{sys.executable} ran here, but the image's packages are installed for {ours['interpreter']} "
                     "(is the image's PATH overridden?)")
        elif ours.get("lock_sha256") != lock_sha256(PROJECT):
            where = "the image was built from another requirements.lock than this checkout's: rebuild it"
        else:
            where = "the image was built from this checkout's requirements.lock, and changed since"
        print(f"image check: {sys.executable} cannot run this project's jobs ({where}); {BUILD}", file=stream)
        return EXIT
    if os.environ.get("SLURM_PROCID", "0") == "0":
        for w in warnings:
            print(f"image check: warning: {w}", file=stream)
    return 0


# ------------------------------------------------------------------------------- the marker, from a login node


def read_marker(image: str):
    """(marker or None, where it was read or why not) of an image file: inside it with unsquashfs (squashfs-tools,
    which enroot's import uses, so it is where .sqsh files are made), else from `<image>.json` beside it when that
    is not older than the image."""
    import shutil
    import subprocess

    path = Path(os.path.expanduser(image))
    why = []
    unsquashfs = shutil.which("unsquashfs")
    if unsquashfs:
        try:
            out = subprocess.run([unsquashfs, "-cat", str(path), MARKER.lstrip("/")], capture_output=True,
                                 timeout=120)
            if out.returncode == 0:
                return _parsed(out.stdout, f"its {MARKER}"), f"its {MARKER}"
            last = (out.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            why.append(f"unsquashfs -cat could not read {MARKER} from it ({last})")
        except (OSError, subprocess.SubprocessError) as err:
            why.append(f"unsquashfs could not read it ({err})")
    else:
        why.append(f"unsquashfs (squashfs-tools) is not on PATH to read its {MARKER}")
    sidecar = Path(str(path) + ".json")
    try:
        if sidecar.stat().st_mtime >= path.stat().st_mtime:
            return _parsed(sidecar.read_bytes(), str(sidecar)), f"the marker beside it, {sidecar}"
        why.append(f"{sidecar} is older than the image")
    except FileNotFoundError:
        why.append(f"no {sidecar} beside it")
    except OSError as err:
        why.append(f"{sidecar}: {err}")
    return None, "; ".join(why)


def _parsed(data: bytes, where: str) -> dict:
    try:
        found = json.loads(data)
    except ValueError:
        return {"unreadable": f"{where} is not JSON"}
    return found if isinstance(found, dict) else {"unreadable": f"{where} is not a JSON object"}


def main(argv: list) -> int:
    if argv[:1] == ["check"]:
        return check()
    if argv[:1] == ["marker"] and len(argv) <= 2:
        # the Dockerfile: `python image.py marker DIR` (DIR holds the requirements.lock and pyproject.toml it
        # installed from) > MARKER
        print(json.dumps(marker(Path(argv[1]) if len(argv) == 2 else PROJECT), indent=1))
        return 0
    print("usage: python -m common.image check | marker [DIR]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
