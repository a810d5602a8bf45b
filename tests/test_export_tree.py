"""Heads leave training ready to decode fast: the tree (and draft vocabulary) chosen at export,
and the device-type default the decoder uses when a folder has no tree (or one chosen for
another device type). Tiny random models only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import draftheads as dh
from draftheads.plans import PlanEntry, TreePlans, primary, read_plans
from draftheads.inference.proposers.hybrid import LookupThenHeads
from draftheads.inference.default_tree import DYNAMIC_DEFAULTS, large_static_choices, resolve_tree, tree_source
from draftheads.inference.tree import default_choices
from draftheads.tune import training as export_tree
from draftheads.tune.batch_plan import LOOKUP_RESOLUTION

from inference_utils import greedy_reference, self_distilled_heads, tiny_target


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _choices(decoder) -> list[list[int]]:
    """The tree a greedy request drafts (the heads' drafter's, where the plan puts lookup in front)."""
    drafter = decoder.proposer.heads if isinstance(decoder.proposer, LookupThenHeads) else decoder.proposer
    return sorted([list(c) for c in drafter.shape.choices], key=lambda c: (len(c), c))


def read_tree(folder):
    """The greedy batch-1 tree (as JSON holds it) and draft vocabulary of a folder's tree.json."""
    entry = primary(read_plans(folder))
    return entry.tree.to_json(), entry.draft_vocab_size


def _sorted(tree):
    return sorted([list(c) for c in tree], key=lambda c: (len(c), c))


# ---------------------------------------------------------------------------------------------
# The decoder's default: by device type
# ---------------------------------------------------------------------------------------------


def test_the_default_tree_depends_on_the_device_type():
    target = tiny_target("llama")
    medusa = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1)
    eagle = dh.EagleHead.for_target(target)
    assert resolve_tree(medusa, "cpu").to_json() == default_choices(3)
    big = resolve_tree(medusa, torch.device("cuda"))
    assert big.to_json() == large_static_choices(3) and big.nodes > 4 * (len(default_choices(3)) + 1)
    assert big.depth == 3  # one depth per head, never deeper
    dh.SpeculativeDecoder(target, medusa, tree=big)  # a valid tree for these heads (a spec, as resolved)
    dh.SpeculativeDecoder(target, medusa, tree=big.to_json())  # and as JSON holds it
    assert resolve_tree(eagle, "cpu") == DYNAMIC_DEFAULTS["cpu"]
    assert resolve_tree(eagle, "cuda:0").total_tokens > 2 * DYNAMIC_DEFAULTS["cpu"].total_tokens


def test_a_tree_chosen_by_training_applies_on_its_device_type_only(tmp_path):
    target = tiny_target("llama")
    heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1)
    heads.save_pretrained(tmp_path / "h")
    tree_file = tmp_path / "h" / "tree.json"
    chosen = [[0], [0, 0]]

    assert tree_source(heads, "cpu") == "device default"
    tree_file.write_text(json.dumps({"tree": chosen, "chosen_by": "training", "device_type": "cuda"}))
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert _choices(dh.SpeculativeDecoder(target, loaded)) == _sorted(default_choices(3))  # chosen for a GPU
    assert tree_source(loaded, "cpu") == "device default" and tree_source(loaded, "cuda") == "training"
    assert resolve_tree(loaded, "cuda").to_json() == chosen

    tree_file.write_text(json.dumps({"tree": chosen, "chosen_by": "training", "device_type": "cpu"}))
    assert _choices(dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))) == chosen

    tree_file.write_text(json.dumps({"tree": chosen}))  # calibrated: used whatever the device
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert resolve_tree(loaded, "cuda").to_json() == chosen and resolve_tree(loaded, "cpu").to_json() == chosen
    assert tree_source(loaded, "cuda") == "calibration"


def test_a_dynamic_tree_for_another_device_keeps_its_draft_vocabulary():
    target = tiny_target("llama")
    eagle = dh.EagleHead.for_target(target)
    tree = {"total_tokens": 6, "depth": 2, "top_k": 2, "draft_vocab_size": 32}
    eagle.plans = TreePlans((PlanEntry(tree=tree, device_type="cpu", chosen_by="training"),))
    assert resolve_tree(eagle, "cuda").to_json() == {**DYNAMIC_DEFAULTS["cuda"].to_json(), "draft_vocab_size": 32}
    assert resolve_tree(eagle, "cpu").to_json() == tree


# ---------------------------------------------------------------------------------------------
# The tree chosen at export
# ---------------------------------------------------------------------------------------------


def _counted(heads, rows):
    heads.token_counts.zero_()
    heads.token_counts += torch.bincount(torch.cat(rows), minlength=heads.config.vocab_size)
    return heads


