"""The target's own tokens, kept exact from generation to training.

Decoding generated ids to text and tokenizing that text again is lossy: a byte-level model may
emit a byte that is not valid UTF-8 on its own (half of a multi-byte character), which decodes
to U+FFFD and re-tokenizes as other tokens, and a model may emit a non-canonical split ("hel" +
"lo") that re-tokenizes as "hello". Heads trained on such rows learn tokens the target never
wrote. So ``distill`` stores the generated ids beside the text, in ``TOKEN_IDS`` (``_token_ids``):

* chat rows: a list with one entry per assistant message, in order: that turn's new ids (the
  end-of-turn token the target stopped at is not included; the template writes it);
* plain-text rows: the ids of the whole text (the prompt prefix and the continuation).

``spliced_chat`` lays a conversation out as ids with every assistant turn's stored ids dropped in
verbatim and the template's text around them tokenized piece by piece. The piece before an
assistant turn is exactly the rendered prompt ``distill`` fed the target for that turn (the
template rendered with its generation prompt), so the sequence is what the target saw and wrote,
turn after turn; ``distill`` builds later turns' prompts the same way. For a template that does not
render earlier turns as a prefix of later ones, or that does not copy the content verbatim right
after the generation prompt, there is no exact splice (``NotSpliceable``): callers then tokenize
the text and count the row.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .chat_mask import Span, assistant_char_spans, make_renderer, special_strings, tokenize_with_spans
from .formats import Message

TOKEN_IDS = "_token_ids"


class NotSpliceable(ValueError):
    """The chat template gives no place to drop the stored ids into (see the module docstring)."""


class IdsDoNotMatch(ValueError):
    """Stored ids that do not decode to the row's text: the row was edited after ``distill``."""


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text ``distill`` writes for generated ids (special tokens left out)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def retokenizes_exactly(tokenizer: Any, ids: Sequence[int]) -> bool:
    """Whether tokenizing the decoded text gives ``ids`` back."""
    return list(tokenizer(decode(tokenizer, ids), add_special_tokens=False)["input_ids"]) == list(ids)


def spliced_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    answers: Sequence[Sequence[int] | None],
    *,
    add_generation_prompt: bool = False,
    specials: Sequence[str] | None = None,
    row: int = -1,
) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of a conversation with the assistant turns' stored ids.

    ``answers[k]`` belongs to the k-th assistant message (``None``: tokenize its text). The mask is
    the assistant-only mask of ``chat_mask`` (1 on the stored ids and on the end-of-turn marker
    after them); with ``add_generation_prompt`` it is all 0 (a prompt). Raises ``NotSpliceable``
    and ``IdsDoNotMatch`` (both ValueError) as the module docstring says."""
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(answers) != len(at):
        raise IdsDoNotMatch(
            f"row {row}: {TOKEN_IDS} holds {len(answers)} entries for {len(at)} assistant messages"
        )
    render = make_renderer(tokenizer)
    full = render(messages, add_generation_prompt)
    spans: list[Span] = []
    if not add_generation_prompt and at:
        specials = special_strings(tokenizer) if specials is None else specials
        spans = assistant_char_spans(render, messages, specials, row)[1]
    cuts: list[tuple[int, int, list[int]]] = []
    for k, (i, ids) in enumerate(zip(at, answers)):
        if ids is None:
            continue
        content = messages[i]["content"]
        if decode(tokenizer, ids) != content:
            raise IdsDoNotMatch(
                f"row {row}: the stored {TOKEN_IDS} of assistant turn {k} decode to "
                f"{decode(tokenizer, ids)[:40]!r}..., not to its content {content[:40]!r}..."
            )
        try:
            before = render(messages[:i], True)
        except Exception as err:  # a template may refuse a prefix
            raise NotSpliceable(f"row {row}: the chat template cannot render the prompt of turn {k} ({err})") from err
        start = len(before)
        if not full.startswith(before) or not full.startswith(content, start):
            raise NotSpliceable(
                f"row {row}: the chat template does not write assistant turn {k} verbatim after its generation "
                "prompt"
            )
        cuts.append((start, start + len(content), list(ids)))
    ids_out: list[int] = []
    mask_out: list[int] = []
    cursor = 0
    for start, end, ids in cuts:
        _extend_text(tokenizer, full, cursor, start, spans, ids_out, mask_out)
        ids_out += ids
        mask_out += [0 if add_generation_prompt else 1] * len(ids)
        cursor = end
    _extend_text(tokenizer, full, cursor, len(full), spans, ids_out, mask_out)
    return ids_out, mask_out


def _extend_text(
    tokenizer: Any, full: str, lo: int, hi: int, spans: Sequence[Span], ids: list[int], mask: list[int]
) -> None:
    """Tokenize ``full[lo:hi]`` on its own and mask it by the (shifted) assistant spans."""
    if hi <= lo:
        return
    piece_ids, piece_mask = tokenize_with_spans(tokenizer, full[lo:hi], [(a - lo, b - lo) for a, b in spans])
    ids += piece_ids
    mask += piece_mask


def text_ids(tokenizer: Any, text: str, stored: Sequence[int], row: int = -1) -> list[int]:
    """bos + the stored ids of a plain-text row + eos (what ``tokenize_text`` builds from the text)."""
    if decode(tokenizer, stored) != text:
        raise IdsDoNotMatch(f"row {row}: the stored {TOKEN_IDS} do not decode to the row's text {text[:40]!r}...")
    ids = list(stored)
    if tokenizer.bos_token_id is not None:
        ids.insert(0, tokenizer.bos_token_id)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids
