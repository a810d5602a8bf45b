"""What a tree search needs for heads that draft every depth in ONE forward (DFlash, P-EAGLE).

Their tree is static (rank paths, Medusa's format) and every node of it is read off the per-depth
top-k of the same draft forward, so the search needs two measurements, both taken as decoding
takes them:
- the acceptance table ``acc[d, r]``: how often depth d+1's rank-r candidate is the token the
  target produces d+1 positions after the root, on the target's own greedy continuations;
- the drafting cost by depth: one forward (DFlash always runs its whole block; P-EAGLE runs
  d - 1 mask slots for a tree d deep).
`calibrate` and training's tree choice feed them to the same search Medusa trees use
(``calibrate.choose_tree``). Each method declares how both are taken (`registry.OneForwardSearch`,
in draftheads/methods/dflash and methods/peagle); this module only asks it.

DFlash heads score their slots with the target's LM head, so they can also rank only a draft
vocabulary (`one_forward_vocab_sizes`): both measurements then take ``draft_vocab_size`` (None: the whole
vocabulary). P-EAGLE heads carry their own trained vocabulary and take none.
"""
from __future__ import annotations

import torch

from ..registry import OneForwardSearch, method_of


def _search(heads: torch.nn.Module) -> OneForwardSearch:
    search = method_of(heads).one_forward
    if search is None:
        raise ValueError(f"{heads.config.head_type} heads do not draft their whole tree in one forward")
    return search


def one_forward_vocab_sizes(heads: torch.nn.Module, sizes: tuple[int, ...]) -> list[int | None]:
    """The draft vocabularies worth trying for these heads: the whole one (None), and for heads
    that rank with the target's LM head and have training token counts, each of ``sizes`` below
    half the vocabulary (as for Medusa)."""
    if not _search(heads).ranks_draft_vocab or int(heads.token_counts.sum()) == 0:
        return [None]
    return [None] + [n for n in sizes if n < heads.config.vocab_size // 2]


def one_forward_draft_seconds(heads: torch.nn.Module, draft_vocab_size: int | None = None) -> dict[int, float]:
    """Seconds of drafting a tree of depth d (key d; 0 = plain, no draft) for these heads, over
    ``draft_vocab_size`` tokens (None: the whole vocabulary)."""
    return _search(heads).draft_seconds(heads, draft_vocab_size)


def one_forward_accuracy(
    target: torch.nn.Module, heads: torch.nn.Module, sequences: list[torch.Tensor], max_rank: int,
    skip_prompt: list[int] | None = None, draft_vocab_size: int | None = None,
) -> torch.Tensor:
    """``acc[d, r]`` on ``sequences`` (the target's greedy continuations), drafted as decoding drafts
    (ranking ``draft_vocab_size`` tokens where the heads can; None: the whole vocabulary)."""
    return _search(heads).accuracy(target, heads, sequences, max_rank, skip_prompt, draft_vocab_size)
