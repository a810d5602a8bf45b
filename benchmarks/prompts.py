"""The prompts the benchmark scripts decode, chosen by one rule so their figures compare with
`draftheads bench`'s: the first turn of each question of ``--questions`` (a set shipped in the
package: ``mt-bench`` by default, ``spec-bench``, ``chat``; or a Spec-Bench / MT-Bench ``.jsonl``,
or a text file, one prompt a line), taken round-robin over categories and rendered by the target's
chat template as `draftheads bench` renders it (``bench.runner.encode_turn``; as raw text for a
target without one).
"""
from __future__ import annotations

import argparse

import torch

from draftheads.data.prompt_sets import DEFAULT_QUESTIONS, describe_names

#: The default target of every script here: the real small model, resolved by name.
DEFAULT_TARGET = "smollm2"


def add_arguments(p: argparse.ArgumentParser, *, num: int = 12) -> None:
    """``--target``, ``--questions`` and ``--num-prompts``, the same in every script."""
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"a model folder, a Hub id or a target name (default: {DEFAULT_TARGET})")
    add_questions_argument(p)
    p.add_argument("--num-prompts", type=int, default=num, help="questions taken round-robin over categories")


def add_questions_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--questions", default=DEFAULT_QUESTIONS, metavar="NAME_OR_FILE",
                   help=f"a set shipped in the package ({describe_names()}), a Spec-Bench/MT-Bench .jsonl or a "
                        f"text file of prompts (default: {DEFAULT_QUESTIONS})")


def load_prompts(tokenizer, questions: str | None, num: int) -> list[torch.Tensor]:
    """``num`` prompts as ``[1, T]`` token ids: the first turns of ``questions`` (default: MT-Bench)."""
    from draftheads.bench.questions import load_questions, select
    from draftheads.bench.runner import encode_turn

    chosen = select(load_questions(questions or DEFAULT_QUESTIONS), None, num)
    if len(chosen) < num:
        raise SystemExit(f"only {len(chosen)} prompts available, asked for {num}: lower --num-prompts")
    use_chat = bool(getattr(tokenizer, "chat_template", None))
    return [encode_turn(tokenizer, q, 0, [], use_chat) for q in chosen]
