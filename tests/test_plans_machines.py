"""Plans name the machine they were measured on (tree.json version 4: ``device_name``, the CPU
model or GPU name, part of an entry's key) and keep its verify cost curve (``cost_curves``):
two CPUs of one device type can verify at different costs (on a 2-core EPYC 8 tokens verify
cheaper than 3; on a Xeon every token costs more), so a decoder on another machine follows the
plan but SAYS so, never silently; calibrating replaces only this machine's entries; older files
load as they are."""
from __future__ import annotations

import json

import pytest

import draftheads as dh
from draftheads.device import cpu_name, device_name
from draftheads.plans import CostCurve, PlanEntry, TreePlans, from_json, measured_on, read_plans, select, write_plans
from draftheads.tune.calibrate import cheap_widths, describe_curve, dynamic_grid

from inference_utils import tiny_target

EPYC, XEON = "AMD EPYC", "Intel(R) Xeon(R) CPU @ 2.20GHz"
EPYC_CURVE = {1: 0.057, 2: 0.095, 3: 0.116, 4: 0.087, 8: 0.081, 16: 0.14}  # measured shape (issue 55)
XEON_CURVE = {1: 0.024, 2: 0.0267, 3: 0.0286, 4: 0.0351, 8: 0.040, 16: 0.06}


def machines() -> TreePlans:
    return TreePlans((
        PlanEntry(tree=[[0]], device_type="cpu", device_name=XEON, chosen_by="training"),
        PlanEntry(tree=None, device_type="cpu", device_name=EPYC, mode="plain", chosen_by="training"),
        PlanEntry(tree=[[0], [1]], device_type="cuda", device_name="NVIDIA H100"),
    ), curves=(CostCurve("cpu", XEON_CURVE, XEON, context=256, threads=2, chosen_by="training"),))


def test_entries_of_two_machines_round_trip_with_their_curves(tmp_path):
    write_plans(tmp_path, machines())
    data = json.loads((tmp_path / "tree.json").read_text())
    assert data["format_version"] == 4 and data["plans"][0]["device_name"] == XEON
    assert data["cost_curves"][0]["verify_seconds"]["8"] == pytest.approx(0.040)
    again = read_plans(tmp_path)
    assert again == machines() and again.curve_for("cpu", XEON).relative()[8] == pytest.approx(0.040 / 0.024)


def test_a_request_runs_this_machines_entry_and_another_machines_is_named():
    plans = machines()
    assert select(plans, "cpu", 1, 0.0, EPYC).entry.mode == "plain"  # this machine's own
    assert select(plans, "cpu", 1, 0.0, EPYC).measured_on is None
    other = select(plans, "cpu", 1, 0.0, "AMD Ryzen 9")  # no entry of its own: followed, and named
    assert other.entry.device_name == EPYC and other.measured_on == EPYC  # the first by name
    assert measured_on(plans, "cpu", XEON) is None and measured_on(plans, "cpu", "AMD Ryzen 9") == EPYC


def test_a_decoder_on_another_cpu_says_it_follows_a_plan_measured_elsewhere(tmp_path, one_torch_thread):
    target = tiny_target("llama")
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    heads.save_pretrained(tmp_path / "h")
    other = "Some Other CPU" if cpu_name() != "Some Other CPU" else "Yet Another CPU"
    write_plans(tmp_path / "h", TreePlans((PlanEntry(tree=[[0]], device_type="cpu", device_name=other),)))
    loaded = dh.load_heads(tmp_path / "h", target=target)
    with pytest.warns(UserWarning, match=rf"cpu plans measured on '{other}', not on this machine .*run `draftheads "
                                         r"calibrate` here"):
        decoder = dh.SpeculativeDecoder(target, loaded)
    out = decoder.generate(target.dummy_inputs["input_ids"][:1, :4] + 3, max_new_tokens=3, eos_token_id=[])
    assert out.stats["plan"]["measured_on"] == other
    # measured here: no warning, nothing said
    write_plans(tmp_path / "h", TreePlans((PlanEntry(tree=[[0]], device_type="cpu", device_name=device_name("cpu")),)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        here = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))
    assert "measured_on" not in here.generate(target.dummy_inputs["input_ids"][:1, :4] + 3, max_new_tokens=3,
                                              eos_token_id=[]).stats["plan"]


