"""Does a tree fit a set of heads? Checked for every tree of tree.json when it is loaded (and for a tree passed to a
proposer), so a bad tree is refused with its source named instead of crashing in the first
decode step (a rank beyond the draft vocabulary makes `topk` fail there).

Static heads (Medusa, Hydra) take a list of rank paths; dynamic heads (EAGLE, EAGLE-3) take
settings ``{"total_tokens", "depth", "top_k"[, "draft_vocab_size"]}``.
"""
from __future__ import annotations

from typing import Any

import torch

from ..registry import method_of

DYNAMIC_KEYS = ("total_tokens", "depth", "top_k")


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tree_problem(heads: torch.nn.Module, tree: Any, draft_vocab_size: int | None = None) -> str | None:
    """What is wrong with ``tree`` for ``heads`` (None: it fits)."""
    kind = heads.config.head_type
    if draft_vocab_size is not None and (not _is_int(draft_vocab_size) or draft_vocab_size < 1):
        return f"draft_vocab_size must be a positive integer or null, got {draft_vocab_size!r}"
    if not method_of(heads).tree.rank_paths:
        if not isinstance(tree, dict):
            return (
                f"{kind} heads draft a dynamic tree: it must be settings {{\"total_tokens\": .., \"depth\": .., "
                f"\"top_k\": ..}}, not {type(tree).__name__} {str(tree)[:60]}"
            )
        return _dynamic_problem(heads, tree)
    if isinstance(tree, dict):
        return (
            f"it holds dynamic-tree settings ({', '.join(sorted(map(str, tree)))}), which only EAGLE heads take; "
            f"{kind} heads take a static tree: a list of paths of per-head ranks, e.g. [[0], [1], [0, 0]]"
        )
    return _static_problem(heads, tree, draft_vocab_size)


def _dynamic_problem(heads: torch.nn.Module, tree: dict) -> str | None:
    unknown = sorted(str(k) for k in set(tree) - {*DYNAMIC_KEYS, "draft_vocab_size"})
    if unknown:
        return f"unknown dynamic-tree setting(s) {unknown}; valid: {', '.join(DYNAMIC_KEYS)}, draft_vocab_size"
    for key, value in tree.items():
        if not (_is_int(value) and value >= 1) and not (key == "draft_vocab_size" and value is None):
            return f"dynamic-tree settings must be positive integers (draft_vocab_size may be null): {key} is {value!r}"
    limit, why = draft_vocab_limit(heads, tree.get("draft_vocab_size"))
    top_k = tree.get("top_k")
    if top_k is not None and top_k > limit:
        return f"top_k {top_k} exceeds {why}: a node cannot have more children than there are tokens to draft"
    return None


def _static_problem(heads: torch.nn.Module, tree: Any, draft_vocab_size: int | None) -> str | None:
    if not isinstance(tree, (list, tuple)):
        return f"a static tree must be a list of paths (lists of per-head ranks), got {type(tree).__name__}"
    paths: set[tuple[int, ...]] = set()
    for path in tree:
        if not isinstance(path, (list, tuple)) or not all(_is_int(r) for r in path):
            return f"path {path!r} is not a list of integer ranks (a tree is a list of paths, e.g. [[0], [1], [0, 0]])"
        if any(r < 0 for r in path):
            return f"path {list(path)} has a negative rank"
        paths.add(tuple(path))
    for path in sorted(paths, key=len):
        if path[:-1] and path[:-1] not in paths:
            return f"path {list(path)} has no parent path {list(path[:-1])} in the tree"
    num_heads = int(heads.config.num_heads)
    deepest = max((len(p) for p in paths), default=0)
    if deepest > num_heads:
        return f"the tree is {deepest} deep but the heads have only {num_heads} heads (one per depth)"
    limit, why = draft_vocab_limit(heads, draft_vocab_size)
    too_far = [list(p) for p in sorted(paths) if p and max(p) >= limit]
    if too_far:
        return (
            f"path {too_far[0]} takes rank {max(too_far[0])}, beyond {why} (ranks are 0..{limit - 1})"
            + (f"; {len(too_far) - 1} more such path(s)" if len(too_far) > 1 else "")
        )
    return None
