"""`continue_from=RUN` and `continue_from=RUN@ba<N>`: a new run that goes on from another run's checkpoint under this
command's settings (another learning rate, schedule, warmup, batch size, data or duration), with that checkpoint's
weights, optimizer state, batch count and data position. It is a run of its own: `continue_from` counts in its
identity (train/config/identity.py), so it has its own name, save folder and identity.json, which records where
it came from (its lineage); the run it continues is only read, never written.

The forms accepted, one decision here:

- `RUN`: a run name, the folder `<storage.checkpoint_root>/RUN` (what `run_name=` names, and what a run's final
  lines print as its checkpoints); or a save folder's path (anything with a `/`: a run whose `save_folder=` was set
  elsewhere). Its newest checkpoint that verifies (train/checkpoint/integrity.py) is the one continued from.
- `RUN@ba<N>`: the checkpoint of batch N in that folder (`ep<E>-ba<N>` in either format), which must verify.

A run named by its folder under the checkpoint root and by its name is one run (the identity spells both as the
name). Light: no torch.
"""
import re
from dataclasses import dataclass
from pathlib import Path

KEY = "continue_from"
_FORM = re.compile(r"(?P<where>[^@\s]+)(?:@ba(?P<batch>\d+))?")


@dataclass(frozen=True)
class Asked:
    """What continue_from= says: where the run is (a name or a path, as given) and the batch asked for, if any."""

    text: str
    where: str
    batch: int | None

    @property
    def is_path(self) -> bool:
        return "/" in self.where

    def folder(self, checkpoint_root) -> Path:
        """The save folder of the run it names: a path as given (its `~` expanded), a name under the root."""
        if self.is_path:
            return Path(self.where).expanduser()
        return Path(str(checkpoint_root)) / self.where


def parse(text) -> Asked | None:
    """continue_from's value read, or None when it is none of the forms above."""
    if not isinstance(text, str):
        return None
    found = _FORM.fullmatch(text.strip())
    if not found or found["where"] in (".", ".."):
        return None
    return Asked(text.strip(), found["where"].rstrip("/") or "/", int(found["batch"]) if found["batch"] else None)


def spelt(text, checkpoint_root) -> str:
    """continue_from as a run's identity counts it: a folder directly under the checkpoint root as its run name
    (`/root/checkpoints/mpt-tiny-1c6d94ab@ba20` and `mpt-tiny-1c6d94ab@ba20` are one run), another path
    normalised; the batch kept (@ba20 and the newest are two runs)."""
    import posixpath

    asked = parse(text)
    if asked is None:
        return str(text)
    where = asked.where
    if asked.is_path:
        where = posixpath.normpath(where)
        if checkpoint_root and str(checkpoint_root).strip():
            root = posixpath.normpath(str(checkpoint_root))
            if posixpath.dirname(where) == root:
                where = posixpath.basename(where)
    return where + (f"@ba{asked.batch}" if asked.batch is not None else "")


def said(lineage: dict | None) -> str:
    """A lineage record (identity.json's `continued_from`) as one says it: `RUN@ba20`; "" for none."""
    if not isinstance(lineage, dict) or not lineage.get("run"):
        return ""
    return f"{lineage['run']}@ba{lineage['batch']}" if lineage.get("batch") is not None else str(lineage["run"])


# The identity's keys that say which training data is read, and in which order: another value is other data, which
# a continuation reads from its beginning (the position in the other run's data means nothing there).
DATA = ("train_loader.", "data.")


def data_changes(theirs: dict, ours: dict) -> list:
    """The keys of two identities (spelt alike) that make their training data differ."""
    return sorted(k for k in set(theirs) | set(ours) if k.startswith(DATA) and theirs.get(k) != ours.get(k))


def same_data(theirs: dict, ours: dict) -> bool:
    return not data_changes(theirs, ours)
