"""The training command's storage overrides, on the commands that find a run afterwards: `python -m train.export
NAME storage=amlfs storage.root=/lustre/x` (and train.sample, train.evaluate, train.status) look where that
training wrote, composed from conf/storage/ as the training composed it. Without them: the local preset
(`$PRETRAIN_ROOT`, or `./runs`)."""
import os
import re
from pathlib import Path

from common.errors import UserError

_OVERRIDE = re.compile(r"^storage(\.[A-Za-z_]\w*)?=")


def take(argv: list) -> tuple[list, list]:
    """(the other arguments, the storage overrides) of a command line."""
    return [a for a in argv if not _OVERRIDE.match(a)], [a for a in argv if _OVERRIDE.match(a)]


def roots(overrides: list) -> tuple[Path, Path]:
    """(checkpoint root, output root) of the storage these overrides name."""
    if not overrides:
        root = Path(os.path.abspath(os.environ.get("PRETRAIN_ROOT", "runs")))
        return root / "checkpoints", root / "outputs"
    import train  # noqa: F401  (the resolvers the storage presets use)
    from train.config.compose import compose

    try:
        storage = compose(list(overrides)).storage
        return Path(storage.checkpoint_root), Path(storage.output_root)
    except Exception as err:  # a preset that does not exist, a key the storage schema lacks
        raise UserError(" ".join(overrides), f"does not name a storage ({str(err).splitlines()[0]})",
                        "give the training command's own storage overrides, e.g. storage=amlfs "
                        "storage.root=/lustre/x") from None
