"""Confidence tables (`heads.confidence`): EAGLE trees ranked by the measured chance of acceptance
instead of the draft probability. The table is fitted monotone and read back from the heads
folder; a tree ranked by it is still decoded exactly (greedy equals `generate` on a transformer
and on a hybrid) and follows the table (a table that trusts rank 0 alone makes every greedy tree
a chain); sampled requests keep EAGLE-2's ranking (the table holds greedy hits)."""
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


def table(rows: list[list[float]]) -> ConfidenceCalibration:
    return ConfidenceCalibration(tuple(map(tuple, rows)), tuple((10,) * BINS for _ in rows))


def trusting_rank_0() -> ConfidenceCalibration:
    """Rank 0 is always accepted, every other rank never: the best tree of n tokens is a chain."""
    return table([[CEILING] * BINS, [FLOOR] * BINS])


# -- the table ------------------------------------------------------------------------------------
def test_fit_makes_each_rank_non_decreasing_and_pulls_thin_cells_to_the_rank_rate():
    records = ([(0, 0.01, True)] * 30 + [(0, 0.01, False)] * 10  # 75% at a low probability
               + [(0, 0.25, False)] * 3                          # three misses: a thin cell below its left
               + [(0, 0.95, True)] * 40
               + [(1, 0.01, False)] * 45 + [(1, 0.01, True)] * 5)
    fitted = ConfidenceCalibration.fit(records, ranks=2)
    for row in fitted.accept:
        assert all(b >= a for a, b in zip(row, row[1:]))
    assert fitted.accept[0][0] == pytest.approx(fitted.accept[0][4])  # the violator pooled with its left
    assert 0.6 < fitted.accept[0][0] < 0.8
    assert fitted.accept[0][-1] > 0.9
    assert fitted.accept[1][0] == pytest.approx((5 + 2 * (5.5 / 51)) / (50 + 2))
    empty_bin = fitted.accept[1][7]  # nothing measured there: the rank's rate (then made monotone)
    assert empty_bin == pytest.approx(5.5 / 51) and empty_bin >= fitted.accept[1][0]
    assert sum(map(sum, fitted.counts)) == len(records)


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


@pytest.mark.parametrize("data,message", [
    ({"format_version": 2}, "format_version"),
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
    assert measured.measured_on["roots"] == 23 and measured.ranks == 3
    assert sum(measured.counts[0]) >= measured.measured_on["roots"], "every root's first level is measured"
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
