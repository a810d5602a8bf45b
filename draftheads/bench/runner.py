"""Runs plain `generate` and every method on the same prompts, interleaved.

Interleaving (every prompt runs plain and each method back to back, in an order that rotates
from prompt to prompt) makes the ratios fair on a machine whose speed drifts: a slow minute
slows every method alike instead of whichever happened to run then. Warm-up runs are not timed.

With ``Settings.rounds`` = N every prompt (each turn) is timed N times per method, each round
interleaved with plain as above (the rotation continues from round to round). Each round has its
own seed, the same for plain and every method: round r of the k-th timed prompt uses
``seed + k * N + r`` (``seed + k`` at N = 1, as before), so at temperature > 0 rounds sample
different continuations. At temperature 0 every round's output is compared with that round's plain
output. A multi-turn question continues with round 0's plain answer, so every round of a turn sees
the same prompt.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .clock import timed
from .methods import PLAIN, Method
from .questions import Question


@dataclass
class Settings:
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    warmup: int = 1
    use_chat_template: bool = True
    progress: bool = True
    #: timed runs of every method (and plain) per prompt; see the module docstring.
    rounds: int = 1


@dataclass
class Sample:
    """One method on one turn of one question."""

    question_id: str
    category: str
    turn: int
    method: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    #: Tokens committed per target forward (bonus token included); empty for plain decoding,
    #: which commits exactly one token per forward by definition.
    accept_lengths: list[int] = field(default_factory=list)
    #: Output identical to plain greedy `generate` (None at temperature > 0: draws differ).
    exact: bool | None = None
    truncated: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    #: which timed round of this turn (0 .. rounds - 1), and the seed plain and the methods used in it.
    round: int = 0
    seed: int | None = None
    #: Seconds after the prefill (the forward that gives the first token; None when not measured):
    #: what decoding alone took, timed the same way for plain `generate` and every method (`clock`).
    decode_seconds: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """The tokens after the first over `decode_seconds` (None with fewer than 2 new tokens):
        at temperature > 0 methods and plain sample different texts, and a 7-token answer's
        tokens/s is mostly its prefill, so only decoding alone compares their speed."""
        if self.decode_seconds is None or self.decode_seconds <= 0 or self.new_tokens < 2:
            return None
        return (self.new_tokens - 1) / self.decode_seconds

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second,
                "decode_tokens_per_second": self.decode_tokens_per_second}


class ChatTemplateError(ValueError):
    pass


def encode_turn(tokenizer, question: Question, turn: int, answers: list[str], use_chat_template: bool) -> torch.Tensor:
    """Prompt ids for ``turn``: the earlier turns with their answers, then this turn.

    With the chat template, turns are user messages and answers assistant messages. Without it
    they are concatenated as text, separated by blank lines."""
    if not use_chat_template:
        parts: list[str] = []
        for k in range(turn):
            parts += [question.turns[k], answers[k]]
        parts.append(question.turns[turn])
        text = "\n\n".join(parts) + "\n\n"
        return tokenizer(text, return_tensors="pt").input_ids
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'the target')} has no chat template: "
            "pass --no-chat-template to feed the questions as raw text"
        )
    messages: list[dict[str, str]] = []
    for k in range(turn):
        messages += [{"role": "user", "content": question.turns[k]}, {"role": "assistant", "content": answers[k]}]
    messages.append({"role": "user", "content": question.turns[turn]})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]


def context_limit(target) -> int | None:
    from ..heads.config import text_config

    return getattr(text_config(target), "max_position_embeddings", None)


def fit_context(ids: torch.Tensor, max_new_tokens: int, limit: int | None) -> tuple[torch.Tensor, bool]:
    """Keep the last tokens of a prompt too long for the model's context (+ the new tokens)."""
    if limit is None or ids.shape[1] + max_new_tokens <= limit:
        return ids, False
    keep = limit - max_new_tokens
    if keep < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the model's {limit} positions")
    return ids[:, -keep:], True


