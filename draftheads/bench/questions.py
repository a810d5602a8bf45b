"""What the benchmark asks: the sets shipped in the package by name (MT-Bench, Spec-Bench, chat
prompts: ``data.prompt_sets``), Spec-Bench question rows, or plain-text prompt files.

A question is one or more user turns. Multi-turn questions (MT-Bench rows) are answered turn by
turn: turn k's prompt contains the earlier turns and their answers, so later turns measure
decoding on a long, partly self-written context, as Spec-Bench does.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..data.prompt_sets import describe_names, resolve_prompt_set

#: Category given to rows and files that do not name one.
DEFAULT_CATEGORY = "default"


class QuestionFileError(ValueError):
    """A question file that cannot be used; the message names the file (and line)."""


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turns: tuple[str, ...]


def load_questions(name_or_path: str | Path) -> list[Question]:
    """Questions from a named set shipped in the package (``mt-bench``, ``spec-bench``, ``chat``:
    ``data.prompt_sets``), a ``.jsonl`` file in Spec-Bench format (``question_id``, ``category``,
    ``turns``) or a plain-text file (one single-turn prompt per non-empty line).

    A malformed row is an error naming ``file:line``: a benchmark that silently skips rows
    measures something else than the user thinks."""
    path = resolve_prompt_set(name_or_path)
    if not path.is_file():
        raise QuestionFileError(f"question file not found: {path} (pass a Spec-Bench .jsonl, a text file with one "
                                f"prompt a line, or a named set: {describe_names()})")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise QuestionFileError(f"{path} is not UTF-8 text ({e})") from None
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            q = _parse_row(path, n, line)
        else:
            q = Question(question_id=f"line-{n}", category=DEFAULT_CATEGORY, turns=(line,))
        if q.question_id in seen:
            raise QuestionFileError(
                f"{path}:{n}: question_id {q.question_id!r} already used on line {seen[q.question_id]}"
            )
        seen[q.question_id] = n
        questions.append(q)
    if not questions:
        raise QuestionFileError(f"{path} has no questions (the file is empty)")
    return questions


def _parse_row(path: Path, n: int, line: str) -> Question:
    where = f"{path}:{n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise QuestionFileError(f"{where} is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise QuestionFileError(f"{where}: expected a JSON object with 'turns', got {type(row).__name__}")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise QuestionFileError(f"{where}: 'turns' must be a non-empty list of non-empty strings, got {turns!r:.80}")
    category = row.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category:
        raise QuestionFileError(f"{where}: 'category' must be a non-empty string, got {category!r}")
    qid = row.get("question_id", n)
    if not isinstance(qid, (int, str)) or isinstance(qid, bool):
        raise QuestionFileError(f"{where}: 'question_id' must be an integer or a string, got {qid!r}")
    return Question(question_id=str(qid), category=category, turns=tuple(turns))


def categories(questions: list[Question]) -> list[str]:
    """Categories in order of first appearance (the order tables and plots use)."""
    return list(OrderedDict.fromkeys(q.category for q in questions))


def select(questions: list[Question], wanted: list[str] | None, max_questions: int | None) -> list[Question]:
    """Keep the ``wanted`` categories (unknown names are an error that lists the valid ones),
    then at most ``max_questions``, taken round-robin over categories so that a short run still
    covers every category instead of only the first one in the file."""
    if wanted:
        valid = categories(questions)
        unknown = [c for c in wanted if c not in valid]
        if unknown:
            raise QuestionFileError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"valid categories: {', '.join(valid)}"
            )
        questions = [q for q in questions if q.category in wanted]
    if max_questions is None or max_questions >= len(questions):
        return questions
    if max_questions < 1:
        raise ValueError(f"--max-questions must be >= 1, got {max_questions}")
    by_category: dict[str, list[Question]] = OrderedDict()
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    picked: list[Question] = []
    depth = 0
    while len(picked) < max_questions:
        for group in by_category.values():
            if depth < len(group) and len(picked) < max_questions:
                picked.append(group[depth])
        depth += 1
    order = {id(q): i for i, q in enumerate(questions)}
    return sorted(picked, key=lambda q: order[id(q)])
