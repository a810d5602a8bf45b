"""tree.json, the one table of what to run where: its versioned format, the files of every
earlier writer still loading as they meant, bad files and bad temperatures refused naming the
value, and the rule that picks an entry (device type, nearest temperature, batch size)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import draftheads as dh
from draftheads.plans import (
    FORMAT_VERSION,
    PlanEntry,
    TreePlans,
    from_json,
    parse_temperatures,
    primary,
    read_plans,
    select,
    write_plans,
)

from inference_utils import tiny_target

STATIC = [[0], [1], [0, 0]]
DYNAMIC = {"total_tokens": 6, "depth": 2, "top_k": 2}

# -- the shapes every earlier writer put in tree.json (read off the history of its writers) -----
#: save_pretrained(tree=...) since the first heads format.
SAVED_BY_HAND = {"tree": STATIC}
#: `draftheads calibrate` for static trees, before the restricted draft vocabulary.
CALIBRATED_FIRST = {"tree": STATIC, "expected_tokens_per_step": 1.6, "expected_speedup": 1.3,
                    "accuracy": [[0.6, 0.2], [0.4, 0.1]], "verify_seconds": {"1": 0.01, "4": 0.012},
                    "draft_seconds": {"0": 0.0, "1": 0.001, "2": 0.002}, "device": "cpu", "candidates": []}
#: ... with the draft vocabulary.
CALIBRATED = {**CALIBRATED_FIRST, "draft_vocab_size": 32}
#: ... with `--batch-sizes`.
CALIBRATED_BATCHES = {**CALIBRATED, "batch_plan": {"1": "speculative", "4": "plain"},
                      "batch_plan_measured": {"1": {"speedup_median": 1.4}, "4": {"speedup_median": 0.8}}}
#: `draftheads calibrate` for EAGLE heads (settings, later with a draft vocabulary inside).
CALIBRATED_DYNAMIC = {"tree": {**DYNAMIC, "draft_vocab_size": 32},
                      "calibration": {"tree": DYNAMIC, "tokens_per_second": 50.0, "plain_tokens_per_second": 40.0,
                                      "mean_accept_length": 1.5, "device": "cpu", "candidates": []}}
#: The tree heads left training with.
TRAINED = {**CALIBRATED, "chosen_by": "training", "device_type": "cpu"}
TRAINED_DYNAMIC_ON_GPU = {"tree": DYNAMIC, "calibration": CALIBRATED_DYNAMIC["calibration"],
                          "chosen_by": "training", "device_type": "cuda"}


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def folder_with(heads, path, data) -> "Path":  # noqa: F821
    heads.save_pretrained(path)
    (path / "tree.json").write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("data, tree, vocab, origin, plan", [
    (SAVED_BY_HAND, STATIC, None, {}, None),
    (CALIBRATED_FIRST, STATIC, None, {}, None),
    (CALIBRATED, STATIC, 32, {}, None),
    (CALIBRATED_BATCHES, STATIC, 32, {}, {1: "speculative", 4: "plain"}),
    (TRAINED, STATIC, 32, {"chosen_by": "training", "device_type": "cpu"}, None),
], ids=["saved-by-hand", "calibrated-first", "calibrated", "calibrated-batches", "trained"])
def test_old_static_files_load_as_they_did(target, tmp_path, data, tree, vocab, origin, plan):
    heads = dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1)
    heads.token_counts.copy_(torch.arange(heads.config.vocab_size))  # counted tokens: a draft vocabulary applies
    loaded = dh.load_heads(folder_with(heads, tmp_path / "h", data), target=target)
    with pytest.deprecated_call():  # the attributes heads carried before plans: views of them now
        assert (loaded.tree, loaded.draft_vocab_size, loaded.tree_origin, loaded.batch_plan) == (tree, vocab, origin, plan)
    assert loaded.plans.version == 1
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert sorted(map(list, decoder.proposer.shape.choices)) == sorted(tree)
    assert (decoder.proposer.vocab_ids is None) == (vocab is None)
    # The measurements travel with the entry, and saving the heads again writes the current format.
    assert loaded.plans.entries[0].measured.get("accuracy") == data.get("accuracy")
    loaded.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "tree.json").read_text())
    assert again["format_version"] == FORMAT_VERSION
    assert read_plans(tmp_path / "again").entries == loaded.plans.entries


def test_an_old_batch_plan_without_batch_1_still_speculates_below_its_smallest_size(target, tmp_path):
    heads = dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1)
    loaded = dh.load_heads(folder_with(heads, tmp_path / "h", {**CALIBRATED, "batch_plan": {"4": "plain"}}), target=target)
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert [decoder.mode_for(b) for b in (1, 3, 4, 8)] == ["speculative", "speculative", "plain", "plain"]


@pytest.mark.parametrize("data, device, expected", [
    (CALIBRATED_DYNAMIC, "cpu", {**DYNAMIC, "draft_vocab_size": 32}),
    (TRAINED_DYNAMIC_ON_GPU, "cuda", DYNAMIC),
], ids=["calibrated", "trained-on-gpu"])
def test_old_dynamic_files_load_as_they_did(target, tmp_path, data, device, expected):
    heads = dh.EagleHead.for_target(target)
    loaded = dh.load_heads(folder_with(heads, tmp_path / "e", data), target=target)
    assert primary(loaded.plans).tree.to_json() == expected
    (entry,) = loaded.plans.entries
    assert entry.device_type == (None if device == "cpu" else "cuda") and entry.measured["calibration"]["device"] == "cpu"


def test_the_file_is_parsed_once_per_load(target, tmp_path, monkeypatch):
    heads = dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1)
    folder_with(heads, tmp_path / "h", CALIBRATED_BATCHES)
    reads = []
    original = json.loads

    def counting(text, *args, **kwargs):
        data = original(text, *args, **kwargs)
        if isinstance(data, dict) and ("tree" in data or "plans" in data):
            reads.append(1)
        return data

    monkeypatch.setattr(json, "loads", counting)
    dh.load_heads(tmp_path / "h", target=target)
    assert len(reads) == 1


# -- the current format --------------------------------------------------------------------------
def table() -> TreePlans:
    return TreePlans((
        PlanEntry(tree=[[0]], temperature=0.0, device_type="cpu"),
        PlanEntry(tree=[[0], [1]], temperature=0.7, device_type="cpu", draft_vocab_size=16),
        PlanEntry(tree=None, temperature=1.0, device_type="cpu", mode="plain"),
        PlanEntry(tree=[[0]], temperature=0.0, batch_size=4, device_type="cpu", mode="plain"),
        PlanEntry(tree=[[0], [0, 0]], temperature=0.0, device_type="cuda", chosen_by="training"),
    ))


def test_a_table_round_trips_through_the_file(tmp_path):
    path = write_plans(tmp_path, table())
    data = json.loads(path.read_text())
    assert data["format_version"] == 4 and len(data["plans"]) == 5
    assert "tree" not in data["plans"][2] and data["plans"][3]["tree"] == [[0]]  # a plain entry keeps its timed tree
    assert read_plans(tmp_path) == table()
    assert not list(tmp_path.glob(".tree.json*"))  # written atomically: no temporary left


def _v2(**entry):
    return {"format_version": 2, "plans": [{"tree": [[0]], **entry}]}


@pytest.mark.parametrize("data, message", [
    (_v2(temperature=-0.5), r"plans\[0\]: temperature must be >= 0 .*got -0.5"),
    (_v2(temperature="0.7"), r"plans\[0\]: temperature must be a number .*got str '0.7'"),
    (_v2(temperature=float("nan")), r"plans\[0\]: temperature must be a finite number .*got nan"),
    (_v2(batch_size=0), r"plans\[0\]: batch_size must be a whole number >= 1, got 0"),
    (_v2(batch_size="4"), r"batch_size must be a whole number >= 1, got '4'"),
    (_v2(mode="fast"), r"unknown mode 'fast'; valid: 'speculative', 'plain'"),
    (_v2(device_type="cuda:0"), r"device_type must be a device type such as \"cpu\" or \"cuda\" \(no index\)"),
    (_v2(colour="red"), r"unknown key\(s\) \['colour'\]"),
    ({"format_version": 2, "plans": [{"mode": "speculative"}]}, r"a speculative entry needs a tree"),
    ({"format_version": 2, "plans": [{"tree": [[0]]}, {"tree": [[1]], "temperature": 0}]},
     r"two plans for device type any, batch size 1, temperature 0.0"),
    ({"format_version": 2, "plans": []}, r"'plans' must be a non-empty list"),
    ({"format_version": 2, "plans": [{"tree": [[0]]}], "batch_plan": {"1": "plain"}}, r"unknown key\(s\) \['batch_plan'\]"),
    ({"format_version": 5, "plans": []}, r"format_version 5; this draftheads reads tree files up to version 4: upgrade"),
    ({"format_version": 3, "plans": [{"tree": [[0]], "prompt_lookup": "yes"}]}, r"prompt_lookup must be true or false, got 'yes'"),
    ({"draft_vocab_size": 3}, r"not a valid tree file \(no 'tree' and no 'format_version'\)"),
])
def test_bad_files_are_refused_naming_the_value(data, message):
    with pytest.raises(ValueError, match=message):
        from_json(data, "h/tree.json")


def test_a_bad_tree_in_any_entry_is_refused_at_load_naming_the_entry(target, tmp_path):
    heads = dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1)
    data = {"format_version": 2, "plans": [{"tree": [[0]]}, {"tree": [[0], [0, 0], [0, 0, 0]], "temperature": 0.7}]}
    with pytest.raises(ValueError, match=r"tree.json: plans\[1\] \(any device, batch 1, temperature 0.7\): the tree is "
                                         r"3 deep but the heads have only 2 heads"):
        dh.load_heads(folder_with(heads, tmp_path / "h", data), target=target)


@pytest.mark.parametrize("text, message", [
    ("0,-0.7", r"temperature '-0.7' must be >= 0"),
    ("0,nan", r"temperature 'nan' must be a finite number"),
    ("0,inf", r"temperature 'inf' must be a finite number"),
    ("0,warm", r"temperature 'warm' is not a number"),
    ("0.7,0,0.70", r"temperature '0.70' is given twice"),
    ("0,,1", r"has an empty item"),
])
def test_bad_temperatures_are_refused_naming_the_value(text, message):
    with pytest.raises(ValueError, match=message):
        parse_temperatures(text)


def test_temperatures_are_sorted_and_lists_are_checked_too():
    assert parse_temperatures("1.0, 0,0.7") == [0.0, 0.7, 1.0]
    with pytest.raises(ValueError, match=r"temperature True must be a number"):
        parse_temperatures([0, True])
    with pytest.raises(ValueError, match="no temperatures given"):
        parse_temperatures([])


# -- the rule --------------------------------------------------------------------------------------
def test_the_nearest_measured_temperature_is_picked_ties_to_the_lower():
    t = table()
    assert select(t, "cpu", 1, 0.0).entry.temperature == 0.0
    assert select(t, "cpu", 1, 0.3).entry.temperature == 0.0
    assert select(t, "cpu", 1, 0.35).entry.temperature == 0.0  # halfway between 0 and 0.7: the lower
    assert select(t, "cpu", 1, 0.6).entry.temperature == 0.7
    assert select(t, "cpu", 1, 0.9).entry.mode == "plain"  # nearer 1.0, measured plain
    assert select(t, "cpu", 1, 5.0).entry.temperature == 1.0


def test_the_batch_size_follows_the_nearest_measured_size_at_or_below():
    t = table()
    assert [select(t, "cpu", b, 0.0).entry.batch_size for b in (1, 3, 4, 16)] == [1, 1, 4, 4]
    # At 0.7 only batch 1 was measured: every batch size takes it.
    assert select(t, "cpu", 8, 0.7).entry.batch_size == 1
    below = TreePlans((PlanEntry(tree=[[0]], batch_size=4, device_type="cpu"),))
    assert select(below, "cpu", 2, 0.0).entry.batch_size == 4  # below every measured size: the smallest


def test_entries_of_another_device_type_are_ignored():
    t = table()
    assert select(t, "cuda", 1, 0.7).entry.tree.to_json() == [[0], [0, 0]]  # cuda has only greedy: nearest is 0
    only_gpu = TreePlans((PlanEntry(tree=[[0]], device_type="cuda"),))
    choice = select(only_gpu, "cpu", 1, 0.0)
    assert choice.entry is None and choice.ignored == ("cuda",)
    anywhere = TreePlans((PlanEntry(tree=[[1]]), PlanEntry(tree=[[0]], device_type="cuda")))
    assert select(anywhere, "cpu", 1, 0.0).entry.tree.to_json() == [[1]]  # any-device entries where none is this type's
    assert select(anywhere, "cuda", 1, 0.0).entry.tree.to_json() == [[0]]  # this type's own entries win


def test_measuring_one_device_type_keeps_the_others():
    old = TreePlans((PlanEntry(tree=[[1]]), PlanEntry(tree=[[0]], device_type="cuda"),
                     PlanEntry(tree=[[0]], device_type="cpu", temperature=1.0)))
    new = TreePlans((PlanEntry(tree=[[0], [1]], device_type="cpu"),))
    merged = old.merged(new)
    assert [(e.device_type, e.tree.to_json()) for e in merged.entries] == [("cpu", [[0], [1]]), ("cuda", [[0]])]


def test_temperatures_compare_as_numbers():
    assert math.isclose(parse_temperatures("0.70")[0], 0.7)
    assert torch.tensor(parse_temperatures("0,1")).tolist() == [0.0, 1.0]


def test_a_measurement_that_drafts_nothing_is_a_plain_entry():
    """Calibration or training choosing no draft (EAGLE settings of one token, static rank paths
    []) must run the target's own generate, not root-only steps of the speculative loop."""
    from draftheads.tune.tables import entries_for

    for tree in ({"total_tokens": 1, "depth": 1, "top_k": 1}, []):
        (entry,) = entries_for(tree, None, {}, "cpu", 1.0)
        assert entry.mode == "plain" and entry.temperature == 1.0 and entry.batch_size == 1
    (entry,) = entries_for({"total_tokens": 16, "depth": 5, "top_k": 2}, None, {}, "cpu", 0.0)
    assert entry.mode == "speculative"
    (entry,) = entries_for([[0], [1]], 1024, {}, "cpu", 0.7)
    assert entry.mode == "speculative"
