"""Atomic writes of files and folders: the one helper every writer in draftheads uses.

Imports nothing from the package (only the standard library), so every layer can use it.

Guarantees:
- a file or folder is written under a temporary name in the same folder, its data fsynced,
  then renamed into place and the parent folder fsynced: a reader sees the old copy or the
  complete new one, never a part;
- replacing a folder takes two renames (old copy aside to ``.NAME.old-*``, new copy in). A kill
  between them leaves no ``NAME`` but a complete old copy: ``recover`` (run at the start of
  every write, and by readers through ``recover``) renames it back. At any moment, either the old
  or the new copy is there or recoverable;
- leftovers of interrupted writes (``.NAME.tmp-*``, ``.NAME.old-*``) are removed by the next
  write of ``NAME``, so killed exports do not pile up;
- files are created readable by others (0666 and folders 0777, minus the umask: 0644/0755 under
  the usual umask 022), like any ``open()``, not with ``mkstemp``'s owner-only 0600/0700.

One writer per target at a time is assumed (the training loop writes on its main process only;
the smollm2 cache holds a lock): a write cleans every leftover of its target, including a
concurrent writer's temporary.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

TMP_TAG = ".tmp-"
OLD_TAG = ".old-"

# The primitives, as module attributes so tests can fail or "kill" the process at each of them.
_rename = os.replace
_rmtree = shutil.rmtree


def _fsync_path(path: Path) -> None:
    """Flush a file's or a folder's entries to disk (folders: best effort; not every OS allows it)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        if path.is_dir():
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


_fsync = _fsync_path


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask is process-wide and racy)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~_umask()


def folder_mode() -> int:
    return 0o777 & ~_umask()


def _temp_name(path: Path, tag: str, token: str | None = None) -> Path:
    return path.parent / f".{path.name}{tag}{token or secrets.token_hex(4)}"


def leftovers(path: str | os.PathLike) -> list[Path]:
    """Temporary and displaced copies of ``path`` left by interrupted writes."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(f".{path.name}{TMP_TAG}*")) + sorted(path.parent.glob(f".{path.name}{OLD_TAG}*"))


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        _rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def recover(path: str | os.PathLike) -> bool:
    """Finish what an interrupted write of ``path`` left: if ``path`` is missing but a displaced
    old copy exists (a kill between the two renames of a folder swap), rename it back; then
    remove every leftover temporary. Returns True if a copy was restored."""
    path = Path(path)
    restored = restore_interrupted_swap(path)
    for entry in leftovers(path):
        _remove(entry)
    return restored


def restore_interrupted_swap(path: str | os.PathLike) -> bool:
    """For readers: if ``path`` is missing but a write left its old copy aside, put it back.
    Leaves temporaries alone (a writer may be building one right now)."""
    path = Path(path)
    if path.exists() or path.is_symlink() or not path.parent.is_dir():
        return False
    olds = sorted(path.parent.glob(f".{path.name}{OLD_TAG}*"), key=lambda p: p.stat().st_mtime)
    if not olds:
        return False
    try:
        _rename(olds[-1], path)
    except OSError:  # a writer finished its swap meanwhile, or the folder is read-only
        return False
    _fsync(path.parent)
    return True


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder``, then every folder (deepest first)."""
    dirs = []
    for root, subdirs, files in os.walk(folder):
        for name in files:
            _fsync(Path(root) / name)
        dirs.append(Path(root))
    for d in reversed(dirs):
        _fsync(d)


def _set_modes(folder: Path) -> None:
    """Give a built folder ordinary permissions (writers such as mkdtemp or libraries may not)."""
    fmode, dmode = file_mode(), folder_mode()
    for root, subdirs, files in os.walk(folder):
        os.chmod(root, dmode)
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                os.chmod(p, fmode)


def temp_folder(path: str | os.PathLike, token: str | None = None) -> Path:
    """A fresh, empty temporary sibling of ``path`` to build its new copy in (``token``: a fixed
    name, for several processes that must agree on it). Removes leftovers of earlier writes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    tmp = _temp_name(path, TMP_TAG, token)
    _remove(tmp)
    tmp.mkdir(mode=folder_mode())
    return tmp


def install_folder(built: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Make the finished folder ``built`` (from ``temp_folder``) the new ``path``, atomically.

    On failure ``built`` is removed and ``path`` keeps (or, if the failure fell between the two
    renames, gets back) its previous copy."""
    built, path = Path(built), Path(path)
    old = None
    try:
        _set_modes(built)
        fsync_tree(built)
        if path.exists() or path.is_symlink():
            old = _temp_name(path, OLD_TAG)
            _rename(path, old)
            _fsync(path.parent)
        _rename(built, path)
        _fsync(path.parent)
    except BaseException:
        if old is not None and old.exists():
            if not path.exists():
                _rename(old, path)  # put the previous copy back
            else:
                _remove(old)  # the new copy made it in: the old one is a leftover
        _remove(built)
        raise
    if old is not None:
        _remove(old)
    return path


def write_folder_atomically(path: str | os.PathLike, files: dict[str, Callable[[Path], Any]]) -> Path:
    """Write ``files`` (name -> callable(dest_path) that writes it) into a fresh folder, then
    swap it in place of ``path``."""
    path = Path(path)
    tmp = temp_folder(path)
    try:
        for name, write in files.items():
            write(tmp / name)
    except BaseException:
        _remove(tmp)
        raise
    return install_folder(tmp, path)


def write_file_atomically(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Call ``write(temp_path)`` to write a sibling temporary, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for entry in path.parent.glob(f".{path.name}{TMP_TAG}*"):
        _remove(entry)
    tmp = _temp_name(path, TMP_TAG)
    try:
        write(tmp)
        os.chmod(tmp, file_mode())
        _fsync(tmp)
        _rename(tmp, path)
        _fsync(path.parent)
    except BaseException:
        _remove(tmp)
        raise
    return path


def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> Path:
    return write_file_atomically(path, lambda p: p.write_bytes(data))


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    return write_file_atomically(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json_atomically(path: str | os.PathLike, data: Any, default: Callable[[Any], Any] | None = None) -> Path:
    """``data`` as indented JSON with a trailing newline."""
    return write_text_atomically(path, json.dumps(data, indent=2, default=default) + "\n")


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``PATH.lock`` (beside ``path``) for the block.

    For builders whose check-then-build must not race: a second process waits for the first
    build and then finds it done. The OS drops the lock if the holder dies. Without ``fcntl``
    (not POSIX) there is no lock; writes still install atomically, so a race costs a second
    build, never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.parent / f"{path.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
