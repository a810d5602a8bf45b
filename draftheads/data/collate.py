"""Batch tokenized examples into padded tensors.

No packing: each example keeps its own row, so attention never crosses documents or conversations
and a head never learns to predict across an unrelated boundary. Padding is on the right, so
positions (and the causal mask) of real tokens are the same as without padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class Collator:
    """``[{input_ids, loss_mask}]`` -> ``{input_ids, attention_mask, loss_mask}`` long tensors.

    Padded positions get ``attention_mask == 0`` and ``loss_mask == 0``, so the value written in
    ``input_ids`` there is never attended to or trained on. That is why falling back to the eos id
    when the tokenizer has no pad token (common for base LMs) is safe.
    """

    def __init__(
        self,
        pad_token_id: int | None,
        pad_to_multiple_of: int | None = None,
        *,
        eos_token_id: int | None = None,
    ) -> None:
        if pad_token_id is None:
            pad_token_id = eos_token_id
        if pad_token_id is None:
            raise ValueError("Collator needs a pad token id; the tokenizer has neither a pad nor an eos token")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1 or None, got {pad_to_multiple_of}")
        self.pad_token_id = int(pad_token_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, pad_to_multiple_of: int | None = None) -> Collator:
        """Pad with the tokenizer's pad id, or its eos id when it has no pad token."""
        return cls(tokenizer.pad_token_id, pad_to_multiple_of, eos_token_id=tokenizer.eos_token_id)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("Collator got an empty batch")
        ids = [_as_list(ex["input_ids"]) for ex in examples]
        masks = [_as_list(ex["loss_mask"]) for ex in examples]
        for i, (a, m) in enumerate(zip(ids, masks)):
            if len(a) != len(m):
                raise ValueError(f"example {i}: input_ids has {len(a)} tokens but loss_mask has {len(m)}")
        length = max(len(a) for a in ids)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = len(ids)
        input_ids = torch.full((batch, length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, length), dtype=torch.long)
        loss_mask = torch.zeros((batch, length), dtype=torch.long)
        for i, (a, m) in enumerate(zip(ids, masks)):
            n = len(a)
            input_ids[i, :n] = torch.as_tensor(a, dtype=torch.long)
            attention_mask[i, :n] = 1
            loss_mask[i, :n] = torch.as_tensor(m, dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def _as_list(value: Any) -> list[int]:
    return value.tolist() if hasattr(value, "tolist") else list(value)
