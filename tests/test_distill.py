"""`draftheads distill`: the target's own answers, turn by turn, resumable, in the input's format."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model, make_tiny_tokenizer

from draftheads.data.distill import (
    ROW_KEY,
    DistillError,
    DistillSettings,
    HFEngine,
    VLLMEngine,
    distill,
    sidecar_path,
    strip_reasoning,
)

TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tok():
    tok = make_tiny_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def model():
    return make_tiny_model("llama")


CHATS = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "def return the value"},
        {"from": "gpt", "value": "import list from dict"},
        {"from": "human", "value": "for value in list print"},
        {"from": "gpt", "value": "the model reads"},
    ]},
    {"id": "b", "conversations": [{"from": "human", "value": "the heads guess"}]},  # no assistant turn
    {"id": "c", "conversations": [
        {"from": "system", "value": "self value"},
        {"from": "human", "value": "print the token and writes the next one while the heads guess two"},
        {"from": "gpt", "value": "x"},
    ]},
    {"id": "d", "conversations": [{"from": "human", "value": "class"}, {"from": "gpt", "value": "y"}]},
]


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _settings(tmp_path, data: Path, **kw) -> DistillSettings:
    base = dict(target="tiny", data=str(data), out=str(tmp_path / "out.jsonl"), max_new_tokens=6, batch_size=3)
    return DistillSettings(**{**base, **kw})


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _reference_answer(model, tok, prompt_ids: list[int], max_new: int) -> str:
    """One unpadded greedy ``generate`` call, cut at eos."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=2, pad_token_id=3)[0, ids.shape[1]:].tolist()
    if 2 in out:
        out = out[: out.index(2)]
    return tok.decode(out, skip_special_tokens=True)


def test_chat_rows_are_regenerated_turn_by_turn_as_generate_would(tmp_path, model, chat_tok):
    data = _write(tmp_path / "chats.jsonl", CHATS)
    s = _settings(tmp_path, data)
    stats = distill(s, HFEngine(model, chat_tok, s), chat_tok, progress=False)
    out = _rows(s.out)
    assert [r["id"] for r in out] == ["a", "b", "c", "d"] and [r[ROW_KEY] for r in out] == [0, 1, 2, 3]
    # row b had no assistant turn: it is answered (issue 39), not skipped
    assert stats.rows_answered == 1 and stats.rows_written == 4 and stats.turns_generated == 5
    for row, src in zip(out, CHATS):
        history = []
        given = iter(m for m in src["conversations"] if m["from"] != "gpt")
        for msg in row["conversations"]:
            if msg["from"] != "gpt":
                assert msg == next(given)  # system and user turns kept verbatim, in the ShareGPT shape
                history.append({"role": {"human": "user"}.get(msg["from"], msg["from"]), "content": msg["value"]})
                continue
            text = chat_tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
            prompt = chat_tok(text, add_special_tokens=False)["input_ids"]
            # the answer given the REGENERATED history, exactly as an unbatched generate call gives it
            assert msg["value"] == _reference_answer(model, chat_tok, prompt, s.max_new_tokens)
            history.append({"role": "assistant", "content": msg["value"]})
        assert next(given, None) is None
    assert [m["from"] for m in out[1]["conversations"]] == ["human", "gpt"]
    assert out[0]["conversations"][1]["value"] != CHATS[0]["conversations"][1]["value"]
    side = json.loads(sidecar_path(s.out).read_text())
    assert side["complete"] and side["settings"]["max_new_tokens"] == 6 and side["stats"]["rows_written"] == 4


def test_messages_format_is_kept(tmp_path, model, chat_tok):
    rows = [{"messages": [{"role": "user", "content": "the model"}, {"role": "assistant", "content": "old"}]}]
    s = _settings(tmp_path, _write(tmp_path / "m.jsonl", rows))
    distill(s, HFEngine(model, chat_tok, s), chat_tok, progress=False)
    (row,) = _rows(s.out)
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"] and row["messages"][1]["content"] != "old"


