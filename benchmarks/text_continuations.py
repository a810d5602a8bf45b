"""Raw-text prompts for benchmarking a base model (Gemma-3-270M): beginnings of human-written text
that neither training (the target's own synthesized text) nor the plan (the package's ``text``
set) ever saw, and that no evaluation question holds.

The text is the running Python's standard library, which every machine has: the opening prose of
module docstrings (``prose``) and the opening lines of functions (``code``), each cut to about
``--words`` words, as a user would hand a base model the start of a document to continue. The
output is a Spec-Bench-format ``.jsonl`` (``question_id``, ``category``, ``turns``) that
``draftheads bench --questions FILE --no-chat-template`` reads; the categories alternate, so the
first N cover both. The shipped ``benchmarks/data/stdlib_continuations.jsonl`` was written by

    python benchmarks/text_continuations.py --out benchmarks/data/stdlib_continuations.jsonl
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
from pathlib import Path

#: Modules whose docstrings open with prose (a paragraph or more), in a fixed order.
PROSE_MODULES = ("argparse", "asyncio/__init__", "bisect", "calendar", "cmd", "codecs", "collections/__init__",
                 "colorsys", "configparser", "contextlib", "copy", "csv", "dataclasses", "difflib", "doctest",
                 "enum", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "getopt", "gettext", "glob",
                 "heapq", "hmac", "imaplib", "inspect", "ipaddress", "json/__init__", "locale", "mailbox",
                 "netrc", "operator", "optparse", "pickle", "pprint", "queue", "quopri", "random", "sched",
                 "shlex", "shutil", "smtplib", "statistics", "string", "tabnanny", "tarfile", "textwrap", "timeit")
CODE_MODULES = ("bisect", "colorsys", "fnmatch", "heapq", "statistics", "textwrap", "shlex", "calendar", "difflib",
                "fractions", "glob", "random", "string", "copy", "operator", "queue", "sched", "csv", "filecmp",
                "getopt", "gettext", "netrc", "pprint", "quopri", "tabnanny")


def _source(module: str) -> str | None:
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def _cut(text: str, words: int) -> str:
    """About ``words`` words of ``text``, cut at a word boundary, whitespace kept as written."""
    out, count = [], 0
    for line in text.splitlines():
        n = len(line.split())
        if count and count + n > words:
            break
        out.append(line)
        count += n
    return "\n".join(out).rstrip()


def prose(words: int) -> list[str]:
    texts = []
    for module in PROSE_MODULES:
        source = _source(module)
        doc = ast.get_docstring(ast.parse(source)) if source else None
        if doc and len(doc.split()) >= words // 2:
            texts.append(_cut(doc.strip(), words))
    return texts


def code(words: int) -> list[str]:
    texts = []
    for module in CODE_MODULES:
        source = _source(module)
        if not source:
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.end_lineno - node.lineno >= 6:
                lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
                texts.append(_cut("\n".join(lines), words))
                break
    return texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--words", type=int, default=60)
    p.add_argument("--num", type=int, default=40)
    args = p.parse_args(argv)
    from draftheads.data.eval_overlap import eval_index
    from draftheads.data.plan_prompts import read_prompt_texts

    plan = {t.strip() for t in read_prompt_texts("text")}
    index = eval_index()
    kinds = {"prose": prose(args.words), "code": code(args.words)}
    rows, i = [], 0
    while len(rows) < args.num and any(i < len(v) for v in kinds.values()):
        for kind, texts in kinds.items():
            if i < len(texts) and len(rows) < args.num and texts[i] not in plan and index.find(texts[i]) is None:
                rows.append({"question_id": f"{kind}-{i + 1}", "category": kind, "turns": [texts[i]]})
        i += 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {args.out} (Python {sys.version.split()[0]}'s standard library)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
