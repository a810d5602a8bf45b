"""The target's own tokens survive from `distill` into training (issue 41 item 15).

Decoding generated ids to text and tokenizing again is lossy: half of a UTF-8 character decodes to
U+FFFD and a non-canonical split ("t" "h" "e") re-tokenizes as "the". distill keeps the ids in
``_token_ids``, builds later turns' prompts from them, and training uses them.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import make_tiny_model
from distill_utils import BYTE_VOCAB, ScriptedEngine, byte_chat_tokenizer

from draftheads.data import DataConfig, build_datasets
from draftheads.data.distill import DistillSettings, HFEngine, distill
from draftheads.data.exact_ids import TOKEN_IDS, retokenizes_exactly, spliced_chat
from draftheads.data.tokenize import tokenize_chat


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _settings(tmp_path, data: Path, **kw) -> DistillSettings:
    return DistillSettings(**{"target": "t", "data": str(data), "out": str(tmp_path / "out.jsonl"), "max_new_tokens": 8, **kw})


def _train_rows(path, tok):
    train, _, stats = build_datasets(DataConfig(path=str(path), eval_fraction=0.0, max_length=512), tok)
    return [(list(r["input_ids"]), list(r["loss_mask"])) for r in train], stats


def _lossy_answer(tok) -> list[int]:
    """"the" in three tokens, then the first byte of "é" alone (not valid UTF-8), then " model"."""
    split_the = tok.convert_tokens_to_ids(["t", "h", "e"])
    lone_byte = tok.convert_tokens_to_ids("Ã")  # byte 0xC3 in the byte-level alphabet
    return split_the + [lone_byte] + tok(" model", add_special_tokens=False)["input_ids"]


def test_an_answer_that_does_not_retokenize_trains_on_the_targets_ids(tmp_path):
    tok = byte_chat_tokenizer()
    answer = _lossy_answer(tok)
    assert not retokenizes_exactly(tok, answer)
    engine = ScriptedEngine(lambda prompt, n: (answer, True))
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", [{"prompt": "what is the model"}]))
    stats = distill(s, engine, tok, progress=False)
    assert stats.answers_retokenized_differently == 1 and stats.rows_answered == 1
    (row,) = _rows(s.out)
    assert row[TOKEN_IDS] == [answer]
    assert "\ufffd" in row["messages"][1]["content"]  # the text is lossy...
    ((ids, mask),), dstats = _train_rows(s.out, tok)
    prompt = engine.calls[0][0][0]
    n = len(prompt) + len(answer)
    # ...the training row is the prompt the target saw, the ids it wrote, and its end-of-turn token
    assert ids[: n + 1] == prompt + answer + [tok.eos_token_id]
    assert mask == [0] * len(prompt) + [1] * (len(answer) + 1) + [0] * (len(ids) - n - 1)
    assert dstats.rows_exact_ids == 1 and dstats.rows_ids_unused == 0
    # without the ids (the old behaviour) training would tokenize the text: other tokens
    plain, _ = tokenize_chat(tok, [{"role": "user", "content": "what is the model"}, row["messages"][1]], 512)
    assert plain[len(prompt) : n] != answer


def test_later_turns_are_prompted_with_the_earlier_answers_exact_ids(tmp_path):
    tok = byte_chat_tokenizer()
    first, second = _lossy_answer(tok), tok("import list", add_special_tokens=False)["input_ids"]
    engine = ScriptedEngine(lambda prompt, n: ((first, True) if n == 0 else (second, True)))
    turns = ["def value", "for value in list"]
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", [{"turns": turns}]))
    distill(s, engine, tok, progress=False)
    (row,) = _rows(s.out)
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]  # answered turn by turn
    p1, p2 = engine.calls[0][0][0], engine.calls[1][0][0]
    between = tok(f"<|im_end|>\n<|im_start|>user\n{turns[1]}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert p2 == p1 + first + between  # what the target wrote, not its text tokenized again
    ((ids, mask),), _ = _train_rows(s.out, tok)
    assert ids[: len(p2) + len(second) + 1] == p2 + second + [tok.eos_token_id]
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == first + [tok.eos_token_id] + second + [tok.eos_token_id]


def test_a_row_edited_after_distill_falls_back_to_its_text_and_is_counted(tmp_path, caplog):
    tok = byte_chat_tokenizer()
    engine = ScriptedEngine(lambda prompt, n: (_lossy_answer(tok), True))
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", [{"prompt": "the model"}, {"prompt": "a list"}]))
    distill(s, engine, tok, progress=False)
    rows = _rows(s.out)
    rows[0]["messages"][1]["content"] = "an answer a person rewrote"
    _write(Path(s.out), rows)
    examples, stats = _train_rows(s.out, tok)
    assert stats.rows_exact_ids == 1 and stats.rows_ids_unused == 1
    assert "could not be used" in caplog.text and "1 rows on the target's exact ids (1 with ids unused" in stats.summary()
    edited = tokenize_chat(tok, [{"role": "user", "content": "the model"}, rows[0]["messages"][1]], 512)
    assert edited in examples  # the edited text, tokenized


def test_text_rows_keep_the_prefix_and_continuation_ids(tmp_path):
    tok = byte_chat_tokenizer(template=None)
    answer = _lossy_answer(tok)
    engine = ScriptedEngine(lambda prompt, n: (answer, False))
    text = "def value(self, list): return self.value + list"
    s = _settings(tmp_path, _write(tmp_path / "t.jsonl", [{"text": text}]), prompt_tokens=4)
    distill(s, engine, tok, progress=False)
    (row,) = _rows(s.out)
    prefix = tok(text, add_special_tokens=False)["input_ids"][:4]
    assert row[TOKEN_IDS] == prefix + answer and engine.calls[0][0][0] == [tok.bos_token_id] + prefix
    ((ids, _),), stats = _train_rows(s.out, tok)
    assert ids == [tok.bos_token_id] + prefix + answer + [tok.eos_token_id] and stats.rows_exact_ids == 1


def test_a_real_model_s_rows_train_on_exactly_what_generate_wrote(tmp_path):
    """A random model over bytes writes ids that often do not survive decoding; the training rows
    still hold, turn after turn, exactly what unbatched greedy ``generate`` writes from the exact
    history."""
    tok = byte_chat_tokenizer()
    model = make_tiny_model("llama", vocab_size=BYTE_VOCAB, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    rows = [{"turns": ["def value", "for value in list"]}, {"prompt": "the model reads"}, {"turns": ["import dict"]}]
    s = _settings(tmp_path, _write(tmp_path / "p.jsonl", rows), max_new_tokens=10, batch_size=3)
    stats = distill(s, HFEngine(model, tok), tok, progress=False)
    assert stats.answers_retokenized_differently > 0  # the case this test is about does occur
    examples, _ = _train_rows(s.out, tok)

    def greedy(ids: list[int]) -> list[int]:
        x = torch.tensor([ids])
        new = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=10,
                             eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist()
        return new[: new.index(2)] if 2 in new else new

    for row, (ids, mask) in zip(_rows(s.out), examples):
        messages, answers = [], []
        for m in row["messages"]:
            if m["role"] == "assistant":
                prompt = spliced_chat(tok, messages, answers, add_generation_prompt=True)[0]
                answers.append(greedy(prompt))
                assert ids[: len(prompt) + len(answers[-1])] == prompt + answers[-1]
            messages.append(m)
        assert row[TOKEN_IDS] == answers
        assert [i for i, k in zip(ids, mask) if k] == [t for a in answers for t in a + [tok.eos_token_id]]
