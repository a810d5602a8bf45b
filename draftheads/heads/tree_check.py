"""Does a tree fit a set of heads? Checked for every tree of tree.json when it is loaded (and for a tree passed to a
proposer), so a bad tree is refused with its source named instead of crashing in the first
decode step (a rank beyond the draft vocabulary makes `topk` fail there).

Which kind of tree some heads take is their method's (`registry.TreeKind`): rank paths (Medusa,
Hydra, P-EAGLE, DFlash) or dynamic-tree settings (EAGLE, EAGLE-3), both `plans.trees`.
"""
from __future__ import annotations

from typing import Any

import torch

from ..plans import DynamicTree, StaticTree
from ..plans.trees import is_int
from ..registry import method_of


def plans_problem(heads: torch.nn.Module, plans: Any) -> str | None:
    """What is wrong with the first tree of ``plans`` (a `plans.TreePlans`) that does not fit
    ``heads``, prefixed by its entry when the file holds several (None: all fit)."""
    if plans is None:
        return None
    for i, entry in enumerate(plans.entries):
        if entry.tree is None:
            continue  # a plain entry without the tree it was timed with drafts nothing
        problem = tree_problem(heads, entry.tree, entry.draft_vocab_size)
        if problem:
            return problem if len(plans.entries) == 1 else f"plans[{i}] ({_where(entry)}): {problem}"
    return None


def check_plans(heads: torch.nn.Module, plans: Any, where: Any) -> None:
    """Refuse ``plans`` whose trees do not fit ``heads``, naming ``where`` they came from."""
    problem = plans_problem(heads, plans)
    if problem:
        raise ValueError(f"{where}: {problem}; fix it, delete it or run draftheads calibrate again")


def _where(entry: Any) -> str:
    return f"{entry.device_type or 'any device'}, batch {entry.batch_size}, temperature {entry.temperature:g}"


def draft_vocab_limit(heads: torch.nn.Module, draft_vocab_size: int | None) -> tuple[int, str]:
    """How many tokens the heads rank when drafting, and what sets that number."""
    vocab_ids = getattr(heads, "vocab_ids", None)
    ids = vocab_ids() if callable(vocab_ids) else None
    if ids is not None:  # EAGLE-3: its own reduced vocabulary, fixed at training
        return int(ids.numel()), f"the heads' draft vocabulary (draft_vocab_size {int(ids.numel())} in config.json)"
    vocab = int(heads.config.vocab_size)
    if draft_vocab_size is not None and draft_vocab_size < vocab:
        return int(draft_vocab_size), f"draft_vocab_size {draft_vocab_size}"
    return vocab, f"the vocabulary of {vocab} tokens"


def tree_problem(heads: torch.nn.Module, tree: Any, draft_vocab_size: int | None = None) -> str | None:
    """What is wrong with ``tree`` (a `plans.TreeSpec`, or rank paths / settings as JSON holds
    them) for ``heads`` (None: it fits)."""
    if draft_vocab_size is not None and (not is_int(draft_vocab_size) or draft_vocab_size < 1):
        return f"draft_vocab_size must be a positive integer or null, got {draft_vocab_size!r}"
    who = f"{heads.config.head_type} heads"
    try:
        if method_of(heads).tree.rank_paths:
            return _static_problem(heads, StaticTree.parse(tree, who), draft_vocab_size)
        return _dynamic_problem(heads, DynamicTree.parse(tree, who))
    except ValueError as e:
        return str(e)


def _dynamic_problem(heads: torch.nn.Module, tree: DynamicTree) -> str | None:
    limit, why = draft_vocab_limit(heads, tree.draft_vocab_size)
    if tree.top_k > limit:
        return f"top_k {tree.top_k} exceeds {why}: a node cannot have more children than there are tokens to draft"
    return None


def _static_problem(heads: torch.nn.Module, tree: StaticTree, draft_vocab_size: int | None) -> str | None:
    num_heads = int(heads.config.num_heads)
    if tree.depth > num_heads:
        return f"the tree is {tree.depth} deep but the heads have only {num_heads} heads (one per depth)"
    limit, why = draft_vocab_limit(heads, draft_vocab_size)
    too_far = [list(p) for p in sorted(set(tree.paths)) if p and max(p) >= limit]
    if too_far:
        return (
            f"path {too_far[0]} takes rank {max(too_far[0])}, beyond {why} (ranks are 0..{limit - 1})"
            + (f"; {len(too_far) - 1} more such path(s)" if len(too_far) > 1 else "")
        )
    return None
