"""Per-batch-size plans: `calibrate --batch-sizes` saves which batch sizes decode plainly,
`SpeculativeDecoder` follows it (plain = exactly the target's `generate`), users can override it,
`bench --batch-size` shows the mode used, and bad plans are refused naming the key."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, TextStreamer

import draftheads as dh
from draftheads.cli import main
from draftheads.plans import from_json, greedy_batch_plan, mode_for, parse_batch_plan, primary
from draftheads.inference.inputs import left_pad
from draftheads.tune.batch_plan import measure_batch_plan
from draftheads.tune.tables import entries_for

from inference_utils import self_distilled_heads, tiny_target

NEW = 16
PAD = 0


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, steps=40)
    return target, heads, prompts


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad([torch.tensor(r) for r in rows], PAD)


def rows_of(prompts: torch.Tensor, n: int) -> list[list[int]]:
    """``n`` rows of different lengths (so the batch is really padded)."""
    return [prompts[i, i % 3:].tolist() for i in range(n)]


def generate_reference(target, ids, mask, eos=None, new=NEW, **kwargs):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=eos,
                           pad_token_id=PAD, **kwargs)


# -- the rule ----------------------------------------------------------------------------------
def test_mode_follows_the_nearest_measured_size_at_or_below():
    plan = parse_batch_plan({"1": "speculative", "4": "plain", "8": "speculative"})
    assert [mode_for(plan, b) for b in range(1, 11)] == ["speculative"] * 3 + ["plain"] * 4 + ["speculative"] * 3
    # Below the smallest measured size nothing was measured: speculate (what the decoder does without a plan).
    assert [mode_for({4: "plain"}, b) for b in (1, 3, 4, 64)] == ["speculative", "speculative", "plain", "plain"]
    assert mode_for(None, 8) == "speculative"


# -- the decoder follows the plan --------------------------------------------------------------
def test_plain_marked_batch_is_generate_and_says_plain(setup, one_torch_thread):
    target, heads, prompts = setup
    decoder = dh.SpeculativeDecoder(target, heads, batch_plan={1: "speculative", 4: "plain"})
    for n in (4, 5, 9):  # a measured size, one between (follows 4) and one above the largest (follows 4)
        ids, mask = left_padded(rows_of(prompts, n))
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
        assert out.stats["mode"] == "plain", f"batch {n}"
        assert torch.equal(out.sequences, generate_reference(target, ids, mask)), f"batch {n} differs from generate"
        assert out.num_new_tokens == n * NEW and out.mean_accept_length == 1.0


def test_plain_rows_stop_at_their_own_eos_as_generate_pads_them(setup, one_torch_thread):
    target, heads, prompts = setup
    ids, mask = left_padded(rows_of(prompts, 4))
    free = generate_reference(target, ids, mask)[:, ids.shape[1]:].tolist()
    eos = free[0][3]  # row 0 stops at this token's first appearance, the others wherever it comes, if at all
    decoder = dh.SpeculativeDecoder(target, heads, batch_plan={1: "plain"})
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
    assert out.stats["mode"] == "plain"
    assert torch.equal(out.sequences, generate_reference(target, ids, mask, eos=eos))
    expected = [row.index(eos) + 1 if eos in row else NEW for row in free]
    assert out.stats["row_new_tokens"] == expected and expected[0] < NEW


def test_speculative_marked_batch_says_speculative(setup, one_torch_thread):
    target, heads, prompts = setup
    decoder = dh.SpeculativeDecoder(target, heads, batch_plan={1: "speculative", 4: "plain"})
    for n in (1, 3):
        ids, mask = left_padded(rows_of(prompts, n))
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
        assert out.stats["mode"] == "speculative", f"batch {n}"
        assert torch.equal(out.sequences, generate_reference(target, ids, mask))
        assert out.mean_accept_length > 1.0  # drafts were verified: this really was speculation
    single = decoder.generate(prompts[:1], max_new_tokens=NEW, eos_token_id=[])  # the one-row loop
    assert single.stats["mode"] == "speculative"


def test_no_plan_means_speculative_at_every_size(setup, one_torch_thread):
    target, heads, prompts = setup
    ids, mask = left_padded(rows_of(prompts, 8))
    for plan in ("heads", None):  # in-memory heads carry no plan; None ignores any plan
        out = dh.SpeculativeDecoder(target, heads, batch_plan=plan).generate(ids, attention_mask=mask, max_new_tokens=4)
        assert out.stats["mode"] == "speculative"


def test_proposers_take_a_plan_only_from_the_argument(setup, one_torch_thread):
    target, _, prompts = setup
    ids, mask = left_padded(rows_of(prompts, 4))
    lookup = dh.PromptLookupProposer(max_ngram=2, num_tokens=3)
    assert dh.SpeculativeDecoder(target, lookup).batch_plan is None
    out = dh.SpeculativeDecoder(target, lookup, batch_plan={"2": "plain"}).generate(
        ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert out.stats["mode"] == "plain" and torch.equal(out.sequences, generate_reference(target, ids, mask))


def test_plain_sampling_follows_the_callers_generator(setup, one_torch_thread):
    target, heads, prompts = setup
    ids, mask = left_padded(rows_of(prompts, 4))
    decoder = dh.SpeculativeDecoder(target, heads, batch_plan={1: "plain"})

    def sampled(seed):
        return decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, temperature=1.0, top_k=0,
                                eos_token_id=[], generator=torch.Generator().manual_seed(seed)).sequences

    torch.manual_seed(123)
    first = sampled(7)
    torch.manual_seed(456)  # another global RNG state: the caller's generator alone decides
    assert torch.equal(first, sampled(7))
    assert not torch.equal(first, sampled(8))


def test_plain_mode_ignores_the_settings_speculation_ignores(setup, one_torch_thread):
    """A plan must not change what the output means: a repetition penalty in the generation config
    (which speculative decoding does not apply, with a warning) is not applied in plain mode either."""
    target, heads, prompts = setup
    ids, mask = left_padded(rows_of(prompts, 4))
    expected = generate_reference(target, ids, mask)
    target.generation_config.repetition_penalty = 5.0
    try:
        assert not torch.equal(generate_reference(target, ids, mask), expected)  # generate itself would apply it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decoder = dh.SpeculativeDecoder(target, heads, batch_plan={1: "plain"})
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(out.sequences, expected)
        assert target.generation_config.repetition_penalty == 5.0  # the target's config is left as it was
    finally:
        target.generation_config.repetition_penalty = None


def test_streaming_a_plain_batch_is_refused(setup, tiny_tokenizer):
    target, heads, prompts = setup
    ids, mask = left_padded(rows_of(prompts, 2))
    decoder = dh.SpeculativeDecoder(target, heads, batch_plan={1: "plain"})
    with pytest.raises(ValueError, match="one sequence at a time"):
        decoder.generate(ids, attention_mask=mask, max_new_tokens=4, streamer=TextStreamer(tiny_tokenizer))


# -- saved with the heads, loaded back ----------------------------------------------------------
def _save_with_tree_file(heads, path, extra: dict):
    """Heads with a tree file in the shape `calibrate --batch-sizes` wrote before plans per temperature."""
    heads.save_pretrained(path)
    tree_file = path / "tree.json"
    tree_file.write_text(json.dumps({"tree": [[0], [0, 0]], **extra}))
    return tree_file


def test_saved_plan_is_loaded_and_followed(setup, tmp_path, one_torch_thread):
    target, heads, prompts = setup
    _save_with_tree_file(heads, tmp_path / "h", {"batch_plan": {"1": "speculative", "4": "plain"}})
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert greedy_batch_plan(loaded.plans) == {1: "speculative", 4: "plain"}
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert decoder.batch_plan == {1: "speculative", 4: "plain"}
    ids, mask = left_padded(rows_of(prompts, 4))
    assert decoder.generate(ids, attention_mask=mask, max_new_tokens=4).stats["mode"] == "plain"
    assert decoder.generate(prompts[:1], max_new_tokens=4).stats["mode"] == "speculative"
    # The constructor overrides the saved plan either way.
    assert dh.SpeculativeDecoder(target, loaded, batch_plan=None).mode_for(4) == "speculative"
    assert dh.SpeculativeDecoder(target, loaded, batch_plan={1: "plain"}).mode_for(1) == "plain"


def test_folders_without_a_plan_load_unchanged(setup, tmp_path):
    target, heads, _ = setup
    heads.save_pretrained(tmp_path / "h", tree=[[0], [0, 0]])
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert greedy_batch_plan(loaded.plans) is None and primary(loaded.plans).tree == dh.StaticTree.parse([[0], [0, 0]])
    assert dh.SpeculativeDecoder(target, loaded).mode_for(16) == "speculative"


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"4": "fast"}, r"batch_plan\['4'\]: unknown mode 'fast'; valid: 'speculative', 'plain'"),
        ({"four": "plain"}, r"key 'four' is not a whole batch size >= 1"),
        ({"2.5": "plain"}, r"key '2.5' is not a whole batch size"),
        ({"0": "plain"}, r"key '0' is not a whole batch size >= 1"),
        (["plain"], r"must be an object mapping batch sizes"),
        ({}, r"is empty"),
    ],
)
def test_bad_saved_plan_is_refused_naming_file_and_key(setup, tmp_path, plan, message):
    target, heads, _ = setup
    tree_file = _save_with_tree_file(heads, tmp_path / "h", {"batch_plan": plan})
    with pytest.raises(ValueError, match=message) as info:
        dh.load_heads(tmp_path / "h", target=target)
    assert str(tree_file) in str(info.value) and "calibrate --batch-sizes" in str(info.value)


@pytest.mark.parametrize(
    "plan, message",
    [
        ({4: "never"}, r"batch_plan\[4\]: unknown mode 'never'"),
        ({"x": "plain"}, r"key 'x' is not a whole batch size"),
        ({True: "plain"}, r"key True is not a whole batch size"),
        ({4: "plain", "4": "speculative"}, r"batch size 4 is given twice"),
        ("sometimes", r"batch_plan must be 'heads'.*got 'sometimes'"),
    ],
)
def test_bad_plan_argument_is_refused(setup, plan, message):
    target, heads, _ = setup
    with pytest.raises(ValueError, match=message):
        dh.SpeculativeDecoder(target, heads, batch_plan=plan)


# -- measuring a plan --------------------------------------------------------------------------
def test_measured_plan_times_both_modes_at_every_size(setup, one_torch_thread):
    target, heads, prompts = setup
    result = measure_batch_plan(target, heads, [[0], [0, 0]], [prompts[i] for i in range(3)], [2, 1],
                                new_tokens=6, rounds=1)
    assert list(result.plan) == [1, 2]
    for size, m in result.measured.items():
        assert result.plan[size] == ("speculative" if m["speedup_median"] > m["min_speedup"] else "plain")
        assert m["speedup_min"] <= m["speedup_median"] <= m["speedup_max"]
        assert m["timed_batches"] == (3 if size == 1 else 2)  # 3 prompts: 3 batches of 1, 2 (wrapping) of 2
    saved = entries_for([[0], [0, 0]], None, {}, "cpu", 0.0, result)  # what calibrate saves in tree.json
    assert {e.batch_size: e.mode for e in saved} == result.plan
    assert all(e.measured["batch"] == result.measured[e.batch_size] for e in saved)


def test_measured_plan_works_for_dynamic_trees(one_torch_thread):
    target = tiny_target("llama")
    heads = dh.EagleHead.for_target(target).eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 60, (6,), generator=gen) for _ in range(2)]
    result = measure_batch_plan(target, heads, {"total_tokens": 4, "depth": 2, "top_k": 2}, prompts, [1, 2],
                                new_tokens=4, rounds=1)
    assert set(result.plan) == {1, 2} and set(result.plan.values()) <= {"speculative", "plain"}


# -- the command line ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def medusa_dir(tiny_target_dir, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("plan-heads") / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(path)
    return path


def _calibrate(target_dir, heads_dir, prompts_file, *extra):
    return main(["calibrate", "--target", str(target_dir), "--heads", str(heads_dir), "--prompts", str(prompts_file),
                 "--new-tokens", "4", "--max-nodes", "4", "--num-prompts", "3", "--no-chat-template", *extra])


def test_calibrate_with_batch_sizes_saves_a_plan_the_decoder_loads(tiny_target_dir, medusa_dir, tmp_path, capsys,
                                                                   one_torch_thread):
    heads_dir = tmp_path / "heads"
    shutil.copytree(medusa_dir, heads_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(self, x): return\nfor a in b: print(a)\nimport the model\n")
    assert _calibrate(tiny_target_dir, heads_dir, prompts) == 0
    saved = json.loads((heads_dir / "tree.json").read_text())
    assert [e["batch_size"] for e in saved["plans"]] == [1]  # default: one sequence only, as before
    assert _calibrate(tiny_target_dir, heads_dir, prompts, "--batch-sizes", "1,2") == 0
    saved = json.loads((heads_dir / "tree.json").read_text())
    plan = {e["batch_size"]: e["mode"] for e in saved["plans"]}
    assert set(plan) == {1, 2} and set(plan.values()) <= {"speculative", "plain"}
    for entry in saved["plans"]:
        m = entry["measured"]["batch"]
        assert m["speculative_tokens_per_second"] > 0 and m["plain_tokens_per_second"] > 0
        # speculative where the tree beat plain, or where lookup (alone, if the tree drafts nothing) was kept
        assert entry["mode"] == ("speculative" if m["speedup_median"] > m["min_speedup"] or entry.get("prompt_lookup")
                                 else "plain")
    printed = capsys.readouterr().out
    assert "batch 1: per batch" in printed and "batch 2: per batch" in printed
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    loaded = dh.load_heads(heads_dir, target=target)
    assert greedy_batch_plan(loaded.plans) == plan


def test_bad_batch_sizes_flag_is_refused(tiny_target_dir, medusa_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _calibrate(tiny_target_dir, medusa_dir, tmp_path / "unused.txt", "--batch-sizes", "1,x", "--dry-run")
    assert "batch sizes" in capsys.readouterr().err


def test_bench_shows_the_mode_each_batch_size_ran(tiny_target_dir, medusa_dir, tmp_path, capsys, one_torch_thread):
    heads_dir = tmp_path / "heads"
    shutil.copytree(medusa_dir, heads_dir)
    (heads_dir / "tree.json").write_text(json.dumps({"tree": [[0]], "batch_plan": {"1": "speculative", "2": "plain"}}))
    questions = tmp_path / "q.txt"
    questions.write_text("def f(self, x):\nfor x in y:\n")
    out = tmp_path / "bench"
    code = main(["bench", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompt-lookup",
                 "--questions", str(questions), "--batch-size", "1,2", "--batches", "1", "--max-new-tokens", "6",
                 "--warmup", "0", "--no-chat-template", "--no-progress", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["batch"]["1"]["medusa"]["modes"] == ["speculative"]
    assert report["batch"]["2"]["medusa"]["modes"] == ["plain"] and report["batch"]["2"]["medusa"]["all_exact"]
    assert report["methods"][0]["batch_plan"] == {"1": "speculative", "2": "plain"}
    md = (out / "report.md").read_text()
    assert "| 1 | medusa (speculative) |" in md and "| 2 | medusa (plain) |" in md
    assert "| 2 | prompt-lookup |" in md  # no plan: shown as before


def test_measured_plan_takes_a_root_only_tree(setup, one_torch_thread):
    """Calibration may choose no drafts at all (a root-only tree): it is plain decoding, so the one
    candidate left to time is prompt lookup alone (the heads drafting nothing behind it)."""
    target, heads, prompts = setup
    result = measure_batch_plan(target, heads, [], [prompts[0], prompts[1]], [1, 2], new_tokens=4, rounds=1,
                                try_lookup=True)
    assert set(result.plan) == {1, 2}
    for size, mode in result.plan.items():
        m = result.measured[size]
        assert m["lookup_alone"] and "prompt_lookup" not in m and m["timed_batches"] == 2
        assert result.lookup[size] == (mode == "speculative")
        assert m["chosen"] == ("prompt lookup alone" if mode == "speculative" else "plain")
    lines = result.lines()
    assert "prompt lookup alone (the tree drafts nothing) / plain tokens/s" in lines[0]
    verdicts = [line for line in lines[1:] if line.startswith("  batch ")]
    for size, line in zip(sorted(result.plan), verdicts):
        assert line.endswith(f"-> {result.plan[size]}{' by prompt lookup alone' if result.lookup[size] else ''} "
                             "(speculative needs > 1.00x)")
    assert sum("lookup against plain: 95% interval" in line for line in lines) == len(result.plan)


def test_recalibrating_ignores_a_saved_plan(monkeypatch, one_torch_thread):
    """EAGLE tree settings are timed by decoding: a plan from an earlier calibration marking batch 1
    plain must not turn every setting into plain decoding (they would all time the same)."""
    from draftheads.tune.calibrate import calibrate_dynamic_tree

    target = tiny_target("llama")
    heads = dh.EagleHead.for_target(target).eval()
    heads.plans = from_json({"tree": {"total_tokens": 4, "depth": 2, "top_k": 2}, "batch_plan": {"1": "plain"}})
    assert dh.SpeculativeDecoder(target, heads).mode_for(1) == "plain"  # the plan the calibration must ignore

    def no_plain(*args, **kwargs):
        raise AssertionError("calibration decoded plainly because of a saved batch plan")

    monkeypatch.setattr("draftheads.inference.decoder.generate_plain", no_plain)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 60, (1, 6), generator=gen)]
    grid = [{"total_tokens": 4, "depth": 2, "top_k": 2}]
    result = calibrate_dynamic_tree(target, heads, prompts, new_tokens=4, grid=grid, rounds=1)
    assert len(result.candidates) == 2
