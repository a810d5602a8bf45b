"""Which tree (or plain decoding) a decoder runs for a request: its plan lookup.

Heads come with a table of what to run where (tree.json, `draftheads.plans`; ``heads.plans``
or the decoder's ``plans=``): device type x batch size x temperature -> tree, or plain decoding.
`PlannedDrafts` builds one proposer per distinct tree of the entries that apply on the decoder's
device (once, at construction) and answers, per request, which entry runs (`plans.select`: this
device type's entries, the nearest measured temperature, the largest measured batch size at or
below the request's). Entries measured on
another device type are ignored (warned once): the device default tree is drafted instead.

An entry may also put prompt lookup in front of the heads (``prompt_lookup``: it measured faster
there): that request runs the entry's drafter behind `proposers.hybrid.LookupThenHeads`.
Proposers that are not heads (prompt lookup, a draft model) have no table: one proposer serves
every request. The choice depends only on the request's settings, never on what the target
produces, so decoding stays lossless.

**What the caller asked for wins; the table fills in only what was left open:**
- ``prompt_lookup=True`` runs lookup in front of the heads for every request, also where the
  entry says plain (then the heads draft the entry's tree behind it, which may draft nothing:
  lookup alone); ``False`` never runs lookup, and an entry that speculated only BY lookup (its
  tree drafts nothing) is then plain decoding;
- an explicit ``tree`` drafts that tree for every request, also where the entry says plain, and
  without the entry's lookup (which was measured with the entry's tree, not this one) unless
  ``prompt_lookup=True`` asks for it;
- a ``batch_plan`` argument (a dict, or None: always speculate) decides the mode.
``out.stats["plan"]["from"]`` says, for the mode, the tree and the lookup, which one decided.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ..device import device_name
from ..heads.io import check_plans
from ..plans import PLAIN, SPECULATIVE, BatchPlan, PlanEntry, greedy_batch_plan, mode_for, parse_batch_plan, select
from ..plans import DynamicTree, TreePlans, TreeSpec, measured_on, plans_at, usable_entries
from .default_tree import default_for, heads_plans, source_of
from .proposers.hybrid import LookupThenHeads
from .proposers.prompt_lookup import PromptLookupProposer

#: How the decoder follows the table (its ``batch_plan`` argument).
FOLLOW_HEADS = "heads"


@dataclass(frozen=True)
class PlannedRun:
    """What one request runs: the mode, the proposer (for speculative steps) and, for
    ``out.stats["plan"]``, which entry chose them."""

    mode: str
    proposer: Any
    stats: dict = field(default_factory=dict)


def _tree_key(tree: TreeSpec, draft_vocab_size: int | None) -> tuple[TreeSpec, int | None]:
    return (tree, draft_vocab_size)


def _proposer_for(heads: torch.nn.Module, tree: TreeSpec, draft_vocab_size: int | None) -> Any:
    """``heads``' proposer for an entry's tree, with the entry's own draft vocabulary (a static
    tree's; none: the whole vocabulary). A dynamic tree carries its own."""
    if isinstance(tree, DynamicTree) or draft_vocab_size is None:
        return heads.proposer(tree=tree)
    return heads.proposer(tree=tree, draft_vocab_size=draft_vocab_size)


