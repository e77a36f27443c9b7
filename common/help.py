"""Hydra's own commands for each app: `--help` lists only the app's config groups, and one command at a time.

Both apps compose from the one conf/ folder, so Hydra's `$APP_CONFIG_GROUPS` would show training's groups to
data_prep and data_prep's `dataset` to training, with the private `_cpu`/`_slurm` building blocks and the typed
schemas as if they were choices. Each app's `hydra.help.template` names its groups instead, through the
`help_groups` resolver.
"""
from omegaconf import OmegaConf

from common.paths import CONF


def help_groups(*groups: str) -> str:
    """`group: option, option` for each named group that exists; files starting with `_` are not choices."""
    lines = []
    for group in groups:
        folder = CONF / group
        if folder.is_dir():
            options = sorted(p.stem for p in folder.glob("*.yaml") if not p.name.startswith("_"))
            lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)


def register() -> None:
    if not OmegaConf.has_resolver("help_groups"):
        OmegaConf.register_new_resolver("help_groups", help_groups)


# Hydra's commands: it runs one (a ValueError with a traceback for two)
_COMMANDS = {"-m": "-m", "--multirun": "-m", "-r": "--run", "--run": "--run", "-c": "--cfg", "--cfg": "--cfg",
             "-i": "--info", "--info": "--info", "-sc": "--shell-completion", "--shell-completion": "--shell-completion"}


def one_command(args: list, fix: str) -> list:
    """[the problem] where a command line asks Hydra for two of its commands, else []."""
    from common.errors import Problem

    given = list(dict.fromkeys(_COMMANDS[a] for a in args if a in _COMMANDS))
    if len(given) < 2:
        return []
    return [Problem(" ".join(given), "Hydra does one of -m, --run, --cfg, --info and --shell-completion at a time",
                    fix)]
