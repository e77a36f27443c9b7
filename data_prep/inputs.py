"""input= (files, folders, globs, or nothing for the hub) -> the ordered list of source files."""
from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from common.errors import Problem
from common.paths import hub_switched_off_by
from data_prep.errors import DataPrepError
from data_prep.settings import Settings

HUB_PREFIX = "hf://datasets/"
_CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_UNSUPPORTED = (".bz2", ".xz", ".lz4", ".zip", ".tar", ".parquet", ".arrow")


@dataclass(frozen=True)
class Source:
    path: str  # absolute local path, or hf://datasets/<repo>/<file>
    size: int  # bytes on disk (0 when not known yet: hub files)
    mtime_ns: int
    codec: str  # plain | gzip | zstd

    @property
    def splittable(self) -> bool:
        # Only plain text can be cut into byte ranges; gzip and zstd streams must be read from the start.
        return self.codec == "plain" and self.size > 0


def codec_of(path: str) -> str:
    lower = path.lower()
    if lower.endswith(_UNSUPPORTED):
        raise DataPrepError("input", f"{path}: this compression/format is not supported",
                            "give JSON lines, plain or compressed with gzip (.gz) or zstd (.zst)")
    return _CODECS.get(os.path.splitext(lower)[1], "plain")


def _local(path: str) -> Source:
    st = os.stat(path)
    return Source(os.path.abspath(path), st.st_size, st.st_mtime_ns, codec_of(path))


_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}


def _not_compressed(source: Source) -> str | None:
    """Why a .gz or .zst file is surely not one (empty, or another format's first bytes), or None: found before
    anything is written, rather than when its block is read (a file cut short is only seen there, reader.py)."""
    magic = _MAGIC.get(source.codec)
    if magic is None:
        return None
    if source.size == 0:  # no compressor writes 0 bytes (an empty gzip is 20); a copy or download that failed does
        return f"0 bytes: not a {source.codec} file; a copy or download that failed?"
    try:
        with open(source.path, "rb") as fh:
            head = fh.read(len(magic))
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if head != magic:
        return f"not a {source.codec} file: it starts with {head!r}, not {magic!r}, and its name says {source.codec}"
    return None


# Folder names a corpus gives its splits (SlimPajama-627B: train/, validation/, test/), by what each holds
SPLIT_KINDS = {"train": "train", "training": "train", "validation": "held-out", "valid": "held-out",
               "val": "held-out", "eval": "held-out", "dev": "held-out", "holdout": "held-out", "test": "test"}


def _other_split(path: str, settings: Settings) -> None:
    """An input under a folder named for another kind of split than split= (train/ made into split=val: an
    evaluation on training data, a held-out folder trained on): said, as a copy may be named so on purpose."""
    ours = SPLIT_KINDS.get(settings.split)
    named = next((part for part in reversed(Path(path).parts[:-1] if os.path.isfile(path) else Path(path).parts)
                  if part in SPLIT_KINDS), None)
    if ours and named and SPLIT_KINDS[named] != ours:
        logging.getLogger(__name__).warning(
            f"data_prep: warning: input: {path} is under a folder named {named}/, made here into split="
            f"{settings.split}: a {SPLIT_KINDS[named]} split's documents in a {ours} split (check input= and split=)")


def _expand(item: str, settings: Settings) -> list[str]:
    path = os.path.expanduser(item)
    if os.path.isdir(path):
        found: list[str] = []
        for pattern in settings.dataset.file_globs:
            found += glob.glob(os.path.join(glob.escape(path), pattern), recursive=True)
        files = _not_output(sorted({f for f in found if os.path.isfile(f)}), settings)
        if not files:
            raise DataPrepError("input", f"folder {path} holds no {' or '.join(settings.dataset.file_globs)} files "
                                f"(what dataset={settings.dataset.name} reads)",
                                "point input= at the files themselves, or pick the dataset= that matches them")
        splits = sorted({Path(f).relative_to(path).parts[0] for f in files if len(Path(f).relative_to(path).parts) > 1}
                        & SPLIT_KINDS.keys())
        if len(splits) > 1:  # a corpus's root (SlimPajama-627B/): one split of all of them mixes in held-out data
            raise DataPrepError("input", f"folder {path} holds the splits {', '.join(splits)}: read whole, every "
                                f"one of them would be in split={settings.split}",
                                "point input= at one split's folder, e.g. input="
                                f"{os.path.join(item, settings.split if settings.split in splits else splits[0])}")
        return files
    if os.path.isfile(path):
        return [path]
    if glob.has_magic(path):
        files = _not_output(sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f)), settings)
        if not files:
            raise DataPrepError("input", f"the pattern {path} matches no files", "check the path and quoting")
        return files
    raise DataPrepError("input", f"{path} does not exist", "pass input=<file|folder|glob> of JSON lines")


