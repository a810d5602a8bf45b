"""THE drafter interface: the decode loop drafts through it, one call per step for every active row.

A batch of one is a batch: every drafter drafts for lists of rows, so there is one loop and one
contract (cf. vLLM's ``v1/spec_decode`` proposers, one batch ``propose`` each). The head drafters
implement it directly (`medusa.MedusaDrafter`, `hydra.HydraDrafter`, `eagle.EagleDrafter`,
`dflash.DFlashDrafter`, `peagle.PEagleDrafter`); drafters that are naturally written for one
sequence (a draft model, prompt lookup: `sequence.Proposer`) are wrapped once, by
`sequence.ForkedRows`.

The decode loop owns the target, its cache and the verifier; a drafter only sees tokens and the
target's hidden states, and returns candidate Trees. Nothing about attention masks or caches of
the target leaks into a drafter (cf. transformers' CandidateGenerator).
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree import Tree


class Drafter:
    """Drafts for the rows of a batch; rows are positions in the active batch, in order. `start`
    resets every per-generation state, so one drafter serves one generation after another."""

    #: The target hidden states `start` and `accepted` receive, in ``output_hidden_states``
    #: numbering: ``(-1,)`` = the last hidden state after the final norm (Medusa, Hydra, EAGLE);
    #: layer ids ``i`` = the states entering decoder layers i, concatenated (EAGLE-3); ``()`` = none
    #: (prompt lookup, draft models: they get ``hidden=None``). The verifier captures exactly these,
    #: never all L+1 hidden states.
    feature_layers: tuple[int, ...] = (-1,)

    #: The sources, among those a drafter routes its rows between step by step, that the draft
    #: budget judges each on its own steps (`hybrid.LookupThenHeads`: "lookup"; its heads rows
    #: draft unbudgeted); empty for a drafter that drafts one way. For such a drafter the decoder's
    #: draft budget is a `draft_budget.PerSourceBudget`, handed over with `use_budget`.
    budget_sources: tuple[str, ...] = ()

    # The request's settings, which `start` records (before `start`: greedy).
    _params: SamplingParams = SamplingParams()
    _generator: torch.Generator | None = None

    def bind_target(self, target: torch.nn.Module) -> None:
        """Called once by the decoder with the target (optional): a drafter with its own model
        checks here that it fits the target (e.g. a draft LM's vocabulary) and raises otherwise."""

    def use_compaction(self, policy: str) -> None:
        """The decoder's policy for caches with holes (`inference.compaction`), handed once: only
        a drafter whose own cache gets holes (EAGLE's) has anything to do with it."""

    def use_budget(self, budget: object) -> None:
        """This generation's `draft_budget.PerSourceBudget` (None: no budget), handed over by the
        decoder before `start`; only a drafter with ``budget_sources`` receives it."""

    @property
    def name(self) -> str:
        """What reports call this drafter (the class that drafts)."""
        return type(self).__name__

    def start(self, prompts: list[torch.Tensor], hidden: list[torch.Tensor | None], params: SamplingParams,
              generator: torch.Generator | None) -> None:
        """New sequences: per row its prompt [L] and the target's features [L, F] (or None)."""
        raise NotImplementedError

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        """Per row a tree rooted at its next token (decided but not yet in the target's cache), at
        most its ``max_depths`` drafted tokens deep (0: the root alone, a plain step)."""
        raise NotImplementedError

    def accepted(self, tokens: list[torch.Tensor], hidden: list[torch.Tensor | None]) -> None:
        """Per row the root and accepted drafts [m] (now in the target's cache) and the target's
        features at those positions [m, F] (None when it reads none)."""
        raise NotImplementedError

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (positions in the current batch, in order) go on decoding."""
        raise NotImplementedError

    def stats(self) -> dict:
        """Drafter-specific figures for the output's ``stats`` (e.g. the chosen draft length)."""
        return {}

    def acceptance_estimates(self) -> list[list[float]] | None:
        """Per row of the last `propose`, the drafter's own estimate of the chance that at least j
        of its drafts are accepted, j = 1..its tree's depth ([] for a row that did not draft), or
        None (the default: it makes none). A draft budget may verify fewer drafts from it
        (`loop.verify_widths`); DSpark's confidence head makes such estimates."""
        return None
