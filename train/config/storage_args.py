"""The training command's storage overrides, on the commands that find a run afterwards: `python -m train.export
NAME storage=amlfs storage.root=/lustre/x` (and train.sample, train.evaluate, train.status) look where that
training wrote, composed from conf/storage/ as the training composed it. Without them: the local preset
(`$PRETRAIN_ROOT`, or `./runs`).

Where a run's folders are, decided here once (as conf/ lays them out): its save folder
`<checkpoint_root>/<run_name>` (conf/checkpoint/), its outputs `<output_root>/<run_name>` (conf/train.yaml,
conf/export/hf.yaml), and in them the Hugging Face folder of a batch that llm-foundry's hf_checkpointer writes,
`huggingface/<huggingface_folder_name>` (`ba{batch}` unless the run set it)."""
import os
import re
import string
from pathlib import Path

from common.errors import UserError
from train.plan.estimate import HF_FOLDER_NAME

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


def named(arg: str) -> bool:
    """A command line's word names a run (looked up under the storage's roots), not a path here."""
    return not Path(arg).exists() and os.sep not in arg


def run_folders(run: str | Path, at: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    """(save folder, output folder) of a run: `run` a run name (a str), or its save folder's path (a Path), on the
    storage whose roots are `at` (roots(overrides); the local storage's by default). A save folder elsewhere than
    `<checkpoint_root>/`: in a storage's `checkpoints/`, the `outputs/` beside it (every preset keeps them so);
    else the save folder itself holds its outputs."""
    checkpoint_root, output_root = at or roots([])
    if isinstance(run, str):
        return checkpoint_root / run, output_root / run
    save = Path(os.path.abspath(run))
    if save.parent == Path(os.path.abspath(checkpoint_root)):
        return save, output_root / save.name
    if save.parent.name == "checkpoints":
        return save, save.parent.parent / "outputs" / save.name
    return save, save


HF_SUBFOLDER = "huggingface"  # llm-foundry's hf_checkpointer: <its save_folder>/huggingface/<huggingface_folder_name>


class _Kept(dict):
    """The fields of a name other than those given stay as written (as composer's partial_format leaves them)."""

    def __missing__(self, key):
        return _Field(key)


class _Field:
    def __init__(self, text: str):
        self.text = text

    def __format__(self, spec: str) -> str:
        return "{" + self.text + (f":{spec}" if spec else "") + "}"


class _AnyBatch:
    def __format__(self, spec: str) -> str:
        return "{B}"


def export_folder(save_folder: str | Path, batch: int | None, name: str | None = None,
                  run_name: str | None = None) -> str | Path:
    """The folder hf_checkpointer writes for `batch` under its save_folder (a run's output folder with export=hf):
    `<save_folder>/huggingface/<name>`, `name` its huggingface_folder_name (None: `ba{batch}`) with {batch} (None:
    shown as {B}) and {run_name} filled in; its other fields (composer's {epoch}, {token}, ...) stay as written. A
    Path for a Path, a str for a str (an object store's URL stays whole)."""
    fields = _Kept(batch=_AnyBatch() if batch is None else batch, **({"run_name": run_name} if run_name else {}))
    try:
        folder = string.Formatter().vformat(str(name or HF_FOLDER_NAME), (), fields)
    except (ValueError, IndexError, AttributeError, KeyError):  # a name str.format cannot read: {batch} alone
        folder = str(name or HF_FOLDER_NAME).replace("{batch}", "{B}" if batch is None else str(batch))
    if isinstance(save_folder, Path):
        return save_folder / HF_SUBFOLDER / folder
    return f"{str(save_folder).rstrip('/')}/{HF_SUBFOLDER}/{folder}"


def exports(save_folder: Path, batch: int, name: str | None = None, run_name: str | None = None) -> list:
    """The folders hf_checkpointer wrote for `batch` under `save_folder` (one, or none; several where its name
    holds fields other than {batch} and {run_name}, matched as any)."""
    folder = export_folder(Path(save_folder), batch, name, run_name)
    pattern = re.sub(r"\{[^{}]*\}", "*", str(folder.relative_to(save_folder)))
    if pattern == str(folder.relative_to(save_folder)):
        return [folder] if folder.is_dir() else []
    return sorted(p for p in Path(save_folder).glob(pattern) if p.is_dir())


_BATCH = re.compile("^" + re.escape(HF_FOLDER_NAME).replace(re.escape("{batch}"), r"(\d+)") + "$")


def export_batch(folder: Path) -> int | None:
    """The batch of an export folder named as export=hf and train.export name it (`ba{B}`), or None."""
    found = _BATCH.match(Path(folder).name)
    return int(found[1]) if found else None


def export_run(folder: Path) -> Path | None:
    """The output folder of the run whose export `folder` is (`<output folder>/huggingface/<name>`), or None."""
    folder = Path(folder)
    return folder.parent.parent if folder.parent.name == HF_SUBFOLDER else None
