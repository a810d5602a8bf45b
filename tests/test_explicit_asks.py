"""What a caller asks for wins over the heads' plan, which fills in only what was left open:
``prompt_lookup=True`` (``--prompt-lookup``, ``NAME+lookup``) runs lookup in front also where the
plan says plain, an explicit tree is drafted also there (without the plan's lookup), and
``prompt_lookup=False`` turns an entry that speculated only by lookup into plain decoding.
``out.stats["plan"]["from"]`` says which one decided; greedy output stays the target's own.

The failure this guards (issue 55): a main-job plan of plain decoding overrode ``eagle3+lookup``,
which then ran at 1.00 tokens per step, while lookup alone ran 1.7x on the same prompts."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.bench.methods import build_methods
from draftheads.cli import main
from draftheads.plans import PlanEntry, TreePlans, write_plans

from inference_utils import greedy_reference, self_distilled_heads, tiny_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LOST_TREE = [[0], [1]]  # the tree a plain entry keeps: it was timed there and lost


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, steps=30)
    # prompts that repeat themselves, so prompt lookup finds matches
    repeating = torch.cat([prompts[:2], prompts[:2], prompts[:2, :3]], dim=1)
    return target, heads, repeating


def heads_with(setup, tmp_path, *entries):
    target, heads, _ = setup
    heads.save_pretrained(tmp_path / "h")
    write_plans(tmp_path / "h", TreePlans(tuple(entries)))
    return dh.load_heads(tmp_path / "h", target=target), tmp_path / "h"


PLAIN_ENTRY = PlanEntry(tree=LOST_TREE, device_type="cpu", mode="plain", chosen_by="training")
LOOKUP_ALONE = PlanEntry(tree=[], device_type="cpu", mode="speculative", prompt_lookup=True, chosen_by="training")
BEHIND_LOOKUP = PlanEntry(tree=LOST_TREE, device_type="cpu", prompt_lookup=True, chosen_by="training")


def greedy(decoder, prompts, i=0, n=16):
    return decoder.generate(prompts[i : i + 1], max_new_tokens=n, eos_token_id=[])


def test_prompt_lookup_true_runs_lookup_where_the_plan_says_plain(setup, tmp_path):
    target, _, prompts = setup
    heads, _ = heads_with(setup, tmp_path, PLAIN_ENTRY)
    assert dh.SpeculativeDecoder(target, heads).mode_for(1) == "plain"  # left open: the plan decides
    asked = dh.SpeculativeDecoder(target, heads, prompt_lookup=True)
    assert asked.mode_for(1) == "speculative" and asked.mode_for(1, 0.7) == "speculative"
    out = greedy(asked, prompts)
    assert out.stats["mode"] == "speculative" and out.stats["plan"]["lookup"] is True
    assert out.stats["plan"]["from"] == {"mode": "prompt_lookup argument", "tree": "tree.json",
                                         "prompt_lookup": "prompt_lookup argument"}
    assert out.stats["drafted_by"]["lookup"] > 0  # the copies ran (the prompts repeat)
    assert max(out.accept_lengths) > 1
    assert torch.equal(out.sequences, greedy_reference(target, prompts[:1], 16))


def test_an_explicit_tree_is_drafted_where_the_plan_says_plain_and_without_its_lookup(setup, tmp_path):
    target, _, prompts = setup
    heads, _ = heads_with(setup, tmp_path, PLAIN_ENTRY)
    given = dh.SpeculativeDecoder(target, heads, tree=[[0], [0, 0]])
    assert given.mode_for(1) == "speculative" and given.mode_for(1, 1.0) == "speculative"
    out = greedy(given, prompts, 1)
    assert out.stats["plan"]["from"]["mode"] == "tree argument" and out.stats["plan"]["tree"] == "given"
    assert torch.equal(out.sequences, greedy_reference(target, prompts[1:2], 16))
    # an entry that puts lookup in front: an explicit tree drafts alone unless lookup is asked for too
    heads, _ = heads_with(setup, tmp_path / "b", BEHIND_LOOKUP)
    alone = greedy(dh.SpeculativeDecoder(target, heads, tree=[[0]]), prompts)
    assert "drafted_by" not in alone.stats and alone.stats["plan"]["lookup"] is False
    assert alone.stats["plan"]["from"]["prompt_lookup"] == "tree argument (no lookup)"
    both = greedy(dh.SpeculativeDecoder(target, heads, tree=[[0]], prompt_lookup=True), prompts)
    assert both.stats["plan"]["lookup"] is True and both.stats["drafted_by"]["lookup"] > 0
    assert torch.equal(both.sequences, alone.sequences)


def test_prompt_lookup_false_makes_a_lookup_alone_entry_plain(setup, tmp_path):
    target, _, prompts = setup
    heads, _ = heads_with(setup, tmp_path, LOOKUP_ALONE)
    planned = greedy(dh.SpeculativeDecoder(target, heads), prompts)
    assert planned.stats["mode"] == "speculative" and planned.stats["plan"]["from"]["mode"] == "tree.json"
    off = dh.SpeculativeDecoder(target, heads, prompt_lookup=False)
    out = greedy(off, prompts)
    # root-only steps of the speculative loop would only cost more than generate: plain decoding
    assert out.stats["mode"] == "plain" and out.stats["plan"]["from"]["mode"] == "prompt_lookup argument"
    assert torch.equal(out.sequences, planned.sequences)
    # but the heads' own speculative entries stay speculative with lookup off
    heads, _ = heads_with(setup, tmp_path / "b", BEHIND_LOOKUP)
    out = greedy(dh.SpeculativeDecoder(target, heads, prompt_lookup=False), prompts)
    assert out.stats["mode"] == "speculative" and out.stats["plan"]["lookup"] is False


def test_an_explicit_batch_plan_still_decides_the_mode(setup, tmp_path):
    target, _, prompts = setup
    heads, _ = heads_with(setup, tmp_path, PLAIN_ENTRY)
    forced = dh.SpeculativeDecoder(target, heads, prompt_lookup=True, batch_plan={1: "plain"})
    out = greedy(forced, prompts)
    assert out.stats["mode"] == "plain" and out.stats["plan"]["from"]["mode"] == "batch_plan argument"


def test_bench_name_plus_lookup_runs_lookup_over_a_plain_plan(setup, tmp_path):
    target, _, prompts = setup
    _, folder = heads_with(setup, tmp_path, PLAIN_ENTRY)
    methods = build_methods(["medusa", "medusa+lookup", "medusa-lookup"], target, None, [str(folder)], ["medusa"],
                            None, load_model=None)
    modes = {m.name: m.decoder.mode_for(1) for m in methods}
    assert modes == {"medusa": "plain", "medusa+lookup": "speculative", "medusa-lookup": "plain"}
    out = greedy(methods[1].decoder, prompts)
    assert out.stats["plan"]["lookup"] and torch.equal(out.sequences, greedy_reference(target, prompts[:1], 16))


def test_generate_command_says_what_decided(tiny_target_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    folder = tmp_path / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(folder)
    write_plans(folder, TreePlans((PlanEntry(tree=[[0]], device_type="cpu", mode="plain", chosen_by="training"),)))
    args = ["generate", "--target", str(tiny_target_dir), "--heads", str(folder), "--prompt", "a b a b a b",
            "--no-chat-template", "--max-new-tokens", "6", "--quiet", "--temperature", "0"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "[plan: plain decoding (tree.json, training's entry for cpu, batch 1, temperature 0)]" in err
    assert main(args + ["--prompt-lookup"]) == 0
    err = capsys.readouterr().err
    assert "[plan: speculative, prompt lookup in front (asked: --prompt-lookup), over the plan's plain entry" in err
