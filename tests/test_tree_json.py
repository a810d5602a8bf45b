"""tree.json is checked against its heads at load: a tree that cannot be drafted is refused with
the file and the problem named, never left to crash in the first decode step."""
from __future__ import annotations

import json
import re

import pytest
import torch

import draftheads as dh

from inference_utils import VOCAB, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def saved(heads, folder, tree_json: dict):
    heads.save_pretrained(folder)
    (folder / "tree.json").write_text(json.dumps(tree_json))
    return folder


def refused(folder, target, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(str(folder / "tree.json")) + ": .*" + message):
        dh.load_heads(folder, target=target)


MEDUSA_BAD = {
    "rank beyond the vocabulary": ({"tree": [[0], [VOCAB]]}, rf"path \[{VOCAB}\] takes rank {VOCAB}, beyond the vocabulary of {VOCAB} tokens"),
    "rank beyond draft_vocab_size": ({"tree": [[0], [5]], "draft_vocab_size": 4}, r"rank 5, beyond draft_vocab_size 4"),
    "dynamic settings for medusa": ({"tree": {"total_tokens": 8, "depth": 2, "top_k": 2}}, "which only EAGLE heads take"),
    "flat list": ({"tree": [0, 1]}, r"path 0 is not a list of integer ranks"),
    "fractional rank": ({"tree": [[0.5]]}, r"not a list of integer ranks"),
    "string": ({"tree": "[[0]]"}, "must be a list of paths"),
    "negative rank": ({"tree": [[-1]]}, "negative rank"),
    "disconnected": ({"tree": [[0], [1, 0]]}, r"no parent path \[1\]"),
    "deeper than the heads": ({"tree": [[0], [0, 0], [0, 0, 0]]}, "3 deep but the heads have only 2"),
    "zero draft vocabulary": ({"tree": [[0]], "draft_vocab_size": 0}, "draft_vocab_size must be a positive integer"),
}


@pytest.mark.parametrize("case", list(MEDUSA_BAD))
def test_bad_medusa_tree_json_is_refused_at_load(target, tmp_path, case):
    tree_json, message = MEDUSA_BAD[case]
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    refused(saved(heads, tmp_path / "h", tree_json), target, message)


def test_good_medusa_tree_json_loads_and_is_used(target, tmp_path):
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    folder = saved(heads, tmp_path / "h", {"tree": [[0], [VOCAB - 1], [0, 3]]})
    proposer = dh.SpeculativeDecoder(target, dh.load_heads(folder, target=target)).proposer
    assert proposer.shape.ranks == (-1, 0, VOCAB - 1, 3)


EAGLE_BAD = {
    "top_k above the vocabulary": ({"tree": {"total_tokens": 8, "depth": 2, "top_k": VOCAB + 1}}, rf"top_k {VOCAB + 1} exceeds the vocabulary of {VOCAB}"),
    "top_k above draft_vocab_size": ({"tree": {"total_tokens": 8, "depth": 2, "top_k": 9, "draft_vocab_size": 8}}, "top_k 9 exceeds draft_vocab_size 8"),
    "static paths for eagle": ({"tree": [[0], [1]]}, "eagle heads draft a dynamic tree"),
    "unknown setting": ({"tree": {"total_tokens": 8, "width": 2}}, r"unknown dynamic-tree setting\(s\) \['width'\]"),
}


@pytest.mark.parametrize("case", list(EAGLE_BAD))
def test_bad_eagle_tree_json_is_refused_at_load(target, tmp_path, case):
    tree_json, message = EAGLE_BAD[case]
    refused(saved(dh.EagleHead.for_target(target), tmp_path / "h", tree_json), target, message)


def test_eagle3_top_k_is_checked_against_its_own_draft_vocabulary(target, tmp_path):
    heads = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=16)
    heads.set_draft_vocab(torch.arange(VOCAB))
    refused(saved(heads, tmp_path / "bad", {"tree": {"total_tokens": 8, "depth": 2, "top_k": 17}}), target,
            r"top_k 17 exceeds the heads' draft vocabulary \(draft_vocab_size 16 in config.json\)")
    good = saved(heads, tmp_path / "good", {"tree": {"total_tokens": 8, "depth": 2, "top_k": 16}})
    assert dh.SpeculativeDecoder(target, dh.load_heads(good, target=target)).proposer.top_k == 16


def test_trees_passed_at_run_time_are_checked_before_decoding(target):
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    with pytest.raises(ValueError, match=rf"the tree takes rank {VOCAB}, but the heads draft from {VOCAB} tokens"):
        dh.SpeculativeDecoder(target, heads, tree=[[0], [VOCAB]])
    eagle = dh.EagleHead.for_target(target)
    with pytest.raises(ValueError, match=rf"top_k {VOCAB + 1} exceeds the {VOCAB} tokens"):
        dh.SpeculativeDecoder(target, eagle, tree={"total_tokens": 8, "depth": 2, "top_k": VOCAB + 1})
