"""``tree.json``: what to run where, for a heads folder. The one reader and writer of the file.

Its format (`schema`: versioned, old files still load), the tree an entry drafts (`trees`: a
typed static or dynamic tree), how a request picks an entry (`select`) and the file itself
(`files`: parsed once per load, written atomically). Below the heads (which load it) and the
decoder (which picks from it); the measurements that fill it are `tune`.
"""
from .batch_sizes import MODES, PLAIN, SPECULATIVE, BatchPlan, mode_for, parse_batch_plan, plan_to_json
from .files import TREE_NAME, plans_at, plans_json, read_plans, tree_file, write_plans
from .schema import (
    CHOSEN_BY_CALIBRATION,
    CHOSEN_BY_HAND,
    CHOSEN_BY_TRAINING,
    FORMAT_VERSION,
    CostCurve,
    PlanEntry,
    TreePlans,
    check_temperature,
    from_json,
    given_tree,
    parse_temperatures,
)
from .select import Choice, greedy_batch_plan, measured_on, primary, select, usable_entries
from .trees import DynamicTree, StaticTree, TreeSpec, tree_json, tree_spec

__all__ = [
    "CHOSEN_BY_CALIBRATION", "CHOSEN_BY_HAND", "CHOSEN_BY_TRAINING", "FORMAT_VERSION", "MODES", "PLAIN", "SPECULATIVE",
    "BatchPlan", "Choice", "CostCurve", "DynamicTree", "PlanEntry", "StaticTree", "TreeSpec", "TreePlans", "TREE_NAME", "check_temperature", "from_json", "given_tree",
    "greedy_batch_plan", "measured_on", "mode_for", "parse_batch_plan", "parse_temperatures", "plan_to_json", "plans_at", "plans_json", "primary",
    "read_plans", "select", "tree_file", "tree_json", "tree_spec", "usable_entries", "write_plans",
]