def test_static_export_tree_prefers_a_draft_vocabulary_when_projections_are_expensive(monkeypatch):
    target = tiny_target("llama", vocab=512)
    heads, prompts = self_distilled_heads(target, steps=30)
    rows = [r for r in greedy_reference(target, prompts[:6], 40)]
    _counted(heads, rows)
    acc = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.05]]
    seen = []

    def draft_seconds(heads, repeats=20, draft_vocab_size=None):
        seen.append(draft_vocab_size)
        per_head = 1.0 if draft_vocab_size is None else 1e-6  # the whole vocabulary: absurdly slow
        return {d: d * per_head for d in range(heads.config.num_heads + 1)}

    monkeypatch.setattr(export_tree, "measure_draft_seconds", draft_seconds)
    monkeypatch.setattr(export_tree, "VOCAB_SIZES", (256, 128))  # the real ones are for real vocabularies
    data = export_tree.choose_export_tree(target, heads, rows, acc)
    assert seen == [None, 128]  # the whole vocabulary and every size under half of it (512)
    assert data["draft_vocab_size"] == 128 and data["tree"]
    assert data["chosen_by"] == "training" and data["device_type"] == "cpu"
    # acceptance under the restriction is measured, never above the unrestricted table
    assert all(a <= b + 1e-6 for ra, rb in zip(data["accuracy"], acc) for a, b in zip(ra, rb))


def test_static_export_tree_is_what_calibration_would_pick_from_the_training_table(tmp_path):
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target)
    rows = [r for r in greedy_reference(target, prompts[:4], 40)]
    acc = [[0.9, 0.05, 0.02], [0.8, 0.1, 0.05], [0.7, 0.1, 0.05]]  # confident heads: a tree pays
    data = export_tree.choose_export_tree(target, heads, rows, acc)
    assert torch.allclose(torch.tensor(data["accuracy"]), torch.tensor(acc))  # no draft vocabulary: training's table
    assert data["draft_vocab_size"] is None and len(data["verify_seconds"]) >= 8
    heads.save_pretrained(tmp_path / "h")
    (tmp_path / "h" / "tree.json").write_text(json.dumps(data))
    tree, vocab = read_tree(tmp_path / "h")
    assert tree == data["tree"] and vocab is None
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))
    assert _choices(decoder) == _sorted(data["tree"])
    for i in range(4):
        ref = greedy_reference(target, prompts[i : i + 1], 24)
        assert torch.equal(decoder.generate(prompts[i : i + 1], max_new_tokens=24, eos_token_id=[]).sequences, ref)


def test_dynamic_export_tree_is_timed_and_valid(tmp_path):
    target = tiny_target("llama")
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 64, (40,), generator=gen) for _ in range(4)]
    eagle = dh.EagleHead.for_target(target)
    data = export_tree.choose_export_tree(target, eagle, rows)
    settings = {(c["total_tokens"], c["depth"], c["top_k"]) for c in data["calibration"]["candidates"]}
    assert (1, 1, 1) in settings and len(settings) == 9  # plain decoding + the CPU grid (4 trees, 4 chains)
    assert {(2, 1, 1), (3, 2, 1), (6, 5, 1), (8, 7, 1)} <= settings  # the chains of 1, 2, 5 and 7
    eagle.save_pretrained(tmp_path / "e")
    (tmp_path / "e" / "tree.json").write_text(json.dumps(data))
    tree, _ = read_tree(tmp_path / "e")
    assert tree == data["tree"]
    loaded = dh.load_heads(tmp_path / "e", target=target)
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert decoder.proposer.total_tokens == tree["total_tokens"] and decoder.proposer.depth == tree["depth"]
    prompt = rows[0][:8][None]
    ref = greedy_reference(target, prompt, 20)
    assert torch.equal(decoder.generate(prompt, max_new_tokens=20, eos_token_id=[]).sequences, ref)


