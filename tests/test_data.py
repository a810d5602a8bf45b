"""Data pipeline: formats, assistant-only masks (two template styles), truncation, chunking, drops,
errors and collation. Uses tiny tokenizers trained here, offline, in milliseconds."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import datasets
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from draftheads.data import Collator, DataConfig, build_datasets, load_raw_dataset, tokenize_chat, tokenize_text
from draftheads.data.chat_mask import _mask_by_prefix_encoding, tokenize_with_spans
from draftheads.data.formats import detect_format, normalize_chat

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Not prefix-stable: the first line counts the messages, so a prefix renders differently.
COUNTING = (
    "<|im_start|>system\n{{ messages | length }} messages<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "hello world, how are you today? I am fine, thanks for asking.",
    "The quick brown fox jumps over the lazy dog.\n" * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "You are a helpful assistant. What is the capital of France? Paris is the capital.",
    "user assistant system tell me a joke about cats and dogs",
]


def _bpe(specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=True reports whitespace tokens with shifted/empty offsets: the mask must cope.
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def chatml_tok() -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
        eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def llama_tok() -> PreTrainedTokenizerFast:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(specials),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        additional_special_tokens=specials[2:],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = LLAMA3
    return tok


@pytest.fixture(scope="module")
def plain_tok() -> PreTrainedTokenizerFast:
    """A base-LM tokenizer: bos/eos, no chat template, no pad."""
    return PreTrainedTokenizerFast(
        tokenizer_object=_bpe(["<s>", "</s>"]), bos_token="<s>", eos_token="</s>", clean_up_tokenization_spaces=False
    )


def _runs(tok, ids, mask) -> list[str]:
    """Decoded text of each maximal run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r, skip_special_tokens=False) for r in runs]



SYSTEM = "You are a helpful assistant."
CONVERSATIONS = [
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital."},
    ],
    [
        {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": " hello, how are you today?  "},
        {"role": "user", "content": "tell me a joke about cats"},
        {"role": "assistant", "content": "cats and dogs\n"},
        {"role": "user", "content": "and code?"},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
    ],
    # The assistant repeats the user's words: the user's copy must stay masked.
    [
        {"role": "user", "content": "say: the quick brown fox"},
        {"role": "assistant", "content": "the quick brown fox"},
    ],
    # An empty assistant reply still trains the end-of-turn token.
    [{"role": "user", "content": "say nothing"}, {"role": "assistant", "content": ""}],
]
SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}


def _assistant(conv, strip=False):
    return [m["content"].strip() if strip else m["content"] for m in conv if m["role"] == "assistant"]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _sharegpt(conv):
    return {"conversations": [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in conv]}


def _cfg(path, tmp_path, **kw) -> DataConfig:
    kw.setdefault("eval_fraction", 0.0)
    return DataConfig(path=str(path), cache_dir=str(tmp_path / "hf_cache"), **kw)


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=["system", "multi_turn", "echo", "empty_reply"])
def test_chatml_mask_is_exactly_assistant_content_and_im_end(chatml_tok, conv):
    ids, mask = tokenize_chat(chatml_tok, conv, 4096)
    assert ids == list(chatml_tok.apply_chat_template(conv)["input_ids"])  # same ids HF would feed the model
    assert _runs(chatml_tok, ids, mask) == [c + "<|im_end|>" for c in _assistant(conv)]
    # Nothing outside those runs is trainable: system, user, headers, the "\n" after <|im_end|>.
    masked_out = chatml_tok.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=False)
    for m in conv:
        if m["role"] != "assistant":
            assert m["content"] in masked_out


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=["system", "multi_turn", "echo", "empty_reply"])
def test_llama3_style_template_with_bos(llama_tok, conv):
    ids, mask = tokenize_chat(llama_tok, conv, 4096)
    assert ids[0] == llama_tok.bos_token_id and mask[0] == 0
    assert ids.count(llama_tok.bos_token_id) == 1  # the template writes bos; we must not add another
    assert ids == list(llama_tok.apply_chat_template(conv)["input_ids"])
    # The template trims content; the mask follows what is rendered.
    assert _runs(llama_tok, ids, mask) == [c + "<|eot_id|>" for c in _assistant(conv, strip=True)]


