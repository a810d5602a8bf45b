"""Which tree heads draft when nobody calibrated them: one answer per device type.

A verify forward over many tree tokens costs several plain steps on a CPU and about one on a GPU
(benchmarks/step_profile.py --verify-sizes measures it), so the right default size differs by an order of
magnitude between the two. Heads leave training with trees chosen on the
training device (tree.json entries ``"chosen_by": "training"`` for that device type); entries
measured on another device type are not a good guess here, so they give way to this device's
default (`plans.select`). Trees without a device type (saved by hand, or calibrated before plans
per temperature) and trees passed explicitly are used as they are.
"""
from __future__ import annotations

import torch

from ..device import device_name
from ..heads.acceptance import default_choices, grow_tree
from ..plans import CHOSEN_BY_TRAINING, DynamicTree, PlanEntry, StaticTree, TreePlans, TreeSpec, primary, select
from ..plans import tree_spec
from ..registry import method_of

# EAGLE-2 dynamic-tree settings. CPU: small trees (verify cost grows fast with tokens there).
# CUDA: the EAGLE-2 paper's defaults (60 tokens, depth 6, top-10), the GPU is nearly flat up to ~64.
DYNAMIC_DEFAULTS: dict[str, DynamicTree] = {
    "cpu": DynamicTree(total_tokens=12, depth=5, top_k=4),
    "cuda": DynamicTree(total_tokens=60, depth=6, top_k=10),
}
LARGE_STATIC_NODES = 48  # drafted nodes of the GPU default static tree (Medusa's own default has 63)


def _prior_accuracy(num_heads: int, ranks: int = 10) -> torch.Tensor:
    """A typical per-head, per-rank acceptance table (deeper heads and lower ranks are right less
    often); only its ordering matters for growing a default tree."""
    k = torch.arange(num_heads, dtype=torch.float32)[:, None]
    r = torch.arange(ranks, dtype=torch.float32)[None, :]
    return 0.6 * 0.8**k / (1.0 + 1.5 * r)


def large_static_choices(num_heads: int, nodes: int = LARGE_STATIC_NODES) -> list[list[int]]:
    """A GPU-sized static tree: the best ``nodes`` paths under the prior acceptance table."""
    return [list(path) for path, _ in grow_tree(_prior_accuracy(max(num_heads, 1)), nodes)]


def device_default(heads: torch.nn.Module, device: torch.device | str) -> TreeSpec:
    """The default tree for ``heads`` on ``device``: small on CPU (and anything not CUDA), large on CUDA."""
    kind = torch.device(device).type
    own = getattr(heads, "default_tree", None)
    if callable(own):  # a head type with its own default (DFlash: the chain of its block)
        return tree_spec(own(kind))
    if not method_of(heads).tree.rank_paths:
        return DYNAMIC_DEFAULTS["cuda" if kind == "cuda" else "cpu"]
    num_heads = heads.config.num_heads
    return StaticTree.parse(large_static_choices(num_heads) if kind == "cuda" else default_choices(num_heads))


def heads_plans(heads: torch.nn.Module) -> TreePlans | None:
    """The plans ``heads`` hold: their tree.json as loaded (or set since), else None."""
    return getattr(heads, "plans", None)


def source_of(entry: PlanEntry | None) -> str:
    """"calibration" (or a tree set by hand), "training" or "device default" (for reports)."""
    if entry is None:
        return "device default"
    return "training" if entry.chosen_by == CHOSEN_BY_TRAINING else "calibration"


def tree_source(heads: torch.nn.Module, device: torch.device | str) -> str:
    """Where ``resolve_tree``'s answer comes from for one greedy sequence on ``device``."""
    return source_of(select(heads_plans(heads), torch.device(device).type, 1, 0.0, device_name(device)).entry)


def default_for(heads: torch.nn.Module, device: torch.device | str, plans: TreePlans | None) -> TreeSpec:
    """This device type's default tree for ``heads``. For dynamic trees the draft vocabulary
    restriction of ``plans`` is kept (it trades acceptance for drafting cost and does not depend
    on the tree's size)."""
    tree = device_default(heads, device)
    saved = primary(plans)
    if isinstance(tree, DynamicTree) and saved is not None and isinstance(saved.tree, DynamicTree):
        return tree.with_draft_vocab(saved.tree.draft_vocab_size or tree.draft_vocab_size)
    return tree


def resolve_tree(heads: torch.nn.Module, device: torch.device | str, batch_size: int = 1,
                 temperature: float = 0.0) -> TreeSpec:
    """The tree ``heads`` should draft on ``device`` for a request of ``batch_size`` rows at
    ``temperature`` when the caller gave none: the tree.json entry that `plans.select` picks
    (never one measured on another device type), else the device default."""
    plans = heads_plans(heads)
    entry = select(plans, torch.device(device).type, batch_size, temperature, device_name(device)).entry
    if entry is None or entry.tree is None:
        return default_for(heads, device, plans)
    return entry.tree
