"""A full disk, told as one: which disk, how much is free, how much a checkpoint needs.

torch's zip writer reports a write that ran out of space as ``RuntimeError: ... unexpected pos
N vs M`` (or ``... file write failed``), not as an ``OSError`` with ``errno.ENOSPC``; both mean
the same to a user, who needs the disk's name and the space to free, not the library's words.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

# What torch's PyTorchStreamWriter says when a write comes up short (a full disk, a quota).
_TORCH_SHORT_WRITE = ("unexpected pos", "file write failed", "PytorchStreamWriter failed writing")


def is_short_write(error: BaseException | None) -> bool:
    """Whether ``error`` is a write that ran out of space: ENOSPC/EDQUOT, or torch's short write."""
    if error is None:
        return False
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    return isinstance(error, RuntimeError) and any(s in str(error) for s in _TORCH_SHORT_WRITE)


def mount_point(path: str | os.PathLike) -> Path:
    """The mount point of the file system that holds ``path`` (its nearest existing ancestor)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def folder_size(path: str | os.PathLike) -> int:
    """Bytes of the files under ``path`` (0 when there is none)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def disk_note(path: str | os.PathLike, needed: int | None) -> str:
    """``the disk mounted at M (holding PATH) has F free of T; ... needs about N``."""
    mount = mount_point(path)
    try:
        usage = shutil.disk_usage(mount)
        free = f"has {human(usage.free)} free of {human(usage.total)}"
    except OSError:
        free = "cannot report its free space"
    need = f"; a checkpoint of this run needs about {human(needed)}" if needed else ""
    return f"the disk mounted at {mount} (holding {path}) {free}{need}"
