"""What a tree search needs for heads that draft every depth in ONE forward (DFlash, P-EAGLE).

Their tree is static (rank paths, Medusa's format) and every node of it is read off the per-depth
top-k of the same draft forward, so the search needs two measurements, both taken as decoding
takes them:
- the acceptance table ``acc[d, r]``: how often depth d+1's rank-r candidate is the token the
  target produces d+1 positions after the root, on the target's own greedy continuations;
- the drafting cost by depth: one forward (DFlash always runs its whole block; P-EAGLE runs
  d - 1 mask slots for a tree d deep).
`calibrate` and training's tree choice feed them to the same search Medusa trees use
(``calibrate.choose_tree``).

DFlash heads score their slots with the target's LM head, so they can also rank only a draft
vocabulary (`one_forward_vocab_sizes`): both measurements then take ``draft_vocab_size`` (None: the whole
vocabulary). P-EAGLE heads carry their own trained vocabulary and take none.
"""
from __future__ import annotations

import torch

ONE_FORWARD_OBJECTIVES = ("block", "parallel_depths")  # DFlash, P-EAGLE


def drafts_in_one_forward(heads: torch.nn.Module) -> bool:
    """True for heads whose whole static tree comes from one draft forward."""
    return getattr(heads, "training_objective", "") in ONE_FORWARD_OBJECTIVES


def one_forward_vocab_sizes(heads: torch.nn.Module, sizes: tuple[int, ...]) -> list[int | None]:
    """The draft vocabularies worth trying for these heads: the whole one (None), and for DFlash
    heads with training token counts each of ``sizes`` below half the vocabulary (as for Medusa)."""
    if heads.training_objective != "block" or int(heads.token_counts.sum()) == 0:
        return [None]
    return [None] + [n for n in sizes if n < heads.config.vocab_size // 2]


def one_forward_draft_seconds(heads: torch.nn.Module, draft_vocab_size: int | None = None) -> dict[int, float]:
    """Seconds of drafting a tree of depth d (key d; 0 = plain, no draft) for these heads, over
    ``draft_vocab_size`` tokens (DFlash; None: the whole vocabulary)."""
    if heads.training_objective == "block":
        from .proposers.dflash import measure_block_seconds

        block = measure_block_seconds(heads, draft_vocab_size=draft_vocab_size)
        return {0: 0.0, **{d: block for d in range(1, heads.config.num_heads + 1)}}
    from .proposers.peagle import measure_draft_seconds

    return measure_draft_seconds(heads)


def one_forward_accuracy(
    target: torch.nn.Module, heads: torch.nn.Module, sequences: list[torch.Tensor], max_rank: int,
    skip_prompt: list[int] | None = None, draft_vocab_size: int | None = None,
) -> torch.Tensor:
    """``acc[d, r]`` on ``sequences`` (the target's greedy continuations), drafted as decoding drafts
    (DFlash: ranking ``draft_vocab_size`` tokens, None: the whole vocabulary)."""
    if heads.training_objective == "block":
        from .proposers.dflash import block_accuracy_table

        return block_accuracy_table(target, heads, sequences, max_rank, skip_prompt=skip_prompt,
                                    draft_vocab_size=draft_vocab_size)
    from .proposers.peagle import depth_accuracy_table

    return depth_accuracy_table(target, heads, sequences, max_rank, skip_prompt=skip_prompt)
