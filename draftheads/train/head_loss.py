"""What every head loss is: ONE signature, whatever the method.

A loss is a component built once from the run's settings and called on each micro-batch, as
torchtune's losses are: ``loss = method.loss(settings)``, then ``loss(heads, batch)`` returns a
`HeadLossOutput` and ``loss.counts(heads, batch)`` the ``[K]`` positions each head (draft step,
depth, slot) is trained on, from the masks alone. `TargetWithHeads` builds the batch and calls
whichever loss the heads' method declares (draftheads/registry.py); it never asks which one.

Each method's loss reads from the batch what it needs and leaves the rest: Medusa and Hydra the
last hidden state and the labels (`LossSettings.labels`), the draft-layer methods the heads'
input features and the target's distribution; training noise, COD depths and DFlash's anchors
come from ``batch.generator``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class LossSettings:
    """The run's loss settings (config ``train.*``): ``decay`` weighs head / step k by decay**k
    (methods with their own weights ignore it); ``chunk_size`` rows are scored at once;
    ``topk`` accuracy is logged; ``checkpoint_chunks`` recomputes each chunk's vocab-sized
    logits in backward instead of keeping them (same gradients bit for bit); ``labels``: "data"
    (the dataset's tokens) or "target" (the target's greedy tokens) for methods trained on tokens."""

    decay: float = 0.8
    chunk_size: int = 1024
    topk: int = 5
    checkpoint_chunks: bool = True
    labels: str = "data"


@dataclass
class LossBatch:
    """One micro-batch as a loss reads it. ``input_ids``/``attention_mask``/``loss_mask``/
    ``position_ids`` (a packed window's per-document positions) are the data's; ``hidden`` is the
    target's last hidden state after the final norm, ``features`` what the heads read from the
    target (= ``hidden`` unless they fuse layers); ``denominators`` the step's counts (see
    `HeadLoss.counts`; None: this batch's own); ``ranks`` > 0 (evaluation) also counts hits per
    rank r < ranks; ``generator`` is where training randomness comes from (reseeded per batch,
    so a resumed run draws what a straight run draws). ``greedy_labels`` gives the target's
    greedy labels (from the feature cache, or computed when first asked)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    features: torch.Tensor | None = None
    denominators: torch.Tensor | None = None
    ranks: int = 0
    generator: torch.Generator | None = None
    greedy_labels: Callable[[], torch.Tensor] | None = None

    def target_labels(self) -> torch.Tensor:
        """Token ids whose position t+1 holds the target's greedy prediction after position t."""
        if self.greedy_labels is None:
            raise ValueError("this batch carries no target labels (train.labels: target needs the target's greedy labels)")
        return self.greedy_labels()


@dataclass
class HeadLossOutput:
    """The loss to backpropagate, plus per-head sums (no grad) for logging: each a ``[K]`` tensor.
    ``labels``: the token ids the heads were trained towards (counted into ``heads.token_counts``,
    which ranks the draft vocabulary); None: the batch's ``input_ids``."""

    loss: torch.Tensor
    ce_sum: torch.Tensor  # summed CE over counted positions
    count: torch.Tensor  # positions with a valid target
    top1: torch.Tensor  # positions whose target is the head's argmax
    topk: torch.Tensor  # positions whose target is in the head's top-k
    rank_hits: torch.Tensor | None = None  # [K, R]: positions whose target is the head's rank-r candidate
    labels: torch.Tensor | None = None

    def stats(self) -> torch.Tensor:
        """``[4 + R, K]`` float64 stack (ce_sum, count, top1, topk, then one row per rank when
        counted): one tensor to reduce across processes."""
        rows = torch.stack([self.ce_sum, self.count, self.top1, self.topk]).double()
        if self.rank_hits is not None:
            rows = torch.cat([rows, self.rank_hits.T.to(rows)])
        return rows


class HeadLoss:
    """Base of every method's loss: built from `LossSettings`, called on a `LossBatch`."""

    def __init__(self, settings: LossSettings | None = None) -> None:
        self.settings = settings or LossSettings()

    def __call__(self, heads: torch.nn.Module, batch: LossBatch) -> HeadLossOutput:
        raise NotImplementedError

    def counts(self, heads: torch.nn.Module, batch: LossBatch) -> torch.Tensor:
        """``[K]``: the positions each head is trained on in ``batch``, from the masks alone (no
        model). Summed over a step's micro-batches and processes they are the ``denominators``
        that make the loss a mean over the step's tokens, wherever they fell."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings})"
