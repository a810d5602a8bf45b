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


def normalize_chat(value: Any, fmt: str, row: int) -> list[Message]:
    """A ShareGPT or messages row as ``[{"role", "content"}]`` with roles system/user/assistant."""
    if fmt == "sharegpt":
        role_key, content_key, roles = "from", "value", SHAREGPT_ROLES
    elif fmt == "messages":
        role_key, content_key, roles = "role", "content", MESSAGE_ROLES
    else:
        raise ValueError(f"{fmt!r} is not a chat format ({', '.join(CHAT_FORMATS)})")
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise ValueError(f"row {row}: expected a list of {fmt} messages, got {type(value).__name__}")
    out: list[Message] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise ValueError(f"row {row}, message {i}: expected a mapping, got {type(msg).__name__}")
        raw_role = msg.get(role_key)
        role = roles.get(raw_role.strip().lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise ValueError(
                f"row {row}, message {i}: unknown {role_key!r} value {raw_role!r}; "
                f"expected one of {sorted(roles)}"
            )
        out.append({"role": role, "content": _content_text(msg.get(content_key), row, i)})
    return out


def _content_text(content: Any, row: int, index: int) -> str:
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
                    f"row {row}, message {index}: only text content parts are supported, got {part!r}"
                )
        return "".join(parts)
    raise ValueError(f"row {row}, message {index}: content must be a string, got {content!r}")