def _not_output(files: list[str], settings: Settings) -> list[str]:
    """The files of a folder or pattern, less those under out_root: an out_root inside the input folder holds this
    tool's own files on the next run (its plan, block records), not documents nor another dataset."""
    out = os.path.realpath(settings.out_root)
    kept = [f for f in files if os.path.commonpath([os.path.realpath(f), out]) != out]
    if len(kept) < len(files):
        logging.getLogger(__name__).warning(f"data_prep: warning: input: {len(files) - len(kept)} file(s) under "
                                            f"out_root {settings.out_root} left out (this tool's output, not input)")
    return kept


def _hub_sources(settings: Settings) -> list[Source]:
    ds = settings.dataset
    if not ds.hub_repo:
        raise DataPrepError("input", f"is required for dataset={ds.name}", "pass input=<file|folder|glob>")
    count = ds.hub_shards.get(ds.hub_split)
    if not count:
        raise DataPrepError("dataset.hub.split", f"{ds.hub_repo} has no split {ds.hub_split!r} "
                            f"(known: {', '.join(ds.hub_shards)})", "e.g. split=val dataset.hub.split=validation")
    _require_hub(ds.hub_repo)
    names = [f"{ds.hub_subset}/c4-{ds.hub_split}.{i:05d}-of-{count:05d}.json.gz" for i in range(count)]
    return [Source(f"{HUB_PREFIX}{ds.hub_repo}/{name}", 0, 0, "gzip") for name in names]


def _require_hub(repo: str) -> None:
    fix = "pass input=<folder with c4-*.json.gz files> to read a local copy"
    off = hub_switched_off_by()
    if off:
        raise DataPrepError("input", f"not given, and the hub is switched off ({off}) for {repo}", fix)
    try:
        from huggingface_hub import HfApi

        HfApi().dataset_info(repo, timeout=15)
    except Exception as err:  # any failure here means "cannot read the hub from this machine"
        raise DataPrepError("input", f"not given, and the hub ({repo}) is unreachable: {type(err).__name__}", fix) from None


def resolve_sources(settings: Settings) -> list[Source]:
    if not settings.inputs:
        return _hub_sources(settings)
    # by the file itself (its device and inode): a link to a file already given, symbolic or hard, is that file,
    # read once (a hard link, which realpath does not see, would be read twice: every document doubled)
    seen: dict[tuple, Source] = {}
    problems = []
    for item in settings.inputs:
        _other_split(os.path.expanduser(item), settings)
        for path in _expand(item, settings):
            source = _local(path)
            why = _not_compressed(source)
            if why:
                problems.append(Problem("input", f"{source.path}: cannot be read to the end ({why})",
                                        "re-download or repair that file, or leave it out of input="))
            st = os.stat(source.path)
            first = seen.setdefault((st.st_dev, st.st_ino), source)
            if first is not source and first.path != source.path:
                logging.getLogger(__name__).warning(f"data_prep: warning: input: {source.path} is {first.path} "
                                                    "(a link to it): read once")
            elif first is source and source.size == 0 and source.codec == "plain":
                # An empty JSON lines file is legal (no documents), but it is far more often a copy or download
                # that failed (a 0-byte .gz or .zst cannot be read and stops the run, see reader.py): said, so it
                # is not lost unnoticed.
                logging.getLogger(__name__).warning(f"data_prep: warning: input: {source.path} is empty (0 bytes): "
                                                    "it adds no document, most likely a copy that failed; if it "
                                                    "should hold documents, copy it again and run into a new out_root")
    if problems:  # every such file at once
        raise DataPrepError(problems=problems)
    sources = list(seen.values())
    _warn_compressed_copies(sources)
    return sources


def _warn_compressed_copies(sources: list[Source]) -> None:
    """A file beside its compressed copy (a.jsonl and a.jsonl.gz, as `gzip -k` leaves them) is most likely the
    same documents twice: both are read, as given, and said (nothing else shows every document doubled)."""
    by_stem: dict[str, list[str]] = {}
    for src in sources:
        stem = src.path[: -len(os.path.splitext(src.path)[1])] if src.codec != "plain" else src.path
        by_stem.setdefault(stem, []).append(src.path)
    for paths in (p for p in by_stem.values() if len(p) > 1):
        logging.getLogger(__name__).warning(f"data_prep: warning: input: {' and '.join(sorted(paths))} are one file "
                                            "and its compressed copy, most likely the same documents: both are read "
                                            "(give one of them to read them once)")


def open_local(source: Source) -> str:
    """Local path for reading: hub files are fetched (and cached) by huggingface_hub on first use."""
    if not source.path.startswith(HUB_PREFIX):
        return source.path
    from huggingface_hub import hf_hub_download

    repo_and_file = source.path[len(HUB_PREFIX):]
    owner, name, filename = repo_and_file.split("/", 2)
    return hf_hub_download(f"{owner}/{name}", filename, repo_type="dataset")
