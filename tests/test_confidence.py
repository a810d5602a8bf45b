"""Confidence tables (`heads.confidence`): EAGLE trees ranked by the measured chance of acceptance
instead of the draft probability. The table is fitted monotone per depth and rank and read back
from the heads folder (the first release's one-depth files too); a tree ranked by it is still
decoded exactly (greedy equals `generate` on a transformer and on a hybrid) and follows the table
(a table that trusts rank 0 alone makes every greedy tree a chain; one that trusts the first level
alone widens it); sampled requests keep EAGLE-2's ranking (the table holds greedy hits)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import draftheads as dh
from draftheads.heads.confidence import CEILING, EDGES, FLOOR, ConfidenceCalibration, read_confidence
from draftheads.methods.eagle.confidence import measure_confidence
from draftheads.methods.eagle.drafter import EagleDrafter
from draftheads.inference.sampling import SamplingParams

from hybrid_utils import reference, tiny_hybrid
from inference_utils import tiny_target

BINS = len(EDGES) + 1


def table(*depths: list[list[float]]) -> ConfidenceCalibration:
    """A table of the given chances (one list of rank rows per depth), 10 candidates per cell."""
    return ConfidenceCalibration(tuple(tuple(map(tuple, rows)) for rows in depths),
                                 tuple(tuple((10,) * BINS for _ in rows) for rows in depths))


def trusting_rank_0() -> ConfidenceCalibration:
    """Rank 0 is always accepted, every other rank never: the best tree of n tokens is a chain."""
    return table([[CEILING] * BINS, [FLOOR] * BINS])


def trusting_the_first_level() -> ConfidenceCalibration:
    """Both of a root's candidates are likely accepted, anything deeper unlikely: the best tree
    of n tokens takes both first-level nodes."""
    return table([[CEILING] * BINS, [0.9] * BINS], [[0.05] * BINS, [FLOOR] * BINS])


# -- the table ------------------------------------------------------------------------------------
def test_fit_makes_each_rank_non_decreasing_and_pulls_thin_cells_to_the_rank_rate():
    records = ([(0, 0, 0.01, True)] * 30 + [(0, 0, 0.01, False)] * 10  # 75% at a low probability
               + [(0, 0, 0.25, False)] * 3                             # three misses: a thin cell below its left
               + [(0, 0, 0.95, True)] * 40
               + [(0, 1, 0.01, False)] * 45 + [(0, 1, 0.01, True)] * 5)
    fitted = ConfidenceCalibration.fit(records, ranks=2)
    assert fitted.depths == 1
    for row in fitted.accept[0]:
        assert all(b >= a for a, b in zip(row, row[1:]))
    (rank_0, rank_1), = fitted.accept
    assert rank_0[0] == pytest.approx(rank_0[4])  # the violator pooled with its left
    assert 0.6 < rank_0[0] < 0.8
    assert rank_0[-1] > 0.9
    pooled = (5 + 2 * (5.5 / 51)) / (50 + 2)  # shrunk toward the rank's rate, pooled over depths
    assert rank_1[0] == pytest.approx((5 + 2 * pooled) / (50 + 2))  # and, at its depth, toward that
    empty_bin = rank_1[7]  # nothing measured there: the rank's rate (then made monotone)
    assert empty_bin == pytest.approx(5.5 / 51) and empty_bin >= rank_1[0]
    assert sum(sum(map(sum, c)) for c in fitted.counts) == len(records)


def test_each_depth_gets_its_own_curve_and_a_thin_one_leans_on_the_pooled_cell():
    records = ([(0, 0, 0.95, True)] * 90 + [(0, 0, 0.95, False)] * 10     # the first level: 90% at 0.95
               + [(1, 0, 0.01, True)] * 40 + [(1, 0, 0.01, False)] * 60   # the second: 40% at 0.01
               + [(2, 0, 0.95, True)] * 2)                                # the third: two candidates at 0.95
    fitted = ConfidenceCalibration.fit(records, ranks=1, depths=4)
    assert fitted.depths == 4 and fitted.ranks == 1
    rank_rate = (132 + 0.5) / (202 + 1)  # every cell is already monotone: no pooling of neighbours
    low, high = (40 + 2 * rank_rate) / (100 + 2), (92 + 2 * rank_rate) / (102 + 2)  # pooled over depths
    (first,), (second,), (third,), (fourth,) = fitted.accept
    assert first[-1] == pytest.approx((90 + 2 * high) / 102) and first[0] == pytest.approx(low)
    assert second[0] == pytest.approx((40 + 2 * low) / 102) and second[-1] == pytest.approx(high)
    assert third[-1] == pytest.approx((2 + 2 * high) / 4)
    assert fourth[0] == pytest.approx(low) and fourth[-1] == pytest.approx(high), "an unmeasured depth is pooled"
    assert fitted.counts[1][0][0] == 100 and sum(fitted.counts[3][0]) == 0


def test_rescore_reads_each_ranks_curve_between_bin_centres():
    rows = [[0.1 * (1 + j * 0.5) for j in range(BINS)], [0.05] * BINS]
    rows[0] = [min(CEILING, a) for a in rows[0]]
    t = table(rows)
    bounds = (0.0, *EDGES, 1.0)
    centres = [(a + b) / 2 for a, b in zip(bounds, bounds[1:])]
    at_centres = torch.tensor([[math.log(centres[3]), math.log(centres[3]), math.log(centres[0])]])
    got = t.rescore(at_centres).exp()[0]
    assert got[0] == pytest.approx(rows[0][3]) and got[1] == pytest.approx(0.05)
    assert got[2] == pytest.approx(0.05), "a rank past the table's last uses the last row"
    between = math.log((centres[5] + centres[6]) / 2)
    mid = float(t.rescore(torch.tensor([[between]])).exp())
    assert rows[0][5] < mid < rows[0][6]
    sweep = t.rescore(torch.linspace(-12, 0, 200)[:, None])[:, 0]
    assert bool((sweep[1:] >= sweep[:-1] - 1e-7).all()) and bool((sweep <= 0).all())


def test_rescore_reads_the_curve_of_its_depth_and_the_last_past_it():
    t = table([[0.9] * BINS, [0.5] * BINS], [[0.4] * BINS, [0.2] * BINS])
    lp = torch.full((1, 3), math.log(0.1))
    for depth, want in [(0, [0.9, 0.5, 0.5]), (1, [0.4, 0.2, 0.2]), (5, [0.4, 0.2, 0.2])]:
        assert t.rescore(lp, depth).exp()[0].tolist() == pytest.approx(want)


def test_a_first_release_file_reads_as_one_depth(tmp_path):
    rows = [[0.5] * BINS, [0.2] * BINS]
    (tmp_path / "confidence.json").write_text(json.dumps(
        {"format_version": 1, "edges": list(EDGES), "accept": rows, "counts": [[3] * BINS] * 2}))
    loaded = read_confidence(tmp_path)
    assert loaded.depths == 1 and loaded.accept == (tuple(map(tuple, rows)),)
    assert ConfidenceCalibration.from_json(loaded.to_json()) == loaded and loaded.to_json()["format_version"] == 2


@pytest.mark.parametrize("data,message", [
    ({"format_version": 3}, "format_version"),
    ({"format_version": 2, "edges": list(EDGES), "accept": [[0.5] * BINS], "counts": [[1] * BINS]},
     "not a confidence table"),
    ({"format_version": 2, "edges": list(EDGES), "accept": [[[0.5] * BINS], [[0.5] * BINS] * 2],
      "counts": [[[1] * BINS], [[1] * BINS] * 2]}, "the same ranks"),
    ({"format_version": 1, "edges": list(EDGES), "accept": [[0.5] * BINS], "counts": [[1] * BINS], "extra": 1},
     "unknown key"),
    ({"format_version": 1, "edges": list(EDGES), "accept": [[0.5] * (BINS - 1)], "counts": [[1] * BINS]},
     "one row of"),
    ({"format_version": 1, "edges": list(EDGES), "accept": [[0.9] + [0.5] * (BINS - 1)], "counts": [[1] * BINS]},
     "must not fall"),
    ({"format_version": 1, "edges": list(EDGES), "accept": [[1.5] * BINS], "counts": [[1] * BINS]}, "must lie in"),
    ({"format_version": 1, "edges": [0.5, 0.2], "accept": [[0.5] * 3], "counts": [[1] * 3]}, "rise strictly"),
    ({"format_version": 1, "accept": [[0.5] * BINS]}, "not a confidence table"),
])
def test_a_bad_confidence_file_is_refused_naming_the_file(tmp_path, data, message):
    (tmp_path / "confidence.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as caught:
        read_confidence(tmp_path)
    assert "confidence.json" in str(caught.value)


def test_no_measured_candidate_is_a_named_error():
    with pytest.raises(ValueError, match="no drafted candidate"):
        ConfidenceCalibration.fit([], ranks=2)


# -- measured, saved, loaded, decoded ------------------------------------------------------------------
def self_taught(target, prompt: torch.Tensor, new: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """EAGLE-3 heads with randomised weights (a fresh head's output is zero: every candidate alike)
    and the target's greedy continuation of ``prompt`` they are measured on."""
    torch.manual_seed(4)
    heads = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=48)
    heads.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0))
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return heads.eval(), reference(target, prompt, new)


