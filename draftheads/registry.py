"""The method registry: what a drafting method is, and the one place every layer asks about one.

A *method* (Medusa, Hydra, EAGLE, EAGLE-3, P-EAGLE, DFlash) is everything draftheads knows about
one head type: its heads module, the `HeadsSpec` options it takes, its loss, its drafter, the kind
of tree it drafts and the engine layouts it leaves in or comes back from. Each method is declared
ONCE, in its own module under `draftheads/methods/`, as a `Method` record, and registered here.

The layers below `methods/` (heads, train, tune, inference, export, config) never import it and
never compare a method's name: they ask this registry for the `Method` of a head type or of some
heads (`method_named`, `method_of`) and use what it declares. This module sits at the bottom of
the import layers and imports nothing of draftheads; the package's root registers the methods on
first use (`set_loader`), so `import draftheads` and ``draftheads --help`` stay fast.
"""
from __future__ import annotations

import enum
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping


class TreeKind(str, enum.Enum):
    """How a method's drafts are shaped, and so how its tree is searched and saved (tree.json).

    - ``STATIC``: rank paths (a list of paths of ranks, Medusa's format) searched from per-head,
      per-rank acceptance; every head drafts its depth (Medusa, Hydra).
    - ``DYNAMIC``: EAGLE-2 settings (a dict: token budget, depth, top-k) grown per step from the
      draft's confidences, timed end to end (EAGLE, EAGLE-3).
    - ``ONE_FORWARD``: rank paths read off the per-depth top-k of ONE draft forward, searched from
      the per-depth acceptance table and one forward's cost (P-EAGLE, DFlash).
    """

    STATIC = "static"
    DYNAMIC = "dynamic"
    ONE_FORWARD = "one_forward"

    @property
    def rank_paths(self) -> bool:
        """Whether its trees are rank paths (a list), not settings (a dict)."""
        return self is not TreeKind.DYNAMIC


@dataclass(frozen=True)
class EngineLayout:
    """How an engine holds a method's heads: ``engine_name`` is the name the engine gives that
    draft (vLLM's ``method``, SGLang's ``--speculative-algorithm``, speculators'
    ``speculators_model_type``); ``write(heads, *, verifier, verifier_cfg, num_speculative_tokens)``
    builds the engine folder (an `export.common.EngineFolder`); ``serve_extra``: what vLLM's
    speculative config also needs for it (P-EAGLE: parallel drafting); ``serves_alone``: the folder
    names its verifier, so vLLM serves it without the target's name (speculators' EAGLE-3);
    ``check_engine()``: raises an `export.common.ExportError` naming what the installed engine
    lacks to serve this layout (DSpark, DFlash2: vLLM's Model Runner V2), before a folder is written."""

    engine_name: str
    write: Callable[..., Any]
    serve_extra: Mapping[str, Any] = field(default_factory=dict)
    serves_alone: bool = False
    check_engine: Callable[[], None] | None = None


@dataclass(frozen=True)
class OneForwardSearch:
    """What a tree search measures for a `TreeKind.ONE_FORWARD` method, as decoding drafts:
    ``draft_seconds(heads, draft_vocab_size)`` -> seconds of drafting a tree of depth d (key d;
    0 = plain); ``accuracy(target, heads, sequences, max_rank, skip_prompt, draft_vocab_size)`` ->
    ``acc[d, r]``, how often depth d+1's rank-r candidate is the target's token. ``ranks_draft_vocab``:
    the heads score with the target's LM head, so a search may also try ranking only a draft
    vocabulary of its most frequent training tokens (DFlash; P-EAGLE has its own trained one)."""

    draft_seconds: Callable[..., dict[int, float]]
    accuracy: Callable[..., Any]
    ranks_draft_vocab: bool = False


