"""Attention masks for verify forwards: which cache entries and tree nodes each tree node sees.

One rule (`span_visible`) limits attention to a sliding window or a chunk, applied to logical
positions; the single-sequence tree mask (`tree_attention_mask`), the batch's per-row mask
(`kv.ragged.ragged_mask`) and the static cache's fixed-width mask all go through it. The layer
spans themselves come from the model's config (`layer_spans`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..heads.config import text_config
from .tree import TreeShape


class UnsupportedModelError(ValueError):
    """The model's forward does not honour a custom 4D attention mask, or it has a layer whose state
    draftheads cannot verify a draft over, so trees cannot be verified."""


#: Layer types whose attention a tree mask can express.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
#: Layer types with no token mixer at all (Nemotron-H's MLP and MoE layers): nothing to mask or keep.
STATELESS_LAYER_TYPES = ("mlp", "moe")
#: Layer types that keep a recurrent state AND attend (Falcon-H1: Mamba-2 and attention side by side):
#: the span of their attention part.
STATE_AND_ATTENTION = {"hybrid": "full_attention", "hybrid_sliding": "sliding_attention"}


@dataclass(frozen=True)
class AttentionSpan:
    """What one attention layer lets a query at position q see besides causality: the last
    ``window`` positions (sliding window: k > q - window), or only its own chunk of ``chunk``
    positions (chunked attention, Llama 4: k // chunk == q // chunk). Neither = full attention."""

    window: int | None = None
    chunk: int | None = None

    @property
    def size(self) -> int | None:
        return self.window or self.chunk

    def limits(self, end: int) -> bool:
        """Whether the span hides anything from queries at positions below ``end``."""
        return self.size is not None and end > self.size


FULL = AttentionSpan()


def span_visible(visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, span: AttentionSpan) -> torch.Tensor:
    """``visible`` further limited by ``span``: query positions ``q_pos`` [..., n, 1] against key
    positions ``k_pos`` [..., 1, k] (logical positions, what RoPE sees, broadcast together)."""
    if span.window is not None:
        visible = visible & ((q_pos - k_pos) < span.window)
    if span.chunk is not None:
        visible = visible & ((q_pos // span.chunk) == (k_pos // span.chunk))
    return visible


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``visible``, the dtype's minimum elsewhere (what HF forwards take as a 4D mask)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)


def model_name(model: torch.nn.Module) -> str:
    model_type = getattr(text_config(model), "model_type", None)
    return f"{type(model).__name__} (model_type {model_type!r})" if model_type else type(model).__name__


def layer_spans(model: torch.nn.Module, state_types: tuple[str, ...] = ()) -> dict[str, AttentionSpan]:
    """The attention span of each attention layer type of ``model`` (read from its config), keyed by the
    name its forward uses for a per-layer-type mask dict (``""`` for models without layer types).

    ``state_types``: the layer types whose recurrent state the verifier records and rolls back
    (`kv.recurrent`); they take no mask. Any other layer type is refused by name: a tree forward would
    run every node through a state nobody rolls back to the accepted path."""
    cfg = text_config(model)
    window = getattr(cfg, "sliding_window", None)
    chunk = getattr(cfg, "attention_chunk_size", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        known = set(ATTENTION_LAYER_TYPES) | set(STATELESS_LAYER_TYPES) | set(state_types)
        other = sorted(set(layer_types) - known)
        if other:
            raise UnsupportedModelError(
                f"{model_name(model)} has layers of type {other}, neither attention ({', '.join(ATTENTION_LAYER_TYPES)}) "
                "nor a linear-attention, state-space or convolution layer whose recurrent state draftheads records "
                "per draft token and rolls back: one forward over a tree of candidates would run every node through "
                "that state in order (siblings would see each other), so it cannot be verified"
            )
        attention = [STATE_AND_ATTENTION.get(t, t) for t in layer_types if t in ATTENTION_LAYER_TYPES
                     or t in STATE_AND_ATTENTION]
        spans = {"full_attention": FULL, "sliding_attention": AttentionSpan(window=window),
                 "chunked_attention": AttentionSpan(chunk=chunk)}
        return {t: spans[t] for t in dict.fromkeys(attention)}
    if chunk:
        return {"": AttentionSpan(chunk=chunk)}
    if window and getattr(cfg, "use_sliding_window", True):
        return {"": AttentionSpan(window=window)}
    return {"": FULL}


def limiting_spans(spans: dict[str, AttentionSpan], shape: TreeShape, prefix_len: int) -> dict[str, AttentionSpan]:
    """Every layer type's span where it hides something from this forward (the tree after a
    ``prefix_len`` prefix), full attention for the others; empty when no span limits anything (the
    plain tree mask then serves every layer)."""
    end = prefix_len + shape.max_depth + 1
    if not any(span.limits(end) for span in spans.values()):
        return {}
    return {name: span if span.limits(end) else FULL for name, span in spans.items()}


def tree_attention_mask(
    shape: TreeShape,
    prefix_len: int,
    dtype: torch.dtype,
    device: torch.device,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Additive mask [1, 1, n, prefix_len + n] for one tree forward; ``window``/``chunk`` as in
    `AttentionSpan`, applied to the nodes' positions (prefix length + depth)."""
    n = shape.size
    visible = torch.ones(n, prefix_len + n, dtype=torch.bool)
    visible[:, prefix_len:] = shape.ancestor_mask
    span = AttentionSpan(window=window, chunk=chunk)
    if span != FULL:
        q_pos = prefix_len + shape.depth
        k_pos = torch.cat([torch.arange(prefix_len), q_pos])
        visible = span_visible(visible, q_pos[:, None], k_pos[None, :], span)
    return additive(visible, dtype).to(device)[None, None]


def span_masks(
    limiting: dict[str, AttentionSpan], shape: TreeShape, prefix_len: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The tree masks of a forward some span limits (``limiting`` from `limiting_spans`): one mask
    for a model with one layer type, else one per layer type (Gemma 2/3, Qwen2 with windows:
    sliding + full; Llama 4: chunked + full), as HF forwards take them."""
    masks = {name: tree_attention_mask(shape, prefix_len, dtype, device, window=s.window, chunk=s.chunk)
             for name, s in limiting.items()}
    return next(iter(masks.values())) if len(masks) == 1 else masks


@dataclass
class ShapeOnDevice:
    """A tree shape's topology on the target's device, built once per shape (static trees: once)."""

    depth: torch.Tensor  # [n]
    paths: torch.Tensor  # [leaves, D+1], -1 padded
    block: torch.Tensor  # [n, n] additive mask among the tree's nodes


def shape_on_device(shape: TreeShape, device: torch.device, dtype: torch.dtype) -> ShapeOnDevice:
    """Cached on the shape itself, so dynamic trees (one shape per step) do not pile up."""
    per_device = shape.on_device
    key = (device, dtype)
    if key not in per_device:
        per_device[key] = ShapeOnDevice(
            depth=shape.depth.to(device, non_blocking=True),
            paths=shape.paths.to(device, non_blocking=True),
            block=additive(shape.ancestor_mask, dtype).to(device, non_blocking=True),
        )
    return per_device[key]