@pytest.mark.parametrize("build", [lambda: tiny_target("llama"), lambda: tiny_hybrid("qwen3_5_text")],
                         ids=["llama", "qwen3_5"])
def test_a_measured_table_round_trips_through_the_folder_and_decodes_exactly(build, tmp_path):
    target = build()
    vocab = target.config.vocab_size
    prompt = torch.randint(3, vocab, (1, 8), generator=torch.Generator().manual_seed(2))
    heads, continuation = self_taught(target, prompt, 24)
    measured = measure_confidence(target, heads, [continuation[0]], [prompt.shape[1]], top_k=3, depth=3)
    assert measured.measured_on["roots"] == 23 and measured.ranks == 3 and measured.depths == 3
    assert sum(map(sum, measured.counts[0])) == 3 * measured.measured_on["roots"], "every root's first level"
    assert sum(map(sum, measured.counts[1])) % 3 == 0, "a level is measured where its parent was the true token"
    heads.confidence = measured
    heads.save_pretrained(tmp_path / "heads")
    loaded = dh.load_heads(tmp_path / "heads", target=target).eval()
    assert loaded.confidence == measured
    ids = torch.randint(3, vocab, (1, 10), generator=torch.Generator().manual_seed(5))
    want = reference(target, ids, 20)
    tree = {"total_tokens": 6, "depth": 4, "top_k": 2}
    out = dh.SpeculativeDecoder(target, loaded, tree=tree, draft_budget=None, batch_plan=None).generate(
        ids, max_new_tokens=20, eos_token_id=[])
    assert out.sequences.tolist() == want.tolist()


