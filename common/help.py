"""`--help` of each app lists only its own config groups.

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
