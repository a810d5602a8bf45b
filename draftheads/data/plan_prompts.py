"""The prompts a plan is chosen on: a named set shipped in the package or the user's own file,
checked before any timing starts.

Plans (tree.json) are chosen by timing decoding, so they pay on prompts like the ones they were
timed on. The target's own synthesized chats repeat little of their prompt, and a plan chosen on
them turned prompt lookup off where it ran 1.7x on MT-Bench (issue 55). So training's tree choice
and `draftheads calibrate` time on prompts shaped like what users send (``user``: human-written,
mixed categories, many that hand the model text to rework; ``text`` for a base model without a
chat template), or on the user's own file (``train.plan_prompts``, ``calibrate --prompts``).

A file is refused, named, when it is empty, binary (a NUL byte, or not UTF-8), holds no prompt,
or holds evaluation questions (MT-Bench, Spec-Bench: `eval_overlap`, counted and the first few
named): a plan tuned on the test would be measured on it. The evaluation sets by name are refused
for the same reason.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .eval_overlap import EVAL_SETS, eval_index
from .prompt_sets import describe_names, resolve_prompt_set

#: What training's tree choice times on when ``train.plan_prompts`` is "auto": the user-like set
#: for a target with a chat template, raw-text beginnings for a base model.
AUTO = "auto"
CHAT_DEFAULT = "user"
TEXT_DEFAULT = "text"
SHOWN = 3  # overlapping prompts named in an error (the rest are counted)


class PromptFileError(ValueError):
    """A prompt file or set that cannot be timed on; the message names it and what to do."""


def default_set(has_chat_template: bool) -> str:
    """The set "auto" means for a target with or without a chat template."""
    return CHAT_DEFAULT if has_chat_template else TEXT_DEFAULT


def row_text(row: Any, where: str) -> str:
    """The first user turn of a questions row (``turns``, a list of strings as in Spec-Bench and
    `draftheads bench`), else its ``prompt`` or ``text``. A string ``turns`` is refused, as bench
    refuses it, rather than guessed at (it used to calibrate on its first character)."""
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: expected a JSON object with 'turns', 'prompt' or 'text', got {type(row).__name__}")
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise PromptFileError(f"{where}: 'turns' must be a non-empty list of non-empty strings, got {turns!r:.80}")
        return turns[0]
    for key in ("prompt", "text"):
        if key in row:
            if not isinstance(row[key], str) or not row[key].strip():
                raise PromptFileError(f"{where}: '{key}' must be a non-empty string, got {row[key]!r:.80}")
            return row[key]
    raise PromptFileError(f"{where} has no 'turns', 'prompt' or 'text' field")


def _decoded(path: Path, where: str) -> str:
    """The file's text; empty, binary and non-UTF-8 files refused by name."""
    raw = path.read_bytes()
    if not raw.strip():
        raise PromptFileError(f"{where} {path} is empty ({len(raw)} bytes): give a text file with one prompt per line, "
                              "or a .jsonl of {\"turns\": [...]} / {\"prompt\": ...} / {\"text\": ...} rows")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise PromptFileError(f"{where} {path} looks binary (a NUL byte at offset {nul} of {len(raw)}): give a UTF-8 "
                              "text file with one prompt per line, or a .jsonl of prompt rows")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{where} {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): "
                              "save it as UTF-8") from None


def read_prompt_texts(name_or_path: str | Path, where: str = "--prompts") -> list[str]:
    """Every prompt of a named set or a file (a text file: one prompt a line; ``.jsonl``: rows as
    `row_text` reads them), checked as the module docstring says. ``where``: the flag or config
    key that named it, for the messages."""
    name = str(name_or_path)
    if name in EVAL_SETS:
        raise PromptFileError(f"{where} {name}: that is an evaluation set; a plan chosen on it would be tuned on the "
                              f"questions it is measured on. Pass a set made for plans ({CHAT_DEFAULT}, {TEXT_DEFAULT}, "
                              "chat) or your own prompts")
    path = resolve_prompt_set(name_or_path)
    if not path.is_file():
        raise PromptFileError(f"{where}: prompts file not found: {path} (pass a text or .jsonl file, or a named set: "
                              f"{describe_names()})")
    text = _decoded(path, where)
    texts: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptFileError(f"{path}:{n} is not valid JSON ({e})") from None
            texts.append((n, row_text(row, f"{path}:{n}")))
        else:
            texts.append((n, line))
    if not texts:
        raise PromptFileError(f"{where} {path} holds no prompt (only blank lines)")
    index = eval_index()
    found = [(n, match) for n, t in texts if (match := index.find(t)) is not None]
    if found:
        shown = ", ".join(f"line {n}: {match}" for n, match in found[:SHOWN])
        more = f", and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise PromptFileError(f"{where} {path}: {len(found)} of {len(texts)} prompts are evaluation questions ({shown}"
                              f"{more}); a plan chosen on them would be tuned on the test: remove them")
    return [t for _, t in texts]


def encode_prompts(tokenizer, texts: list[str], use_chat_template: bool, max_tokens: int) -> list:
    """Each prompt as ``[1, T]`` token ids as a user's request reaches the target: through the
    chat template when the target has one (and ``use_chat_template``), else raw text; the last
    ``max_tokens`` kept."""
    out = []
    for text in texts:
        if use_chat_template and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tokenizer(text, return_tensors="pt").input_ids
        out.append(ids[:, -max_tokens:])
    return out
