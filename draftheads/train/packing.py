"""Per-document attention for packed windows: documents, pairings and the target's check.

A packed window holds several documents one after another; ``position_ids`` restart at 0 at each
document's first token (and the padding after the last document is one more run starting at 0).
That one tensor says everything the masks need, so it is the only thing a packed batch adds:

* the frozen target gets ``position_ids`` and no 2D mask; transformers then finds the runs
  itself and builds a block-diagonal causal mask for every attention implementation (sdpa,
  eager, flex, and flash-attention's varlen path), sliding windows included.
  ``check_target_packing`` proves it on the real target before training starts;
* the losses pair a position with one ``shift`` tokens later only inside one document
  (``same_document``), and the draft layers' attention (EAGLE, DFlash, P-EAGLE) is restricted
  to the reader's own document (``document_ids``).

Without ``position_ids`` (unpacked rows) every helper answers "one document per row", so the
losses keep their unpacked behaviour exactly.
"""
from __future__ import annotations

import torch
from torch import nn


class PackingError(ValueError):
    """Packing asked for something it cannot serve, and what to do instead."""


def document_ids(position_ids: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` long: which document of its row each position belongs to (0, 1, ...). A new
    document starts wherever the position restarts at 0. Unpacked (``position_ids`` None): all 0."""
    if position_ids is None:
        return torch.zeros(like.shape[:2], dtype=torch.long, device=like.device)
    return (position_ids == 0).long().cumsum(-1)


def same_document(position_ids: torch.Tensor | None, shift: int) -> torch.Tensor | None:
    """``[B, S - shift]`` bool: positions t and t + shift lie in one document (None: unpacked, so
    always). Documents are contiguous, so every position in between lies in it too."""
    if position_ids is None:
        return None
    return position_ids[:, shift:] - position_ids[:, :-shift] == shift


def within_document(valid: torch.Tensor, position_ids: torch.Tensor | None, shift: int) -> torch.Tensor:
    """``valid`` [B, S - shift] restricted to the pairs (t, t + shift) of one document."""
    same = same_document(position_ids, shift)
    return valid if same is None else valid & same


def positions_or_arange(position_ids: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The RoPE positions of a batch: per-document ``position_ids``, or 0..S-1 for unpacked rows."""
    if position_ids is not None:
        return position_ids
    return torch.arange(like.shape[1], device=like.device)[None].expand(like.shape[0], -1)


def target_inputs(attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> dict:
    """Keyword arguments for the frozen target: the 2D padding mask for unpacked rows; for a
    packed window, ``position_ids`` alone (a 2D mask would switch off transformers' detection of
    the packed runs, and the padding run is one more document nobody reads). The call must pass
    ``use_cache=False``: transformers looks for packed runs only when there is no cache."""
    if position_ids is None:
        return {"attention_mask": attention_mask}
    return {"attention_mask": None, "position_ids": position_ids}


def check_packable(target: nn.Module) -> None:
    """Refuse packing for a target with recurrent layers (linear attention, state-space, convolution):
    their state runs through a packed window from one document into the next, and unlike attention no
    mask or ``position_ids`` can keep documents apart (transformers resets such a state per document
    only in the flash-linear-attention / mamba_ssm CUDA kernels, given ``cu_seqlens``)."""
    from ..inference.recurrent import state_layer_types

    types = state_layer_types(target)
    if types:
        raise PackingError(
            f"data.packing: the target ({type(target).__name__}) has layers that keep a recurrent state "
            f"({', '.join(types)}): it would carry from one packed document into the next; set data.packing: "
            "false (train.group_by_length reduces padding without packing)"
        )


@torch.no_grad()
def check_target_packing(target: nn.Module) -> None:
    """Raise ``PackingError`` unless the target, run on two documents packed into one window with
    per-document ``position_ids``, gives each document the hidden states it gets alone.

    A model whose attention ignores packed ``position_ids`` (an implementation or architecture
    without packed-sequence support) would let every token attend to the documents before it
    without any error; this few-token forward on the real target catches that before training."""
    param = next(target.parameters())
    atol = 1e-4 if param.dtype == torch.float32 else 3e-2  # the few-ulp reordering of a packed matmul
    vocab = int(target.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, vocab, (n,), generator=gen) for n in (7, 5)]
    ids = torch.cat(docs)[None].to(param.device)
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None].to(param.device)
    packed = target(input_ids=ids, position_ids=positions, use_cache=False, output_hidden_states=True).hidden_states
    start = 0
    for doc in docs:
        alone = target(input_ids=doc[None].to(param.device), use_cache=False, output_hidden_states=True).hidden_states
        for layer, (p, a) in enumerate(zip(packed, alone)):
            got = p[:, start : start + len(doc)].float()
            scale = max(1.0, float(a.float().abs().max()))
            if not torch.allclose(got, a.float(), atol=atol * scale, rtol=0):
                implementation = getattr(target.config, "_attn_implementation", "?")
                raise PackingError(
                    f"data.packing: the target ({type(target).__name__}, attention {implementation!r}) does not keep "
                    f"packed documents apart (hidden state {layer} differs by "
                    f"{float((got - a.float()).abs().max()):.2e} from the document run alone); "
                    "set data.packing: false (train.group_by_length reduces padding without packing)"
                )
        start += len(doc)


def pack_for_training(cfg, target: nn.Module | None, train_ds, collator, say=print, *, check_target: bool = True):
    """``(windows, collator)`` replacing the training rows and their collator when
    ``data.packing`` is on (the evaluation rows keep the unpacked collator). Refuses the options
    packing cannot serve, by name; ``check_target``: run ``check_target_packing`` first (skipped
    where the target cannot run a forward outside the launcher, e.g. ZeRO-3 sharded weights)."""
    from ..data.packing import PackingCollator, pack_dataset
    from ..data.sampling import example_lengths

    if cfg.train.group_by_length:
        raise PackingError(
            "data.packing and train.group_by_length are both on: packed windows have no padding to group away; "
            "turn one of them off"
        )
    if target is not None and check_target:
        check_target_packing(target)
    windows, stats = pack_dataset(train_ds, example_lengths(train_ds), cfg.data.packing_window, cfg.data.pack_overflow)
    if stats.windows == 0:
        raise PackingError(f"data.packing: no training row is left to pack ({stats.summary()})")
    say(stats.summary() + f"; train.batch_size counts windows ({cfg.train.batch_size} per batch); evaluation stays unpacked")
    return windows, PackingCollator(collator)
