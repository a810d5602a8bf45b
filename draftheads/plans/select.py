"""Which entry of a tree file a request runs: by device type, batch size and temperature.

1. Device type: the entries measured on the decoder's device type ("cpu", "cuda", ...). A file
   with none for it falls back to its any-device entries (``device_type`` null: trees saved by
   hand and every calibration written before plans per temperature). Entries measured on ANOTHER
   device type are IGNORED: a tree sized for a GPU's nearly flat verify cost is far too large for
   a CPU and the other way round, so the decoder drafts this device's default tree instead and
   says so (`ignored`, which the decoder turns into a warning).
   Within a device type, the entries measured on this machine (``device_name``: the CPU model or
   GPU name) come first, then those that name no machine (files before version 4); failing
   both, another machine's entries of the same device type are used, and `measured_on` names
   that machine, so the decoder SAYS it follows a plan measured elsewhere (the cost of
   verifying n tokens differs between CPUs of one type) instead of trusting it silently.
2. Temperature: the nearest measured one (greedy requests are temperature 0; a tie goes to the
   lower temperature, the more conservative tree).
3. Batch size: among those, the largest measured batch size at or below the request's (as
   `batch_sizes.mode_for`); a batch below every measured size takes the smallest.

The choice depends on the request's settings only, never on what the target produces, so the
output is lossless whichever entry runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from .batch_sizes import size_at_or_below
from .schema import PlanEntry, TreePlans


@dataclass(frozen=True)
class Choice:
    """The entry a request runs (None: no entry applies, draft the device default), the device
    types whose entries were ignored for this device, and (``measured_on``) the other machine
    whose entries are used because none were measured on this one."""

    entry: PlanEntry | None
    ignored: tuple[str, ...] = ()
    measured_on: str | None = None


def usable_entries(plans: TreePlans | None, device_type: str,
                   device_name: str | None = None) -> tuple[list[PlanEntry], tuple[str, ...]]:
    """The entries a decoder on ``device_type`` (on the machine ``device_name``) may use (rule 1)
    and the device types ignored."""
    if plans is None:
        return [], ()
    own = [e for e in plans.entries if e.device_type == device_type]
    anywhere = [e for e in plans.entries if e.device_type is None]
    others = tuple(sorted({e.device_type for e in plans.entries} - {device_type, None}))
    if own:
        return _one_machine(own, device_name), others
    return anywhere, others


def _one_machine(entries: list[PlanEntry], device_name: str | None) -> list[PlanEntry]:
    """Of one device type's entries, one machine's: this one's, else those naming none, else the
    first other machine's (by name)."""
    names = {e.device_name for e in entries}
    if device_name in names:
        chosen = device_name
    elif None in names:
        chosen = None
    else:
        chosen = sorted(names)[0]
    return [e for e in entries if e.device_name == chosen]


def measured_on(plans: TreePlans | None, device_type: str, device_name: str | None) -> str | None:
    """The other machine whose entries a decoder on ``device_name`` follows (rule 1), or None
    when they were measured here or name no machine."""
    entries, _ = usable_entries(plans, device_type, device_name)
    names = {e.device_name for e in entries} - {None}
    return None if not names or device_name in names else sorted(names)[0]


def nearest_temperature(temperatures: list[float], wanted: float) -> float:
    """Rule 2: the nearest of ``temperatures`` to ``wanted``, ties to the lower one."""
    return min(sorted(temperatures), key=lambda t: abs(t - wanted))


def select(plans: TreePlans | None, device_type: str, batch_size: int, temperature: float,
           device_name: str | None = None) -> Choice:
    """The entry for a request (module docstring) on the machine ``device_name`` (None: not
    known, the entries that name no machine first)."""
    entries, ignored = usable_entries(plans, device_type, device_name)
    if not entries:
        return Choice(None, ignored)
    temp = nearest_temperature([e.temperature for e in entries], temperature)
    at_temp = {e.batch_size: e for e in entries if e.temperature == temp}
    size = size_at_or_below(list(at_temp), batch_size)
    return Choice(at_temp[min(at_temp) if size is None else size], ignored,
                  measured_on(plans, device_type, device_name) if device_name is not None else None)


def primary(plans: TreePlans | None, device_type: str | None = None) -> PlanEntry | None:
    """The entry of one greedy sequence (batch 1, temperature 0): the heads' ``tree``. With no
    device type, the file's first device type (its any-device entries first)."""
    if plans is None:
        return None
    if device_type is None:
        device_type = plans.device_types[0] or "any"
    return select(plans, device_type, 1, 0.0).entry


def greedy_batch_plan(plans: TreePlans | None, device_type: str | None = None) -> dict[int, str] | None:
    """``{batch size: mode}`` of the greedy entries for ``device_type`` (None: the file's first),
    or None when the file measured no batch sizes (one batch-1 speculative entry)."""
    if plans is None:
        return None
    entries, _ = usable_entries(plans, device_type or plans.device_types[0] or "any")
    if not entries:
        return None
    temp = nearest_temperature([e.temperature for e in entries], 0.0)
    plan = {e.batch_size: e.mode for e in entries if e.temperature == temp}
    return None if plan == {1: "speculative"} else dict(sorted(plan.items()))
