"""The output folder of a training run: refuse to mix two runs in one folder.

Checkpoint rotation keeps the highest step numbers, so a new run written over an old one would lose
its own checkpoints to the old run's, and ``--resume`` would then continue the wrong run. Hence:
a fresh run into a folder that already holds a run is refused unless ``--overwrite`` clears the
old run's files (only those a run writes, nothing else), and a resume is refused when the
checkpoint was written with another config (anything but the step budget and where things go).

A run that is still going may not have written any of those files yet (loading a real target
takes minutes), so a running run also holds a lock on its folder (run_lock.py). A folder that
is not a run at all (a model, heads, a user's own ``heads/``) is refused by name, with or without
``--overwrite``: --overwrite must never delete what a run did not write.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..config import upgrade_config_dict, with_added_keys

# What a run writes into its output folder; --overwrite removes exactly these.
RUN_ARTEFACTS = ("checkpoints", "heads", "best", "metrics.json", "config.json")
# Their presence means a run already lives here. config.json is the first of them a run writes, once
# everything checkable passed (target, data, heads built), just before its first step; a run that
# fails before it saves a step removes it again (trainer.py), so a failed run blocks nothing.
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


# Files a model folder holds at its top level and a run never writes there.
_MODEL_FILES = ("*.safetensors", "*.bin", "*.gguf", "tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_STEP_ENTRY = re.compile(r"^(step-\d+|\.step-\d+\.tmp-.*|\.tmp-step-\d+.*|\.step-\d+\.old-.*)$")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _is_run_config(data: Any) -> bool:
    """The experiment config a run writes (sections train and heads), not a model's or heads'."""
    return isinstance(data, dict) and isinstance(data.get("train"), dict) and isinstance(data.get("heads"), dict)


def _is_heads_folder(path: Path) -> bool:
    data = _read_json(path / "config.json")
    return isinstance(data, dict) and "head_type" in data


def _names(folder: Path, limit: int = 6) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir() if not p.name.startswith("."))
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


def not_a_run(output_dir: Path) -> str | None:
    """What ``output_dir`` holds that a draftheads run did not write, described for a refusal
    (None: nothing, or only a run's files). A model folder or a heads folder (their config.json is
    not a run's), or a ``heads/``, ``best/``, ``checkpoints/`` or ``metrics.json`` that is not a
    run's: --overwrite would delete them, and a fresh run would write into them."""
    if not output_dir.is_dir():
        return None
    config = output_dir / "config.json"
    if config.is_file():
        data = _read_json(config)
        if isinstance(data, dict) and "head_type" in data:
            return f"a {data['head_type']} heads folder ({_names(output_dir)})"
        if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
            kind = data.get("model_type") or (data.get("architectures") or ["?"])[0]
            return f"a {kind} model ({_names(output_dir)})"
        if not _is_run_config(data):
            return "a config.json that is not a draftheads run's config (no train and heads sections)"
    weights = sorted({p.name for pattern in _MODEL_FILES for p in output_dir.glob(pattern)})
    if weights:
        return f"model files a run never writes there ({', '.join(weights[:6])})"
    for name in ("heads", "best"):
        path = output_dir / name
        if path.is_symlink() or path.is_file() or path.is_dir() and any(path.iterdir()) and not _is_heads_folder(path):
            return f"a {name}{'/' if path.is_dir() else ''} that is not a heads folder a run exported"
    checkpoints = output_dir / "checkpoints"
    if checkpoints.is_symlink() or checkpoints.is_file():
        return "a checkpoints file, not a run's checkpoints/ folder"
    if checkpoints.is_dir():
        other = sorted(p.name for p in checkpoints.iterdir() if not _STEP_ENTRY.match(p.name))
        if other:
            return f"a checkpoints/ folder holding {', '.join(other[:6])} (a run writes only step-N folders there)"
    metrics = output_dir / "metrics.json"
    if metrics.exists() and not (isinstance(_read_json(metrics), dict) and "step" in _read_json(metrics)):
        return "a metrics.json that is not a run's (no step)"
    return None


def check_is_run_folder(output_dir: Path) -> None:
    """Refuse an output folder that holds anything a run did not write under a run's names (see
    `not_a_run`), before anything is loaded or removed."""
    what = not_a_run(output_dir)
    if what:
        raise RunFolderError(
            f"train.output_dir {output_dir} holds {what}, not a draftheads run: a run would write over it and "
            f"--overwrite only removes a run's own files ({', '.join(RUN_ARTEFACTS)}), so it refuses this folder. "
            "Choose another train.output_dir"
        )


def guard_fresh_run(
    output_dir: Path, has_checkpoint: bool, resume: str | None, config: dict[str, Any] | None = None,
    abandoned: bool = False,
) -> bool:
    """Refuse to start from scratch in a folder that holds another run (see the module doc).

    Allowed: a folder whose only run file is config.json when that run never saved a step and
    is gone: ``abandoned`` (its lock was left by a process of this host that has died), or, with
    ``resume`` set, it is this same run's config (killed before its first checkpoint: a requeued
    ``resume: auto`` job must not be stuck on it). Returns True when such a folder is taken over."""
    if has_checkpoint:
        return False
    found = existing_run(output_dir)
    if not found:
        return False
    if found == ["config.json"] and (
        abandoned or resume is not None and config is not None and _same_run_config(output_dir, config)
    ):
        return True
    if resume is None:
        raise RunFolderError(
            f"train.output_dir {output_dir} already holds a run ({', '.join(found)}); "
            "pass --resume to continue it, --overwrite to replace it, or choose another train.output_dir"
        )
    raise RunFolderError(
        f"train.output_dir {output_dir} already holds a run with no checkpoint to resume from ({', '.join(found)}): "
        "it was started with another config, or saves no checkpoints (train.save_every: 0). "
        "Pass --overwrite (without --resume) to replace it, or choose another train.output_dir"
    )


def _same_run_config(output_dir: Path, config: dict[str, Any]) -> bool:
    try:
        saved = json.loads((output_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(saved, dict) and not config_differences(saved, config)


def clear_run(output_dir: Path) -> list[str]:
    """Remove the files a previous run wrote into ``output_dir`` (only those); return their names.
    Refuses (`check_is_run_folder`) a folder whose files under those names a run did not write."""
    check_is_run_folder(output_dir)
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
