"""Decode settings travel as plans, not as attributes of the heads module: ``SpeculativeDecoder(
plans=...)`` takes a table (a `TreePlans`, a heads folder or a tree.json), ``heads.plans`` is the
table the folder was loaded with (as a transformers model carries its generation_config), drafters
take their tree and vocabulary as arguments, and the attributes heads carried before plans
(``tree``, ``draft_vocab_size``, ``tree_origin``, ``batch_plan``) are deprecated views."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.heads.folder import LEGACY_ATTRIBUTES
from draftheads.plans import PlanEntry, TreePlans, given_tree, primary, read_plans, write_plans

from inference_utils import greedy_reference, self_distilled_heads, tiny_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TREE = [[0], [1], [0, 0]]


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, steps=40)
    return target, heads, prompts


def table(tree=TREE, plain_at_2=True) -> TreePlans:
    entries = [PlanEntry(tree=tree, device_type="cpu")]
    if plain_at_2:
        entries.append(PlanEntry(tree=tree, device_type="cpu", batch_size=2, mode="plain"))
    return TreePlans(tuple(entries))


def choices(decoder) -> list:
    return sorted(map(list, decoder.proposer.shape.choices))


def test_a_decoder_follows_the_plans_it_is_given_and_leaves_the_heads_alone(setup):
    target, heads, prompts = setup
    assert heads.plans is None
    decoder = dh.SpeculativeDecoder(target, heads, plans=table())
    assert heads.plans is None  # nothing was written onto the module
    assert choices(decoder) == sorted(TREE) and decoder.mode_for(1) == "speculative" and decoder.mode_for(2) == "plain"
    assert choices(dh.SpeculativeDecoder(target, heads)) != sorted(TREE)  # without plans: the device default
    out = decoder.generate(prompts[:1], max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, prompts[:1], 24))
    assert out.stats["plan"]["entry"]["batch_size"] == 1 and sum(out.accept_lengths) > len(out.accept_lengths)


def test_plans_given_to_the_decoder_win_over_the_ones_loaded_with_the_heads(setup, tmp_path):
    target, heads, _ = setup
    heads.save_pretrained(tmp_path / "h", plans=table([[0]], plain_at_2=False))
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert choices(dh.SpeculativeDecoder(target, loaded)) == [[0]]
    decoder = dh.SpeculativeDecoder(target, loaded, plans=table())
    assert choices(decoder) == sorted(TREE) and decoder.mode_for(2) == "plain"
    assert primary(loaded.plans).tree.to_json() == [[0]]


def test_plans_may_be_named_by_folder_or_file(setup, tmp_path):
    target, heads, _ = setup
    heads.save_pretrained(tmp_path / "h", plans=table())
    for where in (tmp_path / "h", tmp_path / "h" / "tree.json", str(tmp_path / "h")):
        assert choices(dh.SpeculativeDecoder(target, heads, plans=where)) == sorted(TREE)
    assert read_plans(tmp_path / "h") == table()


@pytest.mark.parametrize("plans, error, message", [
    ("missing-folder", FileNotFoundError, "missing-folder does not exist: pass a heads folder or its tree.json"),
    ("empty-folder", FileNotFoundError, "empty-folder holds no tree.json"),
    ({"tree": TREE}, TypeError, "plans must be a TreePlans, a heads folder or a tree.json path .* got dict"),
    (table(dh.StaticTree.chain(6).to_json()), ValueError, "^plans: .*deep"),
], ids=["missing", "no-tree-file", "a-dict", "too-deep"])
def test_bad_plans_are_refused_by_name(setup, tmp_path, plans, error, message):
    target, heads, _ = setup
    (tmp_path / "empty-folder").mkdir()
    if isinstance(plans, str):
        plans = tmp_path / plans
    with pytest.raises(error, match=message):
        dh.SpeculativeDecoder(target, heads, plans=plans)


def test_plans_go_with_heads_only(setup):
    target, _, _ = setup
    with pytest.raises(ValueError, match="`tree` and `plans` apply to heads"):
        dh.SpeculativeDecoder(target, dh.PromptLookupProposer(), plans=table())


def test_saving_takes_a_tree_or_plans_not_both(setup, tmp_path):
    _, heads, _ = setup
    with pytest.raises(ValueError, match="not both"):
        heads.save_pretrained(tmp_path / "h", tree=TREE, plans=table())
    with pytest.raises(TypeError, match="TreePlans"):
        heads.save_pretrained(tmp_path / "h", plans={"tree": TREE})
    assert not (tmp_path / "h").exists()


def test_loaded_heads_hold_their_plans_and_no_other_decode_setting(setup, tmp_path):
    target, heads, _ = setup
    heads.save_pretrained(tmp_path / "h", plans=given_tree(TREE, 16))
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert loaded.plans == read_plans(tmp_path / "h")
    assert not set(vars(loaded)) & set(LEGACY_ATTRIBUTES)  # views of the plans, never stored
    drafter = loaded.proposer()  # a drafter built by hand drafts what it is given: here the defaults
    assert drafter.vocab_ids is None and sorted(map(list, drafter.shape.choices)) != sorted(TREE)
    loaded.token_counts.copy_(torch.arange(loaded.config.vocab_size))  # counted tokens: a draft vocabulary applies
    planned = dh.SpeculativeDecoder(target, loaded).proposer  # the decoder drafts the plan's entry
    assert sorted(map(list, planned.shape.choices)) == sorted(TREE) and planned.vocab_ids.numel() == 16


def test_the_old_attributes_are_deprecated_views_of_the_plans(setup, tmp_path):
    target, heads, _ = setup
    write_plans(tmp_path, table())
    plans = read_plans(tmp_path)
    heads.save_pretrained(tmp_path / "h", plans=plans)
    loaded = dh.load_heads(tmp_path / "h", target=target)
    with pytest.deprecated_call():
        assert (loaded.tree, loaded.draft_vocab_size, loaded.batch_plan) == (TREE, None, {1: "speculative", 2: "plain"})
    with pytest.deprecated_call():  # setting one rewrites the plans as one entry for any device, as before
        loaded.tree = [[0]]
    assert [(e.tree.to_json(), e.device_type, e.batch_size) for e in loaded.plans.entries] == [
        ([[0]], None, 1), ([[0]], None, 2)]
    assert choices(dh.SpeculativeDecoder(target, loaded)) == [[0]]
    with pytest.deprecated_call(), pytest.raises(ValueError, match="saved with the tree it was measured for"):
        heads.draft_vocab_size = 16  # no tree on these heads to measure it with
    assert heads.plans is None
    with pytest.deprecated_call():
        loaded.tree = None
    assert loaded.plans is None