@dataclass(frozen=True)
class ImportLayout:
    """A public checkpoint layout that imports as this method's heads, under its import format's
    name (the key in `Method.imports`, what ``draftheads import --format`` takes): ``description``
    says what the layout is and how it is recognised (`export.formats.import_formats` lists them);
    ``detect(source)`` says whether a checkpoint is in it, ``read(source, target)`` builds the
    heads. ``rank`` orders detection across methods: 0 = a config key names the layout, 1 = tensor
    names tell it, 2 = only tensor shapes do. ``weight_files``: file names its checkpoints keep
    their weights in, besides the usual ``model.safetensors`` / ``pytorch_model.bin`` (tried before
    the catch-all ``*.safetensors``). ``keep_only``: tensor-name prefixes that, when a file holds
    any, are all of it read (a release that is a whole fine-tuned model with the heads inside loads
    only the heads). ``config_names``: words (lower case) its checkpoints' config.json holds in
    ``model_type``, ``speculators_model_type`` or ``architectures``; ``config_keys``: keys only its
    config.json has. With them a checkpoint passed where a heads folder goes is named as one to
    import (`heads.io`), its tensors unread."""

    detect: Callable[[Any], bool]
    read: Callable[[Any, Any], Any]
    description: str = ""
    rank: int = 1
    weight_files: tuple[str, ...] = ()
    keep_only: tuple[str, ...] = ()
    config_names: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Method:
    """Everything about one drafting method, declared in its module under `draftheads/methods/`.

    ``name`` is the head type: ``heads.head_type`` in the experiment config and ``head_type`` in
    a heads folder's config.json. ``heads`` is its `heads.base.DraftHeads` subclass. ``loss`` builds
    its training loss from the run's `train.head_loss.LossSettings`: every loss is called the same
    way, ``loss(heads, batch) -> HeadLossOutput`` and ``loss.counts(heads, batch) -> [K]``.
    ``drafter(heads, tree=None, **options)`` builds the batch drafter decoding drafts with. ``tree``: the
    kind of tree it drafts. ``exports``: export format -> `EngineLayout`; ``imports``: import
    format -> `ImportLayout`. ``aliases``: head_type names older heads folders carry for it.
    ``one_forward``: what its tree search measures (`OneForwardSearch`), for ONE_FORWARD trees.
    ``builtin``: heads a target may ship in its own checkpoint (MTP layers): ``builtin(target)``
    builds them, or raises a ValueError saying why that target has none; ``load_heads`` and
    ``--heads`` name them ``builtin-<name>`` (`builtin_named`).
    ``confidence(target, heads, sequences, skip_prompt)``: measures the heads' confidence table
    (`heads.confidence.ConfidenceCalibration`) on the target's greedy continuations, for methods
    whose trees rank their nodes by it (EAGLE's); None: their trees do not read one.
    ``default``: the head type a config that names none trains (one method is)."""

    name: str
    title: str
    heads: type
    loss: Callable[..., Any]
    drafter: Callable[..., Any]
    tree: TreeKind
    summary: str = ""
    exports: Mapping[str, EngineLayout] = field(default_factory=dict)
    imports: Mapping[str, ImportLayout] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    one_forward: OneForwardSearch | None = None
    builtin: Callable[[Any], Any] | None = None
    confidence: Callable[..., Any] | None = None
    default: bool = False

    @property
    def options(self) -> tuple[str, ...]:
        """The `HeadsSpec` fields this method takes besides num_heads / num_layers: the ones its
        heads are built from (saved with them), then the ones training reads when it starts fresh
        heads (not saved)."""
        return tuple(self.heads.spec_options) + tuple(self.heads.init_options)

    @property
    def learns_next_tokens(self) -> bool:
        """Whether its heads learn the data's (or the target's greedy) next tokens, so that
        ``train.labels`` applies; the others learn the target's distribution at every position."""
        return self.heads.training_objective == "future_tokens"

    def __repr__(self) -> str:
        return f"Method({self.name!r})"


class UnknownMethodError(ValueError):
    """A head type no registered method has."""


_METHODS: dict[str, Method] = {}
_ALIASES: dict[str, str] = {}
_loader: Callable[[], None] | None = None
_lock = threading.RLock()


def set_loader(load: Callable[[], None]) -> None:
    """``load()`` registers every method; it runs at the first lookup (draftheads/__init__.py
    sets it: importing draftheads.methods needs torch, which ``import draftheads`` must not)."""
    global _loader
    _loader = load


def _registered() -> dict[str, Method]:
    global _loader
    if _loader is not None:
        with _lock:
            if _loader is not None:
                load = _loader
                _loader = None
                try:
                    load()
                except BaseException:
                    _loader = load  # a failed import (missing torch?) fails again, naming its cause
                    raise
    return _METHODS


