"""The typed tree (`plans.trees`): rank paths and dynamic-tree settings parsed once, at the
boundary (tree.json, the decoder's ``tree=``), into a `StaticTree` or a `DynamicTree`; the same
drafts whether a tree is given as JSON holds it or as its spec."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.plans import DynamicTree, PlanEntry, StaticTree, TreePlans, from_json, tree_spec
from draftheads.tune.tables import drafts_nothing

from inference_utils import greedy_reference, self_distilled_heads, tiny_target


def test_rank_paths_parse_into_a_static_tree_and_back():
    paths = [[0], [1], [0, 0], [0, 2]]
    tree = tree_spec(paths)
    assert isinstance(tree, StaticTree) and tree.to_json() == paths
    assert (tree.depth, tree.nodes, tree.max_rank) == (2, 5, 2)
    assert StaticTree.chain(3) == tree_spec([[0], [0, 0], [0, 0, 0]]) and StaticTree.chain(3).to_json() == [[0], [0, 0], [0, 0, 0]]
    assert {tree: "hashable"}[StaticTree.parse(tuple(map(tuple, paths)))] == "hashable"  # one drafter per distinct tree
    assert tree_spec(tree) is tree


def test_settings_parse_into_a_dynamic_tree_with_defaults_for_the_missing():
    tree = tree_spec({"top_k": 2})
    assert isinstance(tree, DynamicTree) and (tree.total_tokens, tree.depth, tree.top_k) == (12, 5, 2)
    assert tree.to_json() == {"total_tokens": 12, "depth": 5, "top_k": 2}  # no draft_vocab_size: none written
    full = {"total_tokens": 8, "depth": 3, "top_k": 2, "draft_vocab_size": 32}
    assert tree_spec(full).to_json() == full and tree_spec({**full, "draft_vocab_size": None}).draft_vocab_size is None
    assert tree_spec(full).with_draft_vocab(None).to_json() == {"total_tokens": 8, "depth": 3, "top_k": 2}


BAD = {
    "negative rank": ([[0], [-1]], "path \\[-1\\] has a negative rank"),
    "no parent": ([[0], [1, 0]], r"path \[1, 0\] has no parent path \[1\]"),
    "a flat list": ([0, 1], "path 0 is not a list of integer ranks"),
    "a bool rank": ([[True]], "not a list of integer ranks"),
    "a string": ("[[0]]", "must be a list of paths"),
    "an unknown setting": ({"width": 2}, r"unknown dynamic-tree setting\(s\) \['width'\]"),
    "a zero setting": ({"top_k": 0}, "top_k must be a positive integer, got 0"),
    "a bool setting": ({"depth": True}, "depth must be a positive integer"),
    "a null budget": ({"total_tokens": None}, "total_tokens must be a positive integer, got None"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_tree_that_is_no_tree_is_named(case):
    value, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        tree_spec(value)


def test_the_wrong_kind_names_what_the_heads_take():
    with pytest.raises(ValueError, match="medusa heads take a static tree"):
        StaticTree.parse({"total_tokens": 8}, "medusa heads")
    with pytest.raises(ValueError, match="eagle heads draft a dynamic tree: .* not a static list of paths"):
        DynamicTree.parse([[0]], "eagle heads")
    with pytest.raises(ValueError, match="which only EAGLE heads take"):
        StaticTree.parse(DynamicTree(), "medusa heads")


def test_a_tree_that_drafts_nothing_is_plain_decoding():
    assert tree_spec([]).drafts_nothing and DynamicTree(total_tokens=1).drafts_nothing
    assert not StaticTree.chain(1).drafts_nothing and not DynamicTree().drafts_nothing
    assert drafts_nothing([]) and drafts_nothing({"total_tokens": 1}) and not drafts_nothing(None)


def test_plan_entries_hold_specs_and_write_json():
    entry = PlanEntry(tree=[[0], [0, 0]], device_type="cpu")
    assert entry.tree == StaticTree.chain(2) and entry.to_json()["tree"] == [[0], [0, 0]]
    plans = TreePlans((entry, PlanEntry(tree={"total_tokens": 6, "depth": 2, "top_k": 2}, temperature=0.7)))
    again = from_json(plans.to_json())
    assert again == plans and isinstance(again.entries[1].tree, DynamicTree)
    with pytest.raises(ValueError, match=r"my.json: plans\[0\]: path \[1, 0\] has no parent path"):
        from_json({"format_version": 2, "plans": [{"tree": [[1, 0]]}]}, "my.json")


def test_a_spec_drafts_what_its_json_drafts():
    target = tiny_target("llama")
    medusa = dh.MedusaHeads.for_target(target, num_heads=2)
    paths = [[0], [1], [0, 0]]
    assert medusa.proposer(tree=StaticTree.parse(paths)).shape.ranks == medusa.proposer(tree=paths).shape.ranks
    eagle = dh.EagleHead.for_target(target)
    spec = dh.DynamicTree(total_tokens=8, depth=2, top_k=3)
    by_spec, by_json = eagle.proposer(tree=spec), eagle.proposer(tree=spec.to_json())
    assert (by_spec.total_tokens, by_spec.depth, by_spec.top_k) == (by_json.total_tokens, by_json.depth, by_json.top_k) == (8, 2, 3)
    with pytest.raises(ValueError, match="eagle heads draft a dynamic tree"):
        dh.SpeculativeDecoder(target, eagle, tree=dh.StaticTree.chain(2))
    with pytest.raises(ValueError, match="medusa heads take a static tree"):
        dh.SpeculativeDecoder(target, medusa, tree=spec)


def test_greedy_with_a_static_tree_spec_equals_generate():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target)
    decoder = dh.SpeculativeDecoder(target, heads, tree=dh.StaticTree.parse([[0], [1], [0, 0], [0, 0, 0]]))
    accepted = []
    for i in range(3):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=24, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, 24)), f"prompt {i}"
        accepted += out.accept_lengths
    assert max(accepted) > 1, "no draft was ever accepted: the tree was never exercised"
