"""The EAGLE draft decoder layer: pre-norm attention with RoPE + SwiGLU MLP, on plain tensors.

Written here instead of borrowing a transformers layer: drafting needs a KV cache that tree nodes
append to and discard with an arbitrary ancestor mask, which plain tensors do directly for every
target family. What must match the target does come from torch and transformers: the norm is
``torch.nn.RMSNorm`` and the rotary frequencies (scaled RoPE included) come from transformers'
rope functions for the target's settings.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .unrolled_attention import UnrolledStepMask


def rope_settings(config) -> dict[str, Any]:
    """The target's RoPE as JSON-able settings for the heads' config ``extra``: ``rope_theta``,
    plus ``rope_scaling`` (the target's rope parameters) and ``max_position_embeddings`` when its
    rope type is not the default one (e.g. Llama-3.1's ``llama3``)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict) and "rope_type" not in params and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]  # per-layer-type settings: the full-attention layers'
    params = dict(params) if isinstance(params, dict) else {}
    theta = getattr(config, "rope_theta", None) or params.get("rope_theta") or 10000.0
    settings: dict[str, Any] = {"rope_theta": float(theta)}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        settings["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"} | {"rope_type": rope_type}
        settings["max_position_embeddings"] = int(config.max_position_embeddings)
    return settings


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict | None = None, max_position_embeddings: int | None = None
) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies [head_dim / 2] and the cos/sin scale, computed by transformers'
    own rope functions (``ROPE_INIT_FUNCTIONS``) so that scaled RoPE (llama3, yarn, linear, ...)
    matches the target's rotary embedding."""
    if not scaling:
        return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim), 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = scaling.get("rope_type", "default")
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_scaling type {rope_type!r} is not one transformers knows: {', '.join(ROPE_INIT_FUNCTIONS)}")
    carrier = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings or 2048,
        rope_parameters={**scaling, "rope_theta": theta},
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](carrier, None)
    return inv_freq.float(), float(scale)


