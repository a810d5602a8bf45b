"""What a decode returns, and the one logits_to_keep rule (the prefill, the model probe and draft
models ask only for the logits they read)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SpeculativeOutput:
    sequences: torch.Tensor  # [1, prompt + new], like `generate`
    accept_lengths: list[int]  # tokens committed per verify forward (accepted drafts + 1)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    target_seconds: float = 0.0  # time inside verify forwards (the rest is drafting + bookkeeping)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_new_tokens(self) -> int:
        return int(self.stats.get("new_tokens", 0))

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / max(len(self.accept_lengths), 1)



def logits_to_keep(model: torch.nn.Module, n: int) -> dict[str, int]:
    """``logits_to_keep=n`` where the forward takes it, as `generate` does in its prefill: only the
    last ``n`` positions' logits are used, and the LM head over a whole prompt is not free (a long
    prompt times a large vocabulary is gigabytes of fp32 logits). Hidden states are unaffected."""
    forward = type(model).forward
    keep = _KEEPS_LAST.get(forward)
    if keep is None:
        keep = _KEEPS_LAST[forward] = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": n} if keep else {}


_KEEPS_LAST: dict[Any, bool] = {}