class PlannedDrafts:
    """The proposers a decoder may run and the rule picking one per request (module docstring).

    ``plans``: the table heads follow (None: none, the device default tree); ``prompt_lookup``:
    None follows each entry's ``prompt_lookup`` (heads behind prompt lookup where that measured
    faster); True (or a configured `PromptLookupProposer`) puts lookup in front of the heads for
    every request, False never does."""

    def __init__(self, proposer: Any, device: torch.device, tree: Any = None, is_heads: bool = True,
                 batch_plan: str | Mapping[int | str, str] | None = FOLLOW_HEADS,
                 prompt_lookup: bool | PromptLookupProposer | None = None, plans: TreePlans | None = None) -> None:
        self.device_type = torch.device(device).type
        self.device_name = device_name(device)
        self.plans = plans if is_heads else None
        self.entries: list[PlanEntry] = []
        self._by_tree: dict[tuple, Any] = {}
        self._behind_lookup: dict[int, LookupThenHeads] = {}  # id(heads drafter) -> it behind prompt lookup
        self._lookup = prompt_lookup
        self.explicit_tree = tree is not None
        self.ignored: tuple[str, ...] = ()
        if is_heads:  # the table decides plain decoding even under an explicit tree
            self.entries, self.ignored = usable_entries(self.plans, self.device_type, self.device_name)
        first = self._select(1, 0.0) if self.entries else None
        self.measured_on = measured_on(self.plans, self.device_type, self.device_name) if self.entries else None
        if self.measured_on is not None:
            warnings.warn(
                f"the heads' tree.json holds {self.device_type} plans measured on {self.measured_on!r}, not on this "
                f"machine ({self.device_name!r}); they are followed, but the cost of verifying a tree differs between "
                "machines of one device type: run `draftheads calibrate` here to measure plans for this machine",
                stacklevel=3)
        if not is_heads:
            self.default = proposer  # a Proposer brings its own drafts
        elif tree is not None:
            self.default = proposer.proposer(tree=tree)  # an explicit tree serves every request
        else:
            for entry in self.entries:
                if entry.tree is not None:
                    key = _tree_key(entry.tree, entry.draft_vocab_size)
                    if key not in self._by_tree:
                        self._by_tree[key] = _proposer_for(proposer, entry.tree, entry.draft_vocab_size)
            if first is not None and first.tree is not None:
                self.default = self._by_tree[_tree_key(first.tree, first.draft_vocab_size)]
            else:  # nothing applies here: this device type's default tree
                self.default = proposer.proposer(tree=default_for(proposer, device, self.plans))
            if self.ignored and not self.entries:  # only where the table would have chosen the tree
                warnings.warn(
                    f"the heads' tree.json holds plans measured on {', '.join(self.ignored)} only; this decoder runs "
                    f"on {self.device_type}, so they are IGNORED and the {self.device_type} default tree is drafted "
                    f"(run `draftheads calibrate` on this device to measure plans for it)", stacklevel=3)
        if is_heads:  # every drafter a request may run behind lookup, built now (compaction, cache headroom)
            for entry in [first, *self.entries]:
                if self._uses_lookup(entry):
                    self._behind(self._heads_drafter(entry))
        self._first = first
        self.override = _resolve_override(batch_plan)
        self.always_speculate = batch_plan is None

    def _select(self, batch_size: int, temperature: float) -> PlanEntry | None:
        return select(self.plans, self.device_type, batch_size, temperature, self.device_name).entry

    def _uses_lookup(self, entry: PlanEntry | None) -> bool:
        """Lookup in front for the requests of ``entry``: as asked, else as the entry measured
        (never the entry's lookup under an explicit tree: module docstring)."""
        if self._lookup is None:
            return not self.explicit_tree and entry is not None and entry.prompt_lookup
        return bool(self._lookup)

    def _drafts_nothing(self, entry: PlanEntry | None) -> bool:
        """Whether the heads' drafter for ``entry`` drafts nothing (a root-only tree)."""
        if self.explicit_tree or entry is None or entry.tree is None:
            return False
        return entry.tree.drafts_nothing

    def _heads_drafter(self, entry: PlanEntry | None) -> Any:
        if entry is None or entry.tree is None or not self._by_tree:  # no table, or an explicit tree
            return self.default
        return self._by_tree[_tree_key(entry.tree, entry.draft_vocab_size)]

    def _drafter_for(self, entry: PlanEntry | None) -> Any:
        """The drafter of the requests ``entry`` applies to: its tree's, behind prompt lookup where
        the entry (or the decoder's ``prompt_lookup``) says so."""
        drafter = self._heads_drafter(entry)
        return self._behind(drafter) if self._behind_lookup and self._uses_lookup(entry) else drafter

    def _behind(self, drafter: Any) -> LookupThenHeads:
        """``drafter`` behind prompt lookup: one wrapper per drafter (the configured lookup forked
        for each, else the default one)."""
        if id(drafter) not in self._behind_lookup:
            lookup = self._lookup.fork() if isinstance(self._lookup, PromptLookupProposer) else None
            self._behind_lookup[id(drafter)] = LookupThenHeads(drafter, lookup)
        return self._behind_lookup[id(drafter)]

    @property
    def proposers(self) -> list[Any]:
        """Every proposer this decoder may run (the one a greedy request runs first)."""
        first = self._drafter_for(self._first)
        every = [self.default, *self._by_tree.values(), *self._behind_lookup.values()]
        return [first] + [p for i, p in enumerate(every) if p is not first and all(p is not q for q in every[:i])]

    def batch_plan(self) -> BatchPlan | None:
        """The greedy modes by batch size this decoder follows (for reports): the override, else
        the table's for this device type (None when it measured no batch sizes)."""
        if self.override is not None or self.always_speculate:
            return self.override
        if not self.entries:
            return None
        return greedy_batch_plan(self.plans, self.device_type) if self.plans is not None else None

    def run_for(self, batch_size: int, temperature: float) -> PlannedRun:
        """What a request of ``batch_size`` rows at ``temperature`` (0: greedy) runs: the table's
        entry for it, under what the caller asked (module docstring)."""
        entry = self._select(batch_size, temperature) if self.entries else None
        proposer = self._drafter_for(entry)
        lookup = isinstance(proposer, LookupThenHeads)
        if self.override is not None:
            mode, source = mode_for(self.override, batch_size), "batch_plan argument"
        elif self.always_speculate:
            mode, source = SPECULATIVE, "batch_plan=None"
        elif entry is None:
            mode, source = SPECULATIVE, "no plan (speculative)"
        elif entry.mode == PLAIN and self._lookup:
            mode, source = SPECULATIVE, "prompt_lookup argument"  # lookup was asked for: it runs
        elif entry.mode == PLAIN and self.explicit_tree:
            mode, source = SPECULATIVE, "tree argument"  # the tree was asked for: it is drafted
        elif entry.mode == SPECULATIVE and not lookup and self._drafts_nothing(entry):
            # the entry speculated only by lookup, which the caller turned off: nothing is left to draft
            mode, source = PLAIN, "prompt_lookup argument"
        else:
            mode, source = entry.mode, "tree.json"
        stats: dict[str, Any] = {"tree": "given" if self.explicit_tree else source_of(entry)}
        if entry is not None:
            stats["entry"] = entry.describe()
        if source != "tree.json":
            stats["mode_from"] = source
        if self.ignored and not self.entries:
            stats["ignored_device_types"] = list(self.ignored)
        if self.measured_on is not None:
            stats["measured_on"] = self.measured_on  # another machine's plan (warned when the decoder was built)
        if lookup:
            stats["prompt_lookup"] = "tree.json" if self._lookup is None else "prompt_lookup argument"
        stats["from"] = {
            "mode": source,
            "tree": "tree argument" if self.explicit_tree else ("tree.json" if entry is not None else "device default"),
            "prompt_lookup": ("prompt_lookup argument" if self._lookup is not None
                              else "tree argument (no lookup)" if self.explicit_tree
                              else "tree.json" if entry is not None else "no plan (no lookup)"),
        }
        stats["lookup"] = lookup and mode == SPECULATIVE
        return PlannedRun(PLAIN if mode == PLAIN else SPECULATIVE, proposer, stats)


