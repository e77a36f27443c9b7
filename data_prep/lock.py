"""Keep a second, independent run out of out_root/<split>, while the parts of one run write side by side.

What corrupts is two processes writing the same block (each clears the other's temporary folder), merging
at once, or two runs with different settings adding blocks to one dataset. So a run locks what it writes,
as byte ranges of one lock file, `out_root/<split>/.data_prep_lock/lock` (POSIX record locks, fcntl.lockf):

    byte 0                    the merge (tail/ and index.json): a part that merges waits for it, so two
                              parts finishing together merge one after the other
    byte 1 + i                block i: a plain run (every part, then the merge) locks the whole file,
                              `part=p` the contiguous range of its blocks (exclusive, refused if taken)
    byte SETTINGS + hash      shared by the parts of one run (same plan = same byte); a part is refused
                              while another byte of that area is held, i.e. a run with other settings

So the parts of one sweep never collide, while a second run is refused before it writes anything if it
would write any of the same blocks (same part, a plain run, another num_parts whose parts overlap) or
has other settings.

Why record locks, not a lock file that exists or flock: the kernel drops them when the process dies
(SIGKILL, OOM; on NFS when the node's lease ends), so a crashed run never leaves a stuck lock, and unlike
flock they are not inherited by the forked tokenizer workers, which may outlive a killed parent briefly.
The lock file stays empty; `<host>-<pid>.json` beside it only names the holder in the refusal message.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import struct
import time
from pathlib import Path

from data_prep.blocks import LOCK_FOLDER, Block
from data_prep.errors import DataPrepError, writing
from data_prep.settings import Settings

SETTINGS = 1 << 40  # far above any block's byte
FIX = ("wait for that run to finish or stop it, or choose another out_root; a crashed run holds no lock "
       "(it dies with the process), so if that process is gone just run again")


def _overlaps(a, b) -> bool:
    """Byte ranges [start, end); end None runs to infinity."""
    return (b[1] is None or a[0] < b[1]) and (a[1] is None or b[0] < a[1])


class OutRootLock:
    def __init__(self, settings: Settings, blocks: list[Block], plan: bytes):
        # Inside the split (out_root holds only <split>/ folders). Removed only by a refused run that made it and
        # is alone there (withdraw); a process about to lock it checks that it locked the file that is there
        # (acquire).
        self.settings, self.folder = settings, settings.split_dir / LOCK_FOLDER
        self.settings_byte = SETTINGS + int(hashlib.sha256(plan).hexdigest()[:8], 16)
        if settings.part is None:
            self.range: tuple[int, int | None] = (0, None)  # every block, the merge, every settings byte
            self.what = "every part and the merge"
        elif blocks:
            self.range = (1 + blocks[0].index, 2 + blocks[-1].index)  # a part's blocks are contiguous
            self.what = f"part {settings.part}/{settings.num_parts}, blocks {blocks[0].index}-{blocks[-1].index}"
        else:
            self.range = (1, 1)  # a part with no blocks: nothing of its own to lock
            self.what = f"part {settings.part}/{settings.num_parts}, no blocks"
        self.me = f"{socket.gethostname()}-{os.getpid()}"
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take this run's ranges now or refuse (DataPrepError, exit 2). Writes nothing in out_root/<split>."""
        for _ in range(100):  # a refused run that was alone removes the lock file (withdraw): lock the one there now
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                self.fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # its folder removed this instant
                continue
            try:
                self._take_ranges()
            except DataPrepError:
                self.release()
                raise
            if self._still_there():
                break
            self.release()
        else:
            raise DataPrepError("out_root", f"{self.folder / 'lock'} was removed each time this run locked it",
                                "run again (data_prep runs refused in that folder remove the lock file they made)")
        start, end = self.range
        if end is None or end > start:
            self._forget_dead_holders()
        info = {"host": socket.gethostname(), "pid": os.getpid(), "what": self.what, "range": list(self.range),
                "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        note = self.folder / f"{self.me}.json"
        try:
            with writing(note):  # a full disk shows here first
                note.write_text(json.dumps(info))
        except BaseException:
            self.release()  # removes the note too
            raise

    def _take_ranges(self) -> None:
        start, end = self.range
        if end is None or end > start:
            self._take(fcntl.LOCK_EX, start, end, "would write the same blocks")
        if self.settings.part is not None:
            byte = self.settings_byte  # shared with our sibling parts; only a plain run holds it exclusively
            self._take(fcntl.LOCK_SH, byte, byte + 1, "cannot run beside a run of every part")
            if self._held(SETTINGS, byte) or self._held(byte + 1, None):
                self._refuse("has other settings (another data_prep_plan.json): their blocks would not mix")

    def _still_there(self) -> bool:
        """Whether the file this process locked is still the split's lock file, not one removed since by withdraw."""
        try:
            st = os.stat(self.folder / "lock")
        except FileNotFoundError:
            return False
        mine = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def alone(self) -> bool:
        """After a refusal: whether no other process holds any range here (a sibling part, another run). Takes every
        byte when so, and keeps them until release, so that nothing starts here while this run takes back what it
        made. A split without a lock file holds nobody's."""
        if self.fd is None:
            try:
                self.fd = os.open(self.folder / "lock", os.O_RDWR)
            except FileNotFoundError:
                return True
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            return False
        return True

    def withdraw(self) -> None:
        """Remove the lock folder (this run made it, and is alone: see alone) and release. A run that opened the lock
        file meanwhile finds it gone once it holds its ranges, and locks the new one (acquire)."""
        (self.folder / "lock").unlink(missing_ok=True)
        self.release()
        try:
            self.folder.rmdir()
        except OSError:  # a run starting here already made it again
            pass

    def lock_merge(self) -> None:
        """Wait for byte 0: another part of this run may be merging the same blocks right now."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)

    def release(self) -> None:
        if self.fd is None:
            return
        (self.folder / f"{self.me}.json").unlink(missing_ok=True)
        os.close(self.fd)  # closing the file drops every range this process held
        self.fd = None

    def _take(self, kind: int, start: int, end: int | None, problem: str) -> None:
        try:
            fcntl.lockf(self.fd, kind | fcntl.LOCK_NB, 0 if end is None else end - start, start)
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            self._refuse(problem)

    def _held(self, start: int, end: int | None) -> bool:
        """Does another process hold any of [start, end)? F_GETLK asks without taking anything."""
        query = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, start, 0 if end is None else end - start, 0)
        return struct.unpack("@hhqqi4x", fcntl.fcntl(self.fd, fcntl.F_GETLK, query))[0] != fcntl.F_UNLCK

    def _refuse(self, problem: str) -> None:
        raise DataPrepError("out_root", f"{self.settings.split_dir} is being written by another data_prep run"
                            f"{self._holder()}; this run ({self.what}) {problem}", FIX)

    def _notes(self) -> list[tuple[Path, dict]]:
        found = []
        for path in self.folder.glob("*.json"):
            try:
                found.append((path, json.loads(path.read_text())))
            except (OSError, ValueError):
                continue  # being written or removed right now
        return found

    def _forget_dead_holders(self) -> None:
        # We hold our range now, so whoever left a note overlapping it is gone (killed before it cleaned up).
        for path, info in self._notes():
            if path.stem != self.me and _overlaps(self.range, info.get("range", (0, None))):
                path.unlink(missing_ok=True)

    def _holder(self) -> str:
        notes = [info for _, info in self._notes()]
        if not notes:
            return ""
        # Prefer a note overlapping our range; the newest, as an older one may be from a crashed run.
        info = max(notes, key=lambda i: (_overlaps(self.range, i.get("range", (0, None))), i.get("since", "")))
        return f" (host {info.get('host')} pid {info.get('pid')}: {info.get('what')}, since {info.get('since')})"
