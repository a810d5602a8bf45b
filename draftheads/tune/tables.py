"""Measurements into tree.json entries: what calibration and training's tree choice save.

One entry per (device type, batch size, temperature) measured (`draftheads.plans.schema`): the
tree chosen at that temperature for one sequence, and, where batch sizes were timed, the mode
each size runs (a plain entry keeps the tree that lost there).
"""
from __future__ import annotations

from typing import Any

from ..plans import CHOSEN_BY_CALIBRATION, PLAIN, SPECULATIVE, PlanEntry, tree_spec
from .batch_plan import BatchPlanResult

#: Result fields that are the entry itself, not its measurements.
_CONTENT = ("tree", "draft_vocab_size", "temperature", "chosen_by", "device_type", "device_name", "mode")


def entries_for(tree: Any, draft_vocab_size: int | None, measured: dict[str, Any], device_type: str,
                temperature: float, batch: BatchPlanResult | None = None,
                chosen_by: str = CHOSEN_BY_CALIBRATION, device_name: str | None = None) -> list[PlanEntry]:
    """The entries of one temperature on the machine ``device_name`` (the CPU model or GPU name):
    batch 1 speculative with ``tree`` (unless the batch plan timed batch 1 and plain won), plus
    one per batch size the plan timed (behind prompt lookup where the plan chose it)."""
    measured = {k: v for k, v in measured.items() if k not in _CONTENT}
    # A measurement that chose to draft nothing is plain decoding: the target's own generate, not
    # root-only steps of the speculative loop, which cost more per token.
    mode = PLAIN if drafts_nothing(tree) else SPECULATIVE
    base = PlanEntry(tree=tree, temperature=float(temperature), batch_size=1, device_type=device_type, mode=mode,
                     draft_vocab_size=draft_vocab_size, chosen_by=chosen_by, measured=measured, device_name=device_name)
    plan = batch.plan if batch is not None else {}
    entries = [] if 1 in plan else [base]
    for size, mode in sorted(plan.items()):
        timed = {"batch": batch.measured[size]}
        entries.append(PlanEntry(tree=tree, temperature=float(temperature), batch_size=size, device_type=device_type,
                                 mode=mode, draft_vocab_size=draft_vocab_size, chosen_by=chosen_by,
                                 measured={**measured, **timed} if size == 1 else timed,
                                 prompt_lookup=batch.lookup.get(size, False), device_name=device_name))
    return entries


def drafts_nothing(tree: Any) -> bool:
    """A chosen tree with no draft node: static rank paths ``[]``, or EAGLE settings of one token."""
    return tree is not None and tree_spec(tree).drafts_nothing


def static_entries(result: Any, device_type: str, batch: BatchPlanResult | None = None,
                   chosen_by: str = CHOSEN_BY_CALIBRATION, device_name: str | None = None) -> list[PlanEntry]:
    """Entries from a `calibrate.CalibratedTree` (static trees) at its temperature."""
    return entries_for(result.tree, result.draft_vocab_size, result.to_json(), device_type, result.temperature,
                       batch, chosen_by, device_name)


def dynamic_entries(result: Any, device_type: str, batch: BatchPlanResult | None = None,
                    chosen_by: str = CHOSEN_BY_CALIBRATION, device_name: str | None = None) -> list[PlanEntry]:
    """Entries from a `calibrate.CalibratedDynamicTree` (EAGLE settings) at its temperature."""
    return entries_for(result.tree, None, {"calibration": result.to_json()}, device_type, result.temperature,
                       batch, chosen_by, device_name)


