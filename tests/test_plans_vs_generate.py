"""Training's trees meet the target's own `generate`: per temperature (greedy, 0.7, 1.0 by
default) the chosen tree is timed against `generate` through `measure_batch_plan` at batch sizes
1, 4 and 8 (the scripted tests at 1), and an entry is plain unless the median ratio beats
`generate` by a margin. The
timings are scripted (a fake clock that knows which mode ran), so every verdict here is
deterministic and follows from the rule, not from this machine's speed. Tiny random models only."""
from __future__ import annotations

import json
import math

import pytest
import torch

import draftheads as dh
from draftheads.plans import PLAIN, SPECULATIVE, TreePlans, read_plans, write_plans
from draftheads.tune import training
from draftheads.inference.proposers.hybrid import LookupThenHeads
from draftheads.tune.batch_plan import LOOKUP, measure_batch_plan

from inference_utils import greedy_reference, self_distilled_heads, tiny_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TREE = [[0], [0, 0]]


@pytest.fixture(autouse=True)
def _batch_size_one(monkeypatch):
    """The scripted timings below are batch-1 ones; the batch sizes have their own test."""
    monkeypatch.setattr(training, "VS_GENERATE_BATCH_SIZES", (1,))


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, steps=30)
    rows = list(greedy_reference(target, prompts[:6], 12))  # held-out rows of 18 tokens
    return target, heads, rows


class ScriptedClock:
    """A clock for `measure_batch_plan` whose decodes last what the script says: each decode takes
    the next of ``seconds[mode]``, the mode told apart by whether ``target.generate`` ran (what a
    plain decode calls; speculative decoding never does) or a `LookupThenHeads` started (the tree
    behind prompt lookup). ``modes`` records the order they ran."""

    def __init__(self, target, monkeypatch, spec: list[float], plain: list[float], lookup: list[float] = ()):
        self.seconds = {SPECULATIVE: list(spec), PLAIN: list(plain), LOOKUP: list(lookup)}
        self.now, self.calls, self.started_at = 0.0, {PLAIN: 0, LOOKUP: 0}, None
        self.modes: list[str] = []
        real, real_start = target.generate, LookupThenHeads.start

        def counted(*args, **kwargs):
            self.calls[PLAIN] += 1
            return real(*args, **kwargs)

        def counted_start(drafter, *args, **kwargs):
            self.calls[LOOKUP] += 1
            return real_start(drafter, *args, **kwargs)

        monkeypatch.setattr(target, "generate", counted)
        monkeypatch.setattr(LookupThenHeads, "start", counted_start)

    def __call__(self) -> float:
        if self.started_at is None:  # a decode starts
            self.started_at = dict(self.calls)
            return self.now
        ran = [m for m in (PLAIN, LOOKUP) if self.calls[m] > self.started_at[m]]
        mode = ran[0] if ran else SPECULATIVE
        self.started_at = None
        self.modes.append(mode)
        self.now += self.seconds[mode].pop(0)
        return self.now


def scripted(target, monkeypatch, ratios: list[float], lookup: list[float] | None = None) -> ScriptedClock:
    """A clock where prompt i's speculative decode is ``ratios[i]`` times as fast as generate's
    (both decode the same number of tokens), after one warm-up decode per mode; the tree behind
    prompt lookup ``lookup[i]`` times as fast (default: half as fast, so it never wins)."""
    lookup = lookup if lookup is not None else [0.5] * len(ratios)
    return ScriptedClock(target, monkeypatch, spec=[1.0] + [1.0 / r for r in ratios], plain=[1.0] + [1.0] * len(ratios),
                         lookup=[1.0] + [1.0 / r for r in lookup])


# -- the timing rule itself ---------------------------------------------------------------------
def test_the_median_of_per_prompt_ratios_decides_not_the_totals(setup, monkeypatch):
    target, heads, rows = setup
    # three prompts 1.2x faster, one 10x slower: totals say plain (13 s against 4.8 s), the median speculative
    clock = ScriptedClock(target, monkeypatch, spec=[1.0, 1.0, 1.0, 1.0, 12.0], plain=[1.0] + [1.2] * 4)
    result = measure_batch_plan(target, heads, TREE, rows[:4], [1], new_tokens=4, rounds=1, min_speedup=1.05,
                                clock=clock)
    m = result.measured[1]
    assert m["speedup"] < 1 and math.isclose(m["speedup_median"], 1.2)
    assert math.isclose(m["speedup_min"], 0.1) and math.isclose(m["speedup_max"], 1.2)
    assert result.plan == {1: SPECULATIVE} and m["min_speedup"] == 1.05 and m["timed_batches"] == 4
    # warm-up once per mode, then the two modes interleaved prompt by prompt, order alternated
    assert clock.modes == [SPECULATIVE, PLAIN] + [SPECULATIVE, PLAIN, PLAIN, SPECULATIVE] * 2


@pytest.mark.parametrize("min_speedup, mode", [(1.0, SPECULATIVE), (1.05, PLAIN)])
def test_a_gain_inside_the_margin_is_plain(setup, monkeypatch, min_speedup, mode):
    target, heads, rows = setup
    clock = scripted(target, monkeypatch, [1.03, 1.04, 1.02])
    result = measure_batch_plan(target, heads, TREE, rows[:3], [1], new_tokens=4, rounds=1, min_speedup=min_speedup,
                                clock=clock)
    assert math.isclose(result.measured[1]["speedup_median"], 1.03) and result.plan == {1: mode}


@pytest.mark.parametrize("max_seconds, pairs", [(None, 8), (1000.0, 8), (25.0, 3), (65.0, 4)])
def test_a_time_bound_stops_new_pairs_but_keeps_three(setup, monkeypatch, max_seconds, pairs):
    """Every decode takes 10 s: a 25 s bound is spent after 2 pairs but 3 are kept; 65 s after 4."""
    target, heads, rows = setup
    clock = ScriptedClock(target, monkeypatch, spec=[10.0] * 9, plain=[10.0] * 9)
    result = measure_batch_plan(target, heads, TREE, rows[:4], [1], new_tokens=3, rounds=2, clock=clock,
                                max_seconds=max_seconds)
    m = result.measured[1]
    assert m["timed_batches"] == pairs and len(clock.modes) == 2 + 2 * pairs
    assert m["cut_by_time"] == (pairs < 8) and m["timed_seconds"] == 20.0 * pairs


@pytest.mark.parametrize("name, value", [("min_speedup", 0), ("min_speedup", -1.0), ("min_speedup", float("nan")),
                                         ("min_speedup", "1.05"), ("min_speedup", True), ("max_seconds", 0),
                                         ("max_seconds", float("inf"))])
def test_a_bad_margin_or_bound_is_refused_naming_it(setup, name, value):
    target, heads, rows = setup
    with pytest.raises(ValueError, match=name):
        measure_batch_plan(target, heads, TREE, rows[:1], [1], new_tokens=2, rounds=1, **{name: value})


# -- training's choice --------------------------------------------------------------------------
def fixed_trees(monkeypatch, trees: dict[float, object], fail_above: float | None = None) -> list[float]:
    """Replace training's tree search (timed and tested elsewhere) with fixed trees per temperature;
    returns the temperatures it was asked for. ``fail_above``: temperatures above it raise as
    DFlash's do (no tree chosen at T > 0)."""
    asked = []

    def choose(target, heads, rows, rank_accuracy=None, temperature=0.0, greedy_choice=None, timings=None, prompts=None):
        asked.append(temperature)
        if fail_above is not None and temperature > fail_above:
            raise ValueError("greedy only")
        return {"tree": trees[temperature], "draft_vocab_size": None, "temperature": float(temperature),
                "chosen_by": "training", "device_type": target.device.type,
                "expected_tokens_per_step": 1.6, "expected_speedup": 1.3}

    monkeypatch.setattr(training, "choose_export_tree", choose)
    return asked