def test_text_rows_continue_a_prefix(tmp_path, model):
    tok = make_tiny_tokenizer()
    texts = ["def value(self, list): return self.value + list", "", "for the in model: print(the)"]
    s = _settings(tmp_path, _write(tmp_path / "t.jsonl", [{"text": t} for t in texts]), prompt_tokens=4)
    stats = distill(s, HFEngine(model, tok, s), tok, progress=False)
    out = _rows(s.out)
    assert [r[ROW_KEY] for r in out] == [0, 2] and stats.skipped_empty == 1
    for row in out:
        ids = tok(texts[row[ROW_KEY]], add_special_tokens=False)["input_ids"]
        prefix = ids[: min(4, len(ids) // 2)]
        ref = torch.tensor([[tok.bos_token_id] + prefix])
        new = model.generate(ref, attention_mask=torch.ones_like(ref), do_sample=False, max_new_tokens=6,
                             eos_token_id=2, pad_token_id=3)[0, ref.shape[1]:].tolist()
        new = new[: new.index(2)] if 2 in new else new
        assert row["text"] == tok.decode(prefix + new, skip_special_tokens=True)


class _Killed(RuntimeError):
    pass


class _DyingEngine:
    """Answers ``calls`` generate calls, then dies like a killed process."""

    def __init__(self, inner, calls: int) -> None:
        self.inner, self.calls = inner, calls

    def generate(self, prompts, seed, sampling):
        if self.calls == 0:
            raise _Killed
        self.calls -= 1
        return self.inner.generate(prompts, seed, sampling)


def test_resume_after_a_kill_skips_written_rows_and_never_duplicates(tmp_path, model, chat_tok):
    rows = CHATS * 3  # 12 rows, 15 turns to answer
    data = _write(tmp_path / "chats.jsonl", rows)
    clean = _settings(tmp_path, data, out=str(tmp_path / "clean.jsonl"), batch_size=2)
    distill(clean, HFEngine(model, chat_tok, clean), chat_tok, progress=False)

    s = _settings(tmp_path, data, batch_size=2)
    with pytest.raises(_Killed):  # batch 1 (rows 0,1: turn 0 of both, turn 1 of row 0 = 2 calls) written, batch 2 dies
        distill(s, _DyingEngine(HFEngine(model, chat_tok, s), 2), chat_tok, progress=False)
    assert [r[ROW_KEY] for r in _rows(s.out)] == [0, 1]
    with open(s.out, "a") as f:
        f.write('{"conversations": [{"from": "hu')  # a line torn by the kill
    with pytest.raises(DistillError, match="--resume"):
        distill(s, HFEngine(model, chat_tok, s), chat_tok, progress=False)
    engine = HFEngine(model, chat_tok, s)
    calls = []
    engine.generate = (lambda g: lambda p, seed, sampling: calls.append(len(p)) or g(p, seed, sampling))(engine.generate)
    stats = distill(s, engine, chat_tok, resume=True, progress=False)
    assert stats.rows_resumed == 2
    out = Path(s.out).read_text()
    assert out == Path(clean.out).read_text()  # same rows, once each, in order
    ids = [r[ROW_KEY] for r in _rows(s.out)]
    assert len(ids) == len(set(ids)) == 12
    assert sum(calls) == 15 - 3  # 15 turns in all; rows 0 and 1's three were not generated again
    again = distill(s, HFEngine(model, chat_tok, s), chat_tok, resume=True, progress=False)
    assert again.rows_written == 0 and Path(s.out).read_text() == out


def test_resume_with_other_settings_is_refused(tmp_path, model, chat_tok):
    data = _write(tmp_path / "chats.jsonl", CHATS)
    s = _settings(tmp_path, data)
    distill(s, HFEngine(model, chat_tok, s), chat_tok, progress=False)
    other = _settings(tmp_path, data, max_new_tokens=9)
    with pytest.raises(DistillError, match=r"max_new_tokens: 6 -> 9"):
        distill(other, HFEngine(model, chat_tok, other), chat_tok, resume=True, progress=False)


def test_chat_rows_need_a_chat_template(tmp_path, model):
    tok = make_tiny_tokenizer()  # no chat template
    s = _settings(tmp_path, _write(tmp_path / "c.jsonl", CHATS))
    with pytest.raises(DistillError, match=r"no chat\s+template.*chat_template.*plain-text"):
        distill(s, HFEngine(model, tok, s), tok, progress=False)
    assert not Path(s.out).exists() or not _rows(s.out)


def test_bad_rows_and_settings_are_named(tmp_path, model, chat_tok):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DistillError, match=r"bad.jsonl:2: not valid JSON"):
        distill(_settings(tmp_path, bad), None, chat_tok, progress=False)
    cols = _write(tmp_path / "cols.jsonl", [{"question": "x"}])
    with pytest.raises(DistillError, match=r"cannot tell the data format.*'prompt'.*'turns'"):
        distill(_settings(tmp_path, cols), None, chat_tok, progress=False)
    with pytest.raises(DistillError, match="--reasoning"):
        _settings(tmp_path, cols, reasoning="hide")


def test_vllm_missing_is_a_clear_error(tmp_path, monkeypatch, chat_tok):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    s = _settings(tmp_path, tmp_path / "x.jsonl", engine="vllm")
    with pytest.raises(DistillError, match=r"--engine vllm needs the vllm package.*--engine hf"):
        VLLMEngine("tiny", chat_tok, s)


def test_reasoning_drop_removes_think_blocks():
    assert strip_reasoning("<think>plan it</think>\n\nThe answer.") == "The answer."
    assert strip_reasoning("<think>never closed") == ""
    assert strip_reasoning("no reasoning") == "no reasoning"


def test_cli_distill(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys):
    from draftheads.cli import main

    out = tmp_path / "regen.jsonl"
    args = ["distill", "--target", str(tiny_target_dir), "--data", str(tiny_text_jsonl), "--out", str(out),
            "--max-new-tokens", "4", "--batch-size", "16", "--dtype", "float32", "--no-progress"]
    assert main(args) == 0
    n = len(Path(tiny_text_jsonl).read_text().splitlines())
    assert len(_rows(out)) == n and "tok/s" in capsys.readouterr().out
    assert main(args) == 2 and "--resume" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0 and len(_rows(out)) == n


def _vllm_python() -> Path | None:
    """vLLM lives in its own venv (it pins its own torch): $DRAFTHEADS_VLLM_PYTHON, else a
    .venv-vllm next to this interpreter's venv."""
    import os

    env = os.environ.get("DRAFTHEADS_VLLM_PYTHON")
    path = Path(env) if env else Path(sys.executable).parents[2] / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


@pytest.mark.skipif(_vllm_python() is None, reason="no vLLM venv (set DRAFTHEADS_VLLM_PYTHON)")
def test_vllm_engine_writes_what_the_hf_engine_writes(tmp_path, chat_tok):
    """Greedy fp32: vLLM's offline LLM, fed the same prompt ids, answers every turn as HF does."""
    import os
    import subprocess

    model = make_tiny_model("llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=2)  # vLLM CPU: head_dim 64
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    chat_tok.save_pretrained(model_dir)
    data = _write(tmp_path / "chats.jsonl", CHATS)
    s = _settings(tmp_path, data, out=str(tmp_path / "hf.jsonl"))
    distill(s, HFEngine(model, chat_tok, s), chat_tok, progress=False)

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    worker = Path(__file__).with_name("vllm_distill_worker.py")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [str(_vllm_python()), str(worker), str(root), str(model_dir), str(data), str(tmp_path / "vllm.jsonl"),
         str(s.max_new_tokens), str(s.batch_size)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "vllm.jsonl").read_text() == Path(s.out).read_text()
    assert json.loads(sidecar_path(tmp_path / "vllm.jsonl").read_text())["settings"]["engine"] == "vllm"


def test_rows_too_long_for_the_context_are_skipped_and_counted(tmp_path, chat_tok):
    small = make_tiny_model("llama", max_position_embeddings=40)
    long_turn = " ".join(["the model reads a token"] * 12)
    rows = [CHATS[3], {"conversations": [{"from": "human", "value": long_turn}, {"from": "gpt", "value": "z"}]},
            # fits for its first turn, not for its second: the whole row is dropped
            {"conversations": [{"from": "human", "value": "class"}, {"from": "gpt", "value": "y"},
                               {"from": "human", "value": long_turn}, {"from": "gpt", "value": "w"}]}]
    s = _settings(tmp_path, _write(tmp_path / "c.jsonl", rows))
    stats = distill(s, HFEngine(small, chat_tok, s), chat_tok, progress=False)
    assert [r[ROW_KEY] for r in _rows(s.out)] == [0] and stats.skipped_too_long == 2
    assert stats.turns_generated == 2  # row 0's turn and row 2's first turn
