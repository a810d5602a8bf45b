"""The prompts the benchmark scripts decode, chosen by one rule so their figures compare with
`draftheads bench`'s: the first turn of each question of a Spec-Bench / MT-Bench ``.jsonl`` (or a
text file, one prompt a line), rendered by the target's chat template as `draftheads bench`
renders it (``bench.runner.encode_turn``); for the home-made demo target, which has no chat
template, its held-out code prompts (``bench.questions.demo_questions``).
"""
from __future__ import annotations

import argparse

import torch

#: The default target of every script here: the real small model, resolved by name.
DEFAULT_TARGET = "smollm2"


def add_arguments(p: argparse.ArgumentParser, *, num: int = 12) -> None:
    """``--target``, ``--questions`` and ``--num-prompts``, the same in every script."""
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"a model folder, a Hub id or a target name (default: {DEFAULT_TARGET})")
    p.add_argument("--questions", default=None, metavar="FILE",
                   help="Spec-Bench/MT-Bench .jsonl or a text file of prompts (needed for every target but 'demo')")
    p.add_argument("--num-prompts", type=int, default=num, help="questions taken round-robin over categories")


def load_prompts(tokenizer, target: str, questions: str | None, num: int, prompt_tokens: int = 128) -> list[torch.Tensor]:
    """``num`` prompts as ``[1, T]`` token ids. ``prompt_tokens`` bounds the demo's code prompts only."""
    from draftheads.bench.questions import demo_questions, load_questions, select
    from draftheads.bench.runner import encode_turn

    if questions:
        chosen = select(load_questions(questions), None, num)
    elif target == "demo":
        chosen = demo_questions(tokenizer, num=num, prompt_tokens=prompt_tokens)
    else:
        raise SystemExit(f"--target {target}: pass --questions FILE (a Spec-Bench or MT-Bench question .jsonl, or a "
                         "text file with one prompt a line); only the demo target has built-in prompts")
    if len(chosen) < num:
        raise SystemExit(f"only {len(chosen)} prompts available, asked for {num}: lower --num-prompts")
    use_chat = bool(getattr(tokenizer, "chat_template", None))
    return [encode_turn(tokenizer, q, 0, [], use_chat) for q in chosen]
