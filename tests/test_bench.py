"""`draftheads bench` end to end on a tiny random model, its metrics, and its bad-input errors."""
from __future__ import annotations

import copy
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
    assert medusa["proposer"] == "MedusaProposer" and medusa["tree_nodes"] == len(medusa["tree"]) + 1
    assert report["questions"]["categories"] == ["writing", "code"]
    assert report["questions"]["questions"] == 2 and report["questions"]["samples"] == 3

    # 3 turns x (plain + 3 methods), every method's output equal to plain greedy generate
    assert len(report["samples"]) == 12
    assert report["all_exact"] is True
    results = report["results"]
    assert set(results) == {"plain", "medusa", "draft-model", "prompt-lookup"}
    plain = results["plain"]["by_category"]["overall"]
    assert plain["mean_accepted_tokens"] == 1.0 and plain["speedup"] == pytest.approx(1.0)
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

    assert report["plots"] == ["speedup_by_category.png", "accept_lengths.png", "acceptance_by_depth.png"]
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    md = (out / "report.md").read_text()
    assert "| method | mean accepted tokens | tokens/s | speedup |" in md
    assert "| medusa |" in md and "| prompt-lookup |" in md and "| writing |" in md
    assert "every output equals plain greedy" in md
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


def test_demo_questions_are_raw_code_prefixes(tiny_tokenizer):
    from draftheads.bench.questions import demo_questions

    qs = demo_questions(tiny_tokenizer, num=2, prompt_tokens=16)
    assert len(qs) == 2 and all(q.category == "code" and q.raw and len(q.turns) == 1 for q in qs)
    assert all(q.question_id.endswith(".py") for q in qs)


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
    assert len(report["batch"]["2"]["runs"]) == 1
    assert "| 2 | prompt-lookup |" in (out / "report.md").read_text()


@pytest.mark.parametrize("sizes", ["0,4", "four", ","])
def test_bad_batch_sizes_are_refused(tiny_target_dir, sizes, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench(tiny_target_dir, "--prompt-lookup", "--batch-size", sizes, "--out", tmp_path / "x")
    assert "batch sizes" in capsys.readouterr().err
