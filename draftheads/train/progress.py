"""What a run reports while it trains: the statistics of the steps since the last log line, the
seconds per stage for metrics.json, the progress bar and the lines printed beside it."""
from __future__ import annotations

import contextlib
import os
import time

import torch
from accelerate import PartialState
from tqdm.auto import tqdm

from .metrics import HeadStats, format_heads


class TrainWindow:
    """Training statistics since the last log line, reduced over processes when flushed."""

    def __init__(self, num_heads: int, device: torch.device) -> None:
        self.stats = HeadStats(num_heads, device)
        self.device = device
        self.total_tokens, self.total_seconds = 0, 0.0
        self._reset()

    def _reset(self) -> None:
        self.stats.reset()
        self.loss_sum, self.steps, self.tokens = 0.0, 0, 0
        self.restart_clock()

    def restart_clock(self) -> None:
        self.start = time.perf_counter()

    def add(self, out: dict[str, torch.Tensor], scale: int = 1) -> None:
        """One micro-batch; ``scale``: grad_accum x processes, what its loss was multiplied by
        (see ``step_denominators``), so the sum over a step's micro-batches and processes is the
        step's loss. The loop counts ``steps``."""
        self.stats.add(out["stats"])
        self.loss_sum += out["loss"].item() / scale
        self.tokens += int(out["tokens"])

    def flush(self, accelerator, topk: int) -> dict[str, float]:
        """Loss, per-head loss and top-1, tokens/s over all processes (a collective: call on all)."""
        elapsed = time.perf_counter() - self.start
        tokens = accelerator.reduce(torch.tensor(self.tokens, device=self.device), "sum").item()
        loss = accelerator.reduce(torch.tensor(self.loss_sum, device=self.device), "sum").item() / max(self.steps, 1)
        summary = self.stats.reduced(accelerator).summary(topk, prefix="train/")
        self.total_tokens += tokens
        self.total_seconds += elapsed
        self._reset()
        return {
            "train/loss": loss,
            "train/tokens_per_second": tokens / max(elapsed, 1e-9),
            **{k: v for k, v in summary.items() if "loss_head" in k or "top1_head" in k},
        }

    def tokens_so_far(self, accelerator) -> int:
        """Every token trained on so far, those of the steps not yet logged included (a collective)."""
        pending = accelerator.reduce(torch.tensor(self.tokens, device=self.device), "sum").item()
        return int(self.total_tokens + pending)


class StageTimer:
    """Wall seconds per named stage, for metrics.json."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)


def train_line(step: int, max_steps: int, logs: dict[str, float]) -> str:
    """The line printed at every log step."""
    return (
        f"step {step}/{max_steps} | loss {logs['train/loss']:.4f} "
        f"| heads {format_heads(logs, 'loss', 'train/', '{:.3f}')} | top1 {format_heads(logs, 'top1', 'train/')} "
        f"| lr {logs['train/lr']:.2e} | {logs['train/tokens_per_second']:.0f} tok/s"
    )


def progress_bar(total: int, initial: int, accelerator):
    """The step progress bar, on the local main process only."""
    return tqdm(total=total, initial=initial, desc="train", disable=not accelerator.is_local_main_process, dynamic_ncols=True)


def write_line(progress, line: str) -> None:
    """Print on the main process without breaking the progress bar."""
    if PartialState().is_main_process:
        tqdm.write(line) if progress is not None and not progress.disable else print(line, flush=True)


def main_print(line: str) -> None:
    """Print on the main process before accelerate knows which one it is (from RANK)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, flush=True)
