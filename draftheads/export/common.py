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
IMPORT_METADATA = "draftheads_import.json"  # what an imported heads folder was converted from
# The heads' training-token counts (the draft vocabulary's source), which no engine layout has a
# tensor for: kept beside the export so that importing it back restores them (not read by engines).
TOKEN_COUNTS_NAME = "draftheads_token_counts.json"


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


def check_output_folder(out_dir: str | os.PathLike, source: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an output folder whose replacement would lose something: the source itself, a folder
    inside the source or holding it (replacing OUT replaces them), an existing OUT without
    ``overwrite``, and, with it, an OUT that no export or import wrote (no `EXPORT_METADATA` /
    `IMPORT_METADATA` marker): its files are named, and kept. An empty folder may be replaced."""
    out = Path(out_dir)
    src = Path(source)
    if src.exists():
        a, b = out.absolute().resolve(), src.absolute().resolve()
        if a == b or b in a.parents or a in b.parents:
            where = "is the source" if a == b else "is inside the source" if b in a.parents else "holds the source"
            raise FileExistsError(
                f"{out} {where} {source}: writing there would replace the source itself; choose an OUT outside it"
            )
    if not (out.exists() or out.is_symlink()):
        return
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    if not overwrite:
        raise FileExistsError(f"{out} exists: pass overwrite=True (--overwrite) to replace it")
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
    if not entries or (out / EXPORT_METADATA).is_file() or (out / IMPORT_METADATA).is_file():
        return
    shown = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
    raise FileExistsError(
        f"{out} holds {shown}, which draftheads export/import did not write (no {EXPORT_METADATA} or "
        f"{IMPORT_METADATA}): --overwrite replaces only a folder an earlier export or import wrote. Choose another "
        "OUT, or move those files away yourself"
    )


def token_counts_json(heads) -> str | None:
    """The heads' training-token counts as `TOKEN_COUNTS_NAME`'s text (only the ids seen), or None
    when there are none to keep (fresh heads)."""
    counts = getattr(heads, "token_counts", None)
    if counts is None or not bool((counts != 0).any()):
        return None
    ids = torch.nonzero(counts).flatten().tolist()
    values = counts[ids].tolist()
    return json.dumps({"vocab_size": int(counts.numel()), "counts": {str(i): int(v) for i, v in zip(ids, values)}}) + "\n"


def read_token_counts(folder: Path, vocab_size: int) -> torch.Tensor | None:
    """The counts an export kept (`token_counts_json`), when ``folder`` has them for this vocabulary."""
    file = folder / TOKEN_COUNTS_NAME
    if not folder.is_dir() or not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
        if int(data["vocab_size"]) != vocab_size:
            return None
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for key, value in data["counts"].items():
            counts[int(key)] = int(value)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"{file} is not a token-count file draftheads export wrote ({type(e).__name__}: {e})") from None
    return counts


def write_engine_folder(
    out_dir: str | os.PathLike, folder: EngineFolder, metadata: dict[str, Any], overwrite: bool, card: str | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """``card``: the folder's README.md (export/card.py); ``extra_files``: name -> text of files
    for draftheads beside the engine's (`TOKEN_COUNTS_NAME`); all written in the same atomic swap.
    Refuses what `check_output_folder` refuses (the exporter checked it first, before any work)."""
    out = Path(out_dir)
    check_output_folder(out, metadata.get("heads") or "", overwrite)
    tensors = {k: v.detach().contiguous().cpu() for k, v in folder.tensors.items()}
    files = {
        "config.json": lambda p: p.write_text(json.dumps(folder.config, indent=2) + "\n"),
        "model.safetensors": lambda p: save_file(tensors, str(p), metadata={"format": "pt"}),
        EXPORT_METADATA: lambda p: p.write_text(json.dumps({**metadata, "notes": folder.notes}, indent=2) + "\n"),
    }
    if card is not None:
        files["README.md"] = lambda p: p.write_text(card, encoding="utf-8")
    for name, text in (extra_files or {}).items():
        files[name] = lambda p, text=text: p.write_text(text, encoding="utf-8")
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
