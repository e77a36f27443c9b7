"""Which data loaders llm-foundry builds from a config, by their dotted keys: `train_loader`, then `eval_loader`, or
each of `eval_loaders` (several evaluators, each with its `label`: llm-foundry moves a YAML's `eval_loader` list
there) as `eval_loaders.0`, `eval_loaders.1`, ... A null or absent loader is none. Every check and task step that
looks at the loaders' data, workers or lengths goes through this list, so several evaluators are looked at as one.

Light: no torch, no llm-foundry."""
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf


def loader_keys(cfg) -> list:
    cfg = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg)  # llm-foundry's config as a plain dict too

    def at(key):
        return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)

    keys = [k for k in ("train_loader", "eval_loader") if isinstance(at(k), Mapping)]
    many = at("eval_loaders")
    if isinstance(many, Sequence) and not isinstance(many, str):
        keys += [f"eval_loaders.{i}" for i, one in enumerate(many) if isinstance(one, Mapping)]
    return keys


def eval_keys(cfg) -> list:
    return [k for k in loader_keys(cfg) if k != "train_loader"]


def split_folder(root, split) -> Path:
    """The folder streaming reads a split from, as it opens it: os.path.join(root, split), or root itself where no
    split is named. Nothing is expanded (streaming does not expand `~`), and a relative one is relative to the
    working directory the command runs in (the task makes it absolute against it)."""
    return Path(str(root)) / str(split) if split else Path(str(root))


@dataclass(frozen=True)
class MdsSource:
    """One MDS source a loader reads: its dataset, or one stream of a mixture. `local_key` and `remote_key` are the
    keys a user sets to change its folders: variables.data_local / data_remote where the value is theirs (as
    llm-foundry's YAMLs interpolate them), else the source's own."""

    loader: str  # train_loader, eval_loader, eval_loaders.<i>
    key: str  # <loader>.dataset, or <loader>.dataset.streams.<name>
    local: str | None
    remote: str | None
    split: str | None  # its own, else the dataset's (a stream without a split takes the dataset's)
    local_key: str
    remote_key: str

    @property
    def folder(self) -> Path | None:
        """Where streaming reads this source's split from (None without a local folder)."""
        return split_folder(self.local, self.split) if self.local else None


def _tolerant(cfg):
    def read(key):
        try:
            return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        except Exception:  # an interpolation that does not resolve: the checks' resolve rule names it
            return None
    return read


def mds_sources(cfg, read=None) -> Iterator[MdsSource]:
    """Each MDS source of each loader (loader_keys), as streaming will open it: the checks, the task's shard hashes
    and its record of the training data all read the loaders' folders from here. `read(key)` reads a value (the
    checks' own, which names a key without a value); by default one that reads what it can and None otherwise."""
    cfg = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg)
    tolerant = _tolerant(cfg)
    read = read or tolerant
    data_local, data_remote = tolerant("variables.data_local"), tolerant("variables.data_remote")

    def text(v):
        return None if v is None or v == "" else str(v)

    for loader in loader_keys(cfg):
        streams = tolerant(f"{loader}.dataset.streams")
        keys = [f"{loader}.dataset.streams.{name}" for name in streams] \
            if isinstance(streams, Mapping) and len(streams) else [f"{loader}.dataset"]
        for key in keys:
            local, remote = read(f"{key}.local"), read(f"{key}.remote")
            split = read(f"{key}.split") or read(f"{loader}.dataset.split")
            yield MdsSource(loader, key, text(local), text(remote), text(split),
                            "variables.data_local" if local is not None and local == data_local else f"{key}.local",
                            "variables.data_remote" if remote is not None and remote == data_remote
                            else f"{key}.remote")
