"""Where the project is: jobs run from this checkout, and both apps compose their config from its conf/. And
whether a folder can be made somewhere, told before anything is written."""
import os
import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
CONF = PROJECT / "conf"

# The kernel's own file systems: nobody's folders are made there (proc answers "no such file", sysfs "not
# permitted", even to root), and their free space reads as 0.
KERNEL_FILE_SYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore",
                                 "bpf", "configfs", "efivarfs", "binfmt_misc", "fusectl", "mqueue", "devpts"})


def _file_system(path: Path) -> str | None:
    """The type of the file system `path` is on: that of the longest mount point above it (/proc/self/mounts)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def unwritable(path) -> str | None:
    """Why no folder can be made at `path` (or, where one is there, written into), or None. Told without writing
    anything: from the nearest part of the path that exists (a file, the kernel's /proc or /sys, a read-only file
    system, a folder this user may not write)."""
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    there = path
    while not os.path.lexists(there) and there.parent != there:
        there = there.parent
    if not there.is_dir():
        what = "a file" if there.is_file() else "a link to nothing" if there.is_symlink() else \
            "a special file (a device, a pipe or a socket)"
        return f"{there} is {what}" + (", not a folder" if there == path else ": no folder can be made inside it")
    kind = _file_system(there.resolve())
    if kind in KERNEL_FILE_SYSTEMS:
        return f"{there} is on the kernel's {kind} file system, which holds the kernel's own files only"
    try:
        if os.statvfs(there).f_flag & os.ST_RDONLY:
            return f"{there} is on a read-only file system"
    except OSError:
        pass
    if not os.access(there, os.W_OK | os.X_OK):
        return f"{there} is not writable by this user"
    return None


def is_remote(path) -> bool:
    """Whether a folder or file given (a save_folder, a load_path, a data location, a container image) is an object
    store's URL (s3://, gs://, oci://, azure://, hf://...): a scheme and `://` at its start, as composer and streaming
    read one (urllib's urlparse, which drops leading spaces; composer reads AZURE_BLOBS:// as azure://); `/data/a://b`
    is a local path to them. Nothing of a
    URL is on this machine to look at, so the rules and steps that read a local folder leave it."""
    return bool(_URL.match(str(path)))


_URL = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*|AZURE_BLOBS)://")


def hub_switched_off_by() -> str | None:
    """The variable that switches the Hugging Face hub off, as huggingface_hub reads them (huggingface_hub.constants):
    HF_HUB_OFFLINE, or TRANSFORMERS_OFFLINE where that is unset or empty, one of 1, on, yes, true; None where the
    hub is on."""
    name = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return name if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") else None
