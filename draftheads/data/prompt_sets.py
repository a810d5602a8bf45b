"""Prompt sets by name, shipped in the package so commands have prompts without a file or a network.

- ``mt-bench``, ``spec-bench``: the evaluation questions (``eval_questions/``, see
  ``eval_overlap``): what `draftheads bench` measures heads on (``mt-bench`` by default), and
  what training data must never hold.
- ``chat``: 40 general single-turn chat prompts written for this project (``prompts/chat.jsonl``:
  writing, coding, math, reasoning, extraction, summarisation, QA, roleplay; categories
  interleaved, so the first N cover them all). They are what `draftheads calibrate` times trees on
  by default: tuning a tree on the evaluation questions would tune it on the test.

Every set is a Spec-Bench-format ``.jsonl`` (``question_id``, ``category``, ``turns``). A name
wins over a file of that name in the working directory (pass ``./mt-bench`` for the file).
"""
from __future__ import annotations

from pathlib import Path

from .eval_overlap import EVAL_SETS

PROMPTS_DIR = Path(__file__).with_name("prompts")
CHAT_PROMPTS = PROMPTS_DIR / "chat.jsonl"
#: Every named set: the evaluation sets, then the general chat prompts.
PROMPT_SETS: dict[str, Path] = {**EVAL_SETS, "chat": CHAT_PROMPTS}
#: What `draftheads bench` and the benchmark scripts decode when no --questions is given.
DEFAULT_QUESTIONS = "mt-bench"
#: What `draftheads calibrate` times trees on when no --prompts is given.
DEFAULT_CALIBRATION_PROMPTS = "chat"


def resolve_prompt_set(name_or_path: str | Path) -> Path:
    """The packaged file of a named set, else ``name_or_path`` as a path (checked by the reader)."""
    return PROMPT_SETS.get(str(name_or_path), Path(name_or_path))


def describe_names() -> str:
    """"mt-bench, spec-bench or chat", for help texts and errors."""
    names = list(PROMPT_SETS)
    return ", ".join(names[:-1]) + " or " + names[-1]