def rotary(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [..., n, head_dim] for integer ``positions`` [..., n] (rotate-half layout)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def check_sliding_window(window) -> int | None:
    """``window`` as a positive int, or None (attend to every visible key); anything else is refused."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window must be a positive whole number of positions (or null: no window), got {window!r}")
    return window


def within_window(mask: torch.Tensor, window: int) -> torch.Tensor:
    """``mask`` [..., n, keys] restricted to each query's last ``window`` visible keys.

    Every caller's mask shows a query one key per position (the committed prefix, then its tree
    ancestors or its earlier training-time-test steps, holes of a ragged cache hidden) in
    increasing position order, so the last ``window`` visible keys are exactly the positions
    p - window + 1 .. p of a query at position p: a position sliding window (vLLM's and
    transformers' ``sliding_window``), computed from the mask alone, whatever row each key sits in.
    Why at all: heads trained on windows of W tokens never saw a key farther than W - 1 positions
    away; with ``window`` = W a longer context shows the draft layer only distances it was trained on."""
    from_end = mask.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1)  # visible keys at or after each key
    return mask & (from_end <= window)


class DraftLayer(nn.Module):
    """Pre-norm decoder layer whose attention reads ``attn_in`` (d or 2d wide) and adds to ``x``.

    The output projections (o_proj, down_proj) start at zero, so a fresh layer is the identity on
    its residual stream: a fresh EAGLE head predicts f_{t+1} = f_t (the target's own next-token
    guess, repeated), the same starting point as a fresh Medusa head, and learns from there."""

    def __init__(
        self,
        hidden: int,
        attn_in: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        intermediate: int,
        eps: float,
        theta: float,
        input_norm: bool,
        rope_scaling: dict | None = None,
        max_position_embeddings: int | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.theta = num_heads, num_kv_heads, head_dim, theta
        self.sliding_window = check_sliding_window(sliding_window)
        # Plain attributes (not buffers): never saved, so the on-disk format is the same for every rope.
        self.inv_freq, self.rope_scale = inverse_frequencies(head_dim, theta, rope_scaling, max_position_embeddings)
        self.input_layernorm = nn.RMSNorm(attn_in, eps=eps) if input_norm else None
        self.q_proj = nn.Linear(attn_in, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(attn_in, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(attn_in, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.gate_proj, self.up_proj):
            nn.init.normal_(lin.weight, std=0.02)
        nn.init.zeros_(self.o_proj.weight)
        nn.init.zeros_(self.down_proj.weight)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos/sin by position
        self._fused_cache: dict[str, tuple[tuple, torch.Tensor]] = {}

    # Drafting runs this layer once per tree depth on a handful of tokens, where the number of
    # kernel calls, not FLOPs, sets the cost: without autograd, q/k/v and gate/up are one matmul
    # each and RoPE is a table lookup.
    def _fused(self, name: str, *linears: nn.Linear) -> torch.Tensor:
        key = tuple((id(lin.weight), lin.weight._version, lin.weight.device, lin.weight.dtype) for lin in linears)
        hit = self._fused_cache.get(name)
        if hit is None or hit[0] != key:
            hit = (key, torch.cat([lin.weight.detach() for lin in linears]))
            self._fused_cache[name] = hit
        return hit[1]

    def _rotary(
        self, positions: torch.Tensor, dtype: torch.dtype, bound: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for ``positions``: computed under autograd, else looked up in a cached table.
        ``bound`` (> every position, known on the host) sizes the table without reading
        ``positions`` back from the device, a host sync per draft depth on a GPU."""
        if torch.is_grad_enabled():
            return rotary(positions, self.inv_freq, dtype, self.rope_scale)
        needed = bound if bound is not None else int(positions.max()) + 1
        if self._rope is None or self._rope[0].shape[0] < needed or self._rope[0].dtype != dtype or self._rope[0].device != positions.device:
            size = max(needed, 2 * (0 if self._rope is None else self._rope[0].shape[0]), 512)
            self._rope = rotary(torch.arange(size, device=positions.device), self.inv_freq, dtype, self.rope_scale)
        return self._rope[0][positions], self._rope[1][positions]

    def forward(
        self,
        x: torch.Tensor,
        attn_in: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | UnrolledStepMask,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` [B, n, d], ``attn_in`` [B, n, a], ``positions`` [B or 1, n], ``mask`` bool
        [B or 1, n, T + n] (True = attend; T = rows in ``past``), or training's
        `UnrolledStepMask` (the same attention, computed tile by tile). Returns the output [B, n, d] and
        the keys/values [B, kv, n, hd] of the n new rows (the caller keeps or drops them).

        ``cache`` = (K, V, T): preallocated buffers [B, kv, capacity, hd] whose first T rows are
        the past; the new rows are written at T..T+n in place (drafting: no copies per step)."""
        bsz, n, _ = attn_in.shape
        if self.input_layernorm is not None:
            attn_in = self.input_layernorm(attn_in)
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)
        # Not under autograd, nor under ZeRO-3 (its hooks gather a weight only when its module runs).
        fast = not torch.is_grad_enabled() and not hasattr(self.q_proj.weight, "ds_id")
        if not fast:
            q, k, v = self.q_proj(attn_in), self.k_proj(attn_in), self.v_proj(attn_in)
        else:
            q, k, v = F.linear(attn_in, self._fused("qkv", self.q_proj, self.k_proj, self.v_proj)).split(sizes, -1)
        q = q.view(bsz, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        # Drafting into a preallocated cache: positions stay below its capacity (a sequence's
        # position never exceeds its slot in the cache), so that bounds the RoPE table.
        cos, sin = self._rotary(positions, q.dtype, bound=None if cache is None else cache[0].shape[2])
        q, k = apply_rotary(q, cos[:, None], sin[:, None]), apply_rotary(k, cos[:, None], sin[:, None])
        if cache is not None:
            keys_buf, values_buf, length = cache
            keys_buf[:, :, length : length + n] = k
            values_buf[:, :, length : length + n] = v
            keys, values = keys_buf[:, :, : length + n], values_buf[:, :, : length + n]
        elif past is not None:
            keys, values = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        else:
            keys, values = k, v
        gqa = self.num_heads != self.num_kv_heads
        if isinstance(mask, UnrolledStepMask) and self.sliding_window is None:
            attn = mask.attend(q, keys, values, gqa)  # training's unrolled steps, tile by tile
        else:
            if isinstance(mask, UnrolledStepMask):
                mask = mask.dense()
            if self.sliding_window is not None:
                mask = within_window(mask, self.sliding_window)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=gqa)
        h = x + self.o_proj(attn.transpose(1, 2).reshape(bsz, n, -1))
        mlp_in = self.post_attention_layernorm(h)
        if not fast:
            gate, up = self.gate_proj(mlp_in), self.up_proj(mlp_in)
        else:
            gate, up = F.linear(mlp_in, self._fused("gate_up", self.gate_proj, self.up_proj)).chunk(2, -1)
        out = h + self.down_proj(F.silu(gate) * up)
        return out, (k, v)
