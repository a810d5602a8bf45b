"""The verifier: every target forward of a decode (the prompt's prefill, then ONE forward per step
over the cache + every active row's tree), over the cache a KV store hands it.

Tree attention uses only the model's public arguments: an additive float 4D mask where each node
sees the prefix, its ancestors and itself (`masks`), position ids = prefix length + depth, and
the target's own cache. Which path is accepted is not the verifier's business (`accept`), nor
what the cache keeps afterwards (the KV stores of `kv`).
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .features import FINAL, FeatureTap
from .recurrent import RecurrentStep, recording, recurrent_layout
from .masks import layer_spans, limiting_spans, shape_on_device, span_masks
from .output import logits_to_keep
from .tree import Tree, TreeShape


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the forward's cache argument: ``cache`` in recent transformers (where
    ``past_key_values`` is deprecated), ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def is_chain(shape: TreeShape) -> bool:
    return all(p == i - 1 for i, p in enumerate(shape.parents))


class TreeVerifier:
    """Runs the target over prompts and trees, capturing only the features the proposer reads.

    ``feature_layers``: which hidden states the forwards return, in ``output_hidden_states``
    numbering (a proposer's `feature_layers`; ``None`` = the last hidden state, ``()`` = none).
    Only those are captured (`FeatureTap`), never all L+1."""

    def __init__(self, target: torch.nn.Module, feature_layers: Sequence[int] | None = None) -> None:
        self.target = target
        # The parameters transformers' `device` and `dtype` properties read (the first one, the first
        # floating one), held: those properties walk the module tree, several times per step.
        # `Module.to` moves a parameter's data in place, so they follow the model.
        params = list(target.parameters())
        self._first_param = params[0]
        self._first_float = next((p for p in params if p.is_floating_point()), params[0])
        self.tap = FeatureTap(target, (FINAL,) if feature_layers is None else feature_layers)
        self.feature_layers = self.tap.layers
        # Hybrid targets: the layers that keep a recurrent state, recorded per node and rolled back by the
        # KV stores' commits (`kv.recurrent`); None for attention-only targets.
        self.recurrent = recurrent_layout(target)
        # Refuses layer types that are neither attention nor such a state.
        self.spans = layer_spans(target, self.recurrent.state_types if self.recurrent else ())
        self.cache_arg = cache_kwarg(target)
        # Tree masks over prefix + tree, one buffer per tree size, extended in place: the prefix
        # columns stay 0 (visible), only the tree block moves along (see `_extended_mask`).
        self._masks: dict[tuple[int, torch.device, torch.dtype], list] = {}
        self._arange: dict[torch.device, torch.Tensor] = {}

    @property
    def device(self) -> torch.device:
        """The target's device, as ``target.device`` reads it."""
        return self._first_param.device

    @property
    def dtype(self) -> torch.dtype:
        """The target's dtype, as ``target.dtype`` reads it."""
        return self._first_float.dtype

    def new_cache(self):
        """An empty cache for one decode: transformers' dynamic cache (with the state layers a hybrid
        target needs, `kv.recurrent.RecurrentLayout.new_cache`)."""
        return DynamicCache() if self.recurrent is None else self.recurrent.new_cache()

    def _run(self, cache, parents: torch.Tensor | None = None,
             **inputs) -> tuple[torch.Tensor, torch.Tensor | None, RecurrentStep | None]:
        """One target forward appending to ``cache``: its logits, the captured features and, on a hybrid
        target, the recurrent state after every node (``parents`` [rows, n]: the trees' topology; each
        row's own state is left as it was, for the store's commit to choose from)."""
        with self.tap.capture() as captured, recording(cache, self.recurrent, parents) as step:
            out = self.target(use_cache=True, **inputs, **self.tap.forward_kwargs(), **{self.cache_arg: cache})
        return out.logits, self.tap.features(captured, out), step

    def _with_state_masks(self, masks: torch.Tensor | dict[str, torch.Tensor] | None):
        """A per-layer-type mask dict completed with the state layers' entries (none)."""
        if isinstance(masks, dict) and self.recurrent is not None:
            return {**self.recurrent.no_masks(), **masks}
        return masks

    def prefill(self, cache, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prompts [B, T] into ``cache``: the last position's logits [B, V] (the first token) and
        the features [B, T, F] at every prompt position (None when the proposer reads none)."""
        device = self.device
        extra = {} if attention_mask is None else {
            "attention_mask": attention_mask.to(device), "position_ids": position_ids.to(device)}
        logits, features, _ = self._run(cache, input_ids=input_ids.to(device), **extra, **logits_to_keep(self.target, 1))
        return logits[:, -1], features

    # -- one tree ---------------------------------------------------------------------------------
    def _extended_mask(self, shape: TreeShape, prefix_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[1, 1, n, prefix_len + n] view of a buffer on the device: two small device copies per step
        (clear the last block, place this one) instead of building n x (prefix + n) on the host."""
        n, need = shape.size, prefix_len + shape.size
        key = (n, device, dtype)
        entry = self._masks.get(key)
        if entry is None or entry[0].shape[1] < need:
            entry = self._masks[key] = [torch.zeros(n, max(2 * need, 512), dtype=dtype, device=device), None]
        buffer, placed = entry
        if placed is not None and placed != prefix_len:
            buffer[:, placed : placed + n].zero_()
        buffer[:, prefix_len:need] = shape_on_device(shape, device, dtype).block
        entry[1] = prefix_len
        return buffer[None, None, :, :need]

    def attention_mask(self, shape: TreeShape, prefix_len: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """The mask of one tree after ``prefix_len`` cached tokens (one per layer type where windows
        or chunks differ between layers)."""
        dtype, device = self.dtype, self.device
        if not self.spans:
            return None  # no attention layer (a state-space model): nothing to mask
        limiting = limiting_spans(self.spans, shape, prefix_len)
        if limiting:
            return self._with_state_masks(span_masks(limiting, shape, prefix_len, dtype, device))
        if is_chain(shape):
            # A chain (draft-model and prompt-lookup drafts; a root-only tree is a plain decoding
            # step) needs no tree mask: its tree mask IS the causal mask. Passing none, as
            # `generate` does, lets the model build its own causal mask and take its fast paths.
            return None
        return self._extended_mask(shape, prefix_len, dtype, device)

    def forward(self, cache: DynamicCache, tree: Tree, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [n, V] and features [n, F] of every tree node (by default the last hidden states
        after the final norm, F = H).

        The cache grows by n entries; the KV store's commit then keeps only the accepted ones."""
        _, logits, features, *_ = self.forward_tree(cache, tree, prefix_len)  # (a static verifier records no state)
        return logits[0], None if features is None else features[0]

    def forward_tree(self, cache, tree: Tree, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                                       RecurrentStep | None]:
        """`forward` as a batch of one row, what the loop's stores hand on: the tokens as verified
        [1, n] (on the device), logits [1, n, V], features [1, n, F] (or None) and a hybrid target's
        recorded state."""
        device = self.device
        tokens = tree.tokens.to(device, non_blocking=True)[None]
        if tree.shape.size == 1:
            # A plain step: the root's position is the prefix length, a view of one buffer (no
            # topology lookup and no `depth + prefix` tensor op per step).
            position_ids = self._positions(prefix_len + 1, device)[None, prefix_len : prefix_len + 1]
        else:
            position_ids = (shape_on_device(tree.shape, device, self.dtype).depth + prefix_len)[None]
        parents = None if self.recurrent is None else tree.shape.parents_tensor[None]
        logits, features, step = self._run(
            cache, parents, input_ids=tokens, position_ids=position_ids,
            attention_mask=self.attention_mask(tree.shape, prefix_len),
        )
        return tokens, logits, features, step

    def _positions(self, end: int, device: torch.device) -> torch.Tensor:
        """``arange(end)`` or longer on ``device``, one buffer doubled as decoding goes on: a step's
        positions are a view of it, not a new tensor (and on an accelerator not a copy)."""
        buffer = self._arange.get(device)
        if buffer is None or buffer.numel() < end:
            buffer = self._arange[device] = torch.arange(max(2 * end, 512), device=device)
        return buffer

    # -- a batch of trees -------------------------------------------------------------------------
    def forward_rows(self, cache, tokens: torch.Tensor, position_ids: torch.Tensor,
                     attention_mask: torch.Tensor | dict[str, torch.Tensor],
                     parents: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, RecurrentStep | None]:
        """Logits [rows, n, V] and features [rows, n, F] of every row's (padded) tree, ``tokens``
        [rows, n] on the device, positions and mask as the ragged cache lays them out; ``parents``
        [rows, n] (host) the trees' topology, which a hybrid target's state layers need."""
        device = self.device
        return self._run(cache, parents if self.recurrent is not None else None, input_ids=tokens,
                         position_ids=position_ids.to(device),
                         attention_mask=None if not self.spans else self._with_state_masks(attention_mask))
