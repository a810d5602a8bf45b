"""The tree heads draft, typed: a `StaticTree` of rank paths or `DynamicTree` settings.

Every tree a heads folder, a user or a measurement names is one of two kinds, and which kind a
method drafts is declared once on the method (`registry.TreeKind`):

- `StaticTree`: rank paths, Medusa's format. ``[[0], [1], [0, 0]]`` drafts head 0's best and
  second-best tokens and head 1's best after the first; a chain of n is ``[[0], [0, 0], ...]``
  (`StaticTree.chain`). Medusa, Hydra, and the one-forward drafters (P-EAGLE, DFlash) draft these.
- `DynamicTree`: EAGLE-2's settings, a token budget grown each step from the draft's own
  confidences (``total_tokens``, ``depth``, ``top_k``, optionally a ``draft_vocab_size``).

JSON (tree.json, a config, the Python API) holds them as a list or an object; `tree_spec` turns
either into its spec, checking what can be checked without the heads (integer ranks, connected
paths, known positive settings). Whether a tree fits some heads (depth, ranks against the draft
vocabulary) is `heads.tree_check`. Code past that boundary asks a spec what it is instead of
testing a list or a dict.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, NoReturn, Union

#: EAGLE-2 settings when a dynamic tree leaves some out. Small enough to pay off on a CPU, where
#: verify cost grows quickly with tree size; ``draftheads calibrate`` measures better ones.
DEFAULT_TOTAL_TOKENS = 12
DEFAULT_DEPTH = 5
DEFAULT_TOP_K = 4


def is_int(value: Any) -> bool:
    """A whole number that is not a bool (JSON's true would pass ``isinstance(value, int)``)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class StaticTree:
    """Rank paths: each path a tuple of per-depth ranks, every prefix of a path also a path."""

    paths: tuple[tuple[int, ...], ...]

    @classmethod
    def parse(cls, value: Any, who: str = "these heads") -> "StaticTree":
        """A static tree from a list of paths (or a StaticTree); a ValueError naming the problem
        (``who``: the heads that take it, for the message)."""
        if isinstance(value, StaticTree):
            return value
        if not isinstance(value, (list, tuple)):
            cls._refuse(value, who)
        paths: list[tuple[int, ...]] = []
        for path in value:
            if not isinstance(path, (list, tuple)) or not all(is_int(r) for r in path):
                raise ValueError(f"path {path!r} is not a list of integer ranks (a tree is a list of paths, e.g. "
                                 "[[0], [1], [0, 0]])")
            if any(r < 0 for r in path):
                raise ValueError(f"path {list(path)} has a negative rank")
            paths.append(tuple(path))
        known = set(paths)
        for path in sorted(known, key=len):
            if path[:-1] and path[:-1] not in known:
                raise ValueError(f"path {list(path)} has no parent path {list(path[:-1])} in the tree")
        return cls(tuple(paths))

    @staticmethod
    def _refuse(value: Any, who: str) -> NoReturn:
        if isinstance(value, (Mapping, DynamicTree)):
            keys = ", ".join(sorted(map(str, value.to_json() if isinstance(value, DynamicTree) else value)))
            raise ValueError(f"it holds dynamic-tree settings ({keys}), which only EAGLE heads take; {who} take a "
                             "static tree: a list of paths of per-head ranks, e.g. [[0], [1], [0, 0]]")
        raise ValueError(f"a static tree must be a list of paths (lists of per-head ranks), got {type(value).__name__}")

    @classmethod
    def chain(cls, length: int) -> "StaticTree":
        """``length`` drafted tokens in a line: each depth's best token."""
        return cls(tuple((0,) * d for d in range(1, length + 1)))

    @property
    def depth(self) -> int:
        """How many tokens deep its deepest path drafts."""
        return max((len(p) for p in self.paths), default=0)

    @property
    def nodes(self) -> int:
        """Nodes verified per step: the root plus one per path."""
        return len(self.paths) + 1

    @property
    def max_rank(self) -> int:
        """The largest rank any path takes (-1: no path)."""
        return max((r for p in self.paths for r in p), default=-1)

    @property
    def drafts_nothing(self) -> bool:
        """No path: every step is the root alone (plain decoding)."""
        return not self.paths

    def to_json(self) -> list[list[int]]:
        return [list(p) for p in self.paths]


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 settings: ``total_tokens`` drafted nodes at most, ``depth`` levels, ``top_k``
    children per expanded node; ``draft_vocab_size`` ranks only that many of the most frequent
    training tokens (None: the heads' own vocabulary)."""

    total_tokens: int = DEFAULT_TOTAL_TOKENS
    depth: int = DEFAULT_DEPTH
    top_k: int = DEFAULT_TOP_K
    draft_vocab_size: int | None = None

    @classmethod
    def parse(cls, value: Any, who: str = "these heads") -> "DynamicTree":
        """Dynamic-tree settings from an object (missing ones take the defaults) or a DynamicTree;
        a ValueError naming an unknown or non-positive setting, or a list of paths given instead
        (``who``: the heads that take it, for the message)."""
        if isinstance(value, DynamicTree):
            return value
        if not isinstance(value, Mapping):
            what = "a static list of paths" if isinstance(value, (list, tuple, StaticTree)) else type(value).__name__
            raise ValueError(f"{who} draft a dynamic tree: it must be settings {{\"total_tokens\": .., \"depth\": "
                             f".., \"top_k\": ..}}, not {what} {str(value)[:60]}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(str(k) for k in set(value) - set(names))
        if unknown:
            raise ValueError(f"unknown dynamic-tree setting(s) {unknown}; valid: {', '.join(names)}")
        for key, setting in value.items():
            if not (is_int(setting) and setting >= 1) and not (key == "draft_vocab_size" and setting is None):
                raise ValueError(f"dynamic-tree setting {key} must be a positive integer"
                                 f"{' or null' if key == 'draft_vocab_size' else ''}, got {setting!r}")
        return cls(**value)

    @property
    def drafts_nothing(self) -> bool:
        """A budget of one token: the root alone (plain decoding)."""
        return self.total_tokens <= 1

    def with_draft_vocab(self, draft_vocab_size: int | None) -> "DynamicTree":
        return DynamicTree(self.total_tokens, self.depth, self.top_k, draft_vocab_size)

    def to_json(self) -> dict[str, int]:
        data = {"total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k}
        if self.draft_vocab_size is not None:
            data["draft_vocab_size"] = self.draft_vocab_size
        return data


TreeSpec = Union[StaticTree, DynamicTree]


def tree_spec(value: Any) -> TreeSpec:
    """The spec of a tree as JSON holds it: an object is dynamic-tree settings, a list rank paths
    (a spec comes back as it is); a ValueError naming the problem otherwise."""
    if isinstance(value, (StaticTree, DynamicTree)):
        return value
    if isinstance(value, Mapping):
        return DynamicTree.parse(value)
    return StaticTree.parse(value)


def tree_json(tree: TreeSpec | None) -> list[list[int]] | dict[str, int] | None:
    """A spec as JSON holds it (None stays None)."""
    return None if tree is None else tree.to_json()
