"""Time of the target's verify forward, without adding a device sync to the step."""
from __future__ import annotations

import time

import torch


class ForwardTimer:
    """Time of one verify forward. On CUDA through events read after acceptance has synced anyway
    (a `torch.cuda.synchronize` per step would be a second host sync); elsewhere the wall clock."""

    def __init__(self, device: torch.device) -> None:
        self._events = None
        if device.type == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._t0 = time.perf_counter()
        self._wall: float | None = None

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
        else:
            self._wall = time.perf_counter() - self._t0

    def seconds(self) -> float:
        if self._events is not None:
            self._events[1].synchronize()  # already complete after acceptance: returns at once
            return self._events[0].elapsed_time(self._events[1]) / 1000.0
        return float(self._wall)
