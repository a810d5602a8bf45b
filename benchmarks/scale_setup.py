"""Shared setup of the data-at-scale benchmarks (bench_padding.py, bench_feature_cache.py):
a BPE tokenizer with a ChatML template, a chat dataset with a realistic length spread, and a
random-weight Llama target saved as an ordinary model folder. Offline, seeded."""
from __future__ import annotations

import json
import random
from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTIONS = Path("/work/shared/data/spec_bench_question.jsonl")


def make_tokenizer(out: Path, vocab_size: int = 4096):
    """Byte-level BPE trained on stdlib sources (the demo target's recipe) plus ChatML specials."""
    from draftheads.demo import DemoTargetSpec, corpus_texts, train_tokenizer

    if (out / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(out)
    texts = corpus_texts("train", max_files=300)
    tok = train_tokenizer(texts, DemoTargetSpec(vocab_size=vocab_size))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.model_max_length = 1 << 20
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    return tok


def chat_rows(n: int = 480, seed: int = 0, questions: Path = QUESTIONS) -> list[dict]:
    """ShareGPT rows: Spec-Bench questions as user turns (at most 2000 characters; MT-Bench ones have
    two turns), answers cut
    from stdlib source text with log-normal lengths in characters (median ~550 characters, i.e.
    ~150 tokens; the long tail reaches several thousand), like ShareGPT answers' spread."""
    from draftheads.demo import corpus_texts

    rng = random.Random(seed)
    source = "\n".join(corpus_texts("train", max_files=300))
    rows = []
    qs = [json.loads(line) for line in questions.read_text().splitlines() if line.strip()]
    for i in range(n):
        q = qs[i % len(qs)]
        conv = []
        for turn in q["turns"]:
            length = int(min(12000, rng.lognormvariate(6.3, 1.0)))
            start = rng.randrange(0, len(source) - length)
            conv += [{"from": "human", "value": turn[:2000]}, {"from": "gpt", "value": source[start : start + length]}]
        rows.append({"conversations": conv})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_target(out: Path, tokenizer, layers: int = 12, hidden: int = 512, heads: int = 8, seed: int = 0) -> Path:
    """A random-weight Llama with the tokenizer's vocabulary, saved with the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").exists():
        return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=int(hidden * 8 / 3 // 64 * 64),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
