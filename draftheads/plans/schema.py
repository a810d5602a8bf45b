"""The format of a heads folder's ``tree.json``: one table of what to run where.

Version 4 (written since plans record the machine they were measured on)::

    {
      "format_version": 4,
      "plans": [
        {"device_type": "cpu", "device_name": "AMD EPYC", "batch_size": 1, "temperature": 0.0,
         "mode": "speculative", "tree": [[0], [1], [0, 0]], "draft_vocab_size": 1024,
         "prompt_lookup": true, "chosen_by": "calibrate", "measured": {...}},
        {"device_type": "cpu", "device_name": "AMD EPYC", "batch_size": 4, "temperature": 0.0,
         "mode": "plain", ...}
      ],
      "cost_curves": [
        {"device_type": "cpu", "device_name": "AMD EPYC", "threads": 2, "context": 256,
         "verify_seconds": {"1": 0.057, "2": 0.095, "3": 0.116, "4": 0.087, "8": 0.081},
         "chosen_by": "training"}
      ]
    }

Each entry says, for requests on ``device_type`` ("cpu", "cuda", ...; null: any device) from
``batch_size`` rows up and at ``temperature`` (0: greedy), which ``tree`` to draft (rank paths for
static heads, settings for dynamic ones) with which ``draft_vocab_size``, or that ``mode``
"plain" decoding is faster there (a plain entry may keep the tree that lost, which a decoder told
to always speculate drafts). ``device_name`` is the machine the entry was measured on (the CPU
model, or the GPU's name; null: not recorded): part of the entry's key, because two CPUs of one
device type can verify at different costs (on one 2-core EPYC 8 tokens verify cheaper than 3; on
a Xeon the cost rises with every token), so a decoder on another machine says that it follows a
plan measured elsewhere (`plans.select`). ``prompt_lookup`` (false when absent): a row whose text
repeats an earlier n-gram drafts the copy and the heads draft the others
(`inference.proposers.hybrid`), because that measured faster there. ``chosen_by`` says who
measured it ("calibrate", "training", "given" for a tree saved by hand); ``measured`` keeps the
figures that decided it (free-form, for people; the decoder never reads it). How a request picks
its entry is `plans.select`.

``cost_curves`` (optional) keeps each machine's measured verify cost by tree width
(`CostCurve`): what the widths were chosen with, for people and for `draftheads calibrate`'s
report; the decoder never reads it.

Version 3 is version 4 without ``device_name`` and ``cost_curves``, and version 2 is version 3
without ``prompt_lookup``: both load as they are (their entries name no machine). Version 1 is
every file written before: one top-level ``tree`` (+ ``draft_vocab_size``), the
measurements beside it, optionally ``chosen_by``/``device_type`` (trees chosen by training) and
``batch_plan`` (``{"1": "speculative", "4": "plain"}``). It still loads: `from_json` turns it
into greedy entries (device type null unless training named one, as those files were used).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .batch_sizes import MODES, SPECULATIVE, batch_size, parse_batch_plan
from .trees import TreeSpec, tree_spec

FORMAT_VERSION = 4
CHOSEN_BY_CALIBRATION = "calibrate"
CHOSEN_BY_TRAINING = "training"
CHOSEN_BY_HAND = "given"
#: Keys of a version-1 file that are its content, not its measurements.
LEGACY_CONTENT = ("tree", "draft_vocab_size", "chosen_by", "device_type", "batch_plan")
ENTRY_KEYS = ("device_type", "device_name", "batch_size", "temperature", "mode", "tree", "draft_vocab_size",
              "prompt_lookup", "chosen_by", "measured")
CURVE_KEYS = ("device_type", "device_name", "threads", "context", "verify_seconds", "chosen_by")


@dataclass(frozen=True)
class PlanEntry:
    """What to run for requests on ``device_type`` (None: any) from ``batch_size`` rows up at
    ``temperature``: ``tree`` speculatively (behind prompt lookup when ``prompt_lookup``), or plain
    decoding (``mode`` "plain"). ``tree`` may be given as JSON holds it (rank paths or settings):
    it is kept as its `trees.TreeSpec`."""

    tree: TreeSpec | None
    temperature: float = 0.0
    batch_size: int = 1
    device_type: str | None = None
    mode: str = SPECULATIVE
    draft_vocab_size: int | None = None
    chosen_by: str = CHOSEN_BY_CALIBRATION
    measured: dict = field(default_factory=dict, compare=False)
    prompt_lookup: bool = False
    device_name: str | None = None

    def __post_init__(self) -> None:
        if self.tree is not None:
            object.__setattr__(self, "tree", tree_spec(self.tree))

    @property
    def key(self) -> tuple[str | None, str | None, int, float]:
        return (self.device_type, self.device_name, self.batch_size, self.temperature)

    def describe(self) -> dict[str, Any]:
        """The entry without its measurements (for ``out.stats`` and logs)."""
        out = {"device_type": self.device_type, "batch_size": self.batch_size, "temperature": self.temperature,
               "mode": self.mode, "prompt_lookup": self.prompt_lookup, "chosen_by": self.chosen_by}
        if self.device_name is not None:
            out["device_name"] = self.device_name
        return out

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"device_type": self.device_type}
        if self.device_name is not None:
            data["device_name"] = self.device_name
        data.update(batch_size=self.batch_size, temperature=self.temperature, mode=self.mode)
        if self.tree is not None:  # a plain entry keeps the tree that was timed (and lost) there
            data["tree"] = self.tree.to_json()
            data["draft_vocab_size"] = self.draft_vocab_size
        if self.prompt_lookup:
            data["prompt_lookup"] = True
        data["chosen_by"] = self.chosen_by
        if self.measured:
            data["measured"] = self.measured
        return data


@dataclass(frozen=True)
class CostCurve:
    """One machine's measured verify cost by tree width: the median seconds of one target forward
    over n tree tokens (``verify_seconds``, as measured: not forced to rise with n) on a
    ``context``-token cache with ``threads`` CPU threads (None on a GPU)."""

    device_type: str
    verify_seconds: dict[int, float]
    device_name: str | None = None
    context: int | None = None
    threads: int | None = None
    chosen_by: str = CHOSEN_BY_CALIBRATION

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.device_type, self.device_name)

    def relative(self) -> dict[int, float]:
        """Each width's cost as a multiple of one token's."""
        one = self.verify_seconds.get(1) or min(self.verify_seconds.values())
        return {n: s / one for n, s in sorted(self.verify_seconds.items())}

    def to_json(self) -> dict[str, Any]:
        return {"device_type": self.device_type, "device_name": self.device_name, "threads": self.threads,
                "context": self.context, "verify_seconds": {str(n): s for n, s in sorted(self.verify_seconds.items())},
                "chosen_by": self.chosen_by}


@dataclass(frozen=True)
class TreePlans:
    """A whole ``tree.json``: its entries, in the order they were written, and the cost curves
    they were chosen with."""

    entries: tuple[PlanEntry, ...]
    version: int = FORMAT_VERSION
    curves: tuple[CostCurve, ...] = ()

    def __post_init__(self) -> None:
        seen: dict[tuple, PlanEntry] = {}
        for entry in self.entries:
            if entry.key in seen:
                device, name, size, temp = entry.key
                on = f" ({name})" if name else ""
                raise ValueError(f"two plans for device type {device or 'any'}{on}, batch size {size}, temperature "
                                 f"{temp}: keep one")
            seen[entry.key] = entry
        keys = [c.key for c in self.curves]
        if len(set(keys)) != len(keys):
            raise ValueError("two cost curves for one device: keep one")

    @property
    def device_types(self) -> list[str | None]:
        return sorted({e.device_type for e in self.entries}, key=lambda d: (d is not None, d or ""))

    def curve_for(self, device_type: str, device_name: str | None) -> CostCurve | None:
        """The cost curve measured on this machine, if the file keeps one."""
        return next((c for c in self.curves if c.key == (device_type, device_name)), None)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format_version": FORMAT_VERSION, "plans": [e.to_json() for e in self.entries]}
        if self.curves:
            data["cost_curves"] = [c.to_json() for c in self.curves]
        return data

    def merged(self, new: "TreePlans") -> "TreePlans":
        """``new``'s entries, plus this file's entries for other machines: measuring on one
        machine (device type and name) replaces what was measured there before (and the entries
        of that device type that name no machine, and version-1 any-device entries, which the
        measurement supersedes), never what another machine or device type measured."""
        measured = {(e.device_type, e.device_name) for e in new.entries}
        types = {e.device_type for e in new.entries}

        def superseded(device_type: str | None, device_name: str | None) -> bool:
            return device_type is None or (device_type, device_name) in measured or (
                device_type in types and device_name is None)

        kept = [e for e in self.entries if not superseded(e.device_type, e.device_name)]
        curves = {c.key for c in new.curves}
        kept_curves = [c for c in self.curves if c.key not in curves and not superseded(c.device_type, c.device_name)]
        return TreePlans(tuple(new.entries) + tuple(kept), curves=tuple(new.curves) + tuple(kept_curves))


# -- checks -------------------------------------------------------------------------------------
def check_temperature(value: Any, where: str = "temperature") -> float:
    """A measured temperature: a finite number >= 0 (0 = greedy), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number >= 0 (0 = greedy), got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{where} must be a finite number >= 0 (0 = greedy), got {value!r}")
    if value < 0:
        raise ValueError(f"{where} must be >= 0 (0 = greedy), got {value!r}")
    return value