def register(method: Method) -> Method:
    """Add ``method`` (its module under draftheads/methods/ calls this once). Refuses a second
    method of the same name or alias, and heads whose ``head_type`` is not the method's name."""
    if getattr(method.heads, "head_type", None) != method.name:
        raise ValueError(f"method {method.name!r}: its heads class {method.heads.__name__} has head_type "
                         f"{getattr(method.heads, 'head_type', None)!r}, not {method.name!r}")
    if (method.tree is TreeKind.ONE_FORWARD) != (method.one_forward is not None):
        raise ValueError(f"method {method.name!r}: a {method.tree.value} tree "
                         f"{'needs' if method.one_forward is None else 'takes no'} one_forward search measurements")
    for name in (method.name, *method.aliases):
        known = _METHODS.get(name) or _METHODS.get(_ALIASES.get(name, ""))
        if known is not None and known is not method:
            raise ValueError(f"method {name!r} is registered twice ({known.heads.__name__} and {method.heads.__name__})")
    other_default = next((m for m in _METHODS.values() if m.default and m.name != method.name), None)
    if method.default and other_default is not None:
        raise ValueError(f"method {method.name!r} is declared the default head type, but {other_default.name!r} is")
    _METHODS[method.name] = method
    for alias in method.aliases:
        _ALIASES[alias] = method.name
    return method


def methods() -> tuple[Method, ...]:
    """Every registered method, in registration order."""
    return tuple(_registered().values())


def names() -> tuple[str, ...]:
    """The head types of every registered method."""
    return tuple(_registered())


def method_named(name: str) -> Method:
    """The method of head type ``name`` (or of a name older heads folders carry for it)."""
    found = _registered().get(name) or _METHODS.get(_ALIASES.get(name, ""))
    if found is None:
        raise UnknownMethodError(f"unknown head type {name!r}; valid: {', '.join(sorted(_METHODS))}")
    return found


def default_head_type() -> str:
    """The head type a config that names none trains (the method declared ``default``)."""
    found = [m.name for m in _registered().values() if m.default]
    if len(found) != 1:
        raise UnknownMethodError(f"no default head type is registered (registered: {', '.join(sorted(_METHODS))})")
    return found[0]


def method_of(heads: Any) -> Method:
    """The method of ``heads`` (an instance or a class): the nearest class in its MRO whose
    ``head_type`` is registered, so a subclass of a method's heads drafts and trains as it."""
    cls = heads if isinstance(heads, type) else type(heads)
    registered = _registered()
    for base in cls.__mro__:
        found = registered.get(getattr(base, "head_type", None) or "")
        if found is not None and issubclass(cls, found.heads):
            return found
    raise UnknownMethodError(f"{cls.__name__} heads (head_type {getattr(cls, 'head_type', None)!r}) belong to no "
                             f"registered method; valid head types: {', '.join(sorted(registered))}")


BUILTIN_PREFIX = "builtin-"


def builtin_named(name: Any) -> Method | None:
    """The method of ``builtin-<head type>`` (heads the target ships itself, e.g. ``builtin-mtp``),
    None for any other name; a method that builds no such heads is refused naming those that do."""
    if not isinstance(name, str) or not name.startswith(BUILTIN_PREFIX):
        return None
    method = method_named(name[len(BUILTIN_PREFIX):]) if name[len(BUILTIN_PREFIX):] in names() else None
    if method is None or method.builtin is None:
        have = ", ".join(BUILTIN_PREFIX + m.name for m in methods() if m.builtin is not None) or "none"
        raise UnknownMethodError(f"{name!r} names no heads a target ships itself; valid: {have}")
    return method


def methods_with(predicate: Callable[[Method], bool]) -> tuple[Method, ...]:
    """The registered methods for which ``predicate`` holds (e.g. the ones an export format holds)."""
    return tuple(m for m in methods() if predicate(m))


def head_classes(found: Iterable[Method] | None = None) -> dict[str, type]:
    """Head classes by head type (what `heads.io.head_types` returns)."""
    return {m.name: m.heads for m in (methods() if found is None else found)}


def moved(package: str, name: str) -> Any:
    """``name`` read from ``package`` (heads, inference, inference.proposers; the package root for
    ``XProposer`` names), where the heads classes and drafters lived before each method got its
    own package under draftheads/methods/: a class defined in the module of a registered method's
    heads or drafter, with a DeprecationWarning naming its home now. ``XProposer``, a head
    drafter's former per-sequence name, finds ``XDrafter``. The one path of every old name.
    Anything else is the usual AttributeError."""
    wanted = name[: -len("Proposer")] + "Drafter" if name.endswith("Proposer") else name
    if not name.startswith("_"):
        for method in methods():
            for home in dict.fromkeys((method.heads.__module__, method.drafter.__module__)):
                value = getattr(sys.modules.get(home), wanted, None)
                if isinstance(value, type) and value.__module__ == home:  # defined there, not imported
                    warnings.warn(f"{package}.{name} is deprecated: import {wanted} from {home} (head classes and drafters also from draftheads)",
                                  DeprecationWarning, stacklevel=3)
                    return value
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