def scripted_measure(target, monkeypatch, ratios: dict[float, list[float]], calls: list | None = None,
                     lookup: dict[float, list[float]] | None = None):
    """`measure_batch_plan` with each temperature's scripted per-prompt ratios (``lookup``: the
    tree behind prompt lookup's; default: half as fast as generate)."""

    def measure(*args, temperature, **kwargs):
        if calls is not None:
            calls.append((temperature, args[2], args[4], dict(kwargs)))
        kwargs["resolution"] = None  # every scripted pair is timed (early stopping: test_timing_stops_once_settled)
        behind = lookup[temperature] * kwargs["rounds"] if lookup and temperature in lookup else None
        clock = scripted(target, monkeypatch, ratios[temperature] * kwargs["rounds"], behind)
        return measure_batch_plan(*args, temperature=temperature, clock=clock, **kwargs)

    return measure


def test_each_temperature_goes_plain_where_its_tree_loses_to_generate(setup, monkeypatch, tmp_path):
    target, heads, rows = setup
    asked = fixed_trees(monkeypatch, {0.0: TREE, 0.7: TREE, 1.0: [[0]]})
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    monkeypatch.setattr(training, "VS_GENERATE_MAX_SECONDS", 60.0)  # 8 pairs of ~1 s decodes + 2 s lookup ones: uncut
    calls: list = []
    ratios = {0.0: [1.5, 1.4, 1.6, 1.5], 0.7: [0.8, 0.9, 1.2, 0.7], 1.0: [0.97, 0.98, 1.0, 1.03]}
    plans, chosen = training.choose_export_plans(target, heads, rows, measure=scripted_measure(target, monkeypatch,
                                                                                               ratios, calls))
    assert asked == [0.0, 0.7, 1.0]  # greedy, 0.7 and 1.0 by default
    assert [(t, tree, sizes) for t, tree, sizes, _ in calls] == [(0.0, TREE, [1]), (0.7, TREE, [1]), (1.0, [[0]], [1])]
    assert all(kw["min_speedup"] == training.PLAIN_MARGIN and kw["rounds"] == training.VS_GENERATE_ROUNDS
               and kw["max_seconds"] == training.VS_GENERATE_MAX_SECONDS for *_, kw in calls)
    by_temp = {e.temperature: e for e in plans.entries}
    assert [(e.temperature, e.batch_size, e.mode) for e in plans.entries] == [
        (0.0, 1, SPECULATIVE), (0.7, 1, PLAIN), (1.0, 1, PLAIN)]
    assert by_temp[0.7].tree.to_json() == TREE  # a plain entry keeps the tree that lost
    for t, entry in by_temp.items():  # what was measured is kept in the entry, as calibrate keeps it
        batch = entry.measured["batch"]
        assert math.isclose(batch["speedup_median"], sorted(ratios[t])[1] / 2 + sorted(ratios[t])[2] / 2)
        assert batch["timed_batches"] == 4 * training.VS_GENERATE_ROUNDS and batch["seconds"] > 0
        assert batch["min_speedup"] == training.PLAIN_MARGIN and "expected_speedup" in entry.measured

    summary = training.summarize(chosen, seconds=3.0)  # what metrics.json gets
    assert summary["plain_temperatures"] == [0.7, 1.0] and summary["mode"] == SPECULATIVE
    warm = summary["temperatures"]["0.7"]
    assert warm["mode"] == PLAIN and math.isclose(warm["vs_generate"]["median"], 0.85)
    assert warm["text"].startswith("plain decoding (target.generate)") and "0.85x target.generate" in warm["text"]
    assert warm["vs_generate"]["cut_by_time"] is False  # scripted decodes take about a second each
    assert summary["temperatures"]["0"]["vs_generate"]["min"] == pytest.approx(1.4)
    assert summary["vs_generate_seconds"] == pytest.approx(sum(d["batch"]["seconds"] for d in chosen))
    json.dumps(summary)  # metrics.json is JSON

    # the decoder follows it: generate itself at 1.0 (and 0.7), the tree greedily, output unchanged
    heads.save_pretrained(tmp_path / "h")
    write_plans(tmp_path / "h", plans)
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))
    prompt = rows[0][None, :6]  # the random prompt (tokens >= 3: no pad id to mistake for padding)
    hot = decoder.generate(prompt, max_new_tokens=6, temperature=1.0, seed=0, eos_token_id=[])
    assert hot.stats["mode"] == PLAIN and hot.stats["plan"]["entry"]["temperature"] == 1.0
    assert decoder.generate(prompt, max_new_tokens=6, temperature=0.7, seed=0).stats["mode"] == PLAIN
    greedy = decoder.generate(prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
    assert greedy.stats["mode"] == SPECULATIVE
    assert torch.equal(greedy.sequences, greedy_reference(target, prompt, 12))


def test_where_the_tree_behind_prompt_lookup_is_faster_the_entry_says_so(setup, monkeypatch, tmp_path):
    """Each tree is timed alone and behind prompt lookup in the same rounds: greedy, lookup wins
    (1.6x against 1.2x), at 0.7 the heads alone (1.1x against 0.9x), at 1.0 neither beats generate.
    The decoder then drafts lookup-first for greedy requests only, and stays exact."""
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE, 0.7: TREE, 1.0: TREE})
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    ratios = {0.0: [1.2] * 4, 0.7: [1.1] * 4, 1.0: [0.9] * 4}
    lookup = {0.0: [1.6] * 4, 0.7: [0.9] * 4, 1.0: [0.95] * 4}
    calls: list = []
    plans, chosen = training.choose_export_plans(target, heads, rows,
                                                 measure=scripted_measure(target, monkeypatch, ratios, calls, lookup))
    assert all(kw["try_lookup"] is True for *_, kw in calls)
    assert [(e.temperature, e.mode, e.prompt_lookup) for e in plans.entries] == [
        (0.0, SPECULATIVE, True), (0.7, SPECULATIVE, False), (1.0, PLAIN, False)]
    greedy = plans.entries[0].measured["batch"]
    assert greedy["speedup_median"] == pytest.approx(1.2) and greedy["prompt_lookup"]["speedup_median"] == pytest.approx(1.6)
    assert greedy["chosen"] == "heads behind prompt lookup"
    text = training.describe(chosen[0])["text"]
    assert "behind prompt lookup; measured 1.20x target.generate" in text and "behind prompt lookup 1.60x" in text
    assert training.describe(chosen[0])["prompt_lookup"] is True

    heads.save_pretrained(tmp_path / "h")
    write_plans(tmp_path / "h", plans)
    assert json.loads((tmp_path / "h" / "tree.json").read_text())["plans"][0]["prompt_lookup"] is True
    loaded = dh.load_heads(tmp_path / "h", target=target)
    decoder = dh.SpeculativeDecoder(target, loaded)
    assert isinstance(decoder.proposer, LookupThenHeads)  # what one greedy sequence runs
    prompt = torch.cat([rows[0][:6], rows[0][:6]])[None]  # a repeat for the lookup to find
    out = decoder.generate(prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
    assert out.stats["plan"]["prompt_lookup"] == "tree.json" and out.stats["plan"]["entry"]["prompt_lookup"] is True
    assert torch.equal(out.sequences, greedy_reference(target, prompt, 12))
    warm = decoder.generate(prompt, max_new_tokens=4, temperature=0.7, seed=0, eos_token_id=[])
    assert warm.stats["mode"] == SPECULATIVE and "prompt_lookup" not in warm.stats["plan"]
    alone = dh.SpeculativeDecoder(target, loaded, prompt_lookup=False)  # the argument overrides the plan
    assert not isinstance(alone.proposer, LookupThenHeads)
    out = alone.generate(prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
    assert "prompt_lookup" not in out.stats["plan"] and torch.equal(out.sequences, greedy_reference(target, prompt, 12))
    everywhere = dh.SpeculativeDecoder(target, loaded, prompt_lookup=True)
    warm = everywhere.generate(prompt, max_new_tokens=4, temperature=0.7, seed=0, eos_token_id=[])
    assert warm.stats["plan"]["prompt_lookup"] == "prompt_lookup argument"


def test_lookup_stays_in_front_unless_measured_slower(setup, monkeypatch):
    """Lookup in front is not asked to win (its cost where nothing repeats is a few microseconds of
    search): it stays unless its paired ratio to the alternative is below 1 - LOOKUP_RESOLUTION with
    95% confidence. Greedy: lookup ties the heads alone within noise (1.12 +- 0.04 against 1.12):
    kept. 0.7: clearly slower (1.03 against 1.19 on every prompt): the heads alone. 1.0: the heads
    lose to generate and lookup in front is no slower than plain within noise (0.99 +- 0.03): kept,
    so the entry speculates behind lookup instead of going plain."""
    from draftheads.tune.batch_plan import LOOKUP_RESOLUTION

    assert LOOKUP_RESOLUTION == pytest.approx(0.01)
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE, 0.7: TREE, 1.0: TREE})
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    ratios = {0.0: [1.12] * 4, 0.7: [1.19] * 4, 1.0: [0.9] * 4}
    lookup = {0.0: [1.08, 1.16, 1.10, 1.14], 0.7: [1.03] * 4, 1.0: [0.96, 1.02, 0.98, 1.0]}
    plans, chosen = training.choose_export_plans(target, heads, rows,
                                                 measure=scripted_measure(target, monkeypatch, ratios, [], lookup))
    assert [(e.temperature, e.mode, e.prompt_lookup) for e in plans.entries] == [
        (0.0, SPECULATIVE, True), (0.7, SPECULATIVE, False), (1.0, SPECULATIVE, True)]
    greedy, warm, hot = (e.measured["batch"] for e in plans.entries)
    assert greedy["chosen"] == "heads behind prompt lookup" and greedy["lookup_vs"]["against"] == "heads alone"
    assert warm["chosen"] == "heads" and warm["lookup_vs"]["interval"][1] < 1 - LOOKUP_RESOLUTION
    assert hot["chosen"] == "heads behind prompt lookup" and hot["lookup_vs"]["against"] == "plain"
    assert 0 < greedy["lookup_search_share"] < 0.01  # microseconds of search against a step


