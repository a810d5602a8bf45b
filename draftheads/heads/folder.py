"""The files of a heads folder: ``config.json`` + ``model.safetensors`` (+ optional ``tree.json``).

Writing and the tree file live here, below the head classes (whose ``save_pretrained`` writes
through `save_heads`); reading a whole folder back into heads is `io.load_heads`, which needs
the head classes.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..atomic import write_folder_atomically
from .config import FORMAT_VERSION

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TREE_NAME = "tree.json"


def non_finite_tensors(state: dict[str, torch.Tensor]) -> str | None:
    """Which floating tensors of ``state`` hold NaN/inf (None: all finite). Saving and loading both
    refuse such heads: they would draft garbage, which lossless decoding hides as a slowdown."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if not bad:
        return None
    return f"non-finite values (NaN/inf) in {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} ({len(bad)} of {len(state)} tensors)"


def save_heads(heads: torch.nn.Module, path: str | os.PathLike, tree: list[list[int]] | None = None) -> Path:
    """Export heads only (never the target's weights) as a versioned safetensors folder."""
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    bad = non_finite_tensors(state)
    if bad:
        raise ValueError(f"refusing to export heads to {path}: {bad}; did the training diverge?")
    config = heads.config.to_dict()
    tree = tree if tree is not None else getattr(heads, "tree", None)

    files = {
        CONFIG_NAME: lambda p: p.write_text(json.dumps(config, indent=2) + "\n"),
        WEIGHTS_NAME: lambda p: save_file(
            state, str(p), metadata={"format": "pt", "draftheads_format_version": str(FORMAT_VERSION)}
        ),
    }
    if tree is not None:
        files[TREE_NAME] = lambda p: p.write_text(json.dumps({"tree": tree}, indent=2) + "\n")
    return write_folder_atomically(path, files)


def read_tree(path: str | os.PathLike) -> tuple[list[list[int]] | dict | None, int | None]:
    """The calibrated tree and draft vocabulary size saved by `draftheads calibrate`, if any
    (parsed only: `load_heads` checks that they fit the heads)."""
    tree_file = Path(path) / TREE_NAME
    if not tree_file.is_file():
        return None, None
    try:
        data = json.loads(tree_file.read_text())
        tree = data["tree"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"{tree_file} is not a valid tree file ({e!r}); delete it or run draftheads calibrate again") from None
    return tree, data.get("draft_vocab_size")


def read_tree_origin(path: str | os.PathLike) -> dict[str, Any]:
    """Who chose the saved tree and for which device type: ``{"chosen_by": "training",
    "device_type": "cpu"}`` for trees chosen at the end of training, ``{}`` for calibrated trees
    (which are used as they are) and for folders without a tree."""
    tree_file = Path(path) / TREE_NAME
    if not tree_file.is_file():
        return {}
    data = json.loads(tree_file.read_text())  # read_tree has already validated it
    return {k: data[k] for k in ("chosen_by", "device_type") if isinstance(data.get(k), str)}