def test_prefix_unstable_template_falls_back_to_ordered_search(chatml_tok):
    tok = copy.deepcopy(chatml_tok)
    tok.chat_template = COUNTING
    for conv in CONVERSATIONS:
        ids, mask = tokenize_chat(tok, conv, 4096)
        assert tok.decode(ids[:16]).startswith(f"<|im_start|>system\n{len(conv)} messages")
        assert _runs(tok, ids, mask) == [c + "<|im_end|>" for c in _assistant(conv)]


def test_stable_templates_use_the_exact_prefix_method(chatml_tok, llama_tok):
    from draftheads.data.chat_mask import _span_by_prefix, make_renderer, special_strings

    for tok in (chatml_tok, llama_tok):
        render = make_renderer(tok)
        for conv in CONVERSATIONS:
            full = render(conv, False)
            for i, m in enumerate(conv):
                if m["role"] == "assistant":
                    assert _span_by_prefix(render, conv, i, full, special_strings(tok)) is not None


def test_offsets_and_offset_free_fallback_agree(chatml_tok, llama_tok):
    from draftheads.data.chat_mask import assistant_char_spans, make_renderer, special_strings

    for tok in (chatml_tok, llama_tok):
        for conv in CONVERSATIONS:
            text, spans = assistant_char_spans(make_renderer(tok), conv, special_strings(tok))
            assert tokenize_with_spans(tok, text, spans) == _mask_by_prefix_encoding(tok, text, spans)


def test_chat_truncation_keeps_prefix(chatml_tok):
    conv = CONVERSATIONS[1]
    full_ids, full_mask = tokenize_chat(chatml_tok, conv, 4096)
    ids, mask = tokenize_chat(chatml_tok, conv, 40)
    assert len(ids) == 40 and ids == full_ids[:40] and mask == full_mask[:40]


# --------------------------------------------------------------------------- files and formats


def test_sharegpt_jsonl_end_to_end(chatml_tok, tmp_path):
    path = _write_jsonl(tmp_path / "chat.jsonl", [_sharegpt(c) for c in CONVERSATIONS])
    train, eval_ds, stats = build_datasets(_cfg(path, tmp_path), chatml_tok)
    assert eval_ds is None
    assert stats.format == "sharegpt" and stats.rows_read == stats.rows_kept == len(CONVERSATIONS)
    assert stats.dropped_empty == stats.dropped_no_trainable == 0
    assert set(train.column_names) == {"input_ids", "loss_mask"}
    assert stats.trainable_tokens == sum(sum(m) for m in train["loss_mask"])
    for row, conv in zip(train, CONVERSATIONS):
        assert _runs(chatml_tok, row["input_ids"], row["loss_mask"]) == [c + "<|im_end|>" for c in _assistant(conv)]


def test_messages_parquet_end_to_end(llama_tok, tmp_path):
    path = _write_parquet(tmp_path / "chat.parquet", [{"messages": c, "id": i} for i, c in enumerate(CONVERSATIONS)])
    train, _, stats = build_datasets(_cfg(path, tmp_path), llama_tok)
    assert stats.format == "messages" and len(train) == len(CONVERSATIONS)
    for row, conv in zip(train, CONVERSATIONS):
        assert _runs(llama_tok, row["input_ids"], row["loss_mask"]) == [
            c + "<|eot_id|>" for c in _assistant(conv, strip=True)
        ]


def test_text_rows_all_trainable_with_bos_eos(plain_tok, tmp_path):
    path = _write_parquet(tmp_path / "text.parquet", [{"text": t} for t in CORPUS])
    train, _, stats = build_datasets(_cfg(path, tmp_path, max_length=4096), plain_tok)
    assert stats.format == "text" and len(train) == len(CORPUS)
    for row, text in zip(train, CORPUS):
        ids, mask = row["input_ids"], row["loss_mask"]
        assert ids[0] == plain_tok.bos_token_id and ids[-1] == plain_tok.eos_token_id
        assert plain_tok.decode(ids[1:-1]) == text
        assert mask == [0] + [1] * (len(ids) - 1)  # every token but the first is a target


