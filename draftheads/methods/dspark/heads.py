"""DSpark draft heads: DFlash's parallel block drafting plus a light sequential Markov head and a
confidence head (``head_type: dspark``).

The backbone is DFlash's (methods/dflash/heads.py): the target's fused features as context keys
and values, one non-causal forward over the block ``[root, mask x (B-1)]``. DSpark adds:

- the **Markov head**: a low-rank transition bias ``W2 W1[prev]`` (``markov_w1`` an embedding
  V x r of the previous token, ``markov_w2`` r -> V) added to a slot's base logits, where ``prev``
  is the token drafted just before (the root for the first draft). Drafting therefore goes left to
  right over the block's slots after the one parallel forward: a draft depends on the drafts
  before it (`inference/proposers/chained.py` reads trees so);
- the **confidence head**: ``sigmoid(proj([state, W1[prev]]))`` (or of the state alone), each
  draft's estimated probability of being accepted given that the drafts before it were; the
  draft budget turns it into how many drafts to verify (`inference/draft_budget.py`).

``sample_from_anchor`` (vLLM's key, its default for ``Qwen3DSparkModel``): the root's own slot
drafts the first token, so a block of B slots drafts K = B tokens (slot k drafts token k+1 after
the root). Off, the DFlash layout: slot 0 drafts nothing and the block drafts B-1 (speculators
writes that by default). Module names are vLLM's (``markov_head.markov_w1``,
``markov_head.markov_w2``, ``confidence_head.proj``), so an export computes what draftheads
computes (methods/dspark/export.py).
"""
from __future__ import annotations

import torch
from torch import nn

from ..dflash.heads import DFlashHeads

DEFAULT_BLOCK_SIZE = 7  # deepseek-ai/dspark_qwen3_8b_block7, DeepSpec's dspark_qwen3_4b config
DEFAULT_MARKOV_RANK = 256  # DeepSpec and speculators
MARKOV_HEAD_TYPES = ("vanilla",)  # what vLLM 0.32 runs (speculators also trains "gated" and "rnn")


def check_markov_rank(rank, vocab_size: int) -> int:
    """A Markov rank is a whole number in 1..vocab (0 would be no Markov head: DFlash; more than
    the vocabulary is not a low-rank factorisation and only costs memory)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= vocab_size:
        raise ValueError(
            f"heads.markov_rank must be a whole number in 1..{vocab_size} (the vocabulary), got {rank!r}: "
            "0 would be no Markov head (train dflash heads for that), and a rank above the vocabulary factors nothing"
        )
    return rank


class MarkovHead(nn.Module):
    """``bias(prev) = markov_w2(markov_w1[prev])``: the low-rank V x V transition bias."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.zeros_(self.markov_w2.weight)  # fresh heads draft what their DFlash backbone drafts

    def embed(self, previous: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(previous)


class ConfidenceHead(nn.Module):
    """One logit per draft: the estimated probability (after a sigmoid) that it is accepted."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1, bias=True)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkHeads(DFlashHeads):
    """DSpark drafter (see the module docstring)."""

    head_type = "dspark"
    default_block_size = DEFAULT_BLOCK_SIZE
    spec_options: tuple[str, ...] = DFlashHeads.spec_options + (
        "markov_rank", "confidence_head", "confidence_with_markov", "confidence_alpha", "sample_from_anchor",
    )
    required_extra: tuple[str, ...] = DFlashHeads.required_extra + ("markov_rank", "sample_from_anchor")

    def __init__(self, config) -> None:
        super().__init__(config)
        ex = config.extra
        rank = check_markov_rank(ex.get("markov_rank"), config.vocab_size)
        kind = ex.get("markov_head_type", "vanilla")
        if kind not in MARKOV_HEAD_TYPES:
            raise ValueError(f"dspark markov_head_type {kind!r}: draftheads (and vLLM 0.32) run {', '.join(MARKOV_HEAD_TYPES)} only")
        self.markov_rank = rank
        self.markov_head = MarkovHead(config.vocab_size, rank)
        self.confidence_with_markov = bool(ex.get("confidence_with_markov", True))
        self.confidence_head = None
        if ex.get("confidence_head", True):
            self.confidence_head = ConfidenceHead(config.hidden_size + (rank if self.confidence_with_markov else 0))

    @classmethod
    def first_draft_slot(cls, extra: dict) -> int:
        return 0 if extra.get("sample_from_anchor", True) else 1

    @classmethod
    def family_options(cls, target: nn.Module, markov_rank: int | None = None, confidence_head: bool = True,
                       confidence_with_markov: bool = True, confidence_alpha: float | None = None,
                       sample_from_anchor: bool = True) -> dict:
        vocab = int(target.get_output_embeddings().weight.shape[0])
        rank = check_markov_rank(DEFAULT_MARKOV_RANK if markov_rank is None else markov_rank, vocab)
        alpha = 1.0 if confidence_alpha is None else float(confidence_alpha)
        if not alpha >= 0.0:
            raise ValueError(f"heads.confidence_alpha must be >= 0 (the confidence loss's weight), got {confidence_alpha!r}")
        return {"markov_rank": rank, "markov_head_type": "vanilla", "confidence_head": bool(confidence_head),
                "confidence_with_markov": bool(confidence_with_markov) and bool(confidence_head),
                "confidence_alpha": alpha, "sample_from_anchor": bool(sample_from_anchor)}

    # -- the sequential stage --------------------------------------------------------------------
    def markov_bias(self, previous: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[.., V] (or [.., len(rows)] over the vocabulary ids ``rows``) transition bias after the
        tokens ``previous`` [..]."""
        embedded = self.markov_head.embed(previous)
        weight = self.markov_head.markov_w2.weight
        return nn.functional.linear(embedded, weight if rows is None else weight[rows])

    def confidence_logits(self, states: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """[..]: each draft's confidence logit from its slot's final-normed state [.., H] and the
        token before it [..] (refused for heads without a confidence head)."""
        if self.confidence_head is None:
            raise RuntimeError("these dspark heads have no confidence head (heads.confidence_head: false)")
        features = states
        if self.confidence_with_markov:
            features = torch.cat([states, self.markov_head.embed(previous).to(states.dtype)], dim=-1)
        return self.confidence_head(features.to(self.confidence_head.proj.weight.dtype)).float()

    @classmethod
    def card_rows(cls, config: dict) -> list[tuple[str, object]]:
        extra = config.get("extra") or {}
        return super().card_rows(config) + [("block size", extra.get("block_size")), ("Markov rank", extra.get("markov_rank")),
                                            ("confidence head", extra.get("confidence_head", True))]
