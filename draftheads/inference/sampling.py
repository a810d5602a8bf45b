"""The target's processed next-token distribution, computed the way transformers' sampling does.

Lossless sampling means "exactly the distribution `generate(do_sample=True, ...)` draws from", so
we reuse transformers' own warpers (temperature, then top-k, then top-p, on fp32 logits) rather
than re-deriving their tie and threshold rules.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def warpers(self) -> LogitsProcessorList:
        """The same processors, in the same order, that `generate(do_sample=True)` builds."""
        procs = LogitsProcessorList()
        if self.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            procs.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return procs

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed probabilities for logits [..., V] (fp32)."""
        scores = logits.float()
        shape = scores.shape
        scores = scores.reshape(-1, shape[-1])
        scores = self.warpers()(None, scores)
        return torch.softmax(scores, dim=-1).reshape(shape)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a probability vector [V] (need not be normalised)."""
    return int(torch.multinomial(probs, 1, generator=generator))
