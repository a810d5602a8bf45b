"""The output folder of a training run: refuse to mix two runs in one folder.

Checkpoint rotation keeps the highest step numbers, so a new run written over an old one would lose
its own checkpoints to the old run's, and ``--resume`` would then continue the wrong run. Hence:
a fresh run into a folder that already holds a run is refused unless ``--overwrite`` clears the
old run's files (only those a run writes, nothing else), and a resume is refused when the
checkpoint was written with another config (anything but the step budget and where things go).

A run that is still going may not have written any of those files yet (loading a real target
takes minutes), so a running run also holds a lock on its folder (run_lock.py).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..config import upgrade_config_dict, with_added_keys

# What a run writes into its output folder; --overwrite removes exactly these.
RUN_ARTEFACTS = ("checkpoints", "heads", "best", "metrics.json", "config.json")
# Their presence means a run already lives here. config.json is written first, at the start of a
# run: a run on another machine (whose lock this one cannot see) shows that way before anything else.
RUN_MARKERS = ("checkpoints", "heads", "best", "metrics.json", "config.json")

# Config keys a resumed run may change: the step budget, and where outputs, caches and logs go.
RESUMABLE_KEYS = (
    "train.max_steps",
    "train.num_epochs",
    "train.resume",
    "train.output_dir",
    "train.log_every",
    "train.choose_tree",  # what happens after the last step, not what is trained
    "data.cache_dir",
    "tracking.",
)


class RunFolderError(ValueError):
    """The output folder cannot take this run (another run's files, a file, not writable)."""


def check_writable(output_dir: Path) -> None:
    """Fail before any model is loaded if ``output_dir`` is a file or cannot be written."""
    if output_dir.exists() and not output_dir.is_dir():
        raise RunFolderError(f"train.output_dir {output_dir} is a file, not a folder: choose another train.output_dir")
    probe_dir = output_dir
    while not probe_dir.exists():  # the nearest existing ancestor is where the folder gets created
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise RunFolderError(f"train.output_dir {output_dir}: {probe_dir} is a file, not a folder")
    if not _writable(probe_dir):
        raise RunFolderError(
            f"train.output_dir {output_dir}: {probe_dir} is not writable by this user; "
            "choose another train.output_dir or fix its permissions"
        )


def _writable(folder: Path) -> bool:
    """Whether this process can create files in ``folder`` (permissions, a read-only mount)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:  # os.access does not see read-only file systems everywhere; a real create does
        fd, probe = tempfile.mkstemp(prefix=".draftheads-write-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def existing_run(output_dir: Path) -> list[str]:
    """The names of another run's files in ``output_dir`` (empty: no run there)."""
    found = []
    for name in RUN_MARKERS:
        path = output_dir / name
        if path.is_dir() and any(path.iterdir()) or path.is_file():
            found.append(name + ("/" if path.is_dir() else ""))
    return found


def guard_fresh_run(output_dir: Path, has_checkpoint: bool, resume: str | None, config: dict[str, Any] | None = None) -> None:
    """Refuse to start from scratch in a folder that holds another run (see the module doc).

    With ``resume`` set, a folder whose only file is the config.json of this same run (``config``;
    killed before its first checkpoint) starts fresh: a requeued ``resume: auto`` job must not be
    stuck on it."""
    if has_checkpoint:
        return
    found = existing_run(output_dir)
    if found == ["config.json"] and resume is not None and config is not None and _same_run_config(output_dir, config):
        return
    if not found:
        return
    what = "holds a run" if resume is None else "holds a run with no checkpoint to resume from"
    raise RunFolderError(
        f"train.output_dir {output_dir} already {what} ({', '.join(found)}); "
        "pass --resume to continue it, --overwrite to replace it, or choose another train.output_dir"
    )


def _same_run_config(output_dir: Path, config: dict[str, Any]) -> bool:
    try:
        saved = json.loads((output_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(saved, dict) and not config_differences(saved, config)


def clear_run(output_dir: Path) -> list[str]:
    """Remove the files a previous run wrote into ``output_dir`` (only those); return their names."""
    removed = []
    for name in RUN_ARTEFACTS:
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    # and any leftovers of interrupted writes of those (".heads.tmp-*", ".metrics.json.*" ...)
    for child in output_dir.glob(".*"):
        if any(child.name.startswith(f".{name}.") for name in RUN_ARTEFACTS):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return removed


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts, except those a resume may change."""
    a, b = _flatten(saved), _flatten(current)
    keys = sorted(set(a) | set(b))
    return [
        k for k in keys
        if not any(k == r or (r.endswith(".") and k.startswith(r)) for r in RESUMABLE_KEYS)
        and _normal(a.get(k)) != _normal(b.get(k))
    ]  # fmt: skip


def _normal(value: Any) -> Any:
    """JSON round-trips turn tuples into lists: compare them alike."""
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


def check_resume_config(checkpoint: Path, saved: dict[str, Any] | None, current: dict[str, Any]) -> None:
    """Refuse to resume ``checkpoint`` under a config that differs in more than the step budget."""
    if saved is None:
        return  # written before checkpoints carried their config: nothing to compare
    # a checkpoint written before a key was renamed, or before a key existed (what it did then)
    saved = with_added_keys(upgrade_config_dict(saved))
    diff = config_differences(saved, current)
    if diff:
        a, b = _flatten(saved), _flatten(current)
        details = "; ".join(f"{k}: {a.get(k)!r} in the checkpoint, {b.get(k)!r} now" for k in diff[:8])
        raise RunFolderError(
            f"cannot resume from {checkpoint}: it was written with another config ({details}). "
            "Only the step budget (train.max_steps, train.num_epochs) may change on resume; "
            "use the original settings, or start a new run (--overwrite, or another train.output_dir)"
        )


def check_context(max_length: int, target_config: Any, say) -> None:
    """Warn when training windows are longer than the target's declared context: positions past
    it are ones the target was not trained on (its hidden states there, and so what the heads
    learn from them, are unreliable). A warning, not an error: with RoPE scaling a model may
    legitimately run past the figure its config declares."""
    limit = getattr(target_config, "max_position_embeddings", None)
    if isinstance(limit, int) and max_length > limit:
        say(
            f"warning: data.max_length={max_length} is above the target's context "
            f"(max_position_embeddings={limit}); windows are trained past what the target saw in "
            f"pre-training. Set data.max_length <= {limit} unless the target's RoPE scaling covers it"
        )
