"""Per-head accuracy, loss and the acceptance length they imply.

A chain of K Medusa heads, verified greedily, commits the target's own token plus head k's guess
for every k whose guess and all earlier guesses were right. If head k's top-1 accuracy is
``a_k`` and errors were independent, the expected tokens per target forward are
``1 + sum_k prod_{j<=k} a_j``. It is an estimate (errors correlate, and trees do better than
chains), but it moves with what decoding will see, unlike the loss.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch


def chain_acceptance_length(top1: Sequence[float]) -> float:
    """Expected tokens committed per step by a greedy chain of heads with these top-1 accuracies."""
    total, running = 1.0, 1.0
    for acc in top1:
        running *= acc
        total += running
    return total


class HeadStats:
    """Running sums of ``HeadLossOutput.stats()`` (ce_sum, count, top1, topk per head)."""

    def __init__(self, num_heads: int, device: torch.device | str = "cpu") -> None:
        self.sums = torch.zeros(4, num_heads, dtype=torch.float64, device=device)

    def add(self, stats: torch.Tensor) -> None:
        self.sums += stats.to(self.sums.device, torch.float64)

    def reset(self) -> None:
        self.sums.zero_()

    def reduced(self, accelerator) -> "HeadStats":
        """The sums over all processes (every process must call this at the same point)."""
        out = HeadStats(self.sums.shape[1], self.sums.device)
        out.sums = accelerator.reduce(self.sums.clone(), reduction="sum")
        return out

    def summary(self, topk: int = 5, prefix: str = "") -> dict[str, float]:
        """Flat dict of per-head loss / top-1 / top-k and the simulated chain acceptance length."""
        ce, count, top1, topk_hits = self.sums.cpu().tolist()
        out: dict[str, float] = {}
        accs = []
        for k in range(len(count)):
            n = count[k]
            acc1 = top1[k] / n if n else 0.0
            accs.append(acc1)
            out[f"{prefix}loss_head{k}"] = ce[k] / n if n else math.nan
            out[f"{prefix}top1_head{k}"] = acc1
            out[f"{prefix}top{topk}_head{k}"] = topk_hits[k] / n if n else 0.0
        out[f"{prefix}acceptance_length"] = chain_acceptance_length(accs)
        out[f"{prefix}tokens"] = count[0]
        return out


def format_heads(summary: dict[str, float], key: str, prefix: str = "", fmt: str = "{:.3f}") -> str:
    """``"0.412/0.301/0.188"`` for a per-head metric name like ``top1``."""
    values = []
    k = 0
    while f"{prefix}{key}_head{k}" in summary:
        values.append(fmt.format(summary[f"{prefix}{key}_head{k}"]))
        k += 1
    return "/".join(values)
