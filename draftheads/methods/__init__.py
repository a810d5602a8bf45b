"""The drafting methods: one module per head type, each declaring everything about it once.

Importing this package registers every method in `draftheads.registry` (the package root does it
on the first lookup). A new head type is one module here, imported below, plus its tests and a
config: the layers below (heads, train, tune, inference, export) learn of it through the registry
and never name it.
"""
from . import medusa, hydra, eagle, eagle3, peagle, dflash, dspark, dflash2, mtp  # noqa: F401 (each registers its method)
from ..registry import Method, method_named, method_of, methods

__all__ = ["Method", "method_named", "method_of", "methods"]