def test_training_without_prompt_lookup_times_the_heads_alone(setup, monkeypatch):
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE})
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    calls: list = []
    measure = scripted_measure(target, monkeypatch, {0.0: [1.2] * 4}, calls, {0.0: [2.0] * 4})
    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0,), measure=measure,
                                                 try_lookup=False)
    assert calls[0][3]["try_lookup"] is False
    assert [(e.mode, e.prompt_lookup) for e in plans.entries] == [(SPECULATIVE, False)]
    assert "prompt_lookup" not in plans.entries[0].measured["batch"]


def test_a_greedy_tree_that_loses_is_plain_too(setup, monkeypatch):
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE})
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    measure = scripted_measure(target, monkeypatch, {0.0: [0.9, 1.1, 0.95, 1.0]})
    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0,), measure=measure)
    assert [(e.temperature, e.mode) for e in plans.entries] == [(0.0, PLAIN)]
    assert training.summarize(chosen, 1.0)["plain_temperatures"] == [0.0]


def test_a_tree_that_drafts_nothing_is_plain_without_timing(setup, monkeypatch):
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE, 0.7: []})
    calls: list = []
    measure = scripted_measure(target, monkeypatch, {0.0: [1.5] * 4}, calls)
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0, 0.7), measure=measure,
                                                 try_lookup=False)
    assert [c[0] for c in calls] == [0.0]
    assert [(e.temperature, e.mode) for e in plans.entries] == [(0.0, SPECULATIVE), (0.7, PLAIN)]
    assert "batch" not in plans.entries[1].measured and training.describe(chosen[1])["mode"] == PLAIN


