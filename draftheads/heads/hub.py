"""Heads named by a Hugging Face Hub id (``org/name``) as well as by a folder.

Users share heads on the Hub; ``load_heads("org/name")`` and every ``--heads org/name`` go
through `resolve_heads_folder`, which turns the name into a local folder: the folder itself when
it exists (a local path always wins, so a folder that happens to look like ``org/name`` is never
shadowed by a download), else the repo's snapshot from ``huggingface_hub`` (its cache, the network
unless ``HF_HUB_OFFLINE=1``). A name that is neither gets one error naming both readings.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..atomic import restore_interrupted_swap

# What a heads repo holds: configs, weights, the tree, the model card. Nothing else is downloaded.
HEADS_FILES = ("*.json", "*.safetensors", "*.md")
# A Hub model id as users write it: exactly one "/" between a namespace and a name.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class HeadsNotFoundError(FileNotFoundError):
    """Neither a local heads folder nor a Hub repo that could be resolved."""


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` (what the Hub calls a repo id), not ``./x``, ``/abs/x``, ``a/b/c`` or ``x``."""
    return bool(_HUB_ID.match(name)) and ".." not in name and not name.endswith((".", "-"))


def resolve_heads_folder(name_or_path: str | os.PathLike, revision: str | None = None) -> Path:
    """The local folder that holds the heads called ``name_or_path``.

    An existing path is returned as is (loading then reports what is wrong with it). Otherwise an
    ``org/name`` id is resolved through ``huggingface_hub.snapshot_download`` (``revision``: a
    branch, tag or commit; default the main branch); offline, only the cache is read."""
    path = Path(name_or_path)
    restore_interrupted_swap(path)  # an export killed between its two renames: the folder is still here
    if path.exists() or path.is_symlink():
        return path
    name = str(name_or_path)
    if not looks_like_hub_id(name):
        raise HeadsNotFoundError(f"heads folder not found: {path} (and {name!r} is not a Hub id of the form org/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise HeadsNotFoundError(
            f"heads folder not found: {path}; reading {name!r} as a Hugging Face Hub id needs huggingface_hub "
            "(pip install huggingface_hub)"
        ) from None
    try:
        folder = snapshot_download(repo_id=name, revision=revision, allow_patterns=list(HEADS_FILES))
    except Exception as e:  # huggingface_hub raises its own errors (not found, offline, gated, HTTP, validation)
        offline = _offline()
        how = (
            "HF_HUB_OFFLINE is set, so only the local Hub cache was read" if offline
            else "check the id, your network and your Hub login (huggingface-cli login) for a private repo"
        )
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HeadsNotFoundError(
            f"heads not found: {name!r} is no local folder (no {path.absolute()}) and no Hugging Face Hub repo "
            f"that could be resolved{f' at revision {revision!r}' if revision else ''} ({type(e).__name__}: {reason}); "
            f"{how}"
        ) from None
    return Path(folder)


def _offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except (ImportError, AttributeError):
        return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def is_hub_reference(name_or_path: str | os.PathLike) -> bool:
    """True when ``name_or_path`` names heads on the Hub rather than a local folder (for commands
    that write into the heads folder: the Hub cache is no place for that)."""
    path = Path(name_or_path)
    return not (path.exists() or path.is_symlink()) and looks_like_hub_id(str(name_or_path))
