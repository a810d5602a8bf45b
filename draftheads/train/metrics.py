"""Per-head accuracy, loss and the acceptance length they imply.

A chain of K Medusa heads, verified greedily, commits the target's own token plus head k's guess
for every k whose guess and all earlier guesses were right. If head k's top-1 accuracy is
``a_k`` and errors were independent, the expected tokens per target forward are
``1 + sum_k prod_{j<=k} a_j``. It is an estimate (errors correlate, and trees do better than
chains), but it moves with what decoding will see, unlike the loss.

Evaluation also counts, per head, how often the target token is the head's rank-r candidate
(``acc[k, r]``, r < ``EVAL_RANKS``). With that table the estimate covers the actual static tree
decoding will use (``simulated_acceptance_length``: 1 + the sum over tree nodes of the product
of ``acc`` along the node's path, the same formula ``draftheads calibrate`` ranks trees by), and
the loop keeps the heads with the best such figure.

It differs from real greedy decoding (tests/test_simulated_acceptance.py bounds the gap; measured
on the earlier toy target: "Simulated vs measured acceptance" in `git show 19f3628:benchmarks/README.md`) by two
biases that partly cancel: independence
ignores that heads tend to be right together, and averaging over every position overweights
predictable stretches, which decoding crosses in few steps.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..heads.acceptance import default_choices, expected_tokens_per_step
from ..plans import StaticTree, primary
from ..registry import method_of


def chain_acceptance_length(top1: Sequence[float]) -> float:
    """Expected tokens committed per step by a greedy chain of heads with these top-1 accuracies."""
    total, running = 1.0, 1.0
    for acc in top1:
        running *= acc
        total += running
    return total


# Ranks counted at evaluation: the default trees use ranks < 3 and calibrated ones rarely go past
# 8; a few more rows cost nothing next to the projection and show where the mass is.
EVAL_RANKS = 10
BASE_ROWS = 4  # ce_sum, count, top1, topk


def static_tree(heads: torch.nn.Module) -> list[list[int]] | None:
    """The static tree decoding will use with ``heads`` (their plans' greedy batch-1 tree, else the
    default for their number of heads), or None for heads that draft dynamic trees (EAGLE)."""
    if not method_of(heads).tree.rank_paths:
        return None
    entry = primary(heads.plans)
    if entry is not None and isinstance(entry.tree, StaticTree):
        return entry.tree.to_json()
    own = getattr(heads, "default_tree", None)
    if callable(own):  # DFlash: the chain of its block
        return own("cpu")
    return default_choices(heads.config.num_heads)


def ranks_for(tree: list[list[int]] | None) -> int:
    """How many ranks evaluation must count for ``tree`` (0: none, chain estimate only)."""
    if tree is None:
        return 0
    return max([EVAL_RANKS] + [r + 1 for path in tree for r in path])


def simulated_acceptance_length(rank_acc: torch.Tensor, tree: list[list[int]]) -> float:
    """Expected tokens per step of the static ``tree`` given ``rank_acc[k, r]`` (bonus token
    included). One formula for training and calibration, so the checkpoint training keeps is
    ranked by the same number ``draftheads calibrate`` optimises."""
    return expected_tokens_per_step(tree, rank_acc)


class HeadStats:
    """Running sums of ``HeadLossOutput.stats()``: rows ce_sum, count, top1, topk per head, then
    (evaluation only, ``ranks`` > 0) one row of hit counts per rank. One tensor, so a single
    ``accelerator.reduce`` gathers everything."""

    def __init__(self, num_heads: int, device: torch.device | str = "cpu", ranks: int = 0) -> None:
        self.ranks = ranks
        self.sums = torch.zeros(BASE_ROWS + ranks, num_heads, dtype=torch.float64, device=device)

    def add(self, stats: torch.Tensor) -> None:
        self.sums += stats.to(self.sums.device, torch.float64)

    def reset(self) -> None:
        self.sums.zero_()

    def reduced(self, accelerator) -> "HeadStats":
        """The sums over all processes (every process must call this at the same point)."""
        out = HeadStats(self.sums.shape[1], self.sums.device, self.ranks)
        out.sums = accelerator.reduce(self.sums.clone(), reduction="sum")
        return out

    def rank_accuracy(self) -> torch.Tensor:
        """``[K, ranks]``: acc[k, r] = P(the target token is head k's rank-r candidate)."""
        count = self.sums[1].cpu()
        return (self.sums[BASE_ROWS:].cpu().T / count.clamp(min=1)[:, None]).float()

    def summary(self, topk: int = 5, prefix: str = "", tree: list[list[int]] | None = None) -> dict[str, float]:
        """Flat dict of per-head loss / top-1 / top-k, the simulated chain acceptance length and
        ``simulated_acceptance``: the expected tokens per step of ``tree`` when rank counts were
        kept, else (EAGLE, whose heads are unrolled steps of one dynamic drafter) the chain's."""
        ce, count, top1, topk_hits = self.sums[:BASE_ROWS].cpu().tolist()
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
        if self.ranks and tree is not None:
            out[f"{prefix}simulated_acceptance"] = simulated_acceptance_length(self.rank_accuracy(), tree)
        else:
            out[f"{prefix}simulated_acceptance"] = out[f"{prefix}acceptance_length"]
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
