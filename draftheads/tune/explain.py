"""Why this machine's plan is what it is, in one line: the cost curve it was chosen with and what
the timing measured (for `draftheads demo` and anyone reading a tree.json).

A plan of plain decoding, or of prompt lookup alone, surprises a user who trained heads; the
reasons are on record in the plan itself: how much a verify of n tokens costs here (the cost
curve), how many tokens a step of the heads committed (the acceptance), and the ratios timed
against ``generate`` that decided the entry (`batch_plan`).
"""
from __future__ import annotations

from typing import Any

from ..plans import PLAIN, PlanEntry, TreePlans, select


def _curve_text(plans: TreePlans, entry: PlanEntry) -> str | None:
    curve = plans.curve_for(entry.device_type, entry.device_name) if entry.device_type else None
    if curve is None:
        return None
    relative = curve.relative()
    widths = [n for n in (2, 3, 4, 8, 16) if n in relative]
    one = curve.verify_seconds.get(1)
    costs = ", ".join(f"{n} tokens {relative[n]:.2f}x" for n in widths)
    return f"a verify here costs {one * 1000:.0f} ms for 1 token, {costs}" if one else None


def _acceptance(entry: PlanEntry) -> float | None:
    """Tokens per step the chosen tree committed when it was timed, if the entry kept it."""
    calibration = entry.measured.get("calibration") or {}
    value = calibration.get("mean_accept_length") or entry.measured.get("expected_tokens_per_step")
    return float(value) if isinstance(value, (int, float)) else None


def why(plans: TreePlans | None, device_type: str, device_name: str | None, temperature: float = 0.0) -> str:
    """One line on what a batch-1 request at ``temperature`` runs on this machine and why."""
    entry = select(plans, device_type, 1, temperature, device_name).entry if plans is not None else None
    if entry is None:
        return "no plan for this device: the heads draft the device default tree (run draftheads calibrate here)"
    where = f"{entry.device_name or entry.device_type}"
    batch: dict[str, Any] = entry.measured.get("batch") or {}
    drafts_nothing = entry.tree is None or entry.tree.drafts_nothing
    if entry.mode == PLAIN:
        what = "plain decoding (target.generate)"
    elif entry.prompt_lookup and drafts_nothing:
        what = "prompt lookup alone (no tree of the heads paid here)"
    elif entry.prompt_lookup:
        what = "the heads behind prompt lookup"
    else:
        what = "the heads alone"
    parts = [f"plan on {where} at temperature {temperature:g}: {what}"]
    curve = _curve_text(plans, entry)
    if curve:
        parts.append(curve)
    accepted = _acceptance(entry)
    if accepted is not None and not drafts_nothing:
        parts.append(f"the heads' tree committed {accepted:.2f} tokens per step when timed")
    if batch:
        heads = "lookup alone" if batch.get("lookup_alone") else "the heads alone"
        timed = f"{heads} {batch['speedup_median']:.2f}x generate"
        behind = batch.get("prompt_lookup")
        if behind:
            timed += f", behind lookup {behind['speedup_median']:.2f}x"
        against = batch.get("lookup_vs")
        if against and against.get("interval"):
            lo, hi = against["interval"]
            timed += (f"; lookup against {against['against']}: {lo:.2f}-{'inf' if hi is None else f'{hi:.2f}'}x "
                      f"(95%), kept unless below {against['kept_unless_below']:.2f}")
        parts.append(f"timed on {batch.get('timed_batches', '?')} prompt runs: {timed}")
    return "; ".join(parts)
