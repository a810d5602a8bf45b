"""Comments and docstrings in the package that name a file of this repository name one that is
there, and a function they say is in a file is defined in it: a file that moved leaves such
pointers behind, and a reader following one finds nothing."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "draftheads"
#: Other projects' files the package cites (vLLM, SGLang, speculators, Medusa's and EAGLE's repositories).
EXTERNAL = ("vllm/", "sglang/", "speculators/", "medusa/", "eagle/", "cnets.py", "llama_eagle.py", "qwen3_dflash.py", "_dflash.py")
PATH = re.compile(r"(?<![\w/.])((?:[\w-]+/)*\w+\.py)\b")
#: "`name` in file.py" or "some_name in file.py" (a bare word is prose: "is in draft_layer.py").
DEFINED_IN = re.compile(r"(?:`(\w+)`|\b([a-z]\w*_\w+)) in `?((?:[\w-]+/)*\w+\.py)`?")


def candidates(source: Path, mention: str) -> list[Path]:
    """Where a mention may point: the repository root, the package, the mentioning module's
    package or the one above it."""
    return [ROOT / mention, PACKAGE / mention, source.parent / mention, source.parent.parent / mention]


def mentions(pattern: re.Pattern) -> list[tuple[Path, int, re.Match]]:
    found = []
    for source in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            found += [(source, number, m) for m in pattern.finditer(line)]
    return found


def test_every_file_the_package_names_exists():
    missing = [f"{s.relative_to(ROOT)}:{n}: {m.group(1)}" for s, n, m in mentions(PATH)
               if not m.group(1).startswith(EXTERNAL) and not m.group(1).endswith(EXTERNAL)
               and not any(c.exists() for c in candidates(s, m.group(1)))]
    assert missing == []


def test_a_function_said_to_be_in_a_file_is_defined_there():
    wrong = []
    for source, number, m in mentions(DEFINED_IN):
        name, mention = m.group(1) or m.group(2), m.group(3)
        files = [c for c in candidates(source, mention) if c.exists()]
        if files and not any(re.search(rf"^\s*(def|class) {name}\b|^{name}\s*=", f.read_text(), re.M) for f in files):
            wrong.append(f"{source.relative_to(ROOT)}:{number}: {name} is not in {mention}")
    assert wrong == []
