"""Pieces every exporter shares: the output folder, the verifier (target) reference, config helpers.

An engine folder is written like a heads folder: into a temp folder renamed into place, never
over an existing folder unless asked.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..heads.io import write_folder_atomically

EXPORT_METADATA = "draftheads_export.json"  # what was exported from where (for people, not engines)


class ExportError(ValueError):
    """Heads that a format cannot hold, or an export request that cannot be honoured."""


@dataclass
class EngineFolder:
    """What an exporter produces: the engine's config.json, its tensors, and notes for the user."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)


def check_tensors(folder: EngineFolder, expected: dict[str, tuple[int, ...]], format_name: str) -> None:
    """The exporter's own output against the layout's description: exactly these names and shapes."""
    names = set(folder.tensors)
    extra, missing = sorted(names - set(expected)), sorted(set(expected) - names)
    wrong = sorted(k for k in names & set(expected) if tuple(folder.tensors[k].shape) != tuple(expected[k]))
    if extra or missing or wrong:  # a bug in an exporter, never a user error
        raise AssertionError(
            f"{format_name} export does not match its layout: extra {extra}, missing {missing}, wrong shape "
            + ", ".join(f"{k} {tuple(folder.tensors[k].shape)} != {expected[k]}" for k in wrong)
        )


def write_engine_folder(
    out_dir: str | os.PathLike, folder: EngineFolder, metadata: dict[str, Any], overwrite: bool, card: str | None = None
) -> Path:
    """``card``: the folder's README.md (export/card.py), written in the same atomic swap."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass overwrite=True (--overwrite) to replace it")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    tensors = {k: v.detach().contiguous().cpu() for k, v in folder.tensors.items()}
    files = {
        "config.json": lambda p: p.write_text(json.dumps(folder.config, indent=2) + "\n"),
        "model.safetensors": lambda p: save_file(tensors, str(p), metadata={"format": "pt"}),
        EXPORT_METADATA: lambda p: p.write_text(json.dumps({**metadata, "notes": folder.notes}, indent=2) + "\n"),
    }
    if card is not None:
        files["README.md"] = lambda p: p.write_text(card, encoding="utf-8")
    return write_folder_atomically(out, files)


# -- the verifier -------------------------------------------------------------------------------------
def resolve_verifier(heads_config, verifier: str | None) -> str | None:
    """``--verifier`` if given, else the target the heads recorded; a named target ("smollm2")
    becomes its cache folder (what an engine can open)."""
    name = verifier or (heads_config.target.name_or_path if heads_config.target else "") or None
    if name is None:
        return None
    from ..target import resolve_target

    return resolve_target(name)  # a name unchanged unless it names a target built here (or a retired one)


def verifier_config(verifier: str | None) -> dict[str, Any]:
    """The verifier's config.json when it is a local folder (else empty: a hub id is not fetched)."""
    if verifier and (Path(verifier) / "config.json").is_file():
        return json.loads((Path(verifier) / "config.json").read_text())
    return {}


def verifier_lm_head(verifier: str | None, heads_config) -> torch.Tensor:
    """The target's LM head weight, read from its safetensors files (no model is built), checked
    against the heads' recorded fingerprint. Needed where the format stores the shared head."""
    if not verifier or not Path(verifier).is_dir():
        raise ExportError(
            "these heads share the target's LM head, which the format stores in the draft folder: pass the target "
            f"folder with --verifier (got {verifier!r}, not a local folder)"
        )
    folder = Path(verifier)
    cfg = verifier_config(verifier)
    text = cfg.get("text_config") or cfg
    tied = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    wanted = ("lm_head.weight",) if not tied else ("model.embed_tokens.weight", "embed_tokens.weight", "lm_head.weight")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder} has no *.safetensors weights to read the target's LM head from")
    weight = None
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in wanted:
                if name in f.keys():
                    weight = f.get_tensor(name)
                    break
        if weight is not None:
            break
    if weight is None:
        raise ExportError(f"no {' or '.join(wanted)} in {folder}'s safetensors files")
    from ..heads.config import fingerprints_match, weight_fingerprint

    recorded = heads_config.target.lm_head_fingerprint if heads_config.target else []
    if tuple(weight.shape) != (heads_config.vocab_size, heads_config.hidden_size) or (
        recorded and not fingerprints_match(recorded, weight_fingerprint(weight))
    ):
        raise ExportError(f"{folder}'s LM head is not the one these heads were trained with (another model?)")
    return weight


def llama_layer_config(heads_config, verifier_cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """A LlamaConfig for the draft layer(s): the geometry the heads were built with, the RoPE their
    draft layer applies (the target's scaling, when it has one), no biases."""
    ex = heads_config.extra
    text = verifier_cfg.get("text_config") or verifier_cfg
    theta = float(ex["rope_theta"])
    config = {
        "model_type": "llama",
        "hidden_size": heads_config.hidden_size,
        "intermediate_size": ex["intermediate_size"],
        "num_attention_heads": ex["num_attention_heads"],
        "num_key_value_heads": ex["num_key_value_heads"],
        "head_dim": ex["head_dim"],
        "num_hidden_layers": num_layers,
        "rms_norm_eps": ex["rms_norm_eps"],
        "rope_theta": theta,
        "rope_parameters": {**(ex.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "max_position_embeddings": int(text.get("max_position_embeddings") or 4096),
        "vocab_size": heads_config.vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": text.get("bos_token_id"),
        "eos_token_id": text.get("eos_token_id"),
        "pad_token_id": text.get("pad_token_id"),
    }
    return {k: v for k, v in config.items() if v is not None}


def dtype_name(tensors: dict[str, torch.Tensor]) -> str:
    floats = [t.dtype for t in tensors.values() if t.is_floating_point()]
    return str(floats[0]).replace("torch.", "") if floats else "float32"


def drop_if_zero(tensor: torch.Tensor, name: str, format_name: str, why: str) -> None:
    """Refuse a tensor the format cannot hold, unless it is exactly zero (dropping it changes nothing)."""
    if bool((tensor != 0).any()):
        raise ExportError(f"{name}: {format_name} has no place for it ({why}); the engine would drop it and decode "
                          "differently. Train these heads without it, or export to a format that holds it")
