"""The benchmark scripts import draftheads names that exist.

Benchmarks run by hand (often on a lent GPU, with minutes to spare), and most import draftheads
inside functions, so a renamed or moved name is found only when the run reaches that line: the
reference-trainer benchmark once failed after loading everything because a sampler had moved to
another module. This reads every ``from draftheads... import name`` in benchmarks/, at any depth,
and checks the module has that name.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def draftheads_imports() -> list[tuple[str, int, str, str]]:
    """(script, line, module, name) of every ``from draftheads[.x] import name`` in benchmarks/."""
    found = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "draftheads" or node.module.startswith("draftheads.")):
                found += [(str(path.relative_to(BENCHMARKS)), node.lineno, node.module, a.name) for a in node.names]
    return found


def test_benchmarks_import_draftheads_at_all():
    assert len(draftheads_imports()) > 20, "the scan found no imports: did benchmarks/ move?"


@pytest.mark.parametrize("script,line,module,name", draftheads_imports(),
                         ids=lambda v: str(v) if not isinstance(v, int) else "")
def test_every_imported_name_exists(script, line, module, name):
    mod = importlib.import_module(module)
    if name == "*" or hasattr(mod, name):
        return
    try:  # a submodule imported by name (from draftheads import heads)
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        pytest.fail(f"benchmarks/{script}:{line}: `from {module} import {name}`: {module} has no {name}")
