"""`draftheads demo` (make demo's last step): plain vs the heads' plan vs prompt lookup alone on a
few prompts, one table with tokens/s, tokens per step and equality to generate, then one line on
why the plan is what it is (`tune.explain.why`: the cost curve and what the timing measured)."""
from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

import draftheads as dh
from draftheads.cli import main
from draftheads.plans import CostCurve, PlanEntry, TreePlans, write_plans
from draftheads.tune.explain import why

EPYC = "AMD EPYC"
CURVE = CostCurve("cpu", {1: 0.057, 2: 0.095, 3: 0.116, 4: 0.087, 8: 0.081}, EPYC, context=256, threads=2,
                  chosen_by="training")


def lookup_alone(**batch) -> PlanEntry:
    measured = {"batch": {"speedup_median": 1.31, "timed_batches": 9, "lookup_alone": True,
                          "lookup_vs": {"against": "plain", "interval": [1.12, 1.52], "kept_unless_below": 0.99},
                          **batch}}
    return PlanEntry(tree={"total_tokens": 1, "depth": 1, "top_k": 1}, device_type="cpu", device_name=EPYC,
                     prompt_lookup=True, chosen_by="training", measured=measured)


def test_why_names_the_curve_and_the_timed_verdict():
    line = why(TreePlans((lookup_alone(),), curves=(CURVE,)), "cpu", EPYC)
    assert line.startswith("plan on AMD EPYC at temperature 0: prompt lookup alone (no tree of the heads paid here)")
    assert "a verify here costs 57 ms for 1 token, 2 tokens 1.67x, 3 tokens 2.04x, 4 tokens 1.53x, 8 tokens 1.42x" in line
    assert "timed on 9 prompt runs: lookup alone 1.31x generate; lookup against plain: 1.12-1.52x (95%)" in line
    heads = PlanEntry(tree={"total_tokens": 8, "depth": 3, "top_k": 3}, device_type="cpu", device_name=EPYC,
                      mode="plain", measured={"calibration": {"mean_accept_length": 1.66},
                                              "batch": {"speedup_median": 0.89, "timed_batches": 4}})
    line = why(TreePlans((heads,), curves=(CURVE,)), "cpu", EPYC)
    assert "plain decoding (target.generate)" in line and "committed 1.66 tokens per step" in line
    assert "the heads alone 0.89x generate" in line
    assert why(None, "cpu", EPYC).startswith("no plan for this device")


@pytest.fixture(scope="module")
def heads_dir(tiny_target_dir, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("demo") / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(path)
    entry = PlanEntry(tree=[], device_type="cpu", prompt_lookup=True, chosen_by="training",
                      measured={"batch": {"speedup_median": 1.2, "timed_batches": 3, "lookup_alone": True}})
    write_plans(path, TreePlans((entry,)))
    return path


def test_demo_prints_the_table_and_why(tiny_target_dir, heads_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "code", "turns": ["def f(x): return x def f(x): return"]}\n'
                       '{"category": "prose", "turns": ["the cat sat on the mat and the cat sat on"]}\n')
    code = main(["demo", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--questions", str(prompts),
                 "--no-chat-template", "--max-new-tokens", "8", "--num-prompts", "2"])
    out = capsys.readouterr().out
    assert code == 0  # every output equal to generate
    lines = out.splitlines()
    assert lines[0].startswith("| prompt | plain tok/s | plain tok/step | plan tok/s |")
    assert lines[2].startswith("| code |") and lines[3].startswith("| prose |") and lines[4].startswith("| **all** |")
    assert lines[4].endswith("| 2/2 |") and "x) |" in lines[4]  # ratios to plain
    assert any(line.startswith("plan on ") and "prompt lookup alone" in line for line in lines)