def check_plans_target(heads: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Plans from another heads folder were measured on that folder's target: refuse them for heads of
    another target (a hybrid's verify costs and acceptance say nothing about a transformer's, and back),
    naming both. A bare tree.json carries no target and is taken as it is."""
    import json
    from pathlib import Path

    from ..heads.config import TargetInfo

    config = Path(folder) / "config.json"
    mine = getattr(getattr(heads, "config", None), "target", None)
    if not config.is_file() or mine is None:
        return
    try:
        theirs = json.loads(config.read_text()).get("target")
    except (OSError, ValueError):
        return  # not a heads folder's config: plans_at says what is wrong with the folder
    if not isinstance(theirs, dict):
        return
    try:
        info = TargetInfo(**theirs)
    except TypeError:
        return
    problems = info.mismatches(mine)
    if problems:
        raise ValueError(
            f"plans={folder} were measured with heads for another target ({info.architecture}, "
            f"{info.name_or_path or 'unnamed'}) than these heads' ({mine.architecture}, {mine.name_or_path or 'unnamed'}): "
            f"{'; '.join(problems)}. Plans are measured per target: calibrate these heads "
            "(draftheads calibrate) instead"
        )


def resolve_plans(heads: torch.nn.Module, plans: TreePlans | str | os.PathLike | None) -> TreePlans | None:
    """The table ``heads`` follow: ``plans`` (a `TreePlans`, or a heads folder or tree file,
    read), checked to fit the heads; None: the heads' own (``heads.plans``, their tree.json)."""
    if plans is None:
        return heads_plans(heads)
    where = "plans"
    if isinstance(plans, (str, os.PathLike)):
        check_plans_target(heads, plans)
        where, plans = str(plans), plans_at(plans)
    elif not isinstance(plans, TreePlans):
        raise TypeError(f"plans must be a TreePlans, a heads folder or a tree.json path (None: the heads' own), "
                        f"got {type(plans).__name__}")
    check_plans(heads, plans, where)
    return plans


def _resolve_override(batch_plan: Any) -> BatchPlan | None:
    """A ``batch_plan`` dict argument as a plan (None for "heads" and None)."""
    if batch_plan is None:
        return None
    if isinstance(batch_plan, str):
        if batch_plan != FOLLOW_HEADS:
            raise ValueError(
                f"batch_plan must be 'heads' (the plan saved with the heads), None (always speculative) or a dict "
                f"like {{1: 'speculative', 4: 'plain'}}; got {batch_plan!r}"
            )
        return None
    return parse_batch_plan(batch_plan, "batch_plan")
