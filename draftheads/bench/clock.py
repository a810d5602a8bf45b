"""When a timed call's prefill ended, so that bench can time decoding alone.

Plain `generate` and every method start the same way: one target forward over the prompts (the
prefill), whose last logits give each row's first token. That work is the same for all of them,
so timing only what follows takes it out of the comparison, and with it the short-answer artifact
at T > 0 (plain and a method sample different texts; a 7-token answer's tokens/s is mostly its
prefill). The clock is a forward hook on the target: it sees plain `generate`, the speculative
decoder, a batch plan's plain mode and a batch of rows alike, and it needs nothing from the
decoders (a streamer would, and the decoder streams one row only).
"""
from __future__ import annotations

import time
from typing import Any

import torch


def _sync(device: torch.device) -> None:
    """Wait for the accelerator, so a clock reading means the work before it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PrefillClock:
    """``with PrefillClock(target) as clock: ...``: ``clock.ended`` is the `time.perf_counter()`
    at which the target's first forward inside the block returned (None if none ran)."""

    def __init__(self, target: torch.nn.Module) -> None:
        self.target = target
        self.ended: float | None = None
        self._handle = None

    def __enter__(self) -> PrefillClock:
        self.ended = None
        self._handle = self.target.register_forward_hook(self._first_forward)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()
        self._handle = None

    def _first_forward(self, module, args, output) -> None:
        if self.ended is None:
            _sync(self.target.device)  # once per call, on both sides of a comparison
            self.ended = time.perf_counter()

    def decode_seconds(self, end: float) -> float | None:
        """Seconds from the prefill's end to ``end`` (None when no forward ran)."""
        return None if self.ended is None else end - self.ended


def timed(target: torch.nn.Module, fn, *args) -> tuple[Any, float, float | None]:
    """``fn(*args)``'s result, its wall seconds, and its seconds after the target's prefill (None
    when it ran no target forward): how both benches time plain `generate` and every method."""
    device = target.device
    with PrefillClock(target) as clock:
        _sync(device)
        t0 = time.perf_counter()
        result = fn(*args)
        _sync(device)
        t1 = time.perf_counter()
    return result, t1 - t0, clock.decode_seconds(t1)
