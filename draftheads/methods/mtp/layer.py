"""The MTP layer itself, built from transformers' own classes, and the cache its attention writes to.

An MTP layer's decoder block is the target's own kind (Qwen3.5's gated attention with partial
rotary and zero-centred norms, DeepSeek's MLA and experts, ...), so it is not rewritten here:
the heads hold transformers' `modeling_layers.MtpLayer` around the target's own decoder-layer
class, exactly the module transformers' `MtpModel` (and so `generate(use_mtp=True)`) runs. What a
heads folder records to rebuild it without the target is the layer's config (a dict) and the two
classes by their import path, only ever under ``transformers.``.

The attention of that block goes through transformers' public cache argument: `DraftKV` is what
it sees as the cache during one draft forward. It hands the block the keys and values it must
attend to and keeps the new ones where the caller wants them: written in place into the drafter's
preallocated buffers (drafting: EAGLE's draft cache, `methods/eagle/drafter.py`), concatenated to
the earlier unrolled steps' (training: `methods/eagle/loss.py`), or only measured (`kv_shapes`).
Which keys each query may see is the 4D boolean mask the caller passes as ``attention_mask``
(transformers' sdpa attention takes it as is), so trees and training's unrolled steps need no
change to the block.
"""
from __future__ import annotations

import copy
import importlib
from typing import Any

import torch
from torch import nn

ALLOWED_PREFIX = "transformers."


def class_path(cls: type) -> str:
    """``module.QualName`` of a transformers class, as a heads config records it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def import_class(path: str, what: str) -> type:
    """The class at ``path``; only transformers' own classes are ever imported from a config."""
    if not isinstance(path, str) or not path.startswith(ALLOWED_PREFIX) or "." not in path:
        raise ValueError(f"{what} {path!r}: MTP heads rebuild their layer from transformers' own classes only "
                         f"(a path under {ALLOWED_PREFIX!r})")
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        import transformers

        raise ValueError(f"{what} {path!r} is not in this transformers ({transformers.__version__}): {e}; install "
                         "the transformers version the heads were saved with") from None
    if not isinstance(found, type) or not issubclass(found, nn.Module):
        raise ValueError(f"{what} {path!r} is not a torch module class")
    return found


def config_from_dict(data: dict[str, Any]):
    """A transformers config of ``data["model_type"]`` with ``data``'s values, attending with sdpa
    (the boolean tree masks go to it as they are)."""
    from transformers import CONFIG_MAPPING

    model_type = data.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"mtp_config: model_type {model_type!r} is not one this transformers knows")
    config = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(data))
    config._attn_implementation = "sdpa"
    if hasattr(config, "_experts_implementation"):  # experts outside a PreTrainedModel: the plain loop
        config._experts_implementation = "eager"
    return config


def build_layer(config, decoder_layer: type, norm: type, use_post_norm: bool = True) -> nn.Module:
    """transformers' MTP layer (layer index 0 of ``config``, an MTP config of one layer)."""
    from transformers.modeling_layers import MtpLayer

    return MtpLayer(config, decoder_layer, norm, 0, use_post_norm)


class DraftKV:
    """What the MTP block's attention takes for a cache in one forward (module docstring).

    ``buffers``: per attention layer index, preallocated (keys, values) [rows, heads, slots, dim]
    whose first ``length`` slots are the past; the new entries go to ``length:length+n`` in place.
    ``past``: per layer index, the earlier unrolled steps' (keys, values) to attend after (training).
    Neither: only what the layer writes is kept (``new``), e.g. to learn its shapes."""

    is_compileable = False

    def __init__(self, buffers: list | None = None, length: int = 0, past: list | None = None) -> None:
        self.buffers, self.length, self.past = buffers, length, past
        self.new: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.new[layer_idx] = (key_states, value_states)
        if self.buffers is not None:
            keys_buf, values_buf = self.buffers[layer_idx]
            n = key_states.shape[2]
            keys_buf[:, :, self.length : self.length + n] = key_states
            values_buf[:, :, self.length : self.length + n] = value_states
            return keys_buf[:, :, : self.length + n], values_buf[:, :, : self.length + n]
        if self.past is not None and self.past[layer_idx] is not None:
            past_k, past_v = self.past[layer_idx]
            return torch.cat([past_k, key_states], 2), torch.cat([past_v, value_states], 2)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length if self.buffers is not None else 0
