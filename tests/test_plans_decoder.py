"""The decoder runs the tree.json entry of each request: its device type, the nearest measured
temperature, its batch size; it says which in ``out.stats["plan"]``; greedy output stays the
target's own whatever entry runs; entries of another device type are ignored with a warning;
`draftheads calibrate --temperatures` measures one entry per temperature."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

import draftheads as dh
from draftheads.cli import main
from draftheads.inference.inputs import left_pad
from draftheads.inference.tree import default_choices
from draftheads.plans import PlanEntry, TreePlans, read_plans, write_plans
from draftheads.tune.calibrate import head_accuracy_table

from inference_utils import greedy_reference, self_distilled_heads, tiny_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY_TREE = [[0]]
WARM_TREE = [[0], [1], [0, 0]]


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, steps=40)
    return target, heads, prompts


def planned_heads(setup, tmp_path, entries) -> torch.nn.Module:
    target, heads, _ = setup
    heads.save_pretrained(tmp_path / "h")
    write_plans(tmp_path / "h", TreePlans(tuple(entries)))
    return dh.load_heads(tmp_path / "h", target=target)


def per_temperature(device_type="cpu"):
    return [
        PlanEntry(tree=GREEDY_TREE, temperature=0.0, device_type=device_type),
        PlanEntry(tree=WARM_TREE, temperature=0.7, device_type=device_type),
        PlanEntry(tree=None, temperature=1.0, device_type=device_type, mode="plain"),
        PlanEntry(tree=GREEDY_TREE, temperature=0.0, batch_size=2, device_type=device_type, mode="plain"),
    ]


def recording(decoder) -> list:
    """Which of the decoder's drafters each call drafts with (by its tree): each generation starts
    the drafter it uses, once."""
    used = []
    for drafter in decoder.drafts.proposers:
        start = drafter.start

        def spy(*args, _start=start, _drafter=drafter, **kwargs):
            used.append(sorted(map(list, _drafter.shape.choices)))
            return _start(*args, **kwargs)

        drafter.start = spy
    return used


def test_each_request_runs_the_entry_of_its_temperature(setup, tmp_path):
    target, _, prompts = setup
    decoder = dh.SpeculativeDecoder(target, planned_heads(setup, tmp_path, per_temperature()))
    used = recording(decoder)
    greedy = decoder.generate(prompts[:1], max_new_tokens=8, eos_token_id=[], temperature=0.0)
    assert greedy.stats["plan"]["entry"]["temperature"] == 0.0 and greedy.stats["plan"]["tree"] == "calibration"
    warm = decoder.generate(prompts[:1], max_new_tokens=8, eos_token_id=[], temperature=0.6, seed=0)
    assert warm.stats["mode"] == "speculative" and warm.stats["plan"]["entry"]["temperature"] == 0.7
    assert used == [GREEDY_TREE, sorted(WARM_TREE)]
    hot = decoder.generate(prompts[:1], max_new_tokens=8, eos_token_id=[], temperature=1.3, seed=0)
    assert hot.stats["mode"] == "plain" and hot.stats["plan"]["entry"] == {
        "device_type": "cpu", "batch_size": 1, "temperature": 1.0, "mode": "plain", "prompt_lookup": False,
        "chosen_by": "calibrate"}
    assert len(used) == 2  # the plain request drafted nothing
    assert decoder.mode_for(1, 0.9) == "plain" and decoder.mode_for(1, 0.8) == "speculative"


def test_greedy_output_is_the_targets_whatever_entry_runs(setup, tmp_path):
    target, _, prompts = setup
    decoder = dh.SpeculativeDecoder(target, planned_heads(setup, tmp_path, per_temperature()))
    for i in range(3):
        out = decoder.generate(prompts[i : i + 1], max_new_tokens=16, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, prompts[i : i + 1], 16))
    # batch 2 is planned plain at temperature 0: the target's own batched generate
    ids, mask = left_pad([prompts[0], prompts[1, 1:]], 0)
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    assert out.stats["mode"] == "plain" and out.stats["plan"]["entry"]["batch_size"] == 2
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    # and with the table's warm tree forced for greedy requests, still the target's output
    warm = dh.SpeculativeDecoder(target, planned_heads(setup, tmp_path / "w", [PlanEntry(tree=WARM_TREE, device_type="cpu")]))
    for i in range(3):
        out = warm.generate(prompts[i : i + 1], max_new_tokens=16, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, prompts[i : i + 1], 16))


def test_plans_of_another_device_type_are_ignored_with_a_warning(setup, tmp_path):
    target, _, prompts = setup
    heads = planned_heads(setup, tmp_path, per_temperature("cuda"))
    with pytest.warns(UserWarning, match=r"measured on cuda only; this decoder runs on cpu, so they are IGNORED and "
                                         r"the cpu default tree is drafted"):
        decoder = dh.SpeculativeDecoder(target, heads)
    out = decoder.generate(prompts[:1], max_new_tokens=8, eos_token_id=[], temperature=1.0, seed=0)
    assert out.stats["mode"] == "speculative"  # cuda's plain entry does not apply here either
    assert out.stats["plan"]["tree"] == "device default" and out.stats["plan"]["ignored_device_types"] == ["cuda"]
    assert sorted(map(list, decoder.proposer.shape.choices)) == sorted(map(list, default_choices(3)))


def test_an_own_device_type_entry_gives_no_warning(setup, tmp_path):
    target, *_ = setup
    heads = planned_heads(setup, tmp_path, per_temperature("cpu") + [PlanEntry(tree=WARM_TREE, device_type="cuda")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dh.SpeculativeDecoder(target, heads)


def test_arguments_still_override_the_table(setup, tmp_path):
    target, _, prompts = setup
    heads = planned_heads(setup, tmp_path, per_temperature())
    given = dh.SpeculativeDecoder(target, heads, tree=[[0], [0, 0]])
    out = given.generate(prompts[:1], max_new_tokens=6, eos_token_id=[], temperature=0.7, seed=0)
    assert out.stats["plan"]["tree"] == "given" and sorted(map(list, given.proposer.shape.choices)) == [[0], [0, 0]]
    assert given.mode_for(1, 1.0) == "speculative"  # an explicit tree is drafted, also where the table says plain
    always = dh.SpeculativeDecoder(target, heads, batch_plan=None)
    assert always.mode_for(1, 1.0) == "speculative" and always.mode_for(2, 0.0) == "speculative"
    out = always.generate(prompts[:1], max_new_tokens=6, eos_token_id=[], temperature=0.7, seed=0)
    assert out.stats["plan"]["entry"]["temperature"] == 0.7 and out.stats["plan"]["mode_from"] == "batch_plan=None"
    forced = dh.SpeculativeDecoder(target, heads, batch_plan={1: "plain"})
    assert forced.mode_for(1, 0.7) == "plain" and forced.batch_plan == {1: "plain"}


def test_a_tree_set_by_hand_on_loaded_heads_replaces_their_table(setup, tmp_path):
    target, *_ = setup
    heads = planned_heads(setup, tmp_path, per_temperature())
    with pytest.deprecated_call():  # the attribute heads carried before plans
        heads.tree = [[0], [0, 0]]
    decoder = dh.SpeculativeDecoder(target, heads)
    assert decoder.mode_for(1, 1.0) == "speculative"
    assert sorted(map(list, decoder.proposer.shape.choices)) == [[0], [0, 0]]


def test_acceptance_tables_at_a_temperature_are_the_tempered_target_probabilities(setup):
    target, heads, prompts = setup
    seqs = list(greedy_reference(target, prompts[:4], 24))
    greedy = head_accuracy_table(target, heads, seqs, 4, skip_prompt=[6] * 4)
    cold = head_accuracy_table(target, heads, seqs, 4, skip_prompt=[6] * 4, temperature=1e-4)
    assert torch.allclose(cold, greedy, atol=1e-3)  # T -> 0: the point mass on the greedy token
    warm = head_accuracy_table(target, heads, seqs, 4, skip_prompt=[6] * 4, temperature=1.0)
    assert (warm.sum(1) <= 1 + 1e-5).all()  # distinct candidates: their probabilities add up to at most 1
    assert (warm[:, 0] < greedy[:, 0]).all()  # sampling accepts the top candidate less often than greedy does


# -- the command ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def medusa_dir(tiny_target_dir, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("temp-heads") / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(path)
    return path


def _calibrate(target_dir, heads_dir, prompts_file, *extra):
    return main(["calibrate", "--target", str(target_dir), "--heads", str(heads_dir), "--prompts", str(prompts_file),
                 "--new-tokens", "4", "--max-nodes", "4", "--num-prompts", "2", "--no-chat-template", *extra])


def test_calibrate_measures_each_temperature_and_keeps_other_device_types(tiny_target_dir, medusa_dir, tmp_path,
                                                                         capsys):
    heads_dir = tmp_path / "heads"
    shutil.copytree(medusa_dir, heads_dir)
    gpu = PlanEntry(tree=[[0]], device_type="cuda", chosen_by="calibrate")
    write_plans(heads_dir, TreePlans((PlanEntry(tree=[[1]], device_type="cpu"), gpu)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(self, x): return\nfor a in b: print(a)\n")
    assert _calibrate(tiny_target_dir, heads_dir, prompts, "--temperatures", "0,0.7", "--batch-sizes", "1,2") == 0
    printed = capsys.readouterr().out
    assert "-- temperature 0 (greedy)" in printed and "-- temperature 0.7" in printed
    assert "batch plan (temperature 0.7;" in printed
    saved = read_plans(heads_dir)
    cpu = sorted((e.temperature, e.batch_size) for e in saved.entries if e.device_type == "cpu")
    assert cpu == [(0.0, 1), (0.0, 2), (0.7, 1), (0.7, 2)]  # the old cpu entry is replaced
    assert [e for e in saved.entries if e.device_type == "cuda"] == [gpu]  # another device type's is kept
    assert all("batch" in e.measured for e in saved.entries if e.device_type == "cpu")
    assert json.loads((heads_dir / "tree.json").read_text())["format_version"] == 4
    # these random heads pay for no tree (root-only, "tree: []"), so lookup alone (the default candidate) is what
    # each size timed against generate, and an entry speculates by it where it won
    assert "tree: []" in printed and "prompt lookup alone (the tree drafts nothing) / plain" in printed and "behind prompt lookup" not in printed
    for e in (e for e in saved.entries if e.device_type == "cpu"):
        assert e.measured["batch"]["lookup_alone"] and e.prompt_lookup == (e.mode == "speculative")
    assert _calibrate(tiny_target_dir, heads_dir, prompts, "--batch-sizes", "1", "--no-prompt-lookup") == 0
    assert "batch plan" not in capsys.readouterr().out  # without lookup a tree that drafts nothing is plain: nothing to time
    greedy = [e for e in read_plans(heads_dir).entries if e.device_type == "cpu"]
    assert [(e.batch_size, e.mode, e.prompt_lookup, "batch" in e.measured) for e in greedy] == [(1, "plain", False, False)]


@pytest.mark.parametrize("value, message", [
    ("0,-1", "temperature '-1' must be >= 0"),
    ("nan", "temperature 'nan' must be a finite number"),
    ("0,hot", "temperature 'hot' is not a number"),
    ("0,0.7,0.7", "temperature '0.7' is given twice"),
])
def test_bad_temperatures_flag_is_refused_naming_the_value(tiny_target_dir, medusa_dir, tmp_path, capsys, value,
                                                           message):
    with pytest.raises(SystemExit):
        _calibrate(tiny_target_dir, medusa_dir, tmp_path / "unused.txt", "--temperatures", value, "--dry-run")
    err = capsys.readouterr().err
    assert "--temperatures" in err and message in err
