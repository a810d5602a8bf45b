"""Package attributes imported on first use.

``import draftheads`` and ``draftheads --help`` should not pay for torch, transformers and
datasets (seconds) when a command needs none of them. A package lists what it exports and from
which of its modules; the module is imported when the name is first read, then the value is
kept on the package. Packages also repeat those imports under ``TYPE_CHECKING``, so type
checkers and the layering test (tests/test_layering.py) still see every dependency.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a name to the relative module
    (".decoder") that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:  # a subpackage (`dh.inference.verify`): importing it binds it here
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # later reads are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
