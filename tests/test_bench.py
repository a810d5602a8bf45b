"""`draftheads bench` end to end on a tiny random model, its metrics, and its bad-input errors."""
from __future__ import annotations

import copy
import statistics
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import draftheads as dh
from draftheads.bench.methods import heads_method_names, resolve_compare
from draftheads.bench.metrics import acceptance_by_depth, summarize
from draftheads.bench.questions import Question, load_questions, select
from draftheads.bench.runner import Sample, encode_turn
from draftheads.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def heads_dir(tiny_target_dir, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("bench-heads") / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(path)
    return path


@pytest.fixture
def questions_file(tmp_path):
    """Two questions in two categories; the first has two turns (answered turn by turn)."""
    path = tmp_path / "questions.jsonl"
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["def f(self, x):", "for x in y:"]},
        {"question_id": 161, "category": "code", "turns": ["import the model"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bench(target_dir, *extra):
    return main(["bench", "--target", str(target_dir), "--max-new-tokens", "8", "--no-chat-template", "--no-progress",
                 *map(str, extra)])


def test_bench_end_to_end_writes_report_and_plots(tiny_target_dir, heads_dir, questions_file, tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()  # exists: allowed with --overwrite
    (out / "report.md").write_text("stale")
    code = _bench(tiny_target_dir, "--heads", heads_dir, "--prompt-lookup", "--draft-model", tiny_target_dir,
                  "--questions", questions_file, "--out", out, "--overwrite", "--warmup", "1", "--seed", "3")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    env = report["environment"]
    for key in ("device", "dtype", "torch", "transformers", "draftheads", "cpu", "gpu", "torch_threads"):
        assert key in env
    assert env["dtype"] == "float32" and env["device"] == "cpu"
    import draftheads
    assert env["draftheads_path"] == str(Path(draftheads.__file__).resolve().parent)  # which checkout ran
    assert report["args"]["max_new_tokens"] == 8 and report["settings"]["seed"] == 3
    assert [m["name"] for m in report["methods"]] == ["medusa", "draft-model", "prompt-lookup"]
    medusa = report["methods"][0]
    assert medusa["proposer"] == "MedusaDrafter" and medusa["tree_nodes"] == len(medusa["tree"]) + 1
    assert report["questions"]["categories"] == ["writing", "code"]
    assert report["questions"]["questions"] == 2 and report["questions"]["samples"] == 3

    # 3 turns x (plain + 3 methods), every method's output equal to plain greedy generate
    assert len(report["samples"]) == 12
    assert report["all_exact"] is True
    results = report["results"]
    assert set(results) == {"plain", "medusa", "draft-model", "prompt-lookup"}
    plain = results["plain"]["by_category"]["overall"]
    assert plain["mean_accepted_tokens"] == 1.0 and plain["speedup"] == pytest.approx(1.0)
    # the draft budget's steps by mode, per sample and summed per method (plain generate has none)
    assert plain["budget_steps"] is None
    for name in ("medusa", "draft-model", "prompt-lookup"):
        steps = results[name]["by_category"]["overall"]["budget_steps"]
        mine = [x for x in report["samples"] if x["method"] == name]
        assert steps == {m: sum(x["stats"][f"budget_{m}"] for x in mine) for m in ("full", "capped", "plain")}
        assert sum(steps.values()) == sum(len(x["accept_lengths"]) for x in mine)
    for name in ("medusa", "draft-model", "prompt-lookup"):
        per = results[name]
        assert set(per["by_category"]) == {"overall", "writing", "code"}
        overall = per["by_category"]["overall"]
        assert overall["samples"] == 3 and overall["exact"] == 3 and overall["exact_of"] == 3
        assert overall["mean_accepted_tokens"] >= 1.0 and overall["tokens_per_second"] > 0 and overall["speedup"] > 0
        assert set(overall["per_sample_speedup"]) == {"median", "min", "q1", "q3", "max"}
        hist = {int(k): v for k, v in per["accept_length_histogram"].items()}
        assert sum(hist.values()) == overall["steps"] > 0
        assert all(0.0 <= v <= 1.0 for v in per["acceptance_by_depth"].values())
    for s in report["samples"]:
        assert s["new_tokens"] == 8 or s["new_tokens"] < 8  # eos may stop early, never more
        if s["method"] != "plain":
            assert sum(s["accept_lengths"]) + 1 >= s["new_tokens"]  # + the prefill's first token
        # decoding alone is timed from the end of the prefill, for plain generate as for every method
        assert 0 < s["decode_seconds"] < s["seconds"], s
    for name in ("medusa", "draft-model", "prompt-lookup"):
        overall = results[name]["by_category"]["overall"]
        assert overall["decode_speedup"] > 0 and set(overall["per_sample_decode_speedup"]) == {"median", "min", "q1",
                                                                                                 "q3", "max"}

    assert report["plots"] == ["speedup_by_category.png", "accept_lengths.png", "acceptance_by_depth.png"]
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    md = (out / "report.md").read_text()
    assert "| method | mean accepted tokens | tokens/s | speedup |" in md
    assert "| medusa |" in md and "| prompt-lookup |" in md and "| writing |" in md
    assert "every output equals plain greedy" in md
    assert "## Decoding alone (prefill and the first token excluded)" in md and "| decode-only speedup |" in md
    assert "| plain | 1.00 |" in capsys.readouterr().out


def test_bench_flags_outputs_that_differ_from_plain(tiny_target_dir, questions_file, tmp_path, monkeypatch, capsys):
    """The exactness check can fail: a decoder that changes one token is reported as inexact."""
    original = dh.SpeculativeDecoder.generate

    def off_by_one(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        out.sequences[0, -1] = (out.sequences[0, -1] + 1) % self.target.config.vocab_size
        return out

    monkeypatch.setattr(dh.SpeculativeDecoder, "generate", off_by_one)
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--compare", "prompt-lookup", "--questions", questions_file, "--out", out,
                  "--warmup", "0", "--categories", "code") == 0
    report = json.loads((out / "report.json").read_text())
    assert report["all_exact"] is False
    assert report["results"]["prompt-lookup"]["by_category"]["overall"]["exact"] == 0
    assert "differ from plain greedy" in (out / "report.md").read_text()
    assert "some outputs differ" in capsys.readouterr().err


def test_metrics_follow_spec_bench_definitions():
    """Speedup = mean of per-sample rates / mean of plain's (not the mean of ratios); mean
    accepted tokens pools every step; depth d is reached by steps committing >= d + 1 tokens."""
    def sample(method, qid, seconds, accept=(), exact=None):
        return Sample(question_id=qid, category="c", turn=0, method=method, prompt_tokens=4, new_tokens=10,
                      seconds=seconds, accept_lengths=list(accept), exact=exact)

    samples = [
        sample("plain", "a", 1.0), sample("plain", "b", 0.5),
        sample("m", "a", 0.5, (3, 1, 3, 2), True), sample("m", "b", 0.5, (1, 1), True),
    ]
    results = summarize(samples, ["m"], ["c"])
    m = results["m"]["by_category"]["overall"]
    assert m["tokens_per_second"] == pytest.approx(20.0)
    assert m["speedup"] == pytest.approx(20.0 / 15.0)  # mean of ratios would be (2 + 1) / 2
    assert m["per_sample_speedup"]["median"] == pytest.approx(1.5)
    assert m["per_sample_speedup"]["min"] == pytest.approx(1.0) and m["per_sample_speedup"]["max"] == pytest.approx(2.0)
    assert m["mean_accepted_tokens"] == pytest.approx(11 / 6)
    assert m["exact"] == 2 and m["exact_of"] == 2
    assert results["plain"]["by_category"]["overall"]["mean_accepted_tokens"] == 1.0
    assert results["m"]["accept_length_histogram"] == {"1": 3, "2": 1, "3": 2}
    assert acceptance_by_depth({1: 3, 2: 1, 3: 2}) == {1: pytest.approx(0.5), 2: pytest.approx(1 / 3)}


def test_decode_only_speedup_leaves_prefill_and_short_answers_out():
    """At temperature > 0 a method and plain sample different answers: a method whose answer ended
    after 2 tokens reads slow by tokens/s (its prefill dominates) but decodes as fast as plain; a
    1-token answer has no decoding to time, and samples timed before decode_seconds existed have none."""
    def sample(method, qid, new_tokens, seconds, decode_seconds):
        return Sample(question_id=qid, category="c", turn=0, method=method, prompt_tokens=4, new_tokens=new_tokens,
                      seconds=seconds, decode_seconds=decode_seconds)

    samples = [sample("plain", "a", 101, 1.1, 1.0), sample("m", "a", 3, 0.12, 0.02),  # both 100 tokens/s decoding
               sample("plain", "b", 101, 1.1, 1.0), sample("m", "b", 1, 0.1, 0.0),  # nothing to time after the first
               sample("plain", "c", 101, 1.1, 1.0), sample("m", "c", 51, 0.6, None)]  # not measured
    m = summarize(samples, ["m"], ["c"])["m"]["by_category"]["overall"]
    assert m["per_sample_speedup"]["min"] < 0.3  # what tokens/s says of the short answers
    assert m["decode_speedup"] == pytest.approx(1.0)
    assert m["per_sample_decode_speedup"]["min"] == m["per_sample_decode_speedup"]["max"] == pytest.approx(1.0)
    assert Sample("a", "c", 0, "m", 4, 1, 0.1, decode_seconds=0.0).decode_tokens_per_second is None


@pytest.mark.parametrize("decoder", ["generate", "speculative", "speculative batch"])
def test_prefill_clock_stops_at_the_first_target_forward(tiny_llama, decoder):
    """The decode-only clock reads the end of the first target forward (the prefill), for plain
    `generate`, the speculative decoder and a batch alike, and leaves no hook behind."""
    import time

    from draftheads.bench.clock import PrefillClock

    ends: list[float] = []
    recorder = tiny_llama.register_forward_hook(lambda *_: ends.append(time.perf_counter()))
    ids = torch.tensor([[1, 5, 6, 7, 5, 6]] * (2 if decoder == "speculative batch" else 1))
    with PrefillClock(tiny_llama) as clock:
        if decoder == "generate":
            tiny_llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        else:
            dh.SpeculativeDecoder(tiny_llama, dh.PromptLookupProposer()).generate(ids, max_new_tokens=6)
    recorder.remove()
    assert len(ends) >= 2 and ends[0] <= clock.ended <= ends[1]
    assert clock.decode_seconds(ends[-1]) == pytest.approx(ends[-1] - clock.ended)
    assert not tiny_llama._forward_hooks
    with PrefillClock(tiny_llama) as idle:
        pass
    assert idle.ended is None and idle.decode_seconds(1.0) is None


def test_batch_reports_from_before_decode_timing_still_render():
    """Runs recorded without decode timing give no decode-only ratio, shown as n/a."""
    from draftheads.bench.batch import batch_markdown, summarize_batch

    run = {"plain": {"seconds": 1.0, "new_tokens": 10},
           "m": {"seconds": 0.5, "new_tokens": 10, "mean_accept_length": 2.0, "exact": True}}
    res = summarize_batch([run], ["m"])
    assert res["m"]["speedup_median"] == pytest.approx(2.0) and res["m"]["decode_speedup_median"] is None
    assert "| 2.00x [2.00-2.00] | n/a |" in batch_markdown({"1": res}, ["m"])


def test_multi_turn_prompts_carry_earlier_answers(tiny_tokenizer):
    q = Question("1", "writing", ("first question", "second question"))
    tok = tiny_tokenizer
    raw = tok.decode(encode_turn(tok, q, 1, ["the answer"], use_chat_template=False)[0], skip_special_tokens=True)
    assert raw.index("first") < raw.index("answer") < raw.index("second")
    with pytest.raises(ValueError, match="no-chat-template"):
        encode_turn(tok, q, 0, [], use_chat_template=True)
    chat_tok = copy.deepcopy(tok)
    chat_tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}assistant:"
    text = chat_tok.decode(encode_turn(chat_tok, q, 1, ["the answer"], use_chat_template=True)[0])
    assert text.count("user") == 2 and text.count("assistant") == 2
    assert text.index("first") < text.index("answer") < text.index("second") < text.rindex("assistant")


def test_select_round_robins_over_categories():
    qs = [Question(str(i), c, ("x",)) for i, c in enumerate(["a", "a", "a", "b", "b", "c"])]
    assert [q.question_id for q in select(qs, None, 4)] == ["0", "1", "3", "5"]
    assert [q.question_id for q in select(qs, ["b", "c"], None)] == ["3", "4", "5"]


def test_method_names_follow_head_types(heads_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for f in heads_dir.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    assert heads_method_names([str(heads_dir)]) == ["medusa"]
    assert heads_method_names([str(heads_dir), str(other)]) == ["medusa:heads", "medusa:other"]
    assert resolve_compare(None, ["medusa"], None, True) == ["medusa", "prompt-lookup"]
    assert resolve_compare(["plain", "prompt-lookup", "medusa"], ["medusa"], None, False) == ["prompt-lookup", "medusa"]
    assert resolve_compare(["medusa+lookup", "medusa"], ["medusa"], None, False) == ["medusa+lookup", "medusa"]
    assert resolve_compare(["medusa-lookup"], ["medusa"], None, False) == ["medusa-lookup"]
    assert resolve_compare(["prompt-lookup@block", "medusa+lookup@block"], ["medusa"], None, False) == [
        "prompt-lookup@block", "medusa+lookup@block"]
    with pytest.raises(ValueError, match="unknown method 'medusa@typical'"):  # lossy rules are not benchmarked
        resolve_compare(["medusa@typical"], ["medusa"], None, False)
    with pytest.raises(ValueError, match="draft-model needs --draft-model"):
        resolve_compare(["draft-model@block"], ["medusa"], None, False)


def test_block_suffix_reaches_generate_and_the_report(tiny_target_dir, heads_dir, questions_file, tmp_path, monkeypatch):
    """NAME@block decodes NAME with `generate(..., acceptance="block")`, beside NAME's default rule
    in the same run, and stays exact at greedy."""
    seen = []
    original = dh.SpeculativeDecoder.generate

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("acceptance"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(dh.SpeculativeDecoder, "generate", recording)
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--heads", heads_dir, "--prompt-lookup",
                  "--compare", "prompt-lookup,prompt-lookup@block,medusa-lookup@block",
                  "--questions", questions_file, "--warmup", "0", "--out", out) == 0
    report = json.loads((out / "report.json").read_text())
    assert [(m["name"], m["acceptance"]) for m in report["methods"]] == [
        ("prompt-lookup", "exact"), ("prompt-lookup@block", "block"), ("medusa-lookup@block", "block")]
    assert report["methods"][2]["prompt_lookup"] is False and report["all_exact"] is True
    assert seen.count("block") == 2 * seen.count("exact") > 0  # every timed call, in the same run


def test_bench_heads_behind_prompt_lookup(tiny_target_dir, heads_dir, questions_file, tmp_path):
    """NAME+lookup benches those heads with prompt lookup in front, NAME-lookup the heads alone and
    NAME as their tree.json says (it holds no lookup here): exact like every method."""
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--heads", heads_dir, "--compare", "medusa+lookup,medusa,medusa-lookup",
                  "--questions", questions_file, "--warmup", "0", "--out", out) == 0
    report = json.loads((out / "report.json").read_text())
    hybrid, medusa, alone = report["methods"]
    assert hybrid["name"] == "medusa+lookup" and hybrid["prompt_lookup"] is True
    assert hybrid["proposer"] == "MedusaDrafter+PromptLookup" and hybrid["tree"] == medusa["tree"]
    assert medusa["prompt_lookup"] == "as tree.json says" and medusa["proposer"] == "MedusaDrafter"
    assert alone["prompt_lookup"] is False and alone["proposer"] == "MedusaDrafter"
    assert report["all_exact"] is True


# --- bad input: each is refused before any model is loaded ----------------------------------

def test_malformed_row_names_file_and_line(tiny_target_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["ok"]}\n\n{"question_id": 2, "turns": "not a list"}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:3: 'turns' must be a non-empty list"):
        _bench(tiny_target_dir, "--prompt-lookup", "--questions", bad, "--out", tmp_path / "r")
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["ok"]}\n{not json\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:2 is not valid JSON"):
        _bench(tiny_target_dir, "--prompt-lookup", "--questions", bad, "--out", tmp_path / "r")
    bad.write_text('{"question_id": 1, "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: question_id '1' already used on line 1"):
        load_questions(bad)
    assert not (tmp_path / "r").exists()


def test_unknown_category_lists_valid_ones(tiny_target_dir, questions_file, tmp_path):
    with pytest.raises(SystemExit, match="unknown category poetry; valid categories: writing, code"):
        _bench(tiny_target_dir, "--prompt-lookup", "--questions", questions_file, "--categories", "code,poetry",
               "--out", tmp_path / "r")


def test_existing_output_folder_is_refused_without_overwrite(tiny_target_dir, questions_file, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "report.json").write_text("{}")
    with pytest.raises(SystemExit, match="already exists: pass --overwrite"):
        _bench(tiny_target_dir, "--prompt-lookup", "--questions", questions_file, "--out", out)
    assert (out / "report.json").read_text() == "{}"


def test_unknown_or_unconfigured_method_is_refused(tiny_target_dir, questions_file, tmp_path):
    with pytest.raises(SystemExit, match="unknown method 'eagle'.*available: draft-model, prompt-lookup"):
        _bench(tiny_target_dir, "--compare", "eagle", "--questions", questions_file, "--out", tmp_path / "r")
    with pytest.raises(SystemExit, match="draft-model needs --draft-model"):
        _bench(tiny_target_dir, "--compare", "draft-model", "--questions", questions_file, "--out", tmp_path / "r")
    with pytest.raises(SystemExit, match="nothing to compare"):
        _bench(tiny_target_dir, "--questions", questions_file, "--out", tmp_path / "r")


def test_sampling_run_skips_exactness_and_text_prompt_files(tiny_target_dir, tmp_path):
    """At temperature > 0 draws differ from generate's, so exactness is not claimed either way;
    a .txt file gives one single-turn prompt per non-empty line."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(self, x):\n\nfor x in y:\n")
    assert [q.turns for q in load_questions(prompts)] == [("def f(self, x):",), ("for x in y:",)]
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--prompt-lookup", "--questions", prompts, "--temperature", "0.8",
                  "--warmup", "0", "--out", out) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["all_exact"] is None and report["settings"]["temperature"] == 0.8
    assert all(s["exact"] is None for s in report["samples"])
    assert "not checked (temperature > 0" in (out / "report.md").read_text()


def test_bench_batch_sizes_compare_with_plain_batched_generate(tiny_target_dir, heads_dir, questions_file, tmp_path, capsys):
    out = tmp_path / "batched"
    code = _bench(tiny_target_dir, "--heads", heads_dir, "--prompt-lookup", "--questions", questions_file,
                  "--batch-size", "1,2", "--batches", "1", "--out", out, "--warmup", "0")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "batch" and list(report["batch"]) == ["1", "2"]
    for size in ("1", "2"):
        res = report["batch"][size]
        assert res["plain"]["tokens_per_second"] > 0
        for name in ("medusa", "prompt-lookup"):
            assert res[name]["all_exact"] is True and res[name]["speedup_median"] > 0
            assert res[name]["decode_speedup_median"] > 0
        for run in res["runs"]:  # decoding alone: the tokens after each row's first, timed after the prefill
            for side in ("plain", "medusa", "prompt-lookup"):
                assert 0 < run[side]["decode_seconds"] < run[side]["seconds"], (size, side)
                assert run[side]["decode_tokens"] == run[side]["new_tokens"] - int(size)
    assert len(report["batch"]["2"]["runs"]) == 1
    md = (out / "report.md").read_text()
    assert "| 2 | prompt-lookup |" in md and "| decoding alone |" in md


@pytest.mark.parametrize("sizes", ["0,4", "four", ","])
def test_bad_batch_sizes_are_refused(tiny_target_dir, sizes, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench(tiny_target_dir, "--prompt-lookup", "--batch-size", sizes, "--out", tmp_path / "x")
    assert "batch sizes" in capsys.readouterr().err


# --- --rounds N: every prompt (and batch) timed N times per method ----------------------------

def _per_question_by_hand(samples, method):
    """Total tokens / total seconds over a turn's rounds, against plain's on the same rounds."""
    out = {}
    for key in dict.fromkeys((s["question_id"], s["turn"]) for s in samples):
        mine = [s for s in samples if (s["question_id"], s["turn"]) == key and s["method"] == method]
        plain = [s for s in samples if (s["question_id"], s["turn"]) == key and s["method"] == "plain"]
        rate = sum(s["new_tokens"] for s in mine) / sum(s["seconds"] for s in mine)
        out[key] = rate / (sum(s["new_tokens"] for s in plain) / sum(s["seconds"] for s in plain))
    return out


def test_bench_rounds_time_every_turn_n_times(tiny_target_dir, heads_dir, questions_file, tmp_path):
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--heads", heads_dir, "--prompt-lookup", "--questions", questions_file,
                  "--out", out, "--warmup", "0", "--rounds", "2", "--seed", "5") == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["rounds"] == 2 and report["args"]["rounds"] == 2
    samples = report["samples"]
    assert len(samples) == 3 * 2 * 3  # 3 turns x 2 rounds x (plain + 2 methods)
    for name in ("plain", "medusa", "prompt-lookup"):
        for key in {(s["question_id"], s["turn"]) for s in samples}:
            mine = [s for s in samples if (s["question_id"], s["turn"]) == key and s["method"] == name]
            assert sorted(s["round"] for s in mine) == [0, 1]
    # round r of the k-th timed prompt: seed + 2k + r, shared by plain and the methods of that round
    by_turn = list(dict.fromkeys((s["question_id"], s["turn"]) for s in samples))
    for s in samples:
        assert s["seed"] == 5 + 2 * by_turn.index((s["question_id"], s["turn"])) + s["round"]
    # exactness is checked on every round
    assert report["all_exact"] is True
    assert all(s["exact"] is True for s in samples if s["method"] != "plain")
    assert report["results"]["medusa"]["by_category"]["overall"]["exact_of"] == 6
    assert report["questions"]["samples"] == 3 and report["questions"]["truncated"] == 0

    for name in ("medusa", "prompt-lookup"):
        res = report["results"][name]
        hand = _per_question_by_hand(samples, name)
        per_q = res["per_question"]
        assert [(q["question_id"], q["turn"]) for q in per_q] == list(hand)
        for q in per_q:
            assert q["rounds"] == 2 and q["speedup"] == pytest.approx(hand[(q["question_id"], q["turn"])])
            rounds = [s for s in samples if (s["question_id"], s["turn"]) == (q["question_id"], q["turn"])]
            ratios = [m["tokens_per_second"] / p["tokens_per_second"]
                      for r in (0, 1)
                      for m in rounds if m["method"] == name and m["round"] == r
                      for p in rounds if p["method"] == "plain" and p["round"] == r]
            assert q["round_speedups"] == pytest.approx(ratios)
            assert q["round_min"] == pytest.approx(min(ratios)) and q["round_max"] == pytest.approx(max(ratios))
        overall = res["by_category"]["overall"]["per_question_speedup"]
        assert overall["median"] == pytest.approx(statistics.median(hand.values()))
        assert overall["min"] == pytest.approx(min(hand.values())) and overall["max"] == pytest.approx(max(hand.values()))
        code = res["by_category"]["code"]["per_question_speedup"]  # one question in category code
        assert code["median"] == pytest.approx(hand[("161", 0)])
        assert res["by_category"]["overall"]["per_sample_speedup"] is not None  # still every timed sample's ratio
    md = (out / "report.md").read_text()
    assert "2 timed rounds per prompt" in md and "## Per question, over 2 rounds" in md


def test_bench_rounds_draw_a_new_seed_each_round_when_sampling(tiny_target_dir, tmp_path, monkeypatch):
    """At T > 0 each round samples with its own seed, the same one for plain and every method."""
    from draftheads.bench.runner import Runner

    seen = []
    plain, speculative = Runner.plain, Runner.speculative
    monkeypatch.setattr(Runner, "plain", lambda self, ids, seed: (
        seen.append(("plain", seed)) or plain(self, ids, seed)))
    monkeypatch.setattr(Runner, "speculative", lambda self, m, ids, seed: (
        seen.append((m.name, seed)) or speculative(self, m, ids, seed)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(self, x):\nfor x in y:\n")
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--prompt-lookup", "--questions", prompts, "--temperature", "0.8", "--warmup", "0",
                  "--rounds", "3", "--seed", "10", "--out", out) == 0
    assert sorted(seen) == sorted((name, 10 + k) for k in range(6) for name in ("plain", "prompt-lookup"))
    report = json.loads((out / "report.json").read_text())
    for s in report["samples"]:
        assert s["exact"] is None
    seeds = {(s["question_id"], s["round"]): s["seed"] for s in report["samples"]}
    assert len(set(seeds.values())) == 6  # a new seed for every round of every prompt
    assert report["results"]["prompt-lookup"]["per_question"][0]["rounds"] == 3


def test_bench_one_round_keeps_the_old_report(tiny_target_dir, questions_file, tmp_path):
    """--rounds 1 (the default) keeps every key of the reports written before --rounds; the
    per-question speedup over one round is that sample's speedup."""
    out = tmp_path / "r"
    assert _bench(tiny_target_dir, "--prompt-lookup", "--questions", questions_file, "--out", out, "--warmup", "0") == 0
    report = json.loads((out / "report.json").read_text())
    old_top = {"format_version", "created", "command", "args", "environment", "settings", "questions", "methods",
               "results", "all_exact", "samples", "plots"}
    assert old_top <= set(report) and set(report) - old_top <= {"plots_missing"}
    assert report["format_version"] == 1 and report["settings"]["rounds"] == 1
    old_group = {"samples", "new_tokens", "steps", "mean_accepted_tokens", "tokens_per_second", "speedup",
                 "per_sample_speedup", "exact", "exact_of"}
    old_sample = {"question_id", "category", "turn", "method", "prompt_tokens", "new_tokens", "seconds",
                  "accept_lengths", "exact", "truncated", "stats", "tokens_per_second"}
    assert len(report["samples"]) == 3 * 2 and all(old_sample <= set(s) and s["round"] == 0 for s in report["samples"])
    res = report["results"]["prompt-lookup"]
    assert {"by_category", "accept_length_histogram", "acceptance_by_depth"} <= set(res)
    for g in res["by_category"].values():
        assert old_group <= set(g)
        assert g["per_question_speedup"] == pytest.approx(g["per_sample_speedup"])
    md = (out / "report.md").read_text()
    assert "1 timed round per prompt." in md and "## Per question" not in md


@pytest.mark.parametrize("rounds", ["0", "-2", "1.5", "two"])
def test_bad_rounds_are_refused(tiny_target_dir, questions_file, rounds, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench(tiny_target_dir, "--prompt-lookup", "--questions", questions_file, "--rounds", rounds,
               "--out", tmp_path / "x")
    err = capsys.readouterr().err
    assert "--rounds" in err and "whole number" in err and not (tmp_path / "x").exists()


def test_metrics_per_question_speedup_is_total_over_total():
    """Two rounds of one prompt: plain 10 tokens in 1 s then 1 s; the method 10 tokens in 0.5 s,
    then 2 s (a stall). Total over total: 20/2.5 vs 20/2 = 0.8x; the mean of per-round ratios would
    say 1.25x, and the round spread is 0.5x-2x."""
    def sample(method, rnd, seconds):
        return Sample(question_id="a", category="c", turn=0, method=method, prompt_tokens=4, new_tokens=10,
                      seconds=seconds, round=rnd)

    samples = [sample("plain", 0, 1.0), sample("m", 0, 0.5), sample("plain", 1, 1.0), sample("m", 1, 2.0)]
    results = summarize(samples, ["m"], ["c"])
    (q,) = results["m"]["per_question"]
    assert q["speedup"] == pytest.approx(0.8) and q["rounds"] == 2
    assert q["round_speedups"] == pytest.approx([2.0, 0.5])
    assert (q["round_min"], q["round_max"]) == (pytest.approx(0.5), pytest.approx(2.0))
    assert results["m"]["by_category"]["overall"]["per_question_speedup"]["median"] == pytest.approx(0.8)
    assert results["plain"]["per_question"][0]["speedup"] == pytest.approx(1.0)


def test_bench_batch_rounds_repeat_each_batch(tiny_target_dir, questions_file, tmp_path):
    out = tmp_path / "batched"
    assert _bench(tiny_target_dir, "--prompt-lookup", "--questions", questions_file, "--batch-size", "1,2",
                  "--batches", "2", "--rounds", "2", "--out", out, "--warmup", "0", "--seed", "7") == 0
    report = json.loads((out / "report.json").read_text())
    seeds = []
    for size in ("1", "2"):
        res = report["batch"][size]
        assert res["batches"] == 2 and res["rounds"] == 2 and len(res["runs"]) == 4
        runs = res["runs"]
        assert [r["prompt-lookup"]["round"] for r in runs] == [0, 1, 0, 1]
        assert all(r["plain"]["seed"] == r["prompt-lookup"]["seed"] for r in runs)
        seeds += [r["plain"]["seed"] for r in runs]
        pl = res["prompt-lookup"]
        assert pl["all_exact"] is True and all(r["prompt-lookup"]["exact"] for r in runs)
        def by_hand(tokens, seconds):  # each batch: total tokens / total seconds over its 2 rounds, against plain's
            rate = lambda b, side: sum(r[side][tokens] for r in b) / sum(r[side][seconds] for r in b)
            return [rate(b, "prompt-lookup") / rate(b, "plain") for b in (runs[:2], runs[2:])]

        ratios, decode_ratios = by_hand("new_tokens", "seconds"), by_hand("decode_tokens", "decode_seconds")
        assert [x["speedup"] for x in pl["per_batch"]] == pytest.approx(ratios)
        assert pl["speedup_median"] == pytest.approx(statistics.median(ratios))
        assert (pl["speedup_min"], pl["speedup_max"]) == (pytest.approx(min(ratios)), pytest.approx(max(ratios)))
        assert [x["decode_speedup"] for x in pl["per_batch"]] == pytest.approx(decode_ratios)
        assert pl["decode_speedup_median"] == pytest.approx(statistics.median(decode_ratios))
        assert all(len(x["round_speedups"]) == 2 for x in pl["per_batch"])
    assert seeds == list(range(7, 15))  # a new seed for every round of every batch, sizes counted on
    assert "2 timed rounds per batch" in (out / "report.md").read_text()