def parse_temperatures(text: str | list[Any]) -> list[float]:
    """``--temperatures 0,0.7,1.0`` (or a list) as distinct temperatures, sorted; a ValueError
    naming the value for a word, a negative, NaN/inf, a duplicate or an empty list."""
    items = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    if isinstance(text, str) and any(t == "" for t in items):
        raise ValueError(f"temperatures {text!r} has an empty item: give numbers separated by commas, e.g. 0,0.7,1.0")
    out: list[float] = []
    for item in items:
        value = item
        if isinstance(item, str):
            try:
                value = float(item)
            except ValueError:
                raise ValueError(f"temperature {item!r} is not a number: give numbers >= 0 like 0,0.7,1.0") from None
        value = check_temperature(value, f"temperature {item!r}")
        if value in out:
            raise ValueError(f"temperature {item!r} is given twice: each temperature is measured once")
        out.append(value)
    if not out:
        raise ValueError("no temperatures given: give at least one, e.g. 0 (greedy) or 0,0.7,1.0")
    return sorted(out)


# -- reading --------------------------------------------------------------------------------------
def from_json(data: Any, where: str = "tree.json") -> TreePlans:
    """A `TreePlans` from the parsed JSON of a tree file of any version, checked (the trees'
    fit to the heads is `heads.tree_check`'s job); a ValueError naming ``where`` otherwise."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must hold a JSON object, got {type(data).__name__}")
    version = data.get("format_version")
    if version is None:
        return _from_version_1(data, where)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{where}: format_version must be a whole number 1..{FORMAT_VERSION}, got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"{where} has format_version {version}; this draftheads reads tree files up to version "
                         f"{FORMAT_VERSION}: upgrade draftheads (or run draftheads calibrate again)")
    if version == 1:
        return _from_version_1(data, where)
    allowed = {"format_version", "plans"} | ({"cost_curves"} if version >= 4 else set())
    unknown = sorted(str(k) for k in set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} in a version-{version} tree file (it holds "
                         f"{', '.join(sorted(allowed))})")
    plans = data.get("plans")
    if not isinstance(plans, list) or not plans:
        raise ValueError(f"{where}: 'plans' must be a non-empty list of plan entries")
    entries = tuple(_entry(item, f"{where}: plans[{i}]", version) for i, item in enumerate(plans))
    curves = data.get("cost_curves", [])
    if not isinstance(curves, list):
        raise ValueError(f"{where}: 'cost_curves' must be a list, got {type(curves).__name__}")
    try:
        return TreePlans(entries, curves=tuple(_curve(c, f"{where}: cost_curves[{i}]") for i, c in enumerate(curves)))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _curve(item: Any, where: str) -> CostCurve:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where} must be an object with device_type and verify_seconds, got {type(item).__name__}")
    unknown = sorted(str(k) for k in set(item) - set(CURVE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {', '.join(CURVE_KEYS)}")
    device = item.get("device_type")
    if not isinstance(device, str) or not device:
        raise ValueError(f"{where}: device_type must be a device type such as \"cpu\", got {device!r}")
    name = item.get("device_name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{where}: device_name must be a string or null, got {name!r}")
    times = item.get("verify_seconds")
    if not isinstance(times, Mapping) or not times:
        raise ValueError(f"{where}: verify_seconds must be a non-empty object of width -> seconds")
    curve: dict[int, float] = {}
    for width, seconds in times.items():
        n = batch_size(width)
        if n is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"{where}: verify_seconds[{width!r}] must map a width >= 1 to seconds > 0, got {seconds!r}")
        curve[n] = float(seconds)
    for key in ("threads", "context"):
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{where}: {key} must be a whole number >= 1 or null, got {value!r}")
    chosen_by = item.get("chosen_by", CHOSEN_BY_CALIBRATION)
    if not isinstance(chosen_by, str):
        raise ValueError(f"{where}: chosen_by must be a string, got {chosen_by!r}")
    return CostCurve(device_type=device, verify_seconds=curve, device_name=name, context=item.get("context"),
                     threads=item.get("threads"), chosen_by=chosen_by)


def _entry(item: Any, where: str, version: int = FORMAT_VERSION) -> PlanEntry:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where} must be an object with device_type, batch_size, temperature, mode, got "
                         f"{type(item).__name__}")
    valid = [k for k in ENTRY_KEYS if version >= 4 or k != "device_name"]
    unknown = sorted(str(k) for k in set(item) - set(valid))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {', '.join(valid)}")
    name = item.get("device_name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"{where}: device_name must be the machine's name (a CPU model or GPU name) or null, "
                         f"got {name!r}")
    device = item.get("device_type")
    if device is not None and (not isinstance(device, str) or not device or ":" in device):
        raise ValueError(f"{where}: device_type must be a device type such as \"cpu\" or \"cuda\" (no index) or null "
                         f"(any device), got {device!r}")
    size = batch_size(item.get("batch_size", 1))
    if size is None or isinstance(item.get("batch_size", 1), str):
        raise ValueError(f"{where}: batch_size must be a whole number >= 1, got {item.get('batch_size')!r}")
    temperature = check_temperature(item.get("temperature", 0.0), f"{where}: temperature")
    mode = item.get("mode", SPECULATIVE)
    if mode not in MODES:
        raise ValueError(f"{where}: unknown mode {mode!r}; valid: {', '.join(repr(m) for m in MODES)}")
    tree = item.get("tree")
    if mode == SPECULATIVE and tree is None:
        raise ValueError(f"{where}: a speculative entry needs a tree (or mode \"plain\")")
    chosen_by = item.get("chosen_by", CHOSEN_BY_CALIBRATION)
    if not isinstance(chosen_by, str):
        raise ValueError(f"{where}: chosen_by must be a string, got {chosen_by!r}")
    measured = item.get("measured", {})
    if not isinstance(measured, Mapping):
        raise ValueError(f"{where}: measured must be an object, got {type(measured).__name__}")
    lookup = item.get("prompt_lookup", False)
    if not isinstance(lookup, bool):
        raise ValueError(f"{where}: prompt_lookup must be true or false, got {lookup!r}")
    return PlanEntry(tree=_tree(tree, where), temperature=temperature, batch_size=size,
                     device_type=device, mode=mode, draft_vocab_size=item.get("draft_vocab_size"),
                     chosen_by=chosen_by, measured=dict(measured), prompt_lookup=lookup, device_name=name)


def _from_version_1(data: Mapping, where: str) -> TreePlans:
    """Every file written before version 2: one greedy tree, maybe a batch plan (module docstring)."""
    if "tree" not in data:
        raise ValueError(f"{where} is not a valid tree file (no 'tree' and no 'format_version')")
    by_training = data.get("chosen_by") == CHOSEN_BY_TRAINING
    device = data.get("device_type") if by_training and isinstance(data.get("device_type"), str) else None
    chosen_by = CHOSEN_BY_TRAINING if by_training else CHOSEN_BY_CALIBRATION
    measured = {k: v for k, v in data.items() if k not in LEGACY_CONTENT}
    base = PlanEntry(tree=_tree(data["tree"], where), device_type=device, draft_vocab_size=data.get("draft_vocab_size"),
                     chosen_by=chosen_by, measured=measured)
    if "batch_plan" not in data:
        return TreePlans((base,), version=1)
    try:
        plan = parse_batch_plan(data["batch_plan"], f"{where}: batch_plan")
    except ValueError as e:
        raise ValueError(f"{e}; fix it, delete the key or run draftheads calibrate --batch-sizes again") from None
    by_size = data.get("batch_plan_measured") if isinstance(data.get("batch_plan_measured"), Mapping) else {}
    entries = [] if 1 in plan else [base]  # below the smallest measured size: speculative, as these files meant
    for size, mode in plan.items():
        measured = {**(base.measured if size == 1 else {}), **({"batch": by_size[str(size)]} if str(size) in by_size else {})}
        entries.append(replace(base, batch_size=size, mode=mode, measured=measured))
    return TreePlans(tuple(entries), version=1)


def _tree(value: Any, where: str) -> TreeSpec | None:
    """An entry's tree as its spec; a ValueError naming ``where`` for one that is no tree at all
    (whether it fits the heads is checked when they load it, `heads.tree_check`)."""
    try:
        return None if value is None else tree_spec(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def given_tree(tree: TreeSpec | list | dict, draft_vocab_size: int | None = None) -> TreePlans:
    """The file for a tree saved by hand (``save_pretrained(tree=...)``): used on any device."""
    return TreePlans((PlanEntry(tree=tree, draft_vocab_size=draft_vocab_size, chosen_by=CHOSEN_BY_HAND),))
