"""The decoders a benchmark compares, by name.

Heads go through ``load_heads`` + ``SpeculativeDecoder(target, heads)`` and nothing else, so any
head type the package knows (Medusa, and whatever ``load_heads`` learns later) is benchmarked
the way users decode with it; the method is named after the folder's ``head_type``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..arguments import heads_error

DRAFT_MODEL = "draft-model"
PROMPT_LOOKUP = "prompt-lookup"
PLAIN = "plain"
WITH_LOOKUP = "+lookup"  # "eagle3+lookup": those heads behind prompt lookup for every request (`proposers.hybrid`)
WITHOUT_LOOKUP = "-lookup"  # "eagle3-lookup": those heads alone, whatever their tree.json says
#: NAME alone decodes as a user's SpeculativeDecoder(target, heads) does: lookup where the plan says.
LOOKUP_SUFFIXES = {WITH_LOOKUP: True, WITHOUT_LOOKUP: False}
#: Any method with "@block" after its name verifies chains by block verification (`generate(...,
#: acceptance="block")`, lossless like the default): "prompt-lookup@block" beside "prompt-lookup"
#: in one run measures what the rule alone changes. Only lossless rules: a bench checks exactness.
ACCEPTANCE_SUFFIXES = {"@block": "block"}


class MethodError(ValueError):
    """A --compare / --heads combination that names a method nobody configured."""


@dataclass
class Method:
    name: str
    decoder: Any  # SpeculativeDecoder
    source: str | None = None  # heads folder or draft model path
    info: dict[str, Any] = field(default_factory=dict)
    acceptance: str = "exact"  # `SpeculativeDecoder.generate`'s verification rule

    def describe(self) -> dict[str, Any]:
        """What the report records about the method: the proposer and the tree it drafts."""
        from ..inference.proposers.hybrid import LookupThenHeads  # torch: only once a decoder exists
        from ..inference.proposers.sequence import ForkedRows

        proposer = self.decoder.proposer
        out: dict[str, Any] = {"name": self.name, "proposer": proposer.name, "source": self.source,
                               "acceptance": self.acceptance, **self.info}
        if isinstance(proposer, LookupThenHeads):  # the heads' tree and vocabulary; the lookup is the default one
            proposer = proposer.heads
        if isinstance(proposer, ForkedRows):  # a per-sequence drafter: its settings are its own
            proposer = proposer.proposer
        shape = getattr(proposer, "shape", None)
        choices = getattr(shape, "choices", None)
        if choices is not None:
            out["tree"] = [list(c) for c in choices]
            out["tree_nodes"] = int(getattr(shape, "size", len(choices) + 1))
        vocab = getattr(proposer, "vocab_ids", None)
        if vocab is not None:
            out["draft_vocab_size"] = int(vocab.numel())
        plan = getattr(self.decoder, "batch_plan", None)
        if plan:
            out["batch_plan"] = {str(size): mode for size, mode in sorted(plan.items())}
        for attr in ("gamma", "max_gamma", "max_ngram", "num_tokens"):
            value = getattr(proposer, attr, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[attr] = value
        return out


def heads_method_names(heads_dirs: list[str]) -> list[str]:
    """One name per heads folder: its head type ("medusa", "eagle", ...), or
    ``type:folder`` when two folders share a type (e.g. two Medusa checkpoints)."""
    from ..heads import read_config

    types = [read_config(Path(d)).head_type for d in heads_dirs]
    names = []
    for d, t in zip(heads_dirs, types):
        names.append(t if types.count(t) == 1 else f"{t}:{Path(d).name}")
    if len(set(names)) != len(names):
        names = [t if types.count(t) == 1 else f"{t}:{d}" for d, t in zip(heads_dirs, types)]
    return names


def resolve_compare(
    compare: list[str] | None, heads_names: list[str], draft_model: str | None, prompt_lookup: bool
) -> list[str]:
    """The methods to run, in order. Without --compare: everything the flags configure. With
    it: exactly those names; one that needs a flag nobody gave is an error saying which flag."""
    configured = list(heads_names) + ([DRAFT_MODEL] if draft_model else []) + ([PROMPT_LOOKUP] if prompt_lookup else [])
    if not compare:
        if not configured:
            raise MethodError("nothing to compare: give --heads DIR, --draft-model PATH or --prompt-lookup")
        return configured
    available = list(heads_names) + [name + suffix for suffix in LOOKUP_SUFFIXES for name in heads_names]
    available += [DRAFT_MODEL, PROMPT_LOOKUP]
    available += [name + suffix for suffix in ACCEPTANCE_SUFFIXES for name in list(available)]
    chosen: list[str] = []
    for name in compare:
        if name == PLAIN:
            continue  # plain `generate` is always measured: it is the baseline
        if name in chosen:
            raise MethodError(f"--compare names {name!r} twice")
        if split_acceptance(name)[0] == DRAFT_MODEL and not draft_model:
            raise MethodError("--compare draft-model needs --draft-model PATH_OR_ID")
        if name not in available:
            raise MethodError(
                f"unknown method {name!r} in --compare; available: {', '.join(available)} "
                "(heads methods are named after each --heads folder's head_type; give --heads DIR for more)"
            )
        chosen.append(name)
    if not chosen:
        raise MethodError("--compare names no method besides plain")
    return chosen


def split_acceptance(name: str) -> tuple[str, str]:
    """A method name as (the method, its verification rule): "prompt-lookup@block" ->
    ("prompt-lookup", "block"), "eagle3" -> ("eagle3", "exact")."""
    for suffix, rule in ACCEPTANCE_SUFFIXES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], rule
    return name, "exact"


def split_lookup(name: str) -> tuple[str, bool | None]:
    """A method name as (heads name, `SpeculativeDecoder`'s prompt_lookup): "eagle3+lookup" ->
    ("eagle3", True), "eagle3-lookup" -> ("eagle3", False), "eagle3" -> ("eagle3", None)."""
    for suffix, lookup in LOOKUP_SUFFIXES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], lookup
    return name, None


def build_methods(
    names: list[str],
    target,
    tokenizer,
    heads_dirs: list[str],
    heads_names: list[str],
    draft_model: str | None,
    load_model: Callable[[str], tuple[Any, Any]],
    check_fingerprint: bool = True,
    draw_drafts: bool = True,
) -> list[Method]:
    """Decoders for ``names``; ``load_model(path)`` returns (model, tokenizer) for a draft LM,
    loaded the way the target was (device, dtype). ``check_fingerprint``: see ``load_heads``;
    ``draw_drafts``: `SpeculativeDecoder`'s, for heads."""
    import draftheads as dh

    from ..heads import read_config
    from ..inference.default_tree import tree_source

    methods = []
    for full_name in names:
        name, acceptance = split_acceptance(full_name)
        heads_name, lookup = split_lookup(name)
        if heads_name in heads_names:
            folder = heads_dirs[heads_names.index(heads_name)]
            try:
                heads = dh.load_heads(folder, target=target, check_fingerprint=check_fingerprint)
            except (ValueError, OSError) as e:  # missing, corrupt, another target's: one error line (cli.main)
                raise heads_error(folder, e) from None
            config = read_config(Path(folder))
            info = {"head_type": config.head_type, "num_heads": getattr(config, "num_heads", None),
                    "tree_source": tree_source(heads, target.device)}  # calibration / training / device default
            info["draw_drafts"] = draw_drafts
            info["prompt_lookup"] = "as tree.json says" if lookup is None else lookup
            decoder = dh.SpeculativeDecoder(target, heads, draw_drafts=draw_drafts, prompt_lookup=lookup)
            methods.append(Method(full_name, decoder, folder, info, acceptance))
        elif name == DRAFT_MODEL:
            draft, draft_tok = load_model(draft_model)
            proposer = dh.DraftModelProposer(draft, gamma="auto", target_tokenizer=tokenizer, draft_tokenizer=draft_tok)
            info = {"draft_parameters": sum(p.numel() for p in draft.parameters())}
            methods.append(Method(full_name, dh.SpeculativeDecoder(target, proposer), draft_model, info, acceptance))
        elif name == PROMPT_LOOKUP:
            methods.append(Method(full_name, dh.SpeculativeDecoder(target, dh.PromptLookupProposer()), acceptance=acceptance))
        else:  # resolve_compare lets nothing else through
            raise MethodError(f"unknown method {name!r}")
    return methods
