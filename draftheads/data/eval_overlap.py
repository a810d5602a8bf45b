"""Never train on the evaluation prompts: the benchmark questions ship here, and rows that hold one
are found by normalised text.

The project measures heads on MT-Bench (80 questions) and Spec-Bench (480; its first 80 rows ARE
MT-Bench). Heads trained on those very prompts (or on the target's answers to them) would be
measured on their training data. The question files live in ``eval_questions/`` (their origins and
licences in ``eval_questions/NOTICE.md``) so the check runs offline.

Matching is on normalised text (``normalize``: NFKC, case-folded, words only, so spacing, case and
punctuation do not hide a copy). A user turn (chat rows) or a plain-text row overlaps when it
equals an evaluation turn, or contains one that is at least ``MIN_CONTAINED_WORDS`` words long
(a chat-templated question inside a text row, a question with "Answer briefly:" around it);
shorter questions ("Prove the Pythagorean theorem.") only match by equality, as they are too
generic to be evidence inside longer text.
"""
from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .formats import CHAT_FORMATS, normalize_chat

QUESTIONS_DIR = Path(__file__).with_name("eval_questions")
#: The evaluation sets by the names commands use, as Spec-Bench-format .jsonl files.
EVAL_SETS: dict[str, Path] = {
    "mt-bench": QUESTIONS_DIR / "mt_bench_question.jsonl",
    "spec-bench": QUESTIONS_DIR / "spec_bench_question.jsonl",
}
MIN_CONTAINED_WORDS = 8
OVERLAP_POLICIES = ("refuse", "drop", "warn")  # what to do with training rows that hold one
_WORD = re.compile(r"\w+")


def normalize(text: str) -> str:
    """The words of ``text``, NFKC-normalised and case-folded, joined by single spaces."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


@dataclass(frozen=True)
class Match:
    """An evaluation turn found in a row."""

    eval_set: str
    question_id: str
    turn: int  # 1-based, as the benchmarks number turns

    def __str__(self) -> str:
        return f"{self.eval_set} question {self.question_id} turn {self.turn}"


@dataclass
class EvalIndex:
    """Normalised evaluation turns, for equality and containment look-ups."""

    exact: dict[str, Match] = field(default_factory=dict)
    # first MIN_CONTAINED_WORDS words -> the long questions starting with them
    heads: dict[str, list[tuple[str, Match]]] = field(default_factory=dict)
    first_words: set[str] = field(default_factory=set)  # a cheap test before joining a window

    def add(self, text: str, match: Match) -> None:
        norm = normalize(text)
        if not norm:
            return
        self.exact.setdefault(norm, match)
        words = norm.split(" ")
        if len(words) >= MIN_CONTAINED_WORDS:
            self.heads.setdefault(" ".join(words[:MIN_CONTAINED_WORDS]), []).append((norm, match))
            self.first_words.add(words[0])

    def find(self, text: str) -> Match | None:
        """The evaluation turn ``text`` equals or contains (see the module docstring), if any."""
        norm = normalize(text)
        if not norm:
            return None
        if norm in self.exact:
            return self.exact[norm]
        words = norm.split(" ")
        padded = f" {norm} "
        for i in range(len(words) - MIN_CONTAINED_WORDS + 1):
            if words[i] not in self.first_words:
                continue
            for question, match in self.heads.get(" ".join(words[i : i + MIN_CONTAINED_WORDS]), ()):
                if f" {question} " in padded:
                    return match
        return None

    def __len__(self) -> int:
        return len(self.exact)


def read_eval_set(name: str, path: Path) -> Iterable[tuple[str, Match]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            for k, turn in enumerate(row["turns"], 1):
                yield turn, Match(name, str(row["question_id"]), k)


@lru_cache(maxsize=1)
def eval_index() -> EvalIndex:
    """Every turn of every shipped evaluation set (read once per process)."""
    index = EvalIndex()
    for name, path in EVAL_SETS.items():
        for text, match in read_eval_set(name, path):
            index.add(text, match)
    return index


def texts_to_check(value: Any, fmt: str, row: Any) -> list[str]:
    """Where an evaluation question could hide in a row: its user turns (chat rows) or its text."""
    if fmt in CHAT_FORMATS:
        return [m["content"] for m in normalize_chat(value, fmt, row) if m["role"] == "user"]
    return [value] if isinstance(value, str) else []


def first_match(texts: Iterable[str]) -> Match | None:
    index = eval_index()
    for text in texts:
        match = index.find(text)
        if match is not None:
            return match
    return None


def describe(found: Sequence[tuple[int, Match]], total: int, *, limit: int = 3) -> str:
    """"N of M rows hold evaluation questions (row 4: mt-bench question 81 turn 1, ...)"."""
    shown = ", ".join(f"row {row}: {match}" for row, match in found[:limit])
    more = f", and {len(found) - limit} more" if len(found) > limit else ""
    return f"{len(found)} of {total} rows hold evaluation questions ({shown}{more})"
