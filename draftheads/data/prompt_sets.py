"""Prompt sets by name, shipped in the package so commands have prompts without a file or a network.

- ``mt-bench``, ``spec-bench``: the evaluation questions (``eval_questions/``, see
  ``eval_overlap``): what `draftheads bench` measures heads on (``mt-bench`` by default), and
  what training data must never hold.
- ``chat``: 40 general single-turn chat prompts written for this project (``prompts/chat.jsonl``:
  writing, coding, math, reasoning, extraction, summarisation, QA, roleplay; categories
  interleaved, so the first N cover them all).
- ``user``: 32 prompts shaped like what users send (``prompts/user.jsonl``), written for this
  project: mixed categories, longer, and most hand the model text to rework (an email to rewrite,
  code to fix or convert, notes to turn into JSON, minutes to summarise), so the answers repeat
  some of their prompt, as real requests' answers do. What training's tree choice and
  `draftheads calibrate` time plans on by default (`plan_prompts`): tuning a plan on the
  evaluation questions would tune it on the test, and tuning it on the target's own chats, which
  repeat little, turned prompt lookup off where it ran 1.7x.
- ``text``: 24 raw-text beginnings (``prompts/text.jsonl``: prose, lists, code, a letter, a table)
  for a base model without a chat template, which continues text instead of answering.

Every set is a Spec-Bench-format ``.jsonl`` (``question_id``, ``category``, ``turns``). A name
wins over a file of that name in the working directory (pass ``./mt-bench`` for the file).
"""
from __future__ import annotations

from pathlib import Path

from .eval_overlap import EVAL_SETS

PROMPTS_DIR = Path(__file__).with_name("prompts")
CHAT_PROMPTS = PROMPTS_DIR / "chat.jsonl"
USER_PROMPTS = PROMPTS_DIR / "user.jsonl"
TEXT_PROMPTS = PROMPTS_DIR / "text.jsonl"
#: Every named set: the evaluation sets, then the sets plans are timed on.
PROMPT_SETS: dict[str, Path] = {**EVAL_SETS, "chat": CHAT_PROMPTS, "user": USER_PROMPTS, "text": TEXT_PROMPTS}
#: What `draftheads bench` and the benchmark scripts decode when no --questions is given.
DEFAULT_QUESTIONS = "mt-bench"
#: What `draftheads calibrate` times trees on when no --prompts is given.
DEFAULT_CALIBRATION_PROMPTS = "user"


def resolve_prompt_set(name_or_path: str | Path) -> Path:
    """The packaged file of a named set, else ``name_or_path`` as a path (checked by the reader)."""
    return PROMPT_SETS.get(str(name_or_path), Path(name_or_path))


def describe_names() -> str:
    """"mt-bench, spec-bench, chat, user or text", for help texts and errors."""
    names = list(PROMPT_SETS)
    return ", ".join(names[:-1]) + " or " + names[-1]
