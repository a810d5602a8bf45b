"""draftheads/atomic.py: the one writer. A kill at any moment leaves the old or the new copy (or a
displaced old copy that the next write or read restores); failures clean up; leftovers of killed
writes are removed; written files are readable by others."""
from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from draftheads import atomic

ATOMIC_FILE = Path(atomic.__file__)


def _write(path: Path, content: str) -> None:
    atomic.write_folder_atomically(path, {
        "a.txt": lambda p: p.write_text(content),
        "sub": lambda p: (p.mkdir(), (p / "b.txt").write_text(content)),
    })  # fmt: skip


def _content(path: Path) -> str | None:
    """The folder's content if it is a complete copy, else None."""
    try:
        a = (path / "a.txt").read_text()
        b = (path / "sub" / "b.txt").read_text()
    except OSError:
        return None
    return a if a == b else None


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_written_files_and_folders_are_readable_by_others(tmp_path, umask022):
    target = tmp_path / "out"
    _write(target, "x")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "a.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((target / "sub" / "b.txt").stat().st_mode) == 0o644
    atomic.write_json_atomically(tmp_path / "m.json", {"a": 1})
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644


def test_exported_heads_are_readable_by_others(tmp_path, tiny_llama, umask022):
    from draftheads import MedusaHeads

    path = MedusaHeads.for_target(tiny_llama, num_heads=2).save_pretrained(tmp_path / "heads")
    assert stat.S_IMODE(Path(path).stat().st_mode) == 0o755
    for f in Path(path).iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


KILLER = textwrap.dedent(
    """
    import importlib.util, os, sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("atomic", sys.argv[1])
    atomic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(atomic)
    kill_at, calls = int(sys.argv[3]), [0]

    def point():
        if calls[0] == kill_at:
            os._exit(9)  # a kill: no cleanup, no finally
        calls[0] += 1

    for name in ("_rename", "_fsync", "_rmtree"):
        real = getattr(atomic, name)
        setattr(atomic, name, lambda *a, _real=real, **k: (point(), _real(*a, **k))[1])

    def writer(text):
        def write(p):
            point()
            p.write_text(text)
        return write

    def sub(p):
        point()
        p.mkdir()
        (p / "b.txt").write_text("new")
    atomic.write_folder_atomically(Path(sys.argv[2]), {"a.txt": writer("new"), "sub": sub})
    """
)


def test_a_kill_at_any_step_of_the_swap_leaves_the_old_or_the_new_copy(tmp_path):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    completed = False
    for kill_at in range(200):
        target = tmp_path / f"k{kill_at}" / "out"
        _write(target, "old")
        proc = subprocess.run([sys.executable, str(script), str(ATOMIC_FILE), str(target), str(kill_at)])
        if proc.returncode == 0:
            completed = True
            assert _content(target) == "new"
            break
        assert proc.returncode == 9
        now = _content(target)
        if now is None:  # killed between the two renames: the old copy is aside, complete
            assert not target.exists()
            assert atomic.recover(target)
            now = _content(target)
        assert now in ("old", "new"), (kill_at, now)
        atomic.recover(target)  # what the next write or read does first
        assert _content(target) == now and atomic.leftovers(target) == []
        _write(target, "next")
        assert _content(target) == "next" and atomic.leftovers(target) == []
    assert completed and kill_at >= 8, kill_at  # every primitive of the swap was a kill point


def test_a_failure_at_any_step_keeps_a_complete_copy_and_cleans_up(tmp_path, monkeypatch):
    for fail_at in range(200):
        target = tmp_path / f"f{fail_at}" / "out"
        _write(target, "old")
        calls = [0]

        def point():
            calls[0] += 1
            if calls[0] - 1 == fail_at:  # fails once, like a transient error
                raise OSError(28, "No space left on device")

        for name in ("_rename", "_fsync"):
            real = getattr(atomic, name)
            monkeypatch.setattr(atomic, name, lambda *a, _real=real, **k: (point(), _real(*a, **k))[1])
        try:
            _write(target, "new")
            done = True
        except OSError:
            done = False
        monkeypatch.undo()
        assert _content(target) == "new" if done else _content(target) in ("old", "new"), fail_at
        assert atomic.leftovers(target) == [], (fail_at, atomic.leftovers(target))
        if done:
            break
    assert done and fail_at >= 6


def test_file_write_failure_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    atomic.write_json_atomically(path, {"v": 1})

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "_rename", full)
    with pytest.raises(OSError):
        atomic.write_json_atomically(path, {"v": 2})
    assert path.read_text() == '{\n  "v": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_stale_leftovers_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "heads"
    _write(target, "old")
    for name in (".heads.tmp-dead1", ".heads.old-dead2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".heads.tmp-file").write_text("partial")
    (tmp_path / ".other.tmp-keep").mkdir()  # another target's: not ours to remove
    _write(target, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-keep", "heads"]


def test_a_reader_restores_an_interrupted_heads_swap(tmp_path, tiny_llama):
    from draftheads import MedusaHeads, load_heads

    path = Path(MedusaHeads.for_target(tiny_llama, num_heads=2).save_pretrained(tmp_path / "heads"))
    os.replace(path, tmp_path / ".heads.old-1a2b")  # killed between the two renames of the next export
    assert not path.exists()
    assert load_heads(path).config.num_heads == 2
    assert path.is_dir()


def test_atomic_imports_only_the_standard_library():
    tree = ast.parse(ATOMIC_FILE.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


@pytest.mark.skipif(sys.platform == "win32", reason="exclusive_lock is a no-op without fcntl")
def test_exclusive_lock_makes_a_second_process_wait_for_the_first(tmp_path):
    """The smollm2 target converts under it: a second builder must block until the
    first releases, then see what it built (not build beside it)."""
    target = tmp_path / "cache" / "thing"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from draftheads.atomic import exclusive_lock
            with exclusive_lock({str(target)!r}):
                print("held", flush=True)
                time.sleep(1.0)
                open({str(target)!r}, "w").write("built")
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with atomic.exclusive_lock(target):  # waits for the holder's block to end
        assert target.read_text() == "built"
    assert holder.wait(timeout=30) == 0
    assert (target.parent / "thing.lock").is_file()
