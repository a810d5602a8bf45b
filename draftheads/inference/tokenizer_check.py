"""Does a draft model speak the target's token ids? Checked before any drafting.

A draft LM proposes token *ids*; the target verifies ids. If the two tokenizers map a string to
different ids, every draft is rejected (slow) or, worse, the vocab sizes agree and nothing tells
the user. So we compare the full token -> id maps and the special tokens, and say what differs.
"""
from __future__ import annotations

from typing import Any

SPECIAL_TOKENS = ("bos", "eos", "pad", "unk")
_SHOW = 5  # how many differing tokens an error message lists


def _vocab(tokenizer: Any) -> dict[str, int]:
    """The complete token -> id map, added tokens included."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        raise TypeError(f"{type(tokenizer).__name__} has no get_vocab(): pass a Hugging Face tokenizer")
    return dict(get_vocab())


def _size(tokenizer: Any, vocab: dict[str, int]) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return len(vocab)


def tokenizer_size(tokenizer: Any) -> int:
    """Number of ids the tokenizer can produce (``len(tokenizer)``: base vocab plus added tokens)."""
    return _size(tokenizer, _vocab(tokenizer))


def _special(tokenizer: Any, name: str) -> tuple[str | None, int | None]:
    token = getattr(tokenizer, f"{name}_token", None)
    token_id = getattr(tokenizer, f"{name}_token_id", None)
    return (None if token is None else str(token)), (None if token_id is None else int(token_id))


def _fmt(tokens: list[str]) -> str:
    return ", ".join(repr(t) for t in tokens)


def tokenizer_differences(target_tokenizer: Any, draft_tokenizer: Any) -> list[str]:
    """Human-readable differences that make ``draft_tokenizer``'s ids meaningless to the target;
    empty if they are interchangeable."""
    problems: list[str] = []
    tv, dv = _vocab(target_tokenizer), _vocab(draft_tokenizer)
    ts, ds = _size(target_tokenizer, tv), _size(draft_tokenizer, dv)
    if ts != ds:
        problems.append(f"vocabulary size differs: target tokenizer has {ts} tokens, draft tokenizer has {ds}")

    only_target = sorted((t for t in tv if t not in dv), key=tv.__getitem__)
    only_draft = sorted((t for t in dv if t not in tv), key=dv.__getitem__)
    if only_target:
        problems.append(
            f"{len(only_target)} token(s) only in the target tokenizer, e.g. {_fmt(only_target[:_SHOW])}"
        )
    if only_draft:
        problems.append(f"{len(only_draft)} token(s) only in the draft tokenizer, e.g. {_fmt(only_draft[:_SHOW])}")
    moved = sorted((t for t in tv if t in dv and tv[t] != dv[t]), key=tv.__getitem__)
    if moved:
        examples = "; ".join(f"{t!r}: target id {tv[t]}, draft id {dv[t]}" for t in moved[:_SHOW])
        problems.append(f"{len(moved)} token(s) have different ids, e.g. {examples}")

    for name in SPECIAL_TOKENS:
        t_tok, t_id = _special(target_tokenizer, name)
        d_tok, d_id = _special(draft_tokenizer, name)
        if (t_tok, t_id) != (d_tok, d_id):
            problems.append(
                f"{name}_token differs: target {t_tok!r} (id {t_id}), draft {d_tok!r} (id {d_id})"
            )
    return problems


def check_same_tokenizer(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise ``ValueError`` listing every difference if the draft's token ids are not the target's.

    Compared: ``len(tokenizer)``, the full token -> id maps (added tokens included) and the
    bos/eos/pad/unk tokens and ids. Chat templates and normalisation are not compared: they change
    which ids a text becomes, not what an id means, and drafting works on ids only."""
    problems = tokenizer_differences(target_tokenizer, draft_tokenizer)
    if problems:
        raise ValueError(
            "the draft model's tokenizer is not the target's, so its token ids would mean other tokens:\n  - "
            + "\n  - ".join(problems)
            + "\nUse a draft model from the same family (same tokenizer) as the target."
        )