def test_a_tree_that_drafts_nothing_times_prompt_lookup_alone(setup, monkeypatch, tmp_path):
    """No tree of the heads pays (root-only trees): prompt lookup alone, the heads drafting nothing
    behind it, is the one candidate against generate. Greedy it wins (1.4x) and the entry
    speculates by lookup alone; at 1.0 it loses (0.9x) and the entry is plain. The decoder then
    drafts greedy requests by lookup alone, exactly."""
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: [], 1.0: []})
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    calls: list = []
    measure = scripted_measure(target, monkeypatch, {0.0: [1.0] * 4, 1.0: [1.0] * 4}, calls,
                               lookup={0.0: [1.4] * 4, 1.0: [0.9] * 4})
    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0, 1.0), measure=measure)
    assert [(c[0], c[1], c[3]["try_lookup"]) for c in calls] == [(0.0, [], True), (1.0, [], True)]
    assert [(e.temperature, e.mode, e.prompt_lookup, e.tree.drafts_nothing) for e in plans.entries] == [
        (0.0, SPECULATIVE, True, True), (1.0, PLAIN, False, True)]
    greedy = plans.entries[0].measured["batch"]
    assert greedy["lookup_alone"] and greedy["chosen"] == "prompt lookup alone" and "prompt_lookup" not in greedy
    assert greedy["speedup_median"] == pytest.approx(1.4) and greedy["timed_batches"] == 8  # 4 prompts, 2 rounds
    assert plans.entries[1].measured["batch"]["chosen"] == "plain"
    assert training.describe(chosen[0])["text"].startswith("prompt lookup alone, the heads drafting nothing")
    hot = training.describe(chosen[1])
    assert hot["mode"] == PLAIN and "prompt lookup alone measured 0.90x" in hot["text"]

    heads.save_pretrained(tmp_path / "h", plans=plans)
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))
    prompt = torch.cat([rows[0][:6], rows[0][:6]])[None]  # a repeat for the lookup to find
    out = decoder.generate(prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, prompt, 12))
    assert out.stats["drafted_by"]["lookup"] > 0 and out.stats["drafted_by"]["heads"] == 0
    assert decoder.generate(prompt, max_new_tokens=4, temperature=1.0, seed=0, eos_token_id=[]).stats["mode"] == PLAIN