def test_text_field_and_folder_of_jsonl(plain_tok, tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    _write_jsonl(folder / "a.jsonl", [{"body": CORPUS[0]}])
    _write_jsonl(folder / "sub" / "b.jsonl", [{"body": CORPUS[1]}, {"body": CORPUS[2]}])
    (folder / "notes.txt").write_text("ignored")
    assert len(load_raw_dataset(_cfg(folder, tmp_path))) == 3
    train, _, stats = build_datasets(_cfg(folder, tmp_path, text_field="body"), plain_tok)
    assert stats.rows_kept == 3 and len(train) == 3


def test_text_chunking_windows_cover_every_token_once(plain_tok):
    text = CORPUS[1] * 4
    (whole,) = tokenize_text(plain_tok, text, 10_000)
    windows = tokenize_text(plain_tok, text, 16, chunk=True)
    assert len(windows) > 2 and all(len(ids) <= 16 for ids, _ in windows)
    # Consecutive windows overlap by one context token; concatenated targets are the whole stream.
    stream = windows[0][0] + [t for ids, _ in windows[1:] for t in ids[1:]]
    assert stream == whole[0]
    for (prev, _), (ids, mask) in zip(windows, windows[1:]):
        assert ids[0] == prev[-1] and mask[0] == 0
    assert sum(sum(m) for _, m in windows) == len(whole[0]) - 1
    (trunc,) = tokenize_text(plain_tok, text, 16, chunk=False)
    assert trunc[0] == whole[0][:16]


def test_text_chunking_in_build_datasets(plain_tok, tmp_path):
    path = _write_jsonl(tmp_path / "code.jsonl", [{"text": CORPUS[2] * 5}, {"text": "hi"}])
    train, _, stats = build_datasets(_cfg(path, tmp_path, max_length=32), plain_tok)
    assert stats.rows_kept == 2 and stats.examples == len(train) > 2
    assert max(len(x) for x in train["input_ids"]) == 32
    train2, _, stats2 = build_datasets(_cfg(path, tmp_path, max_length=32, chunk_text=False), plain_tok)
    assert len(train2) == 2 and stats2.trainable_tokens == 31 + sum(train2[1]["loss_mask"])


def test_auto_format_and_explicit_format_checks():
    assert detect_format(["conversations", "id"]) == "sharegpt"
    assert detect_format(["messages"]) == "messages"
    assert detect_format(["content"], text_field="content") == "text"
    with pytest.raises(ValueError, match="prompt"):
        detect_format(["prompt", "completion"])
    with pytest.raises(ValueError, match="'messages' column"):
        detect_format(["text"], "messages")


def test_normalize_chat_roles_and_content_parts():
    conv = normalize_chat(
        [{"from": "system", "value": "s"}, {"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}],
        "sharegpt",
        0,
    )
    assert [m["role"] for m in conv] == ["system", "user", "assistant"]
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parts = normalize_chat([{"role": "user", "content": content}], "messages", 0)
    assert parts == [{"role": "user", "content": "ab"}]


def test_unknown_role_names_row_and_value(chatml_tok, tmp_path):
    bad = {"conversations": [{"from": "human", "value": "x"}, {"from": "robot", "value": "y"}]}
    rows = [_sharegpt(CONVERSATIONS[0]), bad]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    for num_proc in (None, 2):
        with pytest.raises(ValueError, match=r"bad.jsonl line 2, message 2: unknown 'from' value 'robot'"):
            build_datasets(_cfg(path, tmp_path, num_proc=num_proc), chatml_tok)
    with pytest.raises(ValueError, match=r"row 4, message 1.*'tool'"):  # index 3: the 4th row
        normalize_chat([{"role": "tool", "content": "x"}], "messages", 3)


# --------------------------------------------------------------------------- drops and errors


def test_rows_without_trainable_tokens_are_dropped_and_counted(chatml_tok, tmp_path):
    long_user = "tell me a joke about cats and dogs " * 20  # pushes the assistant turn past max_length
    rows = [
        {"messages": CONVERSATIONS[0]},
        {"messages": [{"role": "user", "content": long_user}, {"role": "assistant", "content": "no"}]},
        {"messages": [{"role": "user", "content": "no reply"}]},
        {"messages": []},
    ]
    path = _write_jsonl(tmp_path / "drops.jsonl", rows)
    train, _, stats = build_datasets(_cfg(path, tmp_path, max_length=64), chatml_tok)
    assert (stats.rows_read, stats.rows_kept, stats.dropped_no_trainable, stats.dropped_empty) == (4, 1, 2, 1)
    assert len(train) == 1 and stats.trainable_tokens == sum(train[0]["loss_mask"]) > 0
    assert "2 without trainable tokens" in stats.summary()


def test_a_row_whose_text_field_has_another_name_is_an_error_not_an_empty_row(plain_tok, chatml_tok, tmp_path):
    """It used to be counted as empty and dropped: training went on without it."""
    rows = [{"text": CORPUS[0]}, {"txt": CORPUS[1]}, {"text": ""}, {"text": CORPUS[2]}]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(ValueError, match=r"mixed.jsonl line 2 has no 'text' field .*holds 'txt'; set data.text_field=txt"):
        build_datasets(_cfg(path, tmp_path, eval_fraction=0), plain_tok)
    # a row that only lacks the text (its other fields are those every row has: metadata) is still
    # an empty row, counted
    path = _write_jsonl(tmp_path / "empty.jsonl", [{"text": CORPUS[0], "url": "u/1"}, {"url": "u/2"}, {"text": CORPUS[1], "url": "u/3"}])
    _, _, stats = build_datasets(_cfg(path, tmp_path, eval_fraction=0), plain_tok)
    assert (stats.rows_read, stats.rows_kept, stats.dropped_empty) == (3, 2, 1)
    # chat rows: a conversation under another key is named too
    chat = [{"messages": CONVERSATIONS[0]}, {"conversation": CONVERSATIONS[1]}]
    path = _write_jsonl(tmp_path / "chat.jsonl", chat)
    with pytest.raises(ValueError, match=r"chat.jsonl line 2 has no 'messages' field .*holds 'conversation'"):
        build_datasets(_cfg(path, tmp_path, eval_fraction=0), chatml_tok)


def test_empty_dataset_errors_name_path_and_counts(chatml_tok, plain_tok, tmp_path):
    empty = _write_parquet(tmp_path / "empty.parquet", [{"text": "x"}])
    datasets.Dataset.from_dict({"text": []}).to_parquet(str(empty))
    with pytest.raises(ValueError, match=r"empty\.parquet.*0 rows"):
        build_datasets(_cfg(empty, tmp_path), plain_tok)
    none_kept = _write_jsonl(tmp_path / "nokept.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 3)
    with pytest.raises(ValueError, match=r"nokept\.jsonl.*kept 0 of 3 rows.*3 with no trainable"):
        build_datasets(_cfg(none_kept, tmp_path), chatml_tok)


def test_missing_path_error_names_it(plain_tok, tmp_path):
    missing = tmp_path / "nope" / "train.jsonl"
    with pytest.raises(FileNotFoundError, match="nope/train.jsonl"):
        load_raw_dataset(_cfg(missing, tmp_path))
    with pytest.raises(FileNotFoundError, match="data/missing.parquet"):
        build_datasets(DataConfig(path="data/missing.parquet"), plain_tok)


def test_hub_id_goes_to_load_dataset(monkeypatch, tmp_path):
    calls = []

    def fake_load_dataset(path, **kw):
        calls.append((path, kw))
        return datasets.Dataset.from_dict({"text": ["a"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.chdir(tmp_path)
    ds = load_raw_dataset(DataConfig(path="someone/chat-data", split="train_sft"))
    assert len(ds) == 1 and calls == [("someone/chat-data", {"split": "train_sft", "cache_dir": None})]


def test_tokenizer_without_chat_template(plain_tok, tmp_path):
    path = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    with pytest.raises(ValueError, match=r"no chat template.*chat_template.*plain-text"):
        build_datasets(_cfg(path, tmp_path), plain_tok)


def test_config_validation():
    with pytest.raises(ValueError, match="format"):
        DataConfig(path="x", format="alpaca")
    with pytest.raises(ValueError, match="max_length"):
        DataConfig(path="x", max_length=1)
    with pytest.raises(ValueError, match="eval_fraction"):
        DataConfig(path="x", eval_fraction=1.0)


# --------------------------------------------------------------------------- eval split, workers


def test_eval_fraction_and_eval_path(plain_tok, tmp_path):
    rows = [{"text": f"{CORPUS[i % len(CORPUS)]} {i}"} for i in range(20)]
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    train, eval_ds, stats = build_datasets(_cfg(path, tmp_path, eval_fraction=0.1, seed=3), plain_tok)
    assert (len(train), len(eval_ds)) == (18, 2) and stats.eval.rows_read == 2 and stats.rows_read == 18
    again, eval_again, _ = build_datasets(_cfg(path, tmp_path, eval_fraction=0.1, seed=3), plain_tok)
    assert eval_again["input_ids"] == eval_ds["input_ids"]  # the split is reproducible
    eval_path = _write_jsonl(tmp_path / "eval.jsonl", rows[:3])
    train, eval_ds, stats = build_datasets(_cfg(path, tmp_path, eval_path=str(eval_path), max_samples=5), plain_tok)
    assert (len(train), len(eval_ds)) == (5, 3)


def test_num_proc_gives_same_result(chatml_tok, tmp_path):
    path = _write_jsonl(tmp_path / "chat.jsonl", [_sharegpt(c) for c in CONVERSATIONS] * 3 + [{"conversations": []}])
    one, _, s1 = build_datasets(_cfg(path, tmp_path), chatml_tok)
    two, _, s2 = build_datasets(_cfg(path, tmp_path, num_proc=2), chatml_tok)
    assert one["input_ids"] == two["input_ids"] and one["loss_mask"] == two["loss_mask"]
    assert s1.as_dict() == s2.as_dict() and s1.dropped_empty == 1


# --------------------------------------------------------------------------- collation


def test_collator_pads_right_and_masks():
    batch = [
        {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
        {"input_ids": [8], "loss_mask": [0]},
    ]
    out = Collator(pad_token_id=0)(batch)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["loss_mask"].tolist() == [[0, 1, 1], [0, 0, 0]]
    assert all(t.dtype == torch.long for t in out.values())
    padded = Collator(pad_token_id=None, pad_to_multiple_of=4, eos_token_id=2)(batch)
    assert padded["input_ids"].tolist() == [[5, 6, 7, 2], [8, 2, 2, 2]]
    assert padded["loss_mask"].shape == (2, 4) and padded["attention_mask"][0].tolist() == [1, 1, 1, 0]
    with pytest.raises(ValueError, match="pad"):
        Collator(pad_token_id=None)


def test_collator_on_built_dataset(chatml_tok, tmp_path):
    path = _write_jsonl(tmp_path / "chat.jsonl", [_sharegpt(c) for c in CONVERSATIONS])
    train, _, _ = build_datasets(_cfg(path, tmp_path), chatml_tok)
    collate = Collator.from_tokenizer(chatml_tok, pad_to_multiple_of=8)
    assert collate.pad_token_id == chatml_tok.eos_token_id  # no pad token: eos fallback
    batch = collate([train[i] for i in range(len(train))])
    lengths = [len(x) for x in train["input_ids"]]
    assert batch["input_ids"].shape[1] % 8 == 0 and batch["input_ids"].shape[1] >= max(lengths)
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert int(batch["loss_mask"].sum()) == sum(sum(m) for m in train["loss_mask"])


def test_empty_and_corrupt_files_name_the_path(plain_tok, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.jsonl.*0 rows"):
        build_datasets(_cfg(empty, tmp_path), plain_tok)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=r"corrupt\.parquet"):
        build_datasets(_cfg(corrupt, tmp_path), plain_tok)