class Runner:
    def __init__(self, target, tokenizer, methods: list[Method], settings: Settings) -> None:
        self.target, self.tokenizer, self.methods, self.settings = target, tokenizer, methods, settings
        self.limit = context_limit(target)
        self.device = target.device
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else tokenizer.eos_token_id

    def plain(self, ids: torch.Tensor, seed: int) -> torch.Tensor:
        """The baseline: transformers' own `generate` (greedy, or sampling with the same
        temperature and no top-k/top-p, as the methods get)."""
        s = self.settings
        sampling = {"do_sample": False} if s.temperature == 0 else {
            "do_sample": True, "temperature": s.temperature, "top_k": 0, "top_p": 1.0}
        if s.temperature > 0:
            torch.manual_seed(seed)
        ids = ids.to(self.device)
        out = self.target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
            pad_token_id=self.pad_token_id, **sampling,
        )
        return out.cpu()

    def speculative(self, method: Method, ids: torch.Tensor, seed: int):
        generator = torch.Generator().manual_seed(seed)
        return method.decoder.generate(
            ids, max_new_tokens=self.settings.max_new_tokens, temperature=self.settings.temperature, top_k=0, top_p=1.0,
            generator=generator, acceptance=method.acceptance,
        )

    def warm_up(self, questions: list[Question]) -> None:
        """Untimed runs of every method on the first prompt: first calls pay for lazy
        initialisation (kernels, allocator, caches) that a user's steady state never sees."""
        if not questions or self.settings.warmup < 1:
            return
        ids, _ = fit_context(
            encode_turn(self.tokenizer, questions[0], 0, [], self.settings.use_chat_template),
            self.settings.max_new_tokens, self.limit,
        )
        for _ in range(self.settings.warmup):
            self.plain(ids, self.settings.seed)
            for m in self.methods:
                self.speculative(m, ids, self.settings.seed)

    def _round(self, q: Question, turn: int, ids: torch.Tensor, truncated: bool, index: int,
               rnd: int) -> tuple[list[Sample], torch.Tensor]:
        """One timed round of one turn: plain and every method back to back, in the order that
        ``index`` (the count of rounds timed so far) rotates to, all with seed ``settings.seed + index``.
        Returns the samples and plain's output."""
        s = self.settings
        seed = s.seed + index
        # Rotate who goes first so no method always runs right after another's.
        order = [PLAIN] + [m.name for m in self.methods]
        shift = index % len(order)
        order = order[shift:] + order[:shift]
        results: dict[str, Any] = {}
        for name in order:
            if name == PLAIN:
                results[name] = timed(self.target, self.plain, ids, seed)
            else:
                method = next(m for m in self.methods if m.name == name)
                results[name] = timed(self.target, self.speculative, method, ids, seed)
        reference, seconds, decode_seconds = results[PLAIN]
        base = dict(question_id=q.question_id, category=q.category, turn=turn,
                    prompt_tokens=ids.shape[1], truncated=truncated, round=rnd, seed=seed)
        samples = [Sample(method=PLAIN, new_tokens=reference.shape[1] - ids.shape[1], seconds=seconds,
                          decode_seconds=decode_seconds, **base)]
        for m in self.methods:
            out, seconds, decode_seconds = results[m.name]
            exact = bool(torch.equal(out.sequences, reference)) if s.temperature == 0 else None
            samples.append(Sample(
                method=m.name, new_tokens=out.num_new_tokens, seconds=seconds,
                accept_lengths=list(out.accept_lengths), exact=exact, decode_seconds=decode_seconds,
                stats=_json_stats(out.stats), **base,
            ))
        return samples, reference

    def run(self, questions: list[Question]) -> list[Sample]:
        from tqdm.auto import tqdm

        s = self.settings
        if not isinstance(s.rounds, int) or isinstance(s.rounds, bool) or s.rounds < 1:
            raise ValueError(f"rounds must be a whole number >= 1, got {s.rounds!r}")
        samples: list[Sample] = []
        torch.manual_seed(s.seed)
        with torch.inference_mode():
            self.warm_up(questions)
            index = 0
            bar = tqdm(questions, desc="bench", unit="question", file=sys.stderr, disable=not s.progress)
            for q in bar:
                answers: list[str] = []
                for turn in range(len(q.turns)):
                    ids, truncated = fit_context(
                        encode_turn(self.tokenizer, q, turn, answers, s.use_chat_template), s.max_new_tokens, self.limit
                    )
                    for rnd in range(s.rounds):
                        timed, plain_out = self._round(q, turn, ids, truncated, index, rnd)
                        samples += timed
                        if rnd == 0:
                            reference = plain_out
                        index += 1
                    # The next turn continues the conversation with the baseline's answer (round 0's),
                    # so every method and round sees the same prompt even if one of them were not exact.
                    answers.append(self.tokenizer.decode(reference[0, ids.shape[1]:], skip_special_tokens=True))
                bar.set_postfix_str(_running_speedups(samples, [m.name for m in self.methods]))
        return samples


def _json_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The sample's scalar stats, plus the draft budget's steps by mode (``budget_full``,
    ``budget_capped``, ``budget_plain``): how often speculation drafted in full, less, or not at all;
    with a budget per source (heads behind prompt lookup) each source's too (``budget_lookup_plain``, ...)."""
    out = {k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool)) and k not in ("new_tokens", "steps")}
    budget = stats.get("draft_budget") or {}
    for mode, count in budget.get("steps", {}).items():
        out[f"budget_{mode}"] = count
    for source, its in budget.get("sources", {}).items():  # a budget per source: each one's steps too
        for mode, count in its.get("steps", {}).items():
            out[f"budget_{source}_{mode}"] = count
    return out


def _running_speedups(samples: list[Sample], names: list[str]) -> str:
    plain = [x.tokens_per_second for x in samples if x.method == PLAIN]
    if not plain or not sum(plain):
        return ""
    base = sum(plain) / len(plain)
    parts = []
    for name in names:
        rate = [x.tokens_per_second for x in samples if x.method == name]
        parts.append(f"{name} {sum(rate) / len(rate) / base:.2f}x")
    return ", ".join(parts)