def test_a_tree_that_drafts_nothing_has_no_heads_alone_candidate(setup):
    target, heads, rows = setup
    with pytest.raises(ValueError, match="the tree drafts nothing, so it is plain decoding: nothing to time"):
        measure_batch_plan(target, heads, [], rows[:1], [1], new_tokens=2, rounds=1)


def test_where_no_tree_is_chosen_the_greedy_tree_is_timed_there(setup, monkeypatch):
    """DFlash and P-EAGLE choose greedily only: at 0.7 their greedy tree is timed, and goes plain
    there if it loses (before, no entry: 0.7 requests ran the greedy tree untimed)."""
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE}, fail_above=0.0)
    calls: list = []
    measure = scripted_measure(target, monkeypatch, {0.0: [1.5] * 4, 0.7: [0.8] * 4}, calls)
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)
    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0, 0.7), measure=measure)
    assert [(c[0], c[1]) for c in calls] == [(0.0, TREE), (0.7, TREE)]
    assert [(e.temperature, e.mode) for e in plans.entries] == [(0.0, SPECULATIVE), (0.7, PLAIN)]
    assert plans.entries[1].measured["tree_from"].startswith("temperature 0")


def test_a_timing_that_fails_keeps_the_tree_and_says_so(setup, monkeypatch, capsys):
    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE})

    def broken(*args, **kwargs):
        raise RuntimeError("asked for plain decoding but the decoder ran 'speculative'")

    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0,), measure=broken)
    assert [(e.temperature, e.mode) for e in plans.entries] == [(0.0, SPECULATIVE)]
    assert "vs_generate_error" in plans.entries[0].measured
    assert "NOT timed against target.generate" in training.describe(chosen[0])["text"]
    assert "timing the temperature-0 tree against generate failed" in capsys.readouterr().out


def test_the_timed_heads_draft_with_the_entrys_vocabulary_and_are_restored(setup, monkeypatch):
    target, heads, rows = setup
    seen = []
    monkeypatch.setattr(training, "VS_GENERATE_NEW_TOKENS", 4)

    def measure(target, heads, tree, prompts, sizes, **kwargs):
        seen.append((kwargs["draft_vocab_size"], heads.training, [p.shape[0] for p in prompts]))
        raise ValueError("stop here")

    heads.train()
    try:
        training.time_against_generate(target, heads, {"tree": TREE, "draft_vocab_size": 32, "temperature": 0.0},
                                       rows, measure)
    except ValueError:
        pass
    assert heads.training and heads.plans is None  # the heads were timed, never changed
    heads.eval()
    assert seen[0][:2] == (32, False)
    assert len(seen[0][2]) == min(training.VS_GENERATE_ROWS, len(rows))


