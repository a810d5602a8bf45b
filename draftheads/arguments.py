"""Argument types the command lines share (`draftheads` and `draftheads bench`): each turns a
bad value into an argparse error that names what was expected, before anything is loaded."""
from __future__ import annotations

import argparse


class CommandError(ValueError):
    """Bad input a command was given (a flag's value, a file or folder it names): ``draftheads``
    prints the message as one ``error:`` line and exits 2, never a traceback."""


def heads_error(path: object, error: BaseException) -> CommandError:
    """A heads folder that cannot be used (missing, corrupt, another target's), as a `CommandError`
    that names the folder."""
    message = str(error)
    return CommandError(message if str(path) in message else f"--heads {path}: {message}")


def positive_int(text: str) -> int:
    """A whole number >= 1 (max new tokens, rounds, prompts...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


def batch_sizes(text: str) -> list[int]:
    """Comma-separated batch sizes, each >= 1, e.g. "1,4,8"."""
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes like 1,4,8, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be whole numbers >= 1, got {text!r}")
    return sizes
