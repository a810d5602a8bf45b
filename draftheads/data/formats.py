"""Recognise the row format of a dataset and normalise chat rows to one shape.

Public chat corpora come as ShareGPT (``conversations: [{from, value}]``) or OpenAI-style
``messages: [{role, content}]``; plain corpora as one text column. Everything downstream
(chat templates, loss masks) only ever sees ``[{"role": "system"|"user"|"assistant",
"content": str}]`` or a string, so the differences end here. Anything unrecognised is an error
that names the row and the value: a silently skipped role would silently change what the heads
learn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Message = dict[str, str]

CHAT_FORMATS = ("sharegpt", "messages")

# ShareGPT speaker names -> chat-template roles. "chatgpt"/"bard"/"bing" appear in the
# ShareGPT-Vicuna dumps and "model" in Gemma-style data; all are the assistant side.
SHAREGPT_ROLES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
}
MESSAGE_ROLES: dict[str, str] = {"system": "system", "user": "user", "assistant": "assistant"}


def detect_format(columns: Iterable[str], requested: str = "auto", text_field: str = "text") -> str:
    """The concrete format ("sharegpt" | "messages" | "text") for a dataset with these columns.

    With ``requested != "auto"`` it only checks that the needed column is there, so a typo in
    the config fails before any tokenization.
    """
    cols = list(columns)
    needed = {"sharegpt": "conversations", "messages": "messages", "text": text_field}
    if requested != "auto":
        if requested not in needed:
            raise ValueError(f"unknown data format {requested!r}; use auto, sharegpt, messages or text")
        if needed[requested] not in cols:
            raise ValueError(
                f"data format {requested!r} needs a {needed[requested]!r} column; the dataset has columns {cols}"
            )
        return requested
    for fmt in ("sharegpt", "messages", "text"):
        if needed[fmt] in cols:
            return fmt
    raise ValueError(
        f"cannot tell the data format from the columns {cols}: expected 'conversations' (ShareGPT), "
        f"'messages' (OpenAI chat) or {text_field!r} (plain text; set data.text_field for another column)"
    )


def row_label(row: Any) -> str:
    """How messages name a row: ``row N`` counted from 1 for a 0-based index, else the place as
    its caller describes it (``FILE line N``; an object that works it out only when printed).
    Messages inside a row are counted from 1 as well."""
    return f"row {row + 1}" if isinstance(row, int) else str(row)


def normalize_chat(value: Any, fmt: str, row: Any) -> list[Message]:
    """A ShareGPT or messages row as ``[{"role", "content"}]`` with roles system/user/assistant.
    ``row``: the row's place for messages (see `row_label`), read only when there is an error."""
    where = _Where(row)
    if fmt == "sharegpt":
        role_key, content_key, roles = "from", "value", SHAREGPT_ROLES
    elif fmt == "messages":
        role_key, content_key, roles = "role", "content", MESSAGE_ROLES
    else:
        raise ValueError(f"{fmt!r} is not a chat format ({', '.join(CHAT_FORMATS)})")
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise ValueError(f"{where}: expected a list of {fmt} messages, got {type(value).__name__}")
    out: list[Message] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise ValueError(f"{where}, message {i + 1}: expected a mapping, got {type(msg).__name__}")
        raw_role = msg.get(role_key)
        role = roles.get(raw_role.strip().lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise ValueError(
                f"{where}, message {i + 1}: unknown {role_key!r} value {raw_role!r}; "
                f"expected one of {sorted(roles)}"
            )
        out.append({"role": role, "content": _content_text(msg.get(content_key), where, i)})
    return out


class _Where:
    """`row_label` of a row, formatted when a message prints it."""

    def __init__(self, row: Any) -> None:
        self.row = row

    def __str__(self) -> str:
        return row_label(self.row)

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def _content_text(content: Any, where: Any, index: int) -> str:
    """Message content as a string; OpenAI content-part lists are joined if all parts are text."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ValueError(
                    f"{where}, message {index + 1}: only text content parts are supported, got {part!r}"
                )
        return "".join(parts)
    raise ValueError(f"{where}, message {index + 1}: content must be a string, got {content!r}")
