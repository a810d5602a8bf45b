"""Medusa checkpoints -> draftheads MedusaHeads.

FasterDecoding (v1 and v2): ``{h}.{l}.linear.weight/bias`` blocks and ``{h}.{L}.weight`` as head h's
LM head (v2 releases prefix them with ``medusa_head.``). Sizes come from the tensors: v1 configs
are known to disagree with their own weights on the head count, which is reported, not trusted.
vLLM: ``blocks.{h}.layers.{l}.weight`` (+ bias only with ``medusa_fc_bias``), ``lm_heads.{h}.weight``,
or one shared ``lm_heads.0.weight`` with ``original_lm_head``.
"""
from __future__ import annotations

import re
import warnings

import torch

from ...heads import HeadsConfig, TargetInfo
from ...export.sources import Source, load_strict
from .heads import MedusaHeads

ORIGINAL_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
ORIGINAL_HEAD = re.compile(r"^(\d+)\.(\d+)\.weight$")
VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
VLLM_HEAD = re.compile(r"^lm_heads\.(\d+)\.weight$")
#: FasterDecoding's file names for the heads alone.
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
#: A Medusa-2 release is a whole fine-tuned model with the heads inside, under these names: only
#: the heads are read.
MEDUSA_PREFIXES = ("medusa_head.", "medusa_heads.")


def strip_prefix(name: str) -> str:
    for prefix in MEDUSA_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def medusa_layout(source: Source) -> str | None:
    """"vllm-medusa" (blocks.{h}.layers.{l}.*), "medusa" (FasterDecoding's {h}.{l}.linear.*) or None."""
    names = {strip_prefix(k) for k in source.tensors}
    if any(VLLM_BLOCK.match(k) for k in names):
        return "vllm-medusa"
    if any(ORIGINAL_BLOCK.match(k) for k in names):
        return "medusa"
    return None


def _count(indices: set[int], what: str, where: str) -> int:
    n = max(indices) + 1 if indices else 0
    if indices != set(range(n)):
        raise ValueError(f"{where}: {what} are not numbered 0..{n - 1} (found {sorted(indices)})")
    return n


def read_medusa(source: Source, target: torch.nn.Module, layout: str) -> MedusaHeads:
    """``layout``: "medusa" (FasterDecoding) or "vllm-medusa"."""
    where = source.describe()
    tensors = {strip_prefix(k): v for k, v in source.tensors.items()}
    blocks: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    heads_lm: dict[int, torch.Tensor] = {}
    unknown = []
    for name, t in tensors.items():
        m = (ORIGINAL_BLOCK if layout == "medusa" else VLLM_BLOCK).match(name)
        if m:
            blocks.setdefault((int(m[1]), int(m[2])), {})[m[3]] = t
            continue
        m = (ORIGINAL_HEAD if layout == "medusa" else VLLM_HEAD).match(name)
        if m:
            heads_lm[int(m[1])] = (int(m[2]) if layout == "medusa" else None, t)
            continue
        unknown.append(name)
    if "token_map" in unknown:
        raise ValueError(f"{where}: a truncated-vocabulary Medusa (token_map) has no draftheads equivalent")
    if unknown:
        raise ValueError(f"{where}: tensors with no place in Medusa heads: {', '.join(sorted(unknown)[:8])}")
    num_heads = _count({h for h, _ in blocks} | set(heads_lm), "heads", where)
    per_head = {h: {l for hh, l in blocks if hh == h} for h in range(num_heads)}
    num_layers = _count(per_head[0], "blocks of head 0", where) if num_heads else 0
    for h, layers in per_head.items():
        if layers != set(range(num_layers)):
            raise ValueError(f"{where}: head {h} has blocks {sorted(layers)}, head 0 has {num_layers}")
    if layout == "medusa":
        for h, (idx, _) in heads_lm.items():
            if idx != num_layers:
                raise ValueError(f"{where}: head {h}'s LM head is {h}.{idx}.weight, expected {h}.{num_layers}.weight")

    cfg = source.config
    claimed = next((cfg[k] for k in ("medusa_num_heads", "num_heads") if k in cfg), None)
    if claimed is not None and claimed != num_heads:
        warnings.warn(f"{where}: config.json says {claimed} Medusa heads, the weights hold {num_heads}; "
                      "using the weights", stacklevel=3)
    claimed_layers = next((cfg[k] for k in ("medusa_num_layers", "num_hidden_layers") if k in cfg), None)
    if claimed_layers is not None and claimed_layers != num_layers:
        warnings.warn(f"{where}: config.json says {claimed_layers} layers per head, the weights hold {num_layers}; "
                      "using the weights", stacklevel=3)

    info = TargetInfo.from_model(target)
    target_head = target.get_output_embeddings().weight.detach()
    shared = False
    if layout == "vllm-medusa" and cfg.get("original_lm_head"):
        if set(heads_lm) != {0}:
            raise ValueError(f"{where}: original_lm_head needs exactly lm_heads.0.weight, found heads {sorted(heads_lm)}")
        w = heads_lm[0][1]
        shared = tuple(w.shape) == tuple(target_head.shape) and torch.allclose(w.float(), target_head.float().cpu(), rtol=1e-2, atol=1e-3)
        heads_lm = {h: (None, w) for h in range(num_heads)}
    elif set(heads_lm) != set(range(num_heads)):
        raise ValueError(f"{where}: LM heads {sorted(heads_lm)} for {num_heads} heads")

    config = HeadsConfig(head_type="medusa", num_heads=num_heads, num_layers=num_layers, hidden_size=info.hidden_size,
                         vocab_size=info.vocab_size, lm_head="shared" if shared else "own", target=info)
    heads = MedusaHeads(config)
    use_bias = layout == "medusa" or bool(cfg.get("medusa_fc_bias", False))
    if layout == "vllm-medusa" and not use_bias and any("bias" in b for b in blocks.values()):
        warnings.warn(f"{where}: block biases present but medusa_fc_bias is false: vLLM ignores them, so does this import",
                      stacklevel=3)
    state = {}
    for (h, l), parts in blocks.items():
        if "weight" not in parts:
            raise ValueError(f"{where}: head {h} block {l} has no weight")
        state[f"blocks.{h}.{l}.linear.weight"] = parts["weight"]
        bias = parts.get("bias") if use_bias else None
        state[f"blocks.{h}.{l}.linear.bias"] = bias if bias is not None else torch.zeros(parts["weight"].shape[0])
    if not shared:
        for h, (_, w) in heads_lm.items():
            state[f"lm_heads.{h}.weight"] = w
    state["token_counts"] = torch.zeros(info.vocab_size, dtype=torch.long)
    return load_strict(heads, state, where)

