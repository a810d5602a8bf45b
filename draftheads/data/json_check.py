"""Find where a local JSON / JSON-lines data file is broken, by file and line.

``datasets`` reports a malformed line as "An error occurred while generating the dataset", and
pyarrow accepts bytes that are not UTF-8, so a Latin-1 byte only fails later, inside
tokenization, with no file or row. These checks read the raw file once and name the place.
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
        row = _row_note(path, data, line)
        return (
            f"{path}: line {line}{row} is not valid UTF-8 (byte 0x{data[e.start]:02x} at byte column {column}); "
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
    row = 0
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row += 1
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            return f"{path}: line {n} (row {row}) is not valid JSON: {e.msg} at column {e.colno}"
        if not isinstance(value, dict):
            return f"{path}: line {n} (row {row}) is a JSON {type(value).__name__}, expected an object (one row per line)"
    return None


def _row_note(path: Path, data: bytes, line: int) -> str:
    """For JSON lines, the row number of ``line`` (blank lines are not rows)."""
    if not path.name.lower().endswith((".jsonl", ".jsonl.gz")):
        return ""
    lines = data.split(b"\n", line)[: line]
    return f" (row {sum(1 for ln in lines if ln.strip())})"
