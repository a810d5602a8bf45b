"""A decode call's inputs as `generate` reads them: the token matrix, left padding, the EOS ids
and the pad id. One rule for each, shared by the speculative loop, plain decoding and the
batch-plan calibration."""
from __future__ import annotations

from typing import Any

import torch


def eos_ids(target: torch.nn.Module, eos_token_id: int | list[int] | None) -> list[int]:
    """The EOS ids in the order given, else the target's generation config's (``[]``: never stop)."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return []
    return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(e) for e in eos_token_id]


def pad_id(target: torch.nn.Module, eos: list[int]) -> int | None:
    """What `generate` pads finished rows with: the generation config's pad id, else the first EOS
    id (``eos`` from `eos_ids`), else none."""
    pad = getattr(getattr(target, "generation_config", None), "pad_token_id", None)
    if pad is None and eos:
        pad = eos[0]
    return pad


def token_matrix(input_ids: Any) -> torch.Tensor:
    """``input_ids`` as a [batch, seq] tensor (one sequence [seq] becomes one row)."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(ids.shape)}")
    return ids


def left_pad(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One [B, T] batch and its attention mask from 1-D (or [1, T]) prompts, padded on the left as
    decoder-only `generate` needs."""
    rows = [p.reshape(-1) for p in prompts]
    width = max(r.numel() for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - row.numel():] = row
        mask[i, width - row.numel():] = 1
    return ids, mask


def wants_batch_path(input_ids: torch.Tensor, attention_mask: Any) -> bool:
    """Whether a call needs the batched loop: several rows, or one row with padding
    (``input_ids`` as `token_matrix` returns it)."""
    if input_ids.shape[0] != 1:
        return True
    if attention_mask is None:
        return False
    mask = torch.as_tensor(attention_mask)
    return mask.shape != input_ids.shape or not bool((mask == 1).all())


def check_batch(
    input_ids: Any, attention_mask: Any, pad_token_id: int | None, eos: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated ``(input_ids [B, T], attention_mask [B, T])``; a missing mask is inferred from the
    pad token the way `generate` infers it (pad positions masked when the pad id is not an EOS)."""
    ids = token_matrix(input_ids)
    if ids.shape[0] == 0:
        raise ValueError("input_ids has no rows (batch size 0)")
    if ids.shape[1] == 0:
        raise ValueError("the prompts are empty: give at least one token per row (e.g. the BOS token)")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    if attention_mask is None:
        if pad_token_id is not None and pad_token_id not in eos and bool((ids == pad_token_id).any()):
            mask = (ids != pad_token_id).long()
        else:
            mask = torch.ones_like(ids)
    else:
        mask = torch.as_tensor(attention_mask)
        if mask.dim() == 1 and ids.shape[0] == 1:
            mask = mask[None]
        if mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(mask.shape)} but input_ids has shape {tuple(ids.shape)}: "
                "give one 0/1 mask entry per token (the tokenizer's attention_mask for the same batch)"
            )
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        mask = mask.long()
    empty = (mask.sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"row(s) {empty} of the batch have no tokens (attention mask all zeros): give every row at least "
            "one token (e.g. the BOS token) or leave the row out"
        )
    bad = ((mask == 0) & (mask.cumsum(dim=1) > 0)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"row(s) {bad} of the batch are padded on the right (a 0 in attention_mask after a token): decoder-only "
            "models continue from the last position, so pad on the left, as `generate` needs "
            "(tokenizer.padding_side = 'left')"
        )
    return ids, mask