@pytest.mark.parametrize("temperatures, message", [
    ((0.0, -0.7), "must be >= 0"),
    ((0.0, float("nan")), "finite"),
    ((0.0, 0.7, 0.7), "given twice"),
    ((0.0, "hot"), "not a number"),
])
def test_bad_temperatures_are_refused_before_anything_is_timed(setup, monkeypatch, temperatures, message):
    target, heads, rows = setup
    asked = fixed_trees(monkeypatch, {0.0: TREE, 0.7: TREE})
    with pytest.raises(ValueError, match=message):
        training.choose_export_plans(target, heads, rows, temperatures=temperatures, measure=None)
    assert asked == []


# -- files written before this check -------------------------------------------------------------
def test_a_training_file_from_before_loads_and_is_followed(setup, tmp_path):
    """Version-2 files training wrote before (greedy + 0.7, no figures against generate) load as
    they were: a 1.0 request runs the nearest, 0.7 entry, speculatively."""
    target, heads, rows = setup
    heads.save_pretrained(tmp_path / "h")
    old = {"format_version": 2, "plans": [
        {"device_type": "cpu", "batch_size": 1, "temperature": 0.0, "mode": "speculative", "tree": TREE,
         "draft_vocab_size": None, "chosen_by": "training", "measured": {"expected_speedup": 1.3}},
        {"device_type": "cpu", "batch_size": 1, "temperature": 0.7, "mode": "speculative", "tree": [[0]],
         "draft_vocab_size": None, "chosen_by": "training", "measured": {"expected_speedup": 1.1}}]}
    (tmp_path / "h" / "tree.json").write_text(json.dumps(old))
    assert isinstance(read_plans(tmp_path / "h"), TreePlans)
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))
    out = decoder.generate(rows[0][None, :6], max_new_tokens=4, temperature=1.0, seed=0)
    assert out.stats["mode"] == SPECULATIVE and out.stats["plan"]["entry"]["temperature"] == 0.7
    # and describe() still reads what such a run's chosen data held (no mode, no figures)
    text = training.describe({"tree": TREE, "temperature": 0.7, "draft_vocab_size": None,
                              "expected_tokens_per_step": 1.5, "expected_speedup": 1.2})
    assert text["mode"] == SPECULATIVE and "vs_generate" not in text


def test_training_times_batch_sizes_and_writes_an_entry_for_each(setup, monkeypatch, tmp_path):
    """Batch sizes 1, 4 and 8 are timed against generate (a tree that pays for one sequence can
    lose at 8), and each gets its own entry, which the decoder follows."""
    from draftheads.tune.batch_plan import BatchPlanResult

    target, heads, rows = setup
    fixed_trees(monkeypatch, {0.0: TREE})
    monkeypatch.setattr(training, "VS_GENERATE_BATCH_SIZES", (1, 4, 8))
    verdicts = {1: SPECULATIVE, 4: SPECULATIVE, 8: PLAIN}
    asked = []

    def measure(target, heads, tree, prompts, sizes, **kwargs):
        asked.append(sizes)
        figures = {"speedup_median": 1.2, "speedup_min": 1.1, "speedup_max": 1.3, "timed_batches": 4, "min_speedup": 1.0}
        return BatchPlanResult(plan={s: verdicts[s] for s in sizes}, measured={s: dict(figures) for s in sizes})

    plans, chosen = training.choose_export_plans(target, heads, rows, temperatures=(0.0,), measure=measure)
    assert asked == [[1, 4, 8]]
    assert [(e.batch_size, e.mode) for e in plans.entries] == [(1, SPECULATIVE), (4, SPECULATIVE), (8, PLAIN)]
    assert chosen[0]["mode"] == SPECULATIVE and "expected_speedup" in plans.entries[0].measured
    heads.save_pretrained(tmp_path / "h")
    write_plans(tmp_path / "h", plans)
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "h", target=target))
    assert decoder.drafts.run_for(8, 0.0).mode == PLAIN and decoder.drafts.run_for(4, 0.0).mode == SPECULATIVE
