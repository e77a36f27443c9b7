"""Every use of another library's insides is in common/compat.py, each checked against the versions it was written
against: the installed ones (requirements.lock) pass, another version is refused naming the package, the version
found, the versions supported and the test that pins the behaviour."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common import compat
from common.image import lock_pins, norm

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "train", "data_prep", "hydra_plugins", "bench")
OURS = ("common", "train", "data_prep", "bench", "tests", "hydra_plugins.pretrain_launcher",
        "hydra_plugins.recipe_source")
# The libraries whose module-level functions or classes a patch would replace (`lib.attr = ...`).
PATCHED = ("hydra", "submitit", "composer", "streaming", "torch", "omegaconf", "llmfoundry", "transformers", "runpy",
           "hydra_plugins.hydra_submitit_launcher")
# Names with a leading underscore that the standard library documents as public.
DOCUMENTED = {"_exit", "_replace", "_asdict", "_fields", "_make", "_getframe"}
ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")


def _private(name: str) -> bool:
    """A private name: a leading underscore, not a dunder, and not one of Hydra's config keys (`_target_`)."""
    return name.startswith("_") and not name.endswith("_")


def _ours(module: str) -> bool:
    return any(module == o or module.startswith(o + ".") for o in OURS)


def _files() -> list:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py")
                  if p != ROOT / "common" / "compat.py" and ".venv" not in p.parts)


