"""Capture only the target hidden states a proposer reads, instead of ``output_hidden_states=True``.

Asking the target for all its hidden states keeps L+1 tensors of [batch, seq, hidden] alive until
the forward returns: at prefill that is (L+1) x prompt x hidden (~9 GB for an 8B model and a 32k
prompt), even for prompt lookup, which reads none. A `FeatureTap` hooks just the modules whose
tensors are read: the input of decoder layer i (``i`` in ``output_hidden_states`` numbering) or
the output of the final norm (``FINAL``, the last hidden state).

Layer ids follow ``output_hidden_states``: ``hidden_states[i]`` for ``0 <= i < L`` is the input
of decoder layer i, and ``-1`` (or ``L``) is the last hidden state after the final norm.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..heads.config import target_decoder, text_config

#: The last hidden state after the final norm (what Medusa, Hydra and EAGLE read).
FINAL = -1


def _decoder_modules(target: torch.nn.Module) -> tuple[Sequence[torch.nn.Module], torch.nn.Module] | None:
    """The decoder layers and the final norm of a standard HF causal LM, or None if it has another
    layout (the tap then falls back to ``output_hidden_states=True``: correct, just more memory)."""
    decoder = target_decoder(target)
    layers = getattr(decoder, "layers", None)
    norm = getattr(decoder, "norm", None)
    if isinstance(layers, torch.nn.ModuleList) and isinstance(norm, torch.nn.Module) and len(layers) > 0:
        return layers, norm
    return None


class FeatureTap:
    """Which hidden states one target forward must hand back, and how to get them cheaply.

    ``layers``: ids in ``output_hidden_states`` numbering (see the module docstring); their states
    are concatenated in that order along the last dimension. ``()`` = none."""

    def __init__(self, target: torch.nn.Module, layers: Sequence[int]) -> None:
        num_layers = int(text_config(target).num_hidden_layers)
        self.layers: tuple[int, ...] = tuple(int(i) for i in layers)
        bad = [i for i in self.layers if not (-1 <= i <= num_layers)]
        if bad:
            raise ValueError(
                f"feature layers {list(self.layers)}: {bad} outside the target's {num_layers} layers (ids are "
                f"0..{num_layers - 1} for the input of a decoder layer, -1 or {num_layers} for the last hidden "
                "state after the final norm)"
            )
        # -1 and L both mean the final norm's output.
        self._keys = tuple(FINAL if i in (-1, num_layers) else i for i in self.layers)
        self._modules = _decoder_modules(target) if self.layers else None
        #: True when the model's layout is unknown and all hidden states are requested instead.
        self.fallback = bool(self.layers) and self._modules is None

    def forward_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments of the target forward."""
        return {"output_hidden_states": True} if self.fallback else {}

    @contextmanager
    def capture(self) -> Iterator[dict[int, torch.Tensor]]:
        """Hooks live only during one forward: a user's own calls of the target stay untouched."""
        got: dict[int, torch.Tensor] = {}
        if self._modules is None:
            yield got
            return
        layers, norm = self._modules
        handles = []
        for key in dict.fromkeys(self._keys):
            if key == FINAL:
                handles.append(norm.register_forward_hook(lambda _m, _a, out: got.__setitem__(FINAL, out)))
            else:
                handles.append(layers[key].register_forward_pre_hook(_input_hook(got, key), with_kwargs=True))
        try:
            yield got
        finally:
            for handle in handles:
                handle.remove()

    def features(self, got: dict[int, torch.Tensor], out: Any) -> torch.Tensor | None:
        """[batch, seq, F] concatenated features of one forward (None if no layer is read)."""
        if not self.layers:
            return None
        if self.fallback:
            states = out.hidden_states
            parts = [states[-1] if key == FINAL else states[key] for key in self._keys]
        else:
            parts = [got[key] for key in self._keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _input_hook(got: dict[int, torch.Tensor], key: int):
    def hook(_module, args, kwargs):
        got[key] = args[0] if args else kwargs["hidden_states"]

    return hook
