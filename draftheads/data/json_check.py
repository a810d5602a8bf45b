"""Find where a local JSON / JSON-lines data file is broken, by file and line.

``datasets`` reports a malformed line as "An error occurred while generating the dataset", and
pyarrow accepts bytes that are not UTF-8, so a Latin-1 byte only fails later, inside
tokenization, with no file or row. These checks read the raw file once and name the place: the
file and its line number (counted from 1, as editors count), never a row index.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path


def _read_bytes(path: Path) -> bytes:
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return f.read()
    return path.read_bytes()


def utf8_problem(path: str | Path) -> str | None:
    """Where ``path`` first stops being UTF-8 (None: it all decodes)."""
    path = Path(path)
    data = _read_bytes(path)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        return (
            f"{path}: line {line} is not valid UTF-8 (byte 0x{data[e.start]:02x} at byte column {column}); "
            "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix that row"
        )
    return None


def json_problem(path: str | Path) -> str | None:
    """The first line of ``path`` that is not valid JSON (None: it parses)."""
    path = Path(path)
    text = _read_bytes(path).decode("utf-8", errors="replace")
    name = path.name.lower()
    if not name.endswith((".jsonl", ".jsonl.gz")):
        try:  # a .json file may be one document (a list of rows) ...
            json.loads(text)
            return None
        except json.JSONDecodeError as e:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if not all(ln.lstrip().startswith("{") for ln in lines):
                return f"{path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})"
    # ... or JSON lines: one object per line.
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            return f"{path}: line {n} is not valid JSON: {e.msg} at column {e.colno}"
        if not isinstance(value, dict):
            return f"{path}: line {n} is a JSON {type(value).__name__}, expected an object (one row per line)"
    return None


def row_lines(path: str | Path) -> list[int] | None:
    """The line number (from 1) of each row of a JSON-lines file, in order (blank lines are no
    rows); None for a file that is one JSON document (a list of rows has no line per row)."""
    text = _read_bytes(Path(path)).decode("utf-8", errors="replace")
    if text.lstrip().startswith("["):
        return None
    return [n for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def columns(path: str | Path) -> list[str]:
    """The fields the rows of a JSON or JSON-lines file hold (their union, in first-seen order)."""
    text = _read_bytes(Path(path)).decode("utf-8", errors="replace")
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError:
        return []
    seen: dict[str, None] = {}
    for row in rows if isinstance(rows, list) else [rows]:
        if isinstance(row, dict):
            seen.update(dict.fromkeys(row))
    return list(seen)
