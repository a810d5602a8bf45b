"""Loading heads folders: ``config.json`` + ``model.safetensors`` (+ optional ``tree.json``,
read and checked by `draftheads.plans`, and ``confidence.json``, `heads.confidence`).

Writes (folder.py) are atomic (draftheads/atomic.py: a temp folder swapped into place), so an
interrupted export never leaves a half-written folder where a good one was. Loads are strict: safetensors only, every key present
and of the right shape, the target checked when one is given.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..atomic import restore_interrupted_swap, write_folder_atomically, write_json_atomically  # noqa: F401 (re-exported)
from ..plans import TREE_NAME, TreePlans, read_plans
from ..registry import UnknownMethodError, builtin_named, head_classes, method_named, methods
from .confidence import read_confidence
from .config import FORMAT_VERSION, HeadsConfig
from .folder import CONFIG_NAME, WEIGHTS_NAME, non_finite_tensors, save_heads  # noqa: F401 (re-exported)
from .hub import resolve_heads_folder
from .tree_check import check_plans  # noqa: F401 (re-exported)


def head_types() -> dict[str, type]:
    """The heads class of every registered method, by ``head_type`` name (draftheads/methods/)."""
    return head_classes()


def _not_heads_folder(path: Path, data: Any) -> str | None:
    """What ``path`` is when it is not a heads folder but something a user easily passes instead."""
    if (path / "heads" / CONFIG_NAME).is_file():
        best = " (the best evaluation's in best/)" if (path / "best" / CONFIG_NAME).is_file() else ""
        return f"this is a training run folder: the heads are in {path / 'heads'}{best}"
    if isinstance(data, dict) and isinstance(data.get("train"), dict) and isinstance(data.get("heads"), dict):
        return (
            "this is a training run folder (its config.json is the run's experiment config) and it holds no "
            f"exported heads yet: training writes them to {path / 'heads'} when it finishes"
        )
    engine = _engine_export(path, data)
    if engine:
        return engine
    if isinstance(data, dict) and "head_type" not in data and ("model_type" in data or "architectures" in data):
        kind = data.get("model_type") or (data.get("architectures") or ["?"])[0]
        return (
            f"this is a model folder (a {kind} model's config.json), not a heads folder: pass the model as the "
            "target and the folder `draftheads train` exported (config.json with head_type) as heads"
        )
    return None


def _engine_export(path: Path, data: Any) -> str | None:
    """When ``path`` holds draft heads in an engine's layout (a `draftheads export`, or a public
    Medusa / EAGLE / DFlash / speculators checkpoint): where its heads folder is, or how to make one."""
    convert = f"convert it into a heads folder with `draftheads import {path} OUT --target TARGET`"
    record = path / "draftheads_export.json"
    if record.is_file():
        try:
            made = json.loads(record.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            made = {}
        made = made if isinstance(made, dict) else {}
        source = f"; it was exported from the heads folder {made['heads']}, which you can pass instead" if made.get("heads") else ""
        return f"this is a `draftheads export` ({made.get('format', '?')} layout) for an engine, not a heads folder: {convert}{source}"
    if not isinstance(data, dict) or "head_type" in data:
        return None
    names = [str(data.get("model_type") or ""), str(data.get("speculators_model_type") or "")]
    names += [str(a) for a in data.get("architectures") or []]
    layouts = [layout for method in methods() for layout in method.imports.values()]  # what marks each layout's configs
    if any(word in n.lower() for n in names for layout in layouts for word in layout.config_names) \
            or any(key in data for layout in layouts for key in layout.config_keys):
        kind = next(n for n in names if n) if any(names) else "draft"
        return f"this is a draft checkpoint in an engine's layout ({kind}), not a draftheads heads folder: {convert}"
    return None


def read_config(path: str | os.PathLike) -> HeadsConfig:
    """The heads config of a folder or of a Hub id (``org/name``, see heads/hub.py)."""
    path = resolve_heads_folder(path)  # also puts back the old copy of an export killed between its two renames
    if not path.is_dir():
        if path.is_file():
            raise FileNotFoundError(f"{path} is a file: pass the heads folder that holds {CONFIG_NAME} and {WEIGHTS_NAME}")
        raise FileNotFoundError(f"heads folder not found: {path}")
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        other = _not_heads_folder(path, None)
        raise FileNotFoundError(f"{cfg_file} is missing: {path} is not a draftheads heads folder" + (f"; {other}" if other else ""))
    try:
        data = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e})") from None
    other = _not_heads_folder(path, data)
    if other:
        raise ValueError(f"{cfg_file} is not a heads config: {other}")
    if not isinstance(data, dict):
        raise ValueError(f"{cfg_file}: expected a JSON object of heads settings, got a JSON list or value")
    version = data.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise ValueError(
            f"{cfg_file} has format_version {version}; this draftheads reads versions up to "
            f"{FORMAT_VERSION}: upgrade draftheads"
        )
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        missing = "no format_version" if version is None else f"format_version {version!r}"
        raise ValueError(
            f"{cfg_file} has {missing}: a draftheads heads config has an integer format_version 1..{FORMAT_VERSION} "
            "(is this folder an export of draftheads?)"
        )
    types = head_types()
    if "head_type" not in data:
        raise ValueError(f"{cfg_file}: missing key head_type (one of {', '.join(sorted(types))})")
    try:
        method = method_named(data["head_type"]) if isinstance(data["head_type"], str) else None
    except UnknownMethodError:
        method = None
    if method is None:
        raise ValueError(
            f"{cfg_file}: unknown head_type {data.get('head_type')!r}; valid: {', '.join(sorted(types))}"
        )
    data = {**data, "head_type": method.name}  # a name older folders carry reads as the method's own
    try:
        config = HeadsConfig.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{cfg_file}: {e}") from None
    missing = [k for k in method.heads.required_extra if k not in config.extra]
    if missing:
        raise ValueError(
            f"{cfg_file}: {config.head_type} heads need key(s) {', '.join('extra.' + k for k in missing)} "
            "(their draft layer's geometry and inputs); re-export the heads with draftheads"
        )
    return config


class UnverifiedTargetError(ValueError):
    """Heads whose config cannot show which target they were trained for (no fingerprint)."""


def _require_fingerprint(config: HeadsConfig, cfg_file: Path) -> None:
    """Refuse a config that cannot prove which target it belongs to (see ``load_heads``)."""
    if config.target is not None and config.target.lm_head_fingerprint:
        return
    what = "no 'target' object" if config.target is None else "no target.lm_head_fingerprint"
    raise UnverifiedTargetError(
        f"{cfg_file} records {what}, so nothing shows these heads were trained for this target (format "
        f"version {config.format_version} always writes it: was the file edited?). Re-export the heads with "
        "draftheads, or, if you know they belong to this target, load them with check_fingerprint=False "
        "(CLI: --no-fingerprint-check)"
    )


def attach_plans(heads: torch.nn.Module, plans: TreePlans | None, path: Path) -> None:
    """Give ``heads`` the plans of the folder at ``path`` (`DraftHeads.use_plans`: a tree that does
    not fit them is refused here, naming the file, not in the first decode step)."""
    heads.use_plans(plans, path / TREE_NAME)


def load_heads(
    path: str | os.PathLike,
    target: torch.nn.Module | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    check_fingerprint: bool = True,
) -> torch.nn.Module:
    """Load any head type from a folder or a Hub id (``org/name``: a local folder of that name
    wins), strictly. With ``target``, refuse heads trained for
    another model (sizes or LM-head weights differ) and bind them to it.

    Every heads config draftheads writes records the target's LM-head fingerprint; one without it
    (hand-edited, or from another tool) cannot be told apart from heads of another fine-tune of
    the same architecture, so it is refused with a target unless ``check_fingerprint=False``
    says the caller knows these heads belong to ``target``.

    ``builtin-<head type>`` (e.g. ``builtin-mtp``, when no folder of that name exists) is the heads
    ``target`` ships in its own checkpoint (its MTP layers), untrained by draftheads."""
    builtin = builtin_named(str(path)) if not Path(path).exists() else None
    if builtin is not None:
        if target is None:
            raise ValueError(f"{path}: these heads are the target's own (read from its checkpoint): pass target=")
        heads = builtin.builtin(target)
        if dtype is not None:
            heads.to(dtype=dtype)
        return heads.to(device=device or target.get_output_embeddings().weight.device).eval()
    path = resolve_heads_folder(path)
    config = read_config(path)
    if target is not None and check_fingerprint:
        _require_fingerprint(config, path / CONFIG_NAME)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} is missing (only safetensors weights are read, never pickles)")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{weights} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    try:
        heads = method_named(config.head_type).heads(config)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path / CONFIG_NAME}: {config.head_type} heads cannot be built from it ({e})") from None
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
    bad = non_finite_tensors(state)
    if bad:
        raise ValueError(f"{weights}: {bad}: these heads are unusable (exported from a diverged run, or damaged)")
    heads.load_state_dict(state, strict=True)
    try:
        heads.validate_loaded()
    except ValueError as e:
        raise ValueError(f"{weights}: {e}") from None
    attach_plans(heads, read_plans(path), path)  # tree.json, parsed once
    heads.confidence = read_confidence(path)  # confidence.json (EAGLE trees rank nodes by it)
    if target is not None:
        heads.bind_target(target)
        ref = target.get_output_embeddings().weight
        device = device or ref.device
    heads.to(device=device or "cpu")
    if dtype is not None:
        heads.to(dtype=dtype)
    return heads.eval()