def test_measuring_on_one_machine_replaces_its_entries_and_keeps_the_others():
    fresh = TreePlans((PlanEntry(tree=[[1]], device_type="cpu", device_name=EPYC),),
                      curves=(CostCurve("cpu", EPYC_CURVE, EPYC),))
    older = TreePlans(machines().entries + (PlanEntry(tree=[[0]], device_type="cpu", temperature=0.7),),
                      curves=machines().curves)
    merged = older.merged(fresh)
    keys = sorted((e.device_type, e.device_name or "-", e.mode) for e in merged.entries)
    # EPYC's entry replaced, the Xeon's and the GPU's kept, the cpu entry naming no machine superseded
    assert keys == [("cpu", EPYC, "speculative"), ("cpu", XEON, "speculative"), ("cuda", "NVIDIA H100", "speculative")]
    assert {c.device_name for c in merged.curves} == {EPYC, XEON}


def test_version_3_files_load_and_name_no_machine():
    data = {"format_version": 3, "plans": [{"device_type": "cpu", "tree": [[0]], "prompt_lookup": True}]}
    plans = from_json(data)
    assert plans.entries[0].device_name is None and plans.curves == ()
    assert select(plans, "cpu", 1, 0.0, EPYC).measured_on is None  # nothing recorded: nothing to say
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['device_name'\]"):  # version 3 had no machines
        from_json({"format_version": 3, "plans": [{"tree": [[0]], "device_name": EPYC}]})


@pytest.mark.parametrize("curve, message", [
    ({"device_type": "cpu", "verify_seconds": {}}, "verify_seconds must be a non-empty object"),
    ({"device_type": "cpu", "verify_seconds": {"0": 0.1}}, r"verify_seconds\['0'\] must map a width >= 1"),
    ({"device_type": "cpu", "verify_seconds": {"2": -1}}, r"verify_seconds\['2'\] must map a width >= 1 to seconds > 0"),
    ({"device_type": "cpu", "verify_seconds": {"1": 0.1}, "threads": 0}, "threads must be a whole number >= 1"),
    ({"verify_seconds": {"1": 0.1}}, "device_type must be a device type"),
    ({"device_type": "cpu", "verify_seconds": {"1": 0.1}, "colour": 1}, r"unknown key\(s\) \['colour'\]"),
])
def test_bad_cost_curves_are_refused_naming_the_value(curve, message):
    with pytest.raises(ValueError, match=message):
        from_json({"format_version": 4, "plans": [{"tree": [[0]]}], "cost_curves": [curve]}, "h/tree.json")


def test_the_widths_timed_come_from_this_machines_curve():
    # the EPYC: 2, 3 and 4 tokens verify dearer than 8, so only 8 and 16 are worth drafting to
    assert cheap_widths(EPYC_CURVE) == [8, 16]
    assert cheap_widths(XEON_CURVE) == [2, 3, 4, 8, 16]  # every token costs more: every width
    epyc = dynamic_grid("cpu", False, EPYC_CURVE)
    assert {g["total_tokens"] for g in epyc} == {8, 16}
    assert {"total_tokens": 8, "depth": 7, "top_k": 1, "draft_vocab_size": None} in epyc  # a chain of 7
    assert {"total_tokens": 8, "depth": 3, "top_k": 3, "draft_vocab_size": None} in epyc  # a tree of 8
    xeon = dynamic_grid("cpu", False, XEON_CURVE)
    assert {"total_tokens": 2, "depth": 1, "top_k": 1, "draft_vocab_size": None} in xeon  # a chain of one
    assert {g["total_tokens"] for g in xeon} == {2, 3, 4, 8}  # at most 4 widths, each within 2.5x one token
    costly = dynamic_grid("cpu", False, {1: 0.01, 2: 0.011, 3: 0.012, 4: 0.013, 6: 0.014, 8: 0.03, 16: 0.04})
    assert {g["total_tokens"] for g in costly} == {2, 3, 4, 6}
    text = describe_curve(CostCurve("cpu", EPYC_CURVE, EPYC, context=256, threads=2))
    assert text.startswith("verify cost on cpu (AMD EPYC, 2 threads, 256-token cache) by tree width: 1: 57.0 ms")
    assert "3: 2.04x" in text and "8: 1.42x" in text
