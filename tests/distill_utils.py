"""Helpers for the distill tests: a byte-level BPE tokenizer with a ChatML template (the shape of
SmolLM2's: a default system turn, ``<|im_start|>``/``<|im_end|>``), and an engine that answers from
a script and records the prompts it was given."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from conftest import tiny_corpus

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful model<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BYTE_VOCAB = 400


def byte_chat_tokenizer(template: str | None = CHATML):
    """A byte-level BPE tokenizer (every byte is a token, so a model can emit half a UTF-8
    character) with ChatML specials: <|endoftext|> 0 (pad), <|im_start|> 1 (bos), <|im_end|> 2 (eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BYTE_VOCAB, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(400, seed=1) + ["héllo wörld"] * 3, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = template
    return fast


class ScriptedEngine:
    """Answers ``answer(prompt_ids, call_index)`` for every prompt; records (prompts, seed, sampling)."""

    context_length = None

    def __init__(self, answer: Callable[[list[int], int], tuple[list[int], bool]]) -> None:
        self.answer = answer
        self.calls: list[tuple[list[list[int]], int, list]] = []
        self.generated = 0

    def generate(self, prompts: Sequence[list[int]], seed: int, sampling: Sequence) -> list[tuple[list[int], bool]]:
        self.calls.append(([list(p) for p in prompts], seed, list(sampling)))
        out = []
        for p in prompts:
            out.append(self.answer(list(p), self.generated))
            self.generated += 1
        return out


QUESTIONS = ["What is a list?", "what is a LIST", "", "Explain recursion.", "Write a poem about the sea.",
             "How do heads guess tokens?", "Name three colours.", "Why is the sky blue?"]


class SeededEngine:
    """A deterministic stand-in for a sampling target: the answer to prompt ``i`` of a call depends
    only on ``seed + i`` (as vLLM's per-request seeds do) and on the prompt. A prompt equal to
    ``prefix`` (the user-turn prefix of --synthesize) gets a question from ``questions``; any other
    prompt gets "answer <k>". Counts what it generated; ``die_after`` calls raise ``Killed``."""

    context_length = None

    def __init__(self, tok, prefix: list[int], questions: Sequence[str] = QUESTIONS, die_after: int | None = None) -> None:
        self.tok, self.prefix, self.questions, self.die_after = tok, list(prefix), list(questions), die_after
        self.prompt_draws = 0
        self.answers = 0

    def generate(self, prompts, seed, sampling):
        if self.die_after is not None:
            if self.die_after == 0:
                raise Killed
            self.die_after -= 1
        out = []
        for i, p in enumerate(prompts):
            if list(p) == self.prefix:
                self.prompt_draws += 1
                text = self.questions[(seed + i) * 5 % len(self.questions)]
            else:
                self.answers += 1
                text = f"answer {(seed + i + len(p)) % 97}"
            out.append((self.tok(text, add_special_tokens=False)["input_ids"], True))
        return out


class Killed(RuntimeError):
    """Stands for a kill in the middle of a run."""