def test_training_exports_heads_with_a_tree_chosen_by_training(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from transformers import AutoModelForCausalLM

    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    cfg = config_from_dict({
        "target": {"name_or_path": str(tiny_target_dir), "dtype": "float32"},
        "heads": {"num_heads": 3, "num_layers": 1, "lm_head": "own"},
        "data": {"path": str(tiny_text_jsonl), "format": "text", "max_length": 48, "eval_fraction": 0.1,
                 "cache_dir": str(tmp_path / "hf-cache")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 6, "batch_size": 4, "lr": 1e-2,
                  "warmup_steps": 2, "eval_every": 0, "eval_batches": 2, "save_every": 0, "log_every": 3,
                  "labels": "target"},
    }, [])
    result = run(cfg)
    saved = json.loads((result.heads_dir / "tree.json").read_text())
    assert (result.heads_dir / "tree.json").stat().st_mode & 0o044 == 0o044  # readable like the weights
    assert saved["format_version"] == 4
    # greedy, 0.7 and 1.0, chosen by training for its device type, each timed against generate at
    # batch sizes 1, 4 and 8 (a tree that drafts nothing: prompt lookup alone is its one candidate)
    assert [e["temperature"] for e in saved["plans"] if e["batch_size"] == 1] == [0.0, 0.7, 1.0]

    def verdict(entry):
        """What the rule says: the heads alone speculate where their median beats generate; lookup
        in front (or lookup alone) is kept unless the upper end of its 95% interval against that
        choice falls below 1 - LOOKUP_RESOLUTION."""
        batch = entry["measured"]["batch"]
        heads = not batch.get("lookup_alone") and batch["speedup_median"] > batch["min_speedup"]
        lo, hi = batch["lookup_vs"]["interval"]
        kept = hi is None or hi >= 1 - LOOKUP_RESOLUTION
        assert batch["lookup_vs"]["against"] == ("heads alone" if heads else "plain")
        return ("speculative" if heads or kept else "plain"), kept

    for entry in saved["plans"]:
        if entry["batch_size"] > 1:
            assert (entry["mode"], entry.get("prompt_lookup", False)) == verdict(entry)
    assert {(e["temperature"], e["batch_size"]) for e in saved["plans"]} == {
        (t, size) for t in (0.0, 0.7, 1.0) for size in (1, 4, 8)}
    saved["plans"] = [e for e in saved["plans"] if e["batch_size"] == 1]  # what metrics.json summarises
    final = json.loads((Path(cfg.train.output_dir) / "metrics.json").read_text())
    for entry in saved["plans"]:
        assert entry["chosen_by"] == "training" and entry["device_type"] == "cpu"
        assert "draft_vocab_size" in entry and "expected_speedup" in entry["measured"]
        said = final["tree"]["temperatures"][f"{entry['temperature']:g}"]
        assert said["mode"] == entry["mode"]  # metrics.json says what tree.json decided
        batch = entry["measured"]["batch"]  # every tree was timed; the verdict follows the medians
        assert (entry["mode"], entry.get("prompt_lookup", False)) == verdict(entry)
        assert said["vs_generate"]["median"] == batch["speedup_median"]
        if entry["tree"]:
            assert said["vs_generate_behind_lookup"]["median"] == batch["prompt_lookup"]["speedup_median"]
        else:
            assert batch["lookup_alone"] and said["prompt_lookup"] == (entry["mode"] == "speculative")
    assert final["tree"]["plain_temperatures"] == [e["temperature"] for e in saved["plans"] if e["mode"] == "plain"]
    data = {**saved["plans"][0]["measured"], **saved["plans"][0]}
    assert torch.allclose(torch.tensor(data["accuracy"]), torch.tensor(final["final_eval"]["eval/rank_accuracy"]))
    assert final["tree"]["nodes"] == len(data["tree"]) + 1
    assert set(final["tree"]["temperatures"]) == {"0", "0.7", "1"} and final["tree"]["seconds"] > 0
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    loaded = dh.load_heads(result.heads_dir, target=target)
    entry = primary(loaded.plans)
    assert entry.tree.to_json() == data["tree"] and (entry.chosen_by, entry.device_type) == ("training", "cpu")
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert _choices(decoder) == _sorted(data["tree"])
    prompt = torch.tensor([[1, 20, 31, 42, 53]])
    ref = greedy_reference(target, prompt, 24)
    out = decoder.generate(prompt, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences, ref) and out.stats["mode"] == saved["plans"][0]["mode"]


def test_training_chooses_a_tree_per_temperature_timing_few_settings_when_sampling():
    """Greedy, 0.7 and 1.0 by default; at a sampling temperature dynamic heads time only plain
    decoding, the greedy choice and the smallest grid setting (the cost of the extra temperatures
    stays small)."""
    target = tiny_target("llama")
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 64, (40,), generator=gen) for _ in range(4)]
    eagle = dh.EagleHead.for_target(target)
    plans, chosen = export_tree.choose_export_plans(target, eagle, rows)
    assert [(e.temperature, e.device_type, e.chosen_by) for e in plans.entries if e.batch_size == 1] == [
        (0.0, "cpu", "training"), (0.7, "cpu", "training"), (1.0, "cpu", "training")]
    greedy, warm, _ = chosen
    if greedy["tree"]["total_tokens"] == 1:  # plain won greedily: not timed again
        assert warm["tree"] == greedy["tree"] and "skipped" in warm["calibration"]
    else:
        timed = {(c["total_tokens"], c["depth"], c["top_k"]) for c in warm["calibration"]["candidates"]}
        assert (1, 1, 1) in timed and len(timed) <= 3
        assert (greedy["tree"]["total_tokens"], greedy["tree"]["depth"], greedy["tree"]["top_k"]) in timed


def test_training_told_not_to_choose_a_tree_writes_none(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys):
    """train.choose_tree=false: the heads are exported without tree.json (the decoder's device
    default until `draftheads calibrate`), and the run says why."""
    from draftheads.train.loop import run
    from test_train import _cfg  # the tests' training config, choose_tree off

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, eval_every=0, eval_batches=1)
    assert cfg.train.choose_tree is False
    result = run(cfg)
    assert (result.heads_dir / "model.safetensors").is_file() and not (result.heads_dir / "tree.json").exists()
    assert result.metrics["tree"] is None
    assert "tree: not chosen (train.choose_tree is false" in capsys.readouterr().out
