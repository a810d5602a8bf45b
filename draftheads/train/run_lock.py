"""The lock a running training run holds on its output folder.

A run that is still loading its target has written nothing yet, so its files cannot tell a
second run into the same folder that the folder is taken; this lock does, at once, naming the
first run (pid, host, start time). The lock is an OS file lock, which dies with its process: a
killed run's leftover lock file never blocks the next run.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .run_dir import RunFolderError

LOCK_NAME = ".draftheads-run.lock"


class RunLock:
    """An exclusive lock on a run folder for as long as the run goes on (a context manager).

    ``LOCK_NAME`` holds who took it (pid, host, start time, command) for the refusal message;
    the exclusion itself is ``fcntl.flock`` on that file, which the OS drops when the process
    ends however it ends, so a lock file left by a killed run is taken over, not obeyed. Where
    there is no ``flock`` (Windows) a lock whose pid is dead on this host is taken over."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self.fd: int | None = None
        self.took_over: dict[str, Any] | None = None  # the stale lock's record, when one was replaced

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        previous = _read_lock(fd)
        try:
            import fcntl
        except ImportError:  # no flock: trust a live pid on this host
            fcntl = None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise RunFolderError(self._held_message(previous)) from None
        elif previous and _alive(previous):
            os.close(fd)
            raise RunFolderError(self._held_message(previous))
        self.took_over = previous or None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(_argv())[:500],
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError as e:  # a full disk (a resume after the checkpoint that filled it), a quota
            os.close(fd)
            raise RunFolderError(self._unwritable_message(e)) from None
        self.fd = fd

    @property
    def abandoned(self) -> bool:
        """Whether the lock taken over was left by a process of this host that has died: the run
        that held it is gone (a run on another host might still run where flock is not shared)."""
        return bool(self.took_over) and self.took_over.get("host") == socket.gethostname()

    def _unwritable_message(self, error: OSError) -> str:
        from .checkpoint import latest_checkpoint
        from .disk import disk_note, folder_size, is_short_write

        folder = self.path.parent
        if is_short_write(error):
            latest = latest_checkpoint(folder)
            note = disk_note(folder, folder_size(latest) if latest is not None else None)
            return (f"train.output_dir {folder}: the disk is full ({note}); the run could not even write its lock "
                    f"file {self.path.name}. Free space on that disk, or continue the run elsewhere (copy the folder "
                    "and point train.output_dir at the copy)")
        return f"train.output_dir {folder}: cannot write the run's lock file {self.path.name} ({error.strerror or error})"

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _read_lock(self.fd).get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)  # still ours: a finished run leaves no lock file
        finally:
            os.close(self.fd)  # drops the flock
            self.fd = None

    def _held_message(self, holder: dict[str, Any]) -> str:
        who = (
            f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
            + (f": {holder['command']}" if holder.get("command") else "")
        )
        return (
            f"train.output_dir {self.path.parent} is in use by another run ({who}). Wait for it to finish, stop it, "
            "or choose another train.output_dir"
        )


def _read_lock(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the lock's process still runs (unknowable for another host: assume it does)."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except (KeyError, ValueError, TypeError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _argv() -> list[str]:
    return [os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]]
