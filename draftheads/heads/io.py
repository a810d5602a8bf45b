"""Saving and loading heads folders: ``config.json`` + ``model.safetensors`` (+ optional ``tree.json``).

Writes are atomic (a temp folder renamed into place), so an interrupted export never leaves a
half-written folder where a good one was. Loads are strict: safetensors only, every key present
and of the right shape, the target checked when one is given.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import FORMAT_VERSION, HeadsConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TREE_NAME = "tree.json"


def head_types() -> dict[str, type]:
    """Registered head classes by ``head_type`` name."""
    from .eagle import Eagle3Head, EagleHead
    from .hydra import HydraHeads
    from .medusa import MedusaHeads

    return {cls.head_type: cls for cls in (MedusaHeads, HydraHeads, EagleHead, Eagle3Head)}


def write_folder_atomically(path: str | os.PathLike, files: dict[str, Any]) -> Path:
    """Write ``files`` (name -> callable(dest_path)) into a fresh folder, then swap it in place of ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        for name, write in files.items():
            write(tmp / name)
        if path.exists():
            # Keep the previous export until the new one is in place.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / "previous")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def write_json_atomically(path: str | os.PathLike, data: Any) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp creates owner-only files; this is an ordinary file of the heads folder
    os.replace(tmp, path)


def save_heads(heads: torch.nn.Module, path: str | os.PathLike, tree: list[list[int]] | None = None) -> Path:
    """Export heads only (never the target's weights) as a versioned safetensors folder."""
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
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


def read_config(path: str | os.PathLike) -> HeadsConfig:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"heads folder not found: {path}")
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} is missing: {path} is not a draftheads heads folder")
    try:
        data = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e})") from None
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{cfg_file} has format_version {version!r}; this draftheads reads versions up to "
            f"{FORMAT_VERSION}: upgrade draftheads"
        )
    types = head_types()
    if data.get("head_type") not in types:
        raise ValueError(
            f"{cfg_file}: unknown head_type {data.get('head_type')!r}; valid: {', '.join(sorted(types))}"
        )
    return HeadsConfig.from_dict(data)


def read_tree(path: str | os.PathLike) -> tuple[list[list[int]] | dict | None, int | None]:
    """The calibrated tree and draft vocabulary size saved by `draftheads calibrate`, if any."""
    tree_file = Path(path) / TREE_NAME
    if not tree_file.is_file():
        return None, None
    try:
        data = json.loads(tree_file.read_text())
        tree = data["tree"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{tree_file} is not a valid tree file ({e!r})") from None
    if isinstance(tree, dict):  # a dynamic (EAGLE-2) tree: its settings
        unknown = sorted(set(tree) - {"total_tokens", "depth", "top_k", "draft_vocab_size"})
        bad = [k for k, v in tree.items() if not (isinstance(v, int) and v >= 1) and not (k == "draft_vocab_size" and v is None)]
        if unknown or bad:
            raise ValueError(
                f"{tree_file}: a dynamic tree takes positive integers total_tokens, depth, top_k (and draft_vocab_size) "
                f"(unknown: {unknown}, not positive integers: {bad})"
            )
    elif not isinstance(tree, list) or not all(isinstance(p, list) and all(isinstance(r, int) for r in p) for p in tree):
        raise ValueError(f"{tree_file}: 'tree' must be a list of paths (lists of ranks) or dynamic-tree settings")
    vocab = data.get("draft_vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or vocab < 1):
        raise ValueError(f"{tree_file}: 'draft_vocab_size' must be a positive integer or null, got {vocab!r}")
    return tree, vocab


def read_tree_origin(path: str | os.PathLike) -> dict[str, Any]:
    """Who chose the saved tree and for which device type: ``{"chosen_by": "training",
    "device_type": "cpu"}`` for trees chosen at the end of training, ``{}`` for calibrated trees
    (which are used as they are) and for folders without a tree."""
    tree_file = Path(path) / TREE_NAME
    if not tree_file.is_file():
        return {}
    data = json.loads(tree_file.read_text())  # read_tree has already validated it
    return {k: data[k] for k in ("chosen_by", "device_type") if isinstance(data.get(k), str)}


def load_heads(
    path: str | os.PathLike,
    target: torch.nn.Module | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """Load any head type from a folder, strictly. With ``target``, refuse heads trained for
    another model (sizes or LM-head weights differ) and bind them to it."""
    path = Path(path)
    config = read_config(path)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} is missing (only safetensors weights are read, never pickles)")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{weights} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    heads = head_types()[config.head_type](config)
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    if missing or unexpected or wrong_shape:
        details = []
        if missing:
            details.append(f"missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            details.append(f"unexpected: {', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}")
        if wrong_shape:
            details.append(
                "wrong shape: "
                + ", ".join(f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}" for k in wrong_shape[:8])
            )
        raise ValueError(f"{weights} does not match its config.json ({'; '.join(details)})")
    heads.load_state_dict(state, strict=True)
    validate = getattr(heads, "validate_loaded", None)
    if validate is not None:
        try:
            validate()
        except ValueError as e:
            raise ValueError(f"{weights}: {e}") from None
    heads.tree, heads.draft_vocab_size = read_tree(path)
    heads.tree_origin = read_tree_origin(path)
    if target is not None:
        heads.bind_target(target)
        ref = target.get_output_embeddings().weight
        device = device or ref.device
    heads.to(device=device or "cpu")
    if dtype is not None:
        heads.to(dtype=dtype)
    return heads.eval()
