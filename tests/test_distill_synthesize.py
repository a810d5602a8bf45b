"""`distill --synthesize N`: the target writes its prompts (Magpie) and then answers them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from distill_utils import Killed, ScriptedEngine, SeededEngine, byte_chat_tokenizer

from draftheads.data.distill import ROW_KEY, DistillError, DistillSettings, sidecar_path
from draftheads.data.exact_ids import TOKEN_IDS
from draftheads.data.synthesize import collapse_note, prompts_path, synthesize, user_turn_prefix


@pytest.fixture(scope="module")
def tok():
    return byte_chat_tokenizer()


def _prefix_ids(tok) -> list[int]:
    return tok(user_turn_prefix(tok), add_special_tokens=False)["input_ids"]


def _settings(tmp_path, **kw) -> DistillSettings:
    base = {"target": "t", "data": "", "out": str(tmp_path / "chats.jsonl"), "synthesize": 3, "max_new_tokens": 8,
            "batch_size": 2, "temperature": [0.0, 0.0, 0.7, 1.0]}
    return DistillSettings(**{**base, **kw})


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_the_user_turn_prefix_comes_from_the_template(tok):
    assert user_turn_prefix(tok) == "<|im_start|>system\nYou are a helpful model<|im_end|>\n<|im_start|>user\n"
    other = byte_chat_tokenizer(template="{% for m in messages %}[{{ m['role'] }}]: {{ m['content'] }}\n{% endfor %}")
    assert user_turn_prefix(other) == "[user]: "


def test_smollm2_prefix_holds_its_default_system_turn(smollm2_dir):
    from transformers import AutoTokenizer

    prefix = user_turn_prefix(AutoTokenizer.from_pretrained(smollm2_dir))
    assert prefix == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n"
    )


def test_a_base_model_writes_text_and_continues_it(tmp_path):
    """No chat template (a base model such as Gemma-3-270M): candidates are drawn from the BOS token
    alone, one that reaches --prompt-max-tokens is kept (text has no turn to end), and each kept
    text becomes a plain-text row distill continues from its first --prompt-tokens tokens."""
    plain = byte_chat_tokenizer(template=None)
    bos = plain.bos_token_id
    drawn = iter([("The river runs north past the old mill and the bridge.", False), ("", True),
                  ("The river runs north past the old mill and the bridge.", False),
                  ("A recipe for bread: flour, water, salt and yeast.", True)])

    def answer(prompt, n):
        if prompt == [bos]:
            text, finished = next(drawn)
            return plain(text, add_special_tokens=False)["input_ids"], finished
        return plain(" and so on", add_special_tokens=False)["input_ids"], True

    engine = ScriptedEngine(answer)
    settings = _settings(tmp_path, synthesize=2, prompt_tokens=4, temperature=0.0)
    stats = synthesize(settings, engine, plain, progress=False)
    rows = _rows(settings.out)
    assert [r["text"].endswith(" and so on") for r in rows] == [True, True]
    first = plain.decode(plain("The river runs north past the old mill and the bridge.", add_special_tokens=False)["input_ids"][:4])
    assert rows[0]["text"] == first + " and so on" and TOKEN_IDS in rows[0]  # its first 4 tokens, then continued
    continued = [p for call in engine.calls for p in call[0] if p != [bos]]
    assert all(p[0] == bos and len(p) == 1 + 4 for p in continued)  # BOS + the row's first 4 tokens
    assert stats.extra["prompts"]["truncated"] == 0 and stats.extra["prompts"]["duplicates"] == 1
    assert stats.extra["prompts"]["empty"] == 1


def test_a_model_with_neither_a_chat_template_nor_a_bos_token_is_refused_by_name(tmp_path):
    plain = byte_chat_tokenizer(template=None)
    plain.bos_token = None
    plain.name_or_path = "my-base-model"
    with pytest.raises(DistillError, match=r"'my-base-model' has no chat template and no BOS token"):
        synthesize(_settings(tmp_path), ScriptedEngine(lambda p, n: ([], True)), plain, progress=False)
    assert not Path(_settings(tmp_path).out).exists()


def test_prompts_are_deduplicated_filtered_and_answered(tmp_path, tok, capsys):
    from draftheads.data.eval_overlap import EVAL_SETS

    mt_bench_81 = json.loads(EVAL_SETS["mt-bench"].read_text().splitlines()[0])["turns"][0]
    prefix = _prefix_ids(tok)
    drawn = iter([("What is a list?", True), ("  what is a LIST ", True), ("", True), ("Explain recursion", False),
                  (mt_bench_81, True), ("Explain recursion.", True), ("Write a poem.", True), ("More?", True)])

    def answer(prompt, n):
        if prompt == prefix:
            text, finished = next(drawn)
            return tok(text, add_special_tokens=False)["input_ids"], finished
        return tok("an answer", add_special_tokens=False)["input_ids"], True

    engine = ScriptedEngine(answer)
    stats = synthesize(_settings(tmp_path), engine, tok, progress=False)
    rows = _rows(_settings(tmp_path).out)
    assert [r["messages"][0]["content"] for r in rows] == ["What is a list?", "Explain recursion.", "Write a poem."]
    assert [r[ROW_KEY] for r in rows] == [0, 1, 2]
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] and r[TOKEN_IDS] for r in rows)
    prompts = stats.extra["prompts"]
    assert prompts == {**prompts, "asked": 3, "candidates": 8, "kept": 3, "unused": 1, "duplicates": 1, "empty": 1,
                       "truncated": 1, "eval_overlap": 1}
    assert stats.rows_written == 3 and stats.rows_answered == 3
    assert "3 kept of 8 drawn (1 duplicates" in capsys.readouterr().out
    # prompts are sampled at the prompt settings; answers at the row's temperature
    prompt_calls = [c for c in engine.calls if c[0][0] == prefix]
    assert all(s.temperature == 1.0 and s.top_p == 0.95 and s.max_new_tokens == 256 for c in prompt_calls for s in c[2])
    answer_sampling = [s.temperature for c in engine.calls if c[0][0] != prefix for s in c[2]]
    assert answer_sampling == [0.0, 0.0, 0.7]
    side = json.loads(sidecar_path(_settings(tmp_path).out).read_text())
    assert side["complete"] and side["settings"]["synthesize"] == 3 and side["stats"]["extra"]["prompts"]["kept"] == 3


def test_a_set_that_collapses_to_duplicates_says_so(tmp_path, tok, capsys):
    engine = SeededEngine(tok, _prefix_ids(tok), questions=["What is a list?", "WHAT is a list"])
    stats = synthesize(_settings(tmp_path, synthesize=5), engine, tok, progress=False)
    out = capsys.readouterr().out
    assert "warning: the prompts collapse: only 1 distinct prompts of the 5 asked after 15 draws (14 duplicates" in out
    assert stats.rows_written == 1 and engine.prompt_draws == 15  # drew up to 3 x N, then answered the one it had
    with pytest.raises(DistillError, match=r"wrote no usable prompt in 4 tries.*chat model"):
        synthesize(_settings(tmp_path, out=str(tmp_path / "empty.jsonl"), max_candidates=4),
                   SeededEngine(tok, _prefix_ids(tok), questions=[""]), tok, progress=False)


def test_collapse_note_warns_about_a_mostly_repeated_set():
    from draftheads.data.synthesize import PromptStats

    assert collapse_note(PromptStats(asked=10, candidates=12, kept=10, duplicates=2)) is None
    assert "repeated earlier ones" in collapse_note(PromptStats(asked=10, candidates=20, kept=10, duplicates=10))


def test_same_seed_same_set_other_seed_other_prompts(tmp_path, tok):
    def run(name, seed):
        s = _settings(tmp_path, out=str(tmp_path / name), seed=seed, synthesize=4)
        synthesize(s, SeededEngine(tok, _prefix_ids(tok)), tok, progress=False)
        return Path(s.out).read_text()

    a = run("a.jsonl", 0)
    assert a == run("b.jsonl", 0)
    assert a != run("c.jsonl", 1)


@pytest.mark.parametrize("die_after", [1, 2, 3, 4])  # in the prompt stage (3 batches) or among the answers (2)
def test_a_killed_synthesis_resumes_with_nothing_lost_or_repeated(tmp_path, tok, die_after):
    prefix = _prefix_ids(tok)
    clean = _settings(tmp_path, out=str(tmp_path / "clean.jsonl"), synthesize=4)
    reference = SeededEngine(tok, prefix)
    synthesize(clean, reference, tok, progress=False)

    s = _settings(tmp_path, synthesize=4)
    first = SeededEngine(tok, prefix, die_after=die_after)
    with pytest.raises(Killed):
        synthesize(s, first, tok, progress=False)
    with pytest.raises(DistillError, match="--resume"):
        synthesize(s, SeededEngine(tok, prefix), tok, progress=False)
    second = SeededEngine(tok, prefix)
    synthesize(s, second, tok, resume=True, progress=False)
    assert Path(s.out).read_text() == Path(clean.out).read_text()
    assert first.prompt_draws + second.prompt_draws == reference.prompt_draws  # no candidate drawn twice
    assert first.answers + second.answers == reference.answers  # no prompt answered twice


def test_a_batch_torn_by_a_kill_is_drawn_again(tmp_path, tok):
    prefix = _prefix_ids(tok)
    clean = _settings(tmp_path, out=str(tmp_path / "clean.jsonl"), synthesize=4)
    synthesize(clean, SeededEngine(tok, prefix), tok, progress=False)
    s = _settings(tmp_path, synthesize=4)
    with pytest.raises(Killed):
        synthesize(s, SeededEngine(tok, prefix, die_after=2), tok, progress=False)
    with prompts_path(s.out).open("a") as f:
        f.write('{"_batch": 4, "candidates": [{"text": "What')  # the write a kill cut short
    synthesize(s, SeededEngine(tok, prefix), tok, resume=True, progress=False)
    assert Path(s.out).read_text() == Path(clean.out).read_text()


def test_resuming_with_other_settings_is_refused(tmp_path, tok):
    prefix = _prefix_ids(tok)
    s = _settings(tmp_path, synthesize=4)
    with pytest.raises(Killed):
        synthesize(s, SeededEngine(tok, prefix, die_after=1), tok, progress=False)
    with pytest.raises(DistillError, match=r"synthesize: 4 -> 6"):
        synthesize(_settings(tmp_path, synthesize=6), SeededEngine(tok, prefix), tok, resume=True, progress=False)


def test_cli_synthesize(tmp_path, tok, monkeypatch, capsys):
    """`draftheads distill --synthesize N` wires the flags, the default answer mix and the summary."""
    from draftheads.cli import main
    from draftheads.data import distill_command

    engines = []

    def fake_load_engine(args, settings):
        engines.append(SeededEngine(tok, _prefix_ids(tok)))
        return engines[-1], tok

    monkeypatch.setattr(distill_command, "load_engine", fake_load_engine)
    out = tmp_path / "chats.jsonl"
    args = ["distill", "--target", "smollm2", "--synthesize", "3", "--out", str(out), "--no-progress", "--seed", "5"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "prompts: 3 kept" in printed and "3 rows written" in printed and len(_rows(out)) == 3
    settings = json.loads(sidecar_path(out).read_text())["settings"]
    assert settings["temperature"] == [0.0, 0.0, 0.7, 1.0] and settings["max_new_tokens"] == 384
    assert settings["target"] == "smollm2" and settings["seed"] == 5
    assert main(args) == 2 and "--resume" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0 and len(_rows(out)) == 3
    assert main(["distill", "--target", "t", "--synthesize", "0", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--synthesize must be >= 1" in capsys.readouterr().err