def _defined(trees) -> set:
    """The private names the product defines itself: functions, classes, variables, its instances' attributes and
    its modules."""
    names = set()
    for path, tree in trees:
        names.add(path.stem)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def reaches_in(source: str, defined: set = frozenset()) -> list:
    """(line, what) for each use of another library's insides in `source`: a private module or name imported from
    it, a private attribute read or written (directly or by getattr & co.) that the product does not define, an
    assignment to an attribute of one of the PATCHED libraries' modules or classes."""
    tree = ast.parse(source)
    found, imported = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not _ours(a.name):
                    imported[a.asname or a.name.split(".")[0]] = a.name
                    if any(_private(part) for part in a.name.split(".")):
                        found.append((node.lineno, f"import {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not _ours(node.module):
            for a in node.names:
                imported[a.asname or a.name] = f"{node.module}.{a.name}"
                if any(_private(part) for part in node.module.split(".") + [a.name]):
                    found.append((node.lineno, f"from {node.module} import {a.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in defined | DOCUMENTED:
            found.append((node.lineno, f".{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and node.args[1].value not in defined):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                module = imported.get(_root(t)) if isinstance(t, ast.Attribute) else None
                if module and any(module == lib or module.startswith(lib + ".") for lib in PATCHED):
                    found.append((t.lineno, f"{ast.unparse(t)} = ... (a patch of {module})"))
    return sorted(set(found))


def test_no_module_but_compat_reaches_into_another_library():
    trees = [(p, ast.parse(p.read_text(), str(p))) for p in _files()]
    defined = _defined(trees)
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p, _ in trees for line, what in reaches_in(p.read_text(),
                                                                                                    defined)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("line, what", [
    ("from hydra._internal.utils import run_and_report", "from hydra._internal.utils import run_and_report"),
    ("import omegaconf._utils", "import omegaconf._utils"),
    ("from streaming.base.shared.prefix import _get_path", "from streaming.base.shared.prefix import _get_path"),
    ("x = loader._parse_overrides_and_create_caching_repo('train', [])", "._parse_overrides_and_create_caching_repo"),
    ("ret._return_value = 1", "._return_value"),
    ("process = getattr(job, '_process', None)", "getattr(..., '_process')"),
    ("from composer.utils import collect_env\ncollect_env.get_cpu_model = str",
     "collect_env.get_cpu_model = ... (a patch of composer.utils.collect_env)"),
    ("import torch.distributed as dist\ndist.reduce_scatter_tensor = print",
     "dist.reduce_scatter_tensor = ... (a patch of torch.distributed)"),
    ("from streaming.base import dataset\ndataset.get_shm_prefix, y = len, 1",
     "dataset.get_shm_prefix = ... (a patch of streaming.base.dataset)"),
])
def test_the_scan_finds_each_kind_of_use(line, what):
    assert [w for _, w in reaches_in(line)] == [what]


@pytest.mark.parametrize("line", [
    "self._held = []\nself._held.append(1)", "os._exit(0)", "cfg = {'_target_': 'a.B'}\nOmegaConf.select(c, 'x._target_')",
    "from common import host_requeue\nhost_requeue._request_requeue(None, 1)", "x.__class__.__name__",
    "import logging\nlogging.raiseExceptions = False", "from .sweeper import _x", "ret.return_value = 2",
])
def test_the_scan_passes_what_is_not_another_librarys_insides(line):
    assert reaches_in(line, defined={"_held", "_request_requeue", "_x"}) == []


def _pinned(test: str) -> bool:
    path, _, name = test.partition("::")
    return (ROOT / path).is_file() and re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M)


def test_each_guard_accepts_the_locked_versions_and_names_a_test_that_exists():
    lock = lock_pins((ROOT / "requirements.lock").read_text())
    assert len(compat.GUARDED) >= 17
    for name, fn in compat.GUARDED.items():
        # named for the library it reaches into
        assert name.removeprefix("patch_").split("_")[0] in ("hydra", "omegaconf", "submitit", "composer",
                                                               "streaming", "torch", "llmfoundry"), name
        assert _pinned(fn.pinned_by), (name, fn.pinned_by)
        for package, versions in fn.versions.items():
            assert lock[norm(package)] in versions, (name, package)
            assert compat.installed(package).split("+")[0] == lock[norm(package)], package
        compat.check(name, fn.versions, fn.pinned_by)  # raises where refused


def _installed_as(tmp_path, versions: dict) -> dict:
    """An environment in which importlib.metadata finds `versions` ({package: version}) before the real ones."""
    for package, version in versions.items():
        info = tmp_path / f"{package.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    import os

    return {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}


@pytest.mark.e2e  # starts Python processes of their own
def test_each_guard_refuses_another_version_before_it_touches_the_library(tmp_path):
    packages = {p for fn in compat.GUARDED.values() for p in fn.versions}
    code = ("import json\nfrom common import compat\nout = {}\n"
            "for name, fn in compat.GUARDED.items():\n"
            "    try:\n"
            "        fn()\n"
            "        out[name] = None\n"
            "    except compat.UnsupportedVersion as err:\n"
            "        out[name] = [err.key, str(err)]\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_installed_as(tmp_path / "old", {p: "0.0.1" for p in packages}))
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert set(said) == set(compat.GUARDED)
    for name, fn in compat.GUARDED.items():
        package, message = said[name]
        supported = fn.versions[package]
        assert message == (
            f"error: {package}: 0.0.1 is installed; common/compat.py: {name} was written against {package} "
            f"{' or '.join(supported)} only\n  fix: install {package}=={supported[-1]} (requirements.lock); or run "
            f"{fn.pinned_by} with {package} 0.0.1 and, where it passes, add 0.0.1 to {name}'s versions"), name
    # a command: refused before OmegaConf is patched
    proc = subprocess.run([sys.executable, "-m", "train", "--help"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=_installed_as(tmp_path / "omegaconf", {"omegaconf": "2.4.0"}))
    assert proc.returncode != 0 and "error: omegaconf: 2.4.0 is installed; common/compat.py: " \
        "patch_omegaconf_parse_each_interpolation_once was written against omegaconf 2.3.1 only" in proc.stderr
    # a local version label is the version it builds (a CUDA wheel of the locked torch)
    code = ("from common import compat\nfn = compat.GUARDED['patch_torch_gloo_reduce_scatter_average']\n"
            "compat.check('patch_torch_gloo_reduce_scatter_average', fn.versions, fn.pinned_by)\n"
            "print(compat.installed('torch'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=_installed_as(tmp_path / "cuda", {"torch": "2.7.0+cu126"}))
    assert proc.returncode == 0 and proc.stdout.strip() == "2.7.0+cu126", proc.stderr