def drafted_trees(heads, calibration, steps: int = 6, params: SamplingParams | None = None):
    """The trees one drafter grows over ``steps`` steps from random features, ranked by
    ``calibration`` (greedy unless ``params`` say otherwise)."""
    heads.confidence = calibration
    drafter = EagleDrafter(heads, total_tokens=5, depth=4, top_k=2)
    gen = torch.Generator().manual_seed(0)
    width = heads.fc.weight.shape[1]
    prompt = torch.randint(3, 60, (6,), generator=gen)
    drafter.start([prompt], [torch.randn(6, width, generator=gen)], params or SamplingParams(), None)
    trees = []
    for _ in range(steps):
        root = int(torch.randint(3, 60, (1,), generator=gen))
        trees.append(drafter.propose([root], [4])[0])
        drafter.accepted([torch.tensor([root])], [torch.randn(1, width, generator=gen)])
    return trees


def test_a_table_that_trusts_rank_0_alone_turns_every_tree_into_a_chain():
    target = tiny_target("llama")
    heads, _ = self_taught(target, torch.tensor([[3, 4, 5]]), 2)
    raw = drafted_trees(heads, None)
    assert any(t.shape.parents != (-1, 0, 1, 2, 3) for t in raw), "the draft probabilities already chose chains"
    ranked = drafted_trees(heads, trusting_rank_0())
    assert all(t.shape.parents == (-1, 0, 1, 2, 3) for t in ranked)
    for before, after in zip(raw, ranked):  # the chain is each step's top-1 path
        assert after.tokens[1] == before.tokens[1]


