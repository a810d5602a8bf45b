"""Calibrated trees: growth order, the time/acceptance trade-off, and the saved tree being used."""
from __future__ import annotations

import json

import torch

import draftheads as dh
from draftheads.tune.calibrate import calibrate, choose_tree, expected_tokens_per_step, grow_tree

from inference_utils import self_distilled_heads, tiny_target

ACC = torch.tensor([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.05]])


def test_grow_tree_adds_nodes_by_path_probability():
    grown = grow_tree(ACC, max_nodes=6)
    paths = [p for p, _ in grown]
    # 0.6, 0.6*0.5, then the sibling 0.2 beats the depth-3 chain 0.6*0.5*0.4 and [0, 1] (0.12 each)
    assert paths[:3] == [(0,), (0, 0), (1,)]
    assert set(paths[3:5]) == {(0, 0, 0), (0, 1)} and paths[5] == (1, 0)
    values = [v for _, v in grown]
    assert values == sorted(values, reverse=True)
    assert abs(values[1] - 0.3) < 1e-6  # 0.6 * 0.5
    assert abs(expected_tokens_per_step([list(p) for p in paths], ACC) - (1 + sum(values))) < 1e-6


def test_choose_tree_follows_the_cost_of_verification():
    draft = {0: 0.0, 1: 1e-4, 2: 2e-4, 3: 3e-4}
    # GPU-like: verification cost flat in the tree size -> a large tree.
    flat = choose_tree(ACC, {1: 0.010, 64: 0.0105}, draft, max_nodes=20)
    # CPU-like: each tree token costs a lot -> a small tree.
    steep = choose_tree(ACC, {1: 0.010, 2: 0.014, 4: 0.018, 8: 0.030, 16: 0.060, 64: 0.25}, draft, max_nodes=20)
    assert len(flat.tree) > len(steep.tree) >= 1
    # Verification that costs more than it can return -> plain decoding (root only) is chosen.
    hopeless = choose_tree(ACC * 0.05, {1: 0.010, 2: 0.030, 64: 0.5}, draft, max_nodes=20)
    assert hopeless.tree == [] and hopeless.expected_speedup == 1.0


def test_calibrate_end_to_end_saves_a_tree_the_decoder_uses(tmp_path):
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target)
    result = calibrate(target, heads, [prompts[i : i + 1] for i in range(3)], new_tokens=16, max_nodes=8,
                       sizes=[1, 2, 4, 9])
    assert all(0.0 <= a <= 1.0 for row in result.accuracy for a in row)
    assert result.accuracy[0][0] > 0.5  # the heads were trained on these continuations
    heads.save_pretrained(tmp_path / "heads", tree=result.tree)
    data = json.loads((tmp_path / "heads" / "tree.json").read_text())
    assert data["plans"][0]["tree"] == result.tree and data["plans"][0]["device_type"] is None  # saved by hand: any device
    loaded = dh.load_heads(tmp_path / "heads", target=target)
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert [list(c) for c in decoder.proposer.shape.choices] == sorted(result.tree, key=lambda c: (len(c), c))
