"""Medusa heads -> the folder vLLM loads as ``MedusaModel`` (vllm/model_executor/models/medusa.py).

vLLM's loader skips tensors it does not expect without a word, so every tensor draftheads has
either lands on a vLLM parameter or the export is refused. The layout: ``blocks.{h}.layers.{l}.weight``
(+ ``.bias`` only with ``medusa_fc_bias: true``), ``lm_heads.{h}.weight``; ``original_lm_head: true``
reads one shared head from ``lm_heads.0.weight``. (FasterDecoding's own layout, which imports, is
described in imports.py.)
"""
from __future__ import annotations

from ...export.common import EngineFolder, check_tensors, dtype_name, verifier_lm_head


def export_medusa(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
    cfg = heads.config
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    shared = cfg.lm_head == "shared"
    tensors = {}
    for h in range(cfg.num_heads):
        for l in range(cfg.num_layers):
            tensors[f"blocks.{h}.layers.{l}.weight"] = state[f"blocks.{h}.{l}.linear.weight"]
            # draftheads' blocks always carry a bias: vLLM uses it only with medusa_fc_bias: true.
            tensors[f"blocks.{h}.layers.{l}.bias"] = state[f"blocks.{h}.{l}.linear.bias"]
        if not shared:
            tensors[f"lm_heads.{h}.weight"] = state[f"lm_heads.{h}.weight"]
    notes = []
    if shared:
        # original_lm_head: vLLM reads ONE head for all from lm_heads.0.weight in the draft folder.
        weight = verifier_lm_head(verifier, cfg)
        tensors["lm_heads.0.weight"] = weight.to(next((t.dtype for t in tensors.values()), weight.dtype))
        notes.append(f"shared LM head copied from {verifier} (original_lm_head: true)")
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": shared,
        "truncated_vocab_size": cfg.vocab_size,
        "torch_dtype": dtype_name(tensors),
    }
    folder = EngineFolder(config, tensors, notes)
    expected = medusa_vllm_shapes(cfg.num_heads, cfg.num_layers, cfg.hidden_size, cfg.vocab_size, bias=True, shared_lm_head=shared)
    check_tensors(folder, expected, "vLLM Medusa")
    return folder


def medusa_vllm_shapes(num_heads: int, num_layers: int, hidden: int, vocab: int, *, bias: bool, shared_lm_head: bool) -> dict:
    shapes: dict[str, tuple[int, ...]] = {}
    for h in range(num_heads):
        for l in range(num_layers):
            shapes[f"blocks.{h}.layers.{l}.weight"] = (hidden, hidden)
            if bias:
                shapes[f"blocks.{h}.layers.{l}.bias"] = (hidden,)
        if not shared_lm_head or h == 0:
            shapes[f"lm_heads.{h}.weight"] = (vocab, hidden)
    return shapes
