"""Hydra imports every installed Hydra plugin (each module under the `hydra_plugins` namespace) before it reads a
command line. One that fails with an ImportError is a warning of Hydra's; one that fails with anything else
(hydra-nevergrad-sweeper 1.2.0 on Python 3.11 does) ends every command of this tool in Hydra's scan traceback,
naming neither the plugin's package nor what to do. Scanned first here (the scan Hydra would make, once per process), it
is named, with the fix. Light: no torch."""
import sys
from pathlib import Path


def scan_or_say() -> None:
    from hydra.core.plugins import Plugins

    try:
        Plugins.instance()
    except Exception as err:  # a plugin's own error, whatever it is
        module, origin = _failing(err.__traceback__)
        dist = _distribution(origin)
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        print(f"error: {module or 'a Hydra plugin'}: a Hydra plugin installed here fails to import "
              f"({type(err).__name__}: {err})" + (f", from {origin}" if origin else "") + (f" (package {dist})" if dist
              else "") + ": Hydra imports every installed plugin before any command, so no command can run\n"
              f"  fix: pip uninstall {dist or '<its package>'}, or install a version of it that imports on Python "
              f"{python} (for hydra-nevergrad-sweeper: 1.4.0rc3, docs/sweeps.md)", file=sys.stderr)
        sys.exit(2)


def _failing(tb) -> tuple:
    """The plugin module Hydra's scan was importing when it failed, and its file."""
    module = origin = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "_scan_all_plugins":
            module = frame.f_locals.get("modname")
            spec = frame.f_locals.get("spec")
            origin = getattr(spec, "origin", None)
        tb = tb.tb_next
    return module, origin


def _distribution(origin) -> str | None:
    """The installed package (distribution) that holds the file `origin`, or None."""
    if not origin:
        return None
    from importlib import metadata

    target = Path(origin).resolve()
    for dist in metadata.distributions():
        for file in dist.files or ():
            if file.name == target.name and Path(dist.locate_file(file)).resolve() == target:
                return dist.metadata["Name"]
    return None
