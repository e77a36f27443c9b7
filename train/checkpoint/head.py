"""Whether a checkpoint's files can be loaded, told from the files alone, without torch: the login node's check
of load_path (train/checks/node.py), export, a manifest's content check (train/checkpoint/integrity.py) and the
task's resume (train/checkpoint/resume.py, which adds what only torch can tell) all ask it, so they agree."""
import os
import pickle
import zipfile
from pathlib import Path

# How torch.load tells its two formats (torch/serialization.py): a zip archive starts with this record (its
# `_is_zipfile`); anything else is read as the legacy format (`_legacy_load`), a pickle whose first object is this
# magic number. composer 0.32 loads either (torch.load(weights_only=False)): both are checkpoints here.
ZIP_HEAD = b"PK\x03\x04"
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_PACKED = (".tar", ".tar.gz", ".tgz", ".lz4", ".zst", ".gz", ".bz2", ".xz")  # composer unpacks these itself
# bytes per element of the storage types the legacy format names (torch/_utils.py, torch/storage.py)
_ELEMENT = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
            "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
            "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "QUInt8Storage": 1, "QInt8Storage": 1,
            "QInt32Storage": 4, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "UntypedStorage": 1}


class _Stub:
    """Any class a pickle names: it keeps the state it is given and runs no code, so what torch pickled reads
    without torch (and without running anything a file says)."""

    _named = ""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        self._state = None

    def __setstate__(self, state):
        self._state = state

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass

    def field(self, name):
        """A dataclass field from its pickled state (a __dict__, or (__dict__, slots))."""
        parts = self._state if isinstance(self._state, tuple) else (self._state,)
        return next((p[name] for p in parts if isinstance(p, dict) and name in p), None)


class _Reader(pickle.Unpickler):
    """A pickle read with every class a _Stub; the persistent ids of the legacy format's storages are kept in
    `storages` (key -> (storage type, elements)) instead of being read."""

    def __init__(self, f, storages: dict | None = None):
        super().__init__(f, encoding="utf-8")
        self.storages = storages

    def find_class(self, module, name):
        return type(name, (_Stub,), {"_named": f"{module}.{name}"})

    def persistent_load(self, pid):
        if self.storages is None or not isinstance(pid, tuple):
            raise pickle.UnpicklingError(f"a persistent id where none belongs ({pid!r:.80})")
        if pid[0] == "storage":
            _, kind, key = pid[:3]
            self.storages[key] = (getattr(kind, "__name__", str(kind)),)
        return _Stub()


def head_problem(path) -> str | None:
    """Why composer 0.32 (torch 2.7) could not load `path` as a checkpoint, or None: the one decision, made from
    the files alone and without torch, so that the login node (the check of load_path), export and the task
    (`problem`) say the same. A file: a whole zip archive (its central directory, written last, is there), or the
    legacy format with every storage it indexes there in full; a compressed or tar name is composer's to unpack. A
    folder: a sharded checkpoint whose `.metadata` (written by rank 0 after every rank wrote its shard) is there and
    names shard files that are all there, each as long as the items it indexes in it. `.metadata` is a pickle of
    torch's classes: it is read with those classes stubbed (no torch import: the submit path never imports it, and
    the classes are only containers of the names and sizes read here); a `.metadata` torch itself cannot read is
    the task's to find (`problem`)."""
    path = Path(path)
    if path.is_dir():
        return _sharded_problem(path)
    if path.name.endswith(_PACKED):
        return None
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(len(ZIP_HEAD))
            if size == 0:
                return "empty file (its write never started or was cut off)"
            if head == ZIP_HEAD:
                return None if zipfile.is_zipfile(f) else "truncated (no zip central directory: its write was cut off)"
            if head[:1] == b"\x80":  # a pickle: torch.save's legacy format, if it starts with torch's magic number
                f.seek(0)
                return _legacy_problem(f, size)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    return "not a checkpoint: neither torch.save's zip archive nor its legacy pickle format"


def _legacy_problem(f, size: int) -> str | None:
    """The legacy format as torch.load reads it: magic number, protocol, system info, the object (its tensors'
    storages named by key), the keys, then each storage (its element count, its bytes) in the keys' order."""
    try:
        if _Reader(f).load() != _LEGACY_MAGIC:
            return "not a checkpoint: a pickle, but not one torch.save wrote (no torch magic number)"
        _Reader(f).load(), _Reader(f).load()
        storages: dict = {}
        _Reader(f, storages).load()
        short = False
        for key in _Reader(f).load():
            kind = storages[key][0]
            if kind not in _ELEMENT:
                return f"holds a {kind}, a storage type this check does not know"
            count = f.read(8)
            short = len(count) < 8
            if short:
                break
            f.seek(int.from_bytes(count, "little") * _ELEMENT[kind], os.SEEK_CUR)
    except Exception as err:  # noqa: BLE001 -- whatever a cut-off or foreign pickle raises: named, not a traceback
        return f"truncated or damaged (torch's legacy format: {type(err).__name__}: {str(err)[:200]})"
    if short or f.tell() > size:
        return f"truncated ({size} bytes, short of the storages its legacy format indexes: its write was cut off)"
    return None


class _NotMetadata(ValueError):
    pass


def shard_items(folder) -> dict[str, list]:
    """{shard file: [(offset, length, transforms), ...] in the order of their offsets} of every item a sharded
    checkpoint's `.metadata` indexes, read with torch's classes stubbed (head_problem, and the check of each item's
    CRC-32: train/checkpoint/integrity.py). Raises what a cut-off or foreign pickle raises, or _NotMetadata."""
    with open(Path(folder) / ".metadata", "rb") as f:
        metadata = _Reader(f).load()
    if getattr(metadata, "_named", "") != "torch.distributed.checkpoint.metadata.Metadata":
        raise _NotMetadata(".metadata is not torch's distributed checkpoint metadata")
    items: dict[str, list] = {}
    for info in (metadata.field("storage_data") or {}).values():
        items.setdefault(info.field("relative_path"), []).append(
            tuple(info.field(k) for k in ("offset", "length", "transform_descriptors")))
    return {name: sorted(parts, key=lambda p: p[0]) for name, parts in items.items()}


def _sharded_problem(folder: Path) -> str | None:
    meta = folder / ".metadata"
    if not meta.is_file():
        return "no .metadata: not a sharded checkpoint, or its sharded write did not finish"
    if meta.stat().st_size == 0:
        return "empty .metadata (the sharded write did not finish)"
    try:
        items = shard_items(folder)
    except _NotMetadata:
        return ".metadata is not torch's distributed checkpoint metadata"
    except Exception as err:  # noqa: BLE001 -- a cut-off or foreign pickle
        return f".metadata unreadable ({type(err).__name__}: {str(err)[:200]})"
    for name, parts in sorted(items.items()):
        size, shard = max(offset + length for offset, length, _ in parts), folder / name
        if not shard.is_file():
            return f"shard {name} is missing"
        if shard.stat().st_size < size:
            return f"shard {name} is truncated ({shard.stat().st_size} of {size} bytes)"
    return None
