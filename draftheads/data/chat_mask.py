"""Assistant-only loss masks for chat rows, for any chat template.

Draft heads learn to predict what the target model *generates*; in a chat that is the assistant
side only. So a chat row becomes ``tokenizer.apply_chat_template`` token ids plus a mask that is 1
exactly on the assistant turns: their content and the end-of-turn marker the template writes right
after it (the model has to predict ``<|im_end|>``/``<|eot_id|>`` to stop), and 0 on system and user
text, role headers and generation prompts.

Method (no ``{% generation %}`` markers needed, so it works with the templates models ship):

1. Render the whole conversation to text once, ``full``.
2. For assistant message ``i`` render ``messages[:i]`` with the generation prompt (``before``)
   and ``messages[:i+1]`` without (``upto``). If both are prefixes of ``full``, the assistant turn
   is ``full[len(before):len(upto)]``: exactly what the model writes after the generation prompt.
   Inside that region the message content is located; the trainable span runs from the region start
   through the content and on to the end of the first special token after it (the end-of-turn
   marker). Text the template writes after that marker (ChatML's ``\\n``) is not trained: the model
   stops at the marker and never generates it. If the template rewrote the content so it cannot be
   found, the region up to its last special token is trained.
3. Templates that do not render prefixes stably (they add a date, or drop the reasoning of earlier
   turns) fail the prefix check; then each message's content is searched in ``full`` in order
   and the assistant span is its content plus a special token that follows after at most
   whitespace.
4. ``full`` is tokenized once, exactly as ``apply_chat_template(tokenize=True)`` does
   (``add_special_tokens=False``; the template writes bos itself), and character spans become
   token flags through the offset mapping. A token that straddles a span boundary counts as
   trainable. Tokenizers without offsets (slow ones) fall back to prefix tokenization: the span
   boundary is the length of the common prefix of ``encode(full[:b])`` and ``encode(full)`` (there a
   token straddling the end of a span is left out).

Assumptions: the template renders ``messages[:k]`` as a prefix of the full conversation (else step
3's ordered search, which can be fooled by an assistant reply that also occurs in the template text
between the previous message and it), it copies the content verbatim (up to surrounding whitespace),
and the end-of-turn marker is a special token of the tokenizer (a template that ends turns with
plain text only trains the content; in the step-3 fallback such a template would lend the next
turn's special header token instead, if only whitespace separates them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .formats import Message, row_label

Span = tuple[int, int]
Renderer = Callable[[Sequence[Message], bool], str]


def check_chat_template(tokenizer: Any, source: str = "") -> None:
    """Fail early, with the fix, when chat rows meet a tokenizer that cannot render chats."""
    if getattr(tokenizer, "chat_template", None) is None:
        where = f" (data: {source})" if source else ""
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"the tokenizer {name!r} has no chat template, so chat rows{where} cannot be rendered. "
            "Use the tokenizer of a chat/instruct model, set `tokenizer.chat_template` to a Jinja "
            "template, or train on plain-text data (data.format: text)."
        )


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """Texts of the special tokens (bos/eos/pad and added special tokens): end-of-turn candidates."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            found.add(str(added.content))
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def make_renderer(tokenizer: Any) -> Renderer:
    def render(messages: Sequence[Message], add_generation_prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    return render


def assistant_char_spans(
    render: Renderer, messages: Sequence[Message], specials: Sequence[str], row: Any = "a row"
) -> tuple[str, list[Span]]:
    """The rendered conversation and the character spans to train on (see the module docstring).
    ``row``: the row's place for messages (`formats.row_label`)."""
    full = render(messages, False)
    spans: list[Span] = []
    cursor = 0  # where the ordered content search continues (never past the true position)
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            found = _locate(full, msg["content"], cursor, len(full))
            if found is not None and msg["content"].strip():
                cursor = found[1]
            continue
        span = _span_by_prefix(render, messages, i, full, specials)
        if span is None:
            span = _span_by_search(full, msg["content"], cursor, specials)
        if span is None:
            raise ValueError(
                f"{row_label(row)}, message {i + 1}: cannot find the assistant content in the rendered chat "
                f"template (content starts {msg['content'][:60]!r}); the template must copy "
                "message content verbatim"
            )
        spans.append(span)
        cursor = max(cursor, span[1])
    return full, spans


def _span_by_prefix(
    render: Renderer, messages: Sequence[Message], i: int, full: str, specials: Sequence[str]
) -> Span | None:
    try:
        before = render(messages[:i], True)
        upto = render(messages[: i + 1], False)
    except Exception:  # a template may refuse a prefix (e.g. one that must start with a user turn)
        return None
    if not (full.startswith(before) and full.startswith(upto) and len(before) <= len(upto)):
        return None
    start, end = len(before), len(upto)
    found = _locate(full, messages[i]["content"], start, end)
    if found is None:
        last = _last_special_end(full, start, end, specials)
        return (start, last if last is not None else end)
    marker = _first_special(full, found[1], end, specials)
    return (start, marker[1] if marker is not None else found[1])


def _span_by_search(full: str, content: str, cursor: int, specials: Sequence[str]) -> Span | None:
    found = _locate(full, content, cursor, len(full))
    if found is None:
        return None
    marker = _first_special(full, found[1], len(full), specials)
    if marker is not None and not full[found[1] : marker[0]].strip():
        return (found[0], marker[1])
    return found


def _locate(text: str, content: str, lo: int, hi: int) -> Span | None:
    """First occurrence of ``content`` (verbatim, else whitespace-stripped) in ``text[lo:hi]``."""
    for needle in (content, content.strip()):
        idx = text.find(needle, lo, hi)
        if idx >= 0:
            return (idx, idx + len(needle))
    return None


def _first_special(text: str, lo: int, hi: int, specials: Sequence[str]) -> Span | None:
    best: Span | None = None
    for tok in specials:
        idx = text.find(tok, lo, hi)
        if idx >= 0 and (best is None or idx < best[0] or (idx == best[0] and idx + len(tok) > best[1])):
            best = (idx, idx + len(tok))
    return best


def _last_special_end(text: str, lo: int, hi: int, specials: Sequence[str]) -> int | None:
    ends = [idx + len(tok) for tok in specials if (idx := text.rfind(tok, lo, hi)) >= 0]
    return max(ends) if ends else None


def tokenize_with_spans(tokenizer: Any, text: str, spans: Sequence[Span]) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` (no added special tokens) and 1 for tokens overlapping ``spans``."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, ValueError, TypeError, KeyError):
        return _mask_by_prefix_encoding(tokenizer, text, spans)
    ids = list(enc["input_ids"])
    return ids, offsets_to_mask(offsets, spans)


def offsets_to_mask(offsets: Sequence[Sequence[int]], spans: Sequence[Span]) -> list[int]:
    """Per-token 0/1 from character offsets.

    Offsets are first made contiguous (a token owns the text from the previous token's end to its
    own end): byte-level tokenizers with ``trim_offsets`` report whitespace tokens as empty spans
    at the wrong place, and byte-fallback tokenizers give several tokens the same span. A token
    left with an empty span shares the flag of the token before it.
    """
    mask: list[int] = []
    prev_end = 0
    for _start, end in offsets:
        lo, hi = prev_end, max(end, prev_end)
        prev_end = hi
        if hi == lo:
            mask.append(mask[-1] if mask else 0)
            continue
        mask.append(int(any(lo < s_end and hi > s_start for s_start, s_end in spans if s_end > s_start)))
    return mask


def _mask_by_prefix_encoding(tokenizer: Any, text: str, spans: Sequence[Span]) -> tuple[list[int], list[int]]:
    """Offset-free fallback: a character boundary maps to the tokens ``text[:b]`` shares with ``text``."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def boundary(pos: int) -> int:
        prefix = tokenizer(text[:pos], add_special_tokens=False)["input_ids"]
        n = 0
        for a, b in zip(prefix, ids):
            if a != b:
                break
            n += 1
        return n

    mask = [0] * len(ids)
    for s_start, s_end in spans:
        for k in range(boundary(s_start), boundary(s_end)):
            mask[k] = 1
    return ids, mask
