"""Batch-size plans: speculate at some batch sizes, decode plainly at others.

On a device where one verify forward over a few tree tokens per row already fills the hardware
(a CPU at batch 4 or 8), speculation costs more than it returns, so `draftheads calibrate
--batch-sizes` times both modes per batch size. A plan maps batch sizes to a mode::

    {1: "speculative", 4: "plain", 8: "plain"}

A batch between measured sizes follows the nearest measured size at or below it, one above the
largest follows the largest, one below the smallest is decoded speculatively (nothing was
measured there, and speculation is what the decoder does without a plan).
"""
from __future__ import annotations

from typing import Any, Mapping

SPECULATIVE = "speculative"
PLAIN = "plain"
MODES = (SPECULATIVE, PLAIN)

BatchPlan = dict[int, str]


def parse_batch_plan(data: Any, where: str = "batch_plan") -> BatchPlan:
    """``{batch size: mode}`` from a JSON object or a Python dict (keys ints or strings of
    ints); a ValueError naming ``where`` and the bad key otherwise."""
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{where} must be an object mapping batch sizes to 'speculative' or 'plain', "
            f"e.g. {{\"1\": \"speculative\", \"4\": \"plain\"}}; got {type(data).__name__}"
        )
    if not data:
        raise ValueError(f"{where} is empty: give at least one batch size, or no plan at all")
    plan: BatchPlan = {}
    for key, mode in data.items():
        size = batch_size(key)
        if size is None:
            raise ValueError(f"{where}: key {key!r} is not a whole batch size >= 1 (use keys like \"1\", \"4\", \"8\")")
        if size in plan:
            raise ValueError(f"{where}: batch size {size} is given twice")
        if mode not in MODES:
            raise ValueError(f"{where}[{key!r}]: unknown mode {mode!r}; valid: {', '.join(repr(m) for m in MODES)}")
        plan[size] = mode
    return dict(sorted(plan.items()))


def batch_size(key: Any) -> int | None:
    """``key`` as a batch size (an int >= 1, or a string of one), else None."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if key >= 1 else None
    if isinstance(key, str) and key.strip().isdigit():
        size = int(key)
        return size if size >= 1 else None
    return None


def size_at_or_below(sizes: list[int], wanted: int) -> int | None:
    """The batch-size rule of every plan: the largest of ``sizes`` at or below ``wanted`` (None:
    ``wanted`` is below them all)."""
    below = [size for size in sizes if size <= wanted]
    return max(below) if below else None


def mode_for(plan: BatchPlan | None, batch_size: int) -> str:
    """The mode for a batch of ``batch_size`` rows (see the module docstring for the rule)."""
    if not plan:
        return SPECULATIVE
    size = size_at_or_below(list(plan), batch_size)
    return SPECULATIVE if size is None else plan[size]


def plan_to_json(plan: BatchPlan) -> dict[str, str]:
    return {str(size): mode for size, mode in sorted(plan.items())}
