"""Never train on the evaluation prompts: MT-Bench and Spec-Bench ship with the package, and
distill and training refuse (or drop, or warn about) rows that hold one, by normalised text."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from distill_utils import ScriptedEngine, byte_chat_tokenizer

from draftheads.data import DataConfig, build_datasets
from draftheads.data.distill import DistillError, DistillSettings, distill
from draftheads.data.eval_overlap import EVAL_SETS, MIN_CONTAINED_WORDS, eval_index, normalize

ROOT = Path(__file__).resolve().parents[1]


def _questions(name: str) -> list[dict]:
    return [json.loads(line) for line in EVAL_SETS[name].read_text().splitlines() if line.strip()]


MT = _questions("mt-bench")
SPEC = _questions("spec-bench")


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_shipped_sets_are_the_benchmarks_and_ship_in_the_package():
    assert len(MT) == 80 and len(SPEC) == 480
    assert [q["turns"] for q in SPEC[:80]] == [q["turns"] for q in MT]  # Spec-Bench's first 80 rows ARE MT-Bench
    assert len(eval_index()) == 560  # every Spec-Bench turn (MT-Bench's 160 among them), all distinct
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"draftheads.data" = ["eval_questions/*.jsonl", "eval_questions/NOTICE.md",' in pyproject
    assert "licence" in (EVAL_SETS["mt-bench"].parent / "NOTICE.md").read_text()


def test_matching_is_by_normalised_text():
    index = eval_index()
    q = MT[0]["turns"][0]  # "Compose an engaging travel blog post about a recent trip to Hawaii, ..."
    assert index.find(q).question_id == "81"
    assert str(index.find("  " + q.upper().replace(",", " ,") + "!")) == "mt-bench question 81 turn 1"
    assert index.find("Please answer briefly. " + q + " Thanks.").question_id == "81"  # contained, long enough
    assert index.find(q.split(",")[0]) is None  # a fragment is not the question
    short = "Prove the Pythagorean theorem."
    assert len(normalize(short).split()) < MIN_CONTAINED_WORDS
    assert index.find(short) is not None and index.find("Tell me a story, then " + short) is None
    second_turn = MT[0]["turns"][1]
    assert index.find(second_turn).turn == 2
    assert index.find("Compose an engaging poem about the sea.") is None


def test_distill_refuses_a_prompt_set_holding_evaluation_questions(tmp_path):
    tok = byte_chat_tokenizer()
    rows = [{"prompt": "What is a list?"}, {"prompt": MT[3]["turns"][0]},
            {"messages": [{"role": "user", "content": SPEC[200]["turns"][0].lower()}]}]
    data = _write(tmp_path / "p.jsonl", rows[:2])
    engine = ScriptedEngine(lambda p, n: (tok("ok", add_special_tokens=False)["input_ids"], True))

    def settings(policy, name):
        return DistillSettings(target="t", data=str(data), out=str(tmp_path / name), eval_overlap=policy, max_new_tokens=4)

    with pytest.raises(DistillError, match=r"1 of 2 rows hold evaluation questions \(row 1: mt-bench question 84 turn 1\).*--eval-overlap drop"):
        distill(settings("refuse", "a.jsonl"), engine, tok, progress=False)
    assert not engine.calls and not (tmp_path / "a.jsonl").exists()  # refused before generating anything
    stats = distill(settings("drop", "b.jsonl"), engine, tok, progress=False)
    assert stats.rows_written == 1 and stats.eval_overlap == 1
    assert distill(settings("warn", "c.jsonl"), engine, tok, progress=False).rows_written == 2
    chats = _write(tmp_path / "c.jsonl", rows[2:])
    with pytest.raises(DistillError, match=r"spec-bench question 281"):
        distill(DistillSettings(target="t", data=str(chats), out=str(tmp_path / "d.jsonl")), engine, tok, progress=False)


def test_cli_distill_refuses_before_loading_the_target(tmp_path, capsys):
    from draftheads.cli import main

    data = _write(tmp_path / "p.jsonl", [{"turns": MT[10]["turns"]}])
    code = main(["distill", "--target", str(tmp_path / "no-such-model"), "--data", str(data), "--out", str(tmp_path / "o.jsonl")])
    assert code == 2 and "mt-bench question 91 turn 1" in capsys.readouterr().err


def _chat_row(user: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "an answer"}]}


def test_training_refuses_drops_or_warns_about_evaluation_rows(tmp_path, caplog):
    tok = byte_chat_tokenizer()
    rows = [_chat_row("What is a list?"), _chat_row(MT[5]["turns"][0]), _chat_row("Name three colours."),
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                          {"role": "user", "content": MT[5]["turns"][1]}, {"role": "assistant", "content": "ok"}]}]
    path = _write(tmp_path / "train.jsonl", rows)
    with pytest.raises(ValueError, match=r"2 of 4 rows hold evaluation questions \(row 1: mt-bench question 86 turn 1, "
                                         r"row 3: mt-bench question 86 turn 2\).*data.eval_overlap=drop"):
        build_datasets(DataConfig(path=str(path), eval_fraction=0.0), tok)
    train, _, stats = build_datasets(DataConfig(path=str(path), eval_fraction=0.0, eval_overlap="drop"), tok)
    assert len(train) == 2 and stats.dropped_eval_overlap == 2 and "2 rows holding evaluation questions dropped" in stats.summary()
    with caplog.at_level(logging.WARNING):
        train, _, stats = build_datasets(DataConfig(path=str(path), eval_fraction=0.0, eval_overlap="warn"), tok)
    assert len(train) == 4 and "kept (data.eval_overlap=warn)" in caplog.text
    with pytest.raises(ValueError, match="data.eval_overlap='keep' is not one of refuse, drop, warn"):
        DataConfig(path=str(path), eval_overlap="keep")


def test_training_finds_a_question_inside_a_text_row(tmp_path):
    tok = byte_chat_tokenizer()
    question = SPEC[300]["turns"][0]
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\nSure."  # a chat-templated text row
    path = _write(tmp_path / "t.jsonl", [{"text": "def value(self): return self.value"}, {"text": text}])
    with pytest.raises(ValueError, match=r"row 1: spec-bench question 381 turn 1"):
        build_datasets(DataConfig(path=str(path), eval_fraction=0.0), tok)