def test_a_table_by_depth_widens_the_tree_where_its_first_level_alone_is_trusted():
    target = tiny_target("llama")
    heads, _ = self_taught(target, torch.tensor([[3, 4, 5]]), 2)
    one_depth = table([[CEILING] * BINS, [0.9] * BINS])
    assert all(t.shape.parents == (-1, 0, 1, 2, 3) for t in drafted_trees(heads, one_depth))
    wide = drafted_trees(heads, trusting_the_first_level())
    assert all(t.shape.parents.count(0) == 2 and t.shape.parents.count(1) + t.shape.parents.count(2) == 2
               for t in wide), [t.shape.parents for t in wide]


def test_sampled_trees_keep_the_draft_probability_ranking():
    """The table holds greedy hits; a sampled request's top-k trees are ranked as EAGLE-2 ranks
    them (their exactness at T > 0 does not depend on the ranking: tests/test_drawn_drafts.py)."""
    target = tiny_target("llama")
    heads, _ = self_taught(target, torch.tensor([[3, 4, 5]]), 2)
    sampled = SamplingParams(temperature=0.9, top_k=5, sample_drafts=False)
    raw = drafted_trees(heads, None, params=sampled)
    ranked = drafted_trees(heads, trusting_rank_0(), params=sampled)
    assert any(t.shape.parents != (-1, 0, 1, 2, 3) for t in ranked)
    assert all(a.shape.parents == b.shape.parents and torch.equal(a.tokens, b.tokens) for a, b in zip(raw, ranked))


def test_calibrate_saves_the_table_the_heads_load_with(tiny_target_dir, tmp_path, capsys, one_torch_thread):
    from transformers import AutoModelForCausalLM

    from draftheads.cli import main

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    heads, _ = self_taught(target, torch.tensor([[3, 4, 5]]), 2)
    heads.save_pretrained(tmp_path / "heads")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(self, x): return\nfor a in b: print(a)\n")
    assert main(["calibrate", "--target", str(tiny_target_dir), "--heads", str(tmp_path / "heads"), "--prompts",
                 str(prompts), "--new-tokens", "6", "--num-prompts", "2", "--no-chat-template",
                 "--batch-sizes", "none"]) == 0
    printed = capsys.readouterr().out
    assert "chance of acceptance by draft probability" in printed and "confidence.json" in printed
    loaded = dh.load_heads(tmp_path / "heads", target=target)
    assert loaded.confidence is not None and loaded.confidence.measured_on["roots"] == 2 * 5
    assert (tmp_path / "heads" / "tree.json").is_file()


def test_methods_without_a_confidence_table_are_named():
    from draftheads.tune.calibrate import calibrate_confidence

    target = tiny_target("llama")
    with pytest.raises(ValueError, match="medusa heads rank no tree by a confidence table"):
        calibrate_confidence(target, dh.MedusaHeads.for_target(target, num_heads=2), [torch.tensor([[3, 4]])])
