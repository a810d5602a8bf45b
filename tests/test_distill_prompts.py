"""`distill` answers prompt sets (issue 39): user turns without an assistant turn get the target's
answers, turn by turn, instead of being skipped with 0 rows written and exit 0."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_tiny_model
from distill_utils import BYTE_VOCAB, ScriptedEngine, byte_chat_tokenizer

from draftheads.data.distill import ROW_KEY, TEMPERATURE_KEY, DistillError, DistillSettings, distill
from draftheads.data.engines import Sampling


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _settings(tmp_path, data: Path, **kw) -> DistillSettings:
    return DistillSettings(**{"target": "t", "data": str(data), "out": str(tmp_path / "out.jsonl"), "max_new_tokens": 8, **kw})


@pytest.fixture(scope="module")
def tok():
    return byte_chat_tokenizer()


def _numbered(tok):
    """An engine whose n-th answer is the text "answer n" (so the test can tell turns apart)."""
    return ScriptedEngine(lambda prompt, n: (tok(f"answer {n}", add_special_tokens=False)["input_ids"], True))


def test_user_only_rows_are_answered_turn_by_turn_in_every_format(tmp_path, tok):
    rows = [
        {"id": 0, "messages": [{"role": "system", "content": "be short"}, {"role": "user", "content": "u1"},
                               {"role": "user", "content": "u2"}]},
        {"id": 1, "conversations": [{"from": "human", "value": "h1"}]},
    ]
    s = _settings(tmp_path, _write(tmp_path / "m.jsonl", rows[:1]))
    stats = distill(s, _numbered(tok), tok, progress=False)
    (row,) = _rows(s.out)
    assert row["messages"] == [
        {"role": "system", "content": "be short"}, {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "answer 0"}, {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "answer 1"},
    ]
    assert row["id"] == 0 and row[ROW_KEY] == 0 and stats.rows_answered == 1 and stats.turns_generated == 2
    s = _settings(tmp_path, _write(tmp_path / "s.jsonl", rows[1:]), out=str(tmp_path / "s-out.jsonl"))
    distill(s, _numbered(tok), tok, progress=False)
    assert _rows(s.out)[0]["conversations"] == [{"from": "human", "value": "h1"}, {"from": "gpt", "value": "answer 0"}]


def test_prompt_and_turns_rows_become_messages_rows(tmp_path, tok):
    rows = [{"prompt": "what is a list", "category": "x"}, {"question_id": 7, "turns": ["def value", "now in one line"]}]
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", rows), batch_size=2)
    stats = distill(s, _numbered(tok), tok, progress=False)
    a, b = _rows(s.out)
    assert a["prompt"] == "what is a list" and a["category"] == "x"  # the input's keys are kept
    assert a["messages"] == [{"role": "user", "content": "what is a list"}, {"role": "assistant", "content": "answer 0"}]
    assert [m["role"] for m in b["messages"]] == ["user", "assistant", "user", "assistant"]
    assert b["messages"][2]["content"] == "now in one line" and b["question_id"] == 7
    assert stats.rows_answered == 2 and stats.turns_generated == 3


def test_a_row_ending_with_an_unanswered_user_turn_gets_its_answer(tmp_path, tok):
    rows = [{"messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "old"},
                          {"role": "user", "content": "u2"}]}]
    s = _settings(tmp_path, _write(tmp_path / "m.jsonl", rows))
    distill(s, _numbered(tok), tok, progress=False)
    (row,) = _rows(s.out)
    assert [m["content"] for m in row["messages"]] == ["u1", "answer 0", "u2", "answer 1"]


def test_rows_with_nothing_to_answer_are_counted(tmp_path, tok):
    rows = [{"messages": [{"role": "system", "content": "only a system turn"}]}, {"messages": []},
            {"messages": [{"role": "user", "content": "u"}]}]
    s = _settings(tmp_path, _write(tmp_path / "m.jsonl", rows))
    stats = distill(s, _numbered(tok), tok, progress=False)
    assert [r[ROW_KEY] for r in _rows(s.out)] == [2]
    assert stats.skipped_no_user == 1 and stats.skipped_empty == 1 and stats.rows_written == 1


def test_a_malformed_prompt_row_is_named(tmp_path, tok):
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", [{"prompt": "ok"}, {"turns": "not a list"}]))
    with pytest.raises(DistillError, match=r"row 1: 'prompt' must be a string and 'turns' a list"):
        distill(s, _numbered(tok), tok, progress=False)


def test_a_temperature_list_mixes_greedy_and_sampled_rows(tmp_path, tok):
    engine = _numbered(tok)
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(5)]),
                  temperature=[0.0, 0.7], top_p=0.9, batch_size=5)
    distill(s, engine, tok, progress=False)
    ((_, _, sampling),) = engine.calls
    assert [x.temperature for x in sampling] == [0.0, 0.7, 0.0, 0.7, 0.0]
    assert sampling[1] == Sampling(0.7, 0.9, 8)
    assert [r[TEMPERATURE_KEY] for r in _rows(s.out)] == [0.0, 0.7, 0.0, 0.7, 0.0]


def test_hf_engine_mixed_batch_matches_unbatched_generate_for_greedy_rows(tmp_path, tok):
    """One HF batch holding greedy and sampled rows: the greedy rows are what greedy generate writes."""
    import torch

    from draftheads.data.engines import HFEngine

    model = make_tiny_model("llama", vocab_size=BYTE_VOCAB, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    prompts = [{"prompt": p} for p in ("def value", "the model reads", "import dict", "for value in list")]
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", prompts), temperature=[0.0, 1.0], batch_size=4)
    distill(s, HFEngine(model, tok), tok, progress=False)
    for row in _rows(s.out)[::2]:
        ids = tok.apply_chat_template(row["messages"][:1], add_generation_prompt=True, return_dict=True)["input_ids"]
        x = torch.tensor([ids])
        new = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=8,
                             eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist()
        assert row["_token_ids"] == [new[: new.index(2)] if 2 in new else new]


def test_cli_answers_a_prompt_set(tmp_path, tok, capsys):
    """The reported bug: user-only rows wrote 0 rows and exited 0."""
    from draftheads.cli import main

    model = make_tiny_model("llama", vocab_size=BYTE_VOCAB, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    target = tmp_path / "target"
    model.save_pretrained(target)
    tok.save_pretrained(target)
    data = _write(tmp_path / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"def value {i}"}]} for i in range(3)])
    out = tmp_path / "answers.jsonl"
    assert main(["distill", "--target", str(target), "--data", str(data), "--out", str(out), "--max-new-tokens", "4",
                 "--dtype", "float32", "--no-progress"]) == 0
    rows = _rows(out)
    assert len(rows) == 3 and all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in rows)
    assert "3 rows written" in capsys.readouterr().out
