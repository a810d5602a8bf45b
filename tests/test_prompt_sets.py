"""Prompt sets by name: `bench --questions mt-bench|spec-bench|chat` and `calibrate --prompts` read
the files shipped in the package; bench measures MT-Bench by default and calibrate times trees on
the package's own chat prompts, never on the evaluation questions."""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pytest

from draftheads.bench.questions import QuestionFileError, load_questions, select
from draftheads.cli import _calibration_prompts, _encode_prompt, build_parser, main
from draftheads.data.eval_overlap import eval_index
from draftheads.data.prompt_sets import CHAT_PROMPTS, PROMPT_SETS, resolve_prompt_set

ROOT = Path(__file__).resolve().parents[1]
CHAT_CATEGORIES = ["writing", "coding", "math", "reasoning", "extraction", "summarisation", "qa", "roleplay"]


def test_named_sets_resolve_to_the_packaged_files_and_a_path_stays_a_path(tmp_path):
    assert set(PROMPT_SETS) == {"mt-bench", "spec-bench", "chat", "user", "text"}
    for path in PROMPT_SETS.values():
        assert path.is_file() and path.is_relative_to(ROOT / "draftheads")
    mine = tmp_path / "mine.jsonl"
    assert resolve_prompt_set(str(mine)) == mine
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"prompts/*.jsonl"' in pyproject and CHAT_PROMPTS.parent.name == "prompts"  # shipped in the wheel


def test_the_named_sets_load_as_questions():
    mt = load_questions("mt-bench")
    assert len(mt) == 80 and all(len(q.turns) == 2 for q in mt)
    spec = load_questions("spec-bench")
    assert len(spec) == 480
    qa = select(spec, ["qa", "rag"], None)
    assert len(qa) == 160 and {q.category for q in qa} == {"qa", "rag"}
    chat = load_questions("chat")
    assert len(chat) == 40 and all(len(q.turns) == 1 for q in chat)


def test_a_missing_question_file_names_the_sets(tmp_path):
    with pytest.raises(QuestionFileError, match="named set: mt-bench, spec-bench, chat, user or text"):
        load_questions(tmp_path / "mt-bnch.jsonl")


def test_the_chat_prompts_cover_every_category_and_hold_no_evaluation_question():
    rows = [json.loads(line) for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()]
    assert Counter(r["category"] for r in rows) == {c: 5 for c in CHAT_CATEGORIES}
    assert len({r["question_id"] for r in rows}) == len(rows)
    # interleaved: calibrate's first --num-prompts (12 by default) span every category
    assert {r["category"] for r in rows[: len(CHAT_CATEGORIES)]} == set(CHAT_CATEGORIES)
    index = eval_index()
    found = [(r["question_id"], str(index.find(r["turns"][0]))) for r in rows if index.find(r["turns"][0])]
    assert found == []


def test_bench_measures_mt_bench_by_default(tiny_target_dir, tmp_path):
    out = tmp_path / "r"
    assert main(["bench", "--target", str(tiny_target_dir), "--prompt-lookup", "--no-chat-template", "--no-progress",
                 "--max-new-tokens", "2", "--max-questions", "2", "--warmup", "0", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["questions"]["source"] == "mt-bench"
    assert report["questions"]["categories"] == ["writing", "roleplay"]  # round-robin over MT-Bench's categories
    assert report["questions"]["samples"] == 4  # both turns of each question


def test_bench_spec_bench_by_name_with_categories(tiny_target_dir, tmp_path):
    out = tmp_path / "r"
    assert main(["bench", "--target", str(tiny_target_dir), "--prompt-lookup", "--no-chat-template", "--no-progress",
                 "--max-new-tokens", "2", "--questions", "spec-bench", "--categories", "qa", "--max-questions", "2",
                 "--warmup", "0", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["questions"]["source"] == "spec-bench" and report["questions"]["categories"] == ["qa"]


def test_calibrate_defaults_to_the_user_prompts_or_raw_text_without_a_template(tiny_tokenizer):
    args = build_parser().parse_args(["calibrate", "--heads", "h", "--no-chat-template", "--num-prompts", "3",
                                      "--prompt-tokens", "64"])
    assert args.prompts == "auto"
    prompts = _calibration_prompts(args, tiny_tokenizer)  # fed as raw text: raw-text beginnings
    texts = [q.turns[0] for q in load_questions("text")[:3]]
    assert [p.tolist() for p in prompts] == [_encode_prompt(tiny_tokenizer, t, False)[:, -64:].tolist() for t in texts]
    args.prompts = "user"
    prompts = _calibration_prompts(args, tiny_tokenizer)
    texts = [q.turns[0] for q in load_questions("user")[:3]]
    assert [p.tolist() for p in prompts] == [_encode_prompt(tiny_tokenizer, t, False)[:, -64:].tolist() for t in texts]


def test_calibrate_takes_a_plan_set_refuses_an_evaluation_set_and_names_the_sets(tiny_tokenizer, tmp_path):
    args = argparse.Namespace(prompts="text", num_prompts=2, no_chat_template=True, prompt_tokens=32)
    assert len(_calibration_prompts(args, tiny_tokenizer)) == 2
    args.prompts = "mt-bench"  # plans chosen on the evaluation questions would be tuned on the test
    with pytest.raises(SystemExit, match="--prompts mt-bench: that is an evaluation set"):
        _calibration_prompts(args, tiny_tokenizer)
    args.prompts = str(tmp_path / "missing.txt")
    with pytest.raises(SystemExit, match="named set: mt-bench, spec-bench, chat, user or text"):
        _calibration_prompts(args, tiny_tokenizer)


def test_the_plan_sets_hold_no_evaluation_question_and_mix_categories():
    index = eval_index()
    for name, least in (("user", 10), ("text", 10)):
        rows = [json.loads(line) for line in PROMPT_SETS[name].read_text().splitlines() if line.strip()]
        assert len({r["question_id"] for r in rows}) == len(rows)
        assert len({r["category"] for r in rows}) >= least
        assert [r["question_id"] for r in rows if index.find(r["turns"][0])] == []
