"""Evaluating heads during training, and keeping the best ones.

``evaluate`` scores the heads over a fixed eval set (every process its own ``EvalShard``, the
figures reduced over processes); ``BestHeads`` exports the heads of the evaluation whose
simulated acceptance is highest so far to ``best/``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from .checkpoint import export_heads
from .metrics import HeadStats, format_heads, ranks_for, static_tree
from .progress import write_line
from .step import merge_label_counts


@torch.no_grad()
def evaluate(accelerator, model, eval_dl, num_heads: int, topk: int, decay: float) -> dict[str, Any]:
    """Per-head loss / top-1 / top-k, simulated chain acceptance and the simulated acceptance of
    the tree decoding will use (Medusa/Hydra: from per-rank accuracies, kept under
    ``eval/rank_accuracy`` as a [heads, ranks] list) over the (fixed) eval set."""
    tree = static_tree(accelerator.unwrap_model(model).heads)
    ranks = ranks_for(tree)
    stats = HeadStats(num_heads, accelerator.device, ranks=ranks)
    was_training = model.training
    model.eval()
    for batch in eval_dl:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        stats.add(model(**batch, rank_stats=ranks)["stats"])
    model.train(was_training)
    reduced = stats.reduced(accelerator)
    summary: dict[str, Any] = reduced.summary(topk, prefix="eval/", tree=tree)
    losses = [summary[f"eval/loss_head{k}"] for k in range(num_heads)]
    # NaN when a head's loss is NaN (diverged, or no eval position reaches that far): never a
    # partial sum that looks like a loss
    summary["eval/loss"] = sum(decay**k * v for k, v in enumerate(losses))
    if ranks:
        summary["eval/rank_accuracy"] = reduced.rank_accuracy().tolist()
    return summary


def evaluate_and_log(accelerator, model, eval_dl, t, num_heads: int, step: int, progress) -> dict[str, Any]:
    """``evaluate`` at ``step``: logged to the trackers (scalars), printed as one line, returned
    as the record metrics.json keeps (``{"step": step, **summary}``)."""
    summary = evaluate(accelerator, model, eval_dl, num_heads, t.topk, t.loss_decay)
    accelerator.log({k: v for k, v in summary.items() if isinstance(v, (int, float))}, step=step)  # scalars only
    write_line(
        progress,
        f"eval @ {step} | loss {summary['eval/loss']:.4f} | top1 {format_heads(summary, 'top1', 'eval/')} "
        f"| top{t.topk} {format_heads(summary, f'top{t.topk}', 'eval/')} "
        f"| chain acceptance {summary['eval/acceptance_length']:.3f} "
        f"| simulated acceptance {summary['eval/simulated_acceptance']:.3f} tokens/step",
    )
    return {"step": step, **summary}


class EvalShard(torch.utils.data.Dataset):
    """This process's share of the eval rows (rows ``rank``, ``rank + world``, ...), padded to
    the same length on every process with rows that carry no loss-masked token. Every process
    runs the same number of forward passes (ZeRO-3 and DDP need that), and each eval row is
    counted exactly once: ``accelerate.prepare`` would pad uneven shards with repeated rows,
    which the summed metrics would count twice."""

    def __init__(self, dataset, rank: int, world: int) -> None:
        self.dataset = dataset
        self.rows = list(range(rank, len(dataset), world))
        self.length = math.ceil(len(dataset) / world)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i < len(self.rows):
            return self.dataset[self.rows[i]]
        ids = list(self.dataset[0]["input_ids"])[:2]
        return {"input_ids": ids, "loss_mask": [0] * len(ids)}  # padding: nothing to count


class BestHeads:
    """The heads of the evaluation with the highest ``eval/simulated_acceptance`` so far, exported
    to ``path`` (atomically, by the heads' own writer) whenever an evaluation beats the previous
    best. The loss is not what decoding pays for; the simulated acceptance of the tree is. Every
    process calls ``offer`` with the same (reduced) summary, so all take the same decision and
    meet in the export's collectives."""

    KEY = "eval/simulated_acceptance"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step: int | None = None
        self.value = -math.inf

    def offer(self, accelerator, model, heads, label_counts: torch.Tensor, summary: dict[str, Any]) -> bool:
        value = summary.get(self.KEY, math.nan)
        if math.isnan(value) or value <= self.value:
            return False
        if not math.isfinite(summary.get("eval/loss", math.nan)):
            accelerator.print(f"warning: eval @ {summary['step']}: the loss is not finite; best/ keeps its heads")
            return False
        merge_label_counts(accelerator, heads, label_counts)  # the export carries the counts so far
        export_heads(accelerator, model, self.path)
        self.step, self.value = int(summary["step"]), float(value)
        return True

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's record, so a resumed run only replaces best/ with better heads."""
        if state:
            self.step, self.value = int(state["step"]), float(state["simulated_acceptance"])

    def as_dict(self) -> dict[str, Any] | None:
        if self.step is None:
            return None
        return {"step": self.step, "simulated_acceptance": self.value, "path": str(self.path)}
