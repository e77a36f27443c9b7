"""How the project's modules import one another, read from their source (every import statement, those inside
functions included): no circle, and Hydra's plugin package holds only what Hydra's plugin scan must find, imported
by nothing else (the scan executes its modules again in place, so what another module holds on to from there is
redefined under it)."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = "hydra_plugins"
PACKAGES = ("train", "common", "data_prep", PLUGINS)  # the project's importable packages
OUTSIDE = ("train", "common", "data_prep", "tests", "bench")  # every folder of Python outside the plugin package


def _modules() -> dict:
    """Module name -> its file, for every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(path: Path, name: str) -> set:
    """Every name an import statement of the file imports (`from a.b import c`: a.b.c, the module c or a.b's c)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _graph() -> dict:
    modules = _modules()

    def ours(imported: str):  # the module itself, or the one that defines the name imported
        while imported and imported not in modules:
            imported = imported.rpartition(".")[0]
        return imported or None

    return {name: {ours(i) for i in _imported(path, name)} - {None, name} for name, path in modules.items()}


def _circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's), each as one cycle through them."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle(graph, component) for component in found]


def _cycle(graph: dict, component: set) -> list:
    """One cycle within a strongly connected component, from its first module back to it (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(component)


def test_the_circle_finder_finds_a_circle_through_an_import_inside_a_function(tmp_path):
    """What the test below relies on: an import inside a function is an edge, and a circle is named module by
    module."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c", "a"]]
    (tmp_path / "m.py").write_text("import os\n\ndef f():\n    from train.config import compose\n")
    assert _imported(tmp_path / "m.py", "m") == {"os", "train.config.compose"}


def test_the_projects_modules_import_one_another_without_a_circle():
    """A circle makes what a module finds of another depend on which of them was imported first (a name not yet
    defined, or an import hidden inside a function to dodge that): each shared piece lives in a module that every
    one of its users imports, and that imports none of them."""
    circles = _circles(_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_nothing_outside_the_plugin_package_imports_it_or_names_its_modules():
    """Product, tests and benchmarks import the logic from its own package (common/sweep/, train/config/), never
    the thin plugin classes: by an import statement of any module of the plugin namespace, or by a module or class
    inside one of our plugin packages named in a string (a module to import, a `_target_` or its prefix)."""
    ours = tuple(f"{PLUGINS}.{d.name}" for d in (ROOT / PLUGINS).iterdir() if (d / "__init__.py").is_file())
    assert ours, "no plugin package found"
    found = []
    for folder in OUTSIDE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else
                         [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else [])
                imports = not isinstance(node, ast.Constant)
                for name in names:
                    if (name.split(".")[0] == PLUGINS if imports else any(o + "." in name for o in ours)):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, "\n".join(found)


def test_the_plugin_package_holds_only_plugin_classes_and_their_registered_settings():
    """Each module of our plugin packages defines Hydra plugin classes (a Launcher, a Sweeper, a ConfigSource) and
    the dataclasses of the settings it registers in Hydra's ConfigStore; nothing else (a function, another class:
    logic, which belongs in its own package)."""
    import dataclasses
    import importlib

    from hydra.plugins.plugin import Plugin

    for path in sorted((ROOT / PLUGINS).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        defined = {k: v for k, v in vars(module).items() if getattr(v, "__module__", None) == name}
        odd = [k for k, v in defined.items()
               if not (isinstance(v, type) and (issubclass(v, Plugin) or dataclasses.is_dataclass(v)))]
        assert not odd, f"{name} defines {odd}: not a plugin class nor its settings"


@pytest.mark.e2e
def test_hydras_plugin_scan_imports_nothing_of_training():
    """Every Hydra app scans the plugin package as it starts, data_prep's among them: the yaml= config source
    imports training's reading of the file only when training composes (importing `train` registers its resolvers
    and its groups' schemas in Hydra's ConfigStore)."""
    code = ("import sys\nfrom hydra.core.plugins import Plugins\nPlugins.instance()\n"
            "print(sorted(m for m in sys.modules if m == 'train' or m.startswith('train.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
