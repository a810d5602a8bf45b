"""The files of a heads folder: ``config.json`` + ``model.safetensors`` (+ optional ``tree.json``
and ``confidence.json``).

Writing lives here, below the head classes (whose ``save_pretrained`` writes through
`save_heads`); reading a whole folder back into heads is `io.load_heads`, which needs the head
classes. The tree file's format and its reading and writing are `draftheads.plans`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..atomic import write_folder_atomically
from ..plans import (
    CHOSEN_BY_TRAINING,
    TREE_NAME,
    TreePlans,
    TreeSpec,
    from_json,
    given_tree,
    greedy_batch_plan,
    parse_batch_plan,
    plan_to_json,
    plans_json,
    primary,
    tree_json,
)
from .confidence import CONFIDENCE_NAME, confidence_json
from .config import FORMAT_VERSION

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def non_finite_tensors(state: dict[str, torch.Tensor]) -> str | None:
    """Which floating tensors of ``state`` hold NaN/inf (None: all finite). Saving and loading both
    refuse such heads: they would draft garbage, which lossless decoding hides as a slowdown."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if not bad:
        return None
    return f"non-finite values (NaN/inf) in {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} ({len(bad)} of {len(state)} tensors)"


def save_heads(
    heads: torch.nn.Module, path: str | os.PathLike, tree: TreeSpec | list[list[int]] | dict | None = None,
    extra_files: dict[str, str] | None = None, plans: TreePlans | None = None,
) -> Path:
    """Export heads only (never the target's weights) as a versioned safetensors folder, with
    their ``tree.json``: ``tree`` if given (used on any device), else ``plans``, else
    ``heads.plans`` (the plans they were loaded with, or set since), else none.
    ``extra_files``: name -> text written in the same atomic swap (an import's provenance)."""
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    bad = non_finite_tensors(state)
    if bad:
        raise ValueError(f"refusing to export heads to {path}: {bad}; did the training diverge?")
    config = heads.config.to_dict()
    if tree is not None and plans is not None:
        raise ValueError("pass tree (one tree for every request) or plans (a whole table), not both")
    if plans is not None and not isinstance(plans, TreePlans):
        raise TypeError(f"plans must be a draftheads.plans.TreePlans, got {type(plans).__name__}")
    plans = given_tree(tree) if tree is not None else plans if plans is not None else getattr(heads, "plans", None)

    files = {
        CONFIG_NAME: lambda p: p.write_text(json.dumps(config, indent=2) + "\n"),
        WEIGHTS_NAME: lambda p: save_file(
            state, str(p), metadata={"format": "pt", "draftheads_format_version": str(FORMAT_VERSION)}
        ),
    }
    if plans is not None:
        files[TREE_NAME] = lambda p: p.write_text(plans_json(plans))
    confidence = getattr(heads, "confidence", None)
    if confidence is not None:
        files[CONFIDENCE_NAME] = lambda p: p.write_text(confidence_json(confidence))
    for name, text in (extra_files or {}).items():
        files[name] = lambda p, text=text: p.write_text(text, encoding="utf-8")
    return write_folder_atomically(path, files)


#: The attributes heads carried before plans; now deprecated views of ``heads.plans`` (`base.DraftHeads`).
LEGACY_ATTRIBUTES = ("tree", "draft_vocab_size", "tree_origin", "batch_plan")


def plans_view(plans: TreePlans | None) -> dict[str, Any]:
    """What the deprecated heads attributes read from ``plans``: ``tree`` and
    ``draft_vocab_size`` of the greedy batch-1 entry, ``tree_origin`` (``{"chosen_by":
    "training", "device_type": ...}`` for a tree chosen by training, else ``{}``) and
    ``batch_plan`` (the greedy modes by batch size, None when none were measured)."""
    entry = primary(plans)
    origin = {}
    if entry is not None and entry.chosen_by == CHOSEN_BY_TRAINING:
        origin = {"chosen_by": CHOSEN_BY_TRAINING, **({"device_type": entry.device_type} if entry.device_type else {})}
    return {"tree": None if entry is None else tree_json(entry.tree),
            "draft_vocab_size": None if entry is None else entry.draft_vocab_size,
            "tree_origin": origin, "batch_plan": greedy_batch_plan(plans)}


def with_attribute(plans: TreePlans | None, name: str, value: Any) -> TreePlans | None:
    """The plans after a caller that predates them sets ``heads.<name> = value`` (one of
    ``LEGACY_ATTRIBUTES``): the four attributes, this one changed, read as a version-1 tree file
    (one entry, any device); None once ``tree`` is None."""
    current = {**plans_view(plans), name: value}
    if current["tree"] is None:
        if current["draft_vocab_size"] is not None:
            raise ValueError("a draft vocabulary is saved with the tree it was measured for: pass both, as "
                             "heads.use_plans(draftheads.plans.given_tree(tree, draft_vocab_size))")
        return None
    legacy = {"tree": current["tree"], "draft_vocab_size": current["draft_vocab_size"], **(current["tree_origin"] or {})}
    if current["batch_plan"]:
        legacy["batch_plan"] = plan_to_json(parse_batch_plan(current["batch_plan"], "heads.batch_plan"))
    return from_json(legacy, f"heads.{name}")
