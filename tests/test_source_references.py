"""Comments and docstrings in the package that name a file of this repository name one that is
there, and a function they say is in a file is defined in it: a file that moved leaves such
pointers behind, and a reader following one finds nothing."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "draftheads"
#: Other projects' files the package cites (vLLM, SGLang, speculators, Medusa's and EAGLE's repositories).
EXTERNAL = ("vllm/", "transformers/", "sglang/", "speculators/", "deepspec/", "medusa/", "eagle/", "cnets.py", "llama_eagle.py", "qwen3_dflash.py", "_dflash.py")
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


# -- the documentation ----------------------------------------------------------------------------
# README.md, docs/*.md and benchmarks/README.md name files, functions, classes and config keys; a
# rename leaves them pointing at nothing (ARCHITECTURE.md once described an `observe(...)` hook that
# never existed). Every name they cite must exist.

DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Names the docs cite that land with other work in flight (issue 39: the real small target's configs,
#: the set-up commands). `test_pending_names_are_still_pending` removes each from
#: this list as soon as it exists.
PENDING: set[str] = set()
#: Files a run or another project writes, not files of this repository.
RUNTIME_FILES = {"README.md", "report.md", "results.md", "summary.md", "cnets.py", "configs.py", "main.py"}
#: Folders a user's runs write (`--out results/x`, `runs/x/heads`), named in example commands.
RUNTIME_FOLDERS = ("out/", "results/", "runs/", "data/", "features/")
DOC_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|yaml|yml|sh|toml|md))(?![\w/])|(?<![\w/.-])(Makefile)\b")
FILE_COLON_NAME = re.compile(r"((?:[\w-]+/)*\w+\.py):(\w+)")
CODE_SPAN = re.compile(r"`([^`]+)`")
CALL = re.compile(r"\b([A-Za-z_]\w*)\(")
CONFIG_KEY = re.compile(r"(?<![\w./-])(target|heads|data|train|tracking)\.([a-z_]\w*)(?![\w(./-])")
CLASS_NAME = re.compile(r"`(?:(?:dh|draftheads)\.)?([A-Z][a-z0-9]+[A-Z]\w*)`")
#: Classes and calls of other libraries the docs name (engines' model classes, torch/transformers calls).
EXTERNAL_NAMES = {
    "MedusaModel", "LlamaForCausalLM", "LlamaForCausalLMEagle", "LlamaForCausalLMEagle3", "DFlashDraftModel",
    "Qwen3DSparkModel", "DFlash2DraftModel",
    "WarmupDecayLR", "FusedAdam", "AdamW", "EConfig", "DynamicCache", "GatheredParameters", "load", "compile",
    "generate", "from_pretrained", "prepare", "backward", "step", "multinomial", "apply_chat_template",
    "MtpLayer", "MtpModel",  # transformers.modeling_layers (not exported at its top level)
}
REPO_DIRS = ("draftheads", "tests", "benchmarks", "configs", "scripts", "docs")


def _repo_files() -> list[str]:
    found = [p.relative_to(ROOT).as_posix() for d in REPO_DIRS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    return found + [p.name for p in ROOT.iterdir() if p.is_file()]


def _doc_lines():
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            yield doc, number, line


def _exists(mention: str, files: list[str]) -> bool:
    """At the root, in the package, or a unique file path ending in ``/mention`` (docs name
    `kv/ragged.py` for draftheads/inference/kv/ragged.py)."""
    return mention in files or f"draftheads/{mention}" in files or any(f.endswith("/" + mention) for f in files)


DEFINITION = re.compile(r"^\s*(?:def|class)\s+(\w+)|^\s*(\w+)\s*[:=]", re.M)


def _defined_anywhere() -> set[str]:
    """Every function, class, attribute and field defined in the package, the benchmarks or the tests."""
    return {a or b for d in ("draftheads", "benchmarks", "tests") for path in (ROOT / d).rglob("*.py")
            for a, b in DEFINITION.findall(path.read_text())}


def test_every_file_the_docs_name_exists():
    files = _repo_files()
    missing = []
    for doc, number, line in _doc_lines():
        for m in DOC_PATH.finditer(line):
            mention = m.group(1) or m.group(2)
            if mention.startswith("../"):  # a link relative to the doc's own folder
                mention = (doc.parent / mention).resolve().relative_to(ROOT).as_posix()
            if (mention in RUNTIME_FILES or mention in PENDING or mention.startswith(EXTERNAL)
                    or mention.startswith(RUNTIME_FOLDERS)):
                continue
            if not _exists(mention, files):
                missing.append(f"{doc.relative_to(ROOT)}:{number}: {mention}")
    assert not missing, "\n".join(missing)


def test_a_function_the_docs_place_in_a_file_is_defined_there():
    files = _repo_files()
    wrong = []
    for doc, number, line in _doc_lines():
        pairs = [(m.group(1) or m.group(2), m.group(3)) for m in DEFINED_IN.finditer(line)]
        pairs += [(m.group(2), m.group(1)) for m in FILE_COLON_NAME.finditer(line)]
        for name, mention in pairs:
            paths = [f for f in files if f == mention or f.endswith("/" + mention)]
            if paths and not any(re.search(rf"^\s*(def|class) {name}\b|^{name}\s*[:=]", (ROOT / f).read_text(), re.M)
                                 for f in paths):
                wrong.append(f"{doc.relative_to(ROOT)}:{number}: {name} is not in {mention}")
    assert not wrong, "\n".join(wrong)


def test_every_call_and_class_the_docs_name_exists():
    import builtins

    import torch
    import transformers

    import draftheads

    defined = _defined_anywhere()
    unknown = []
    for doc, number, line in _doc_lines():
        names = [c.group(1) for span in CODE_SPAN.finditer(line) for c in CALL.finditer(span.group(1))]
        names += [m.group(1) for m in CLASS_NAME.finditer(line)]
        for name in names:
            if name in defined or name in EXTERNAL_NAMES or hasattr(draftheads, name) or hasattr(torch, name) \
                    or hasattr(transformers, name) or hasattr(torch.nn.Module, name) or hasattr(builtins, name):
                continue
            unknown.append(f"{doc.relative_to(ROOT)}:{number}: {name}")
    assert not unknown, "\n".join(unknown)


def test_every_config_key_the_docs_name_exists():
    """``heads.loss``, ``train.lr``...: a field of that config section. ``target.generate`` (the
    model's method) and ``data.build_datasets`` (the package's function) are not keys."""
    import dataclasses
    import importlib

    from transformers import GenerationMixin, PreTrainedModel

    from draftheads import config
    from draftheads.heads.base import DraftHeads

    def other_meaning(section: str, name: str) -> bool:
        if section == "target":
            return hasattr(PreTrainedModel, name) or hasattr(GenerationMixin, name)
        if section == "heads" and hasattr(DraftHeads, name):  # an attribute of loaded heads (heads.plans)
            return True
        try:
            return hasattr(importlib.import_module(f"draftheads.{section}"), name)
        except ModuleNotFoundError:
            return False

    sections = {f.name: f for f in dataclasses.fields(config.ExperimentConfig)}
    keys = {(name, sub.name) for name, f in sections.items()
            for sub in dataclasses.fields(f.default_factory())}  # type: ignore[misc]
    keys |= {tuple(old.split(".")) for old in config._OLD_KEYS}
    unknown = [f"{doc.relative_to(ROOT)}:{number}: {m.group(1)}.{m.group(2)}"
               for doc, number, line in _doc_lines() for m in CONFIG_KEY.finditer(line)
               if (m.group(1), m.group(2)) not in keys and m.group(2) not in ("py", "yaml", "md")
               and not other_meaning(m.group(1), m.group(2))]
    assert not unknown, "\n".join(unknown)


def test_pending_names_are_still_pending():
    """Once a pending name exists, it leaves PENDING (and is checked like every other name)."""
    files = _repo_files()
    assert [name for name in PENDING if _exists(name, files)] == []
