"""Count the host reads of device data during decoding: each one stalls a GPU until its queue drains.

What counts: ``_local_scalar_dense`` (``item()``, ``int(t)``, ``bool(t)``, ``if t:``), copies from a
non-CPU device to the CPU (``.cpu()`` of device data too when, as on a CPU-only machine, that
data is already in host memory), and ``tolist()`` / ``numpy()`` of device data. On a machine with only a
CPU every tensor is on the host, so the counter tracks which tensors WOULD live on the accelerator:
the parameters and buffers of the given modules (target, heads) and everything computed from them.
Host-built data (token lists, tree topology) is not counted: on a GPU it is not a sync either.

Counts inside the target's own forward (the model's code, not ours) are kept apart. Standalone on
purpose (imports only torch): benchmarks load it next to older versions of the package.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

_HOST = torch.device("cpu")
_COPIES = ("aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize")


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner: "HostSyncCounter") -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        owner = self.owner
        if not owner._depth:
            owner.ops_outside += 1  # a kernel launch on an accelerator
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on_device = [t for t in inputs if owner.is_device_data(t)]
        name = func._schema.name
        if name == "aten::_local_scalar_dense" and on_device and not owner.reading_scalar:
            owner.record("item")
        elif name in _COPIES:
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if any(t.device != _HOST for t in inputs) and any(t.device == _HOST for t in outputs):
                owner.record("copy_to_host")
        if on_device:  # taint what is computed from device data (outputs and mutated arguments)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    owner.taint(t)
            for arg, value in zip(func._schema.arguments, args):
                if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                    owner.taint(value)
        return out


_SCALAR_READS = (torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__bool__,
                 torch.Tensor.__index__)


class _Function(TorchFunctionMode):
    def __init__(self, owner: "HostSyncCounter") -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SCALAR_READS and args and isinstance(args[0], torch.Tensor) and self.owner.is_device_data(args[0]):
            # Counted here, not at dispatch: under inference_mode ``_local_scalar_dense`` of a CPU
            # tensor does not reach the dispatch mode at all.
            self.owner.record("item")
            self.owner.reading_scalar = True
            try:
                return func(*args, **kwargs)
            finally:
                self.owner.reading_scalar = False
        if func in (torch.Tensor.tolist, torch.Tensor.numpy) and args and self.owner.is_device_data(args[0]):
            self.owner.record(func.__name__)
        elif func is torch.Tensor.cpu and args and args[0].device == _HOST and self.owner.is_device_data(args[0]):
            # On a CPU-only machine `.cpu()` of device data returns the tensor itself (no copy is
            # dispatched); on an accelerator it is a device-to-host copy that waits for the queue,
            # and what it returns is host data. Both are mirrored: counted, and an untainted copy.
            self.owner.record("copy_to_host")
            out = args[0].clone()
            self.owner.untaint(out)
            return out
        return func(*args, **kwargs)


class HostSyncCounter:
    """Context manager: ``with HostSyncCounter(target, heads) as c: decoder.generate(...)``, then
    ``c.outside`` (our code) and ``c.inside`` (the target's forward) count host reads of device data."""

    def __init__(self, *modules: torch.nn.Module | None, target: torch.nn.Module | None = None) -> None:
        self._device_data = WeakTensorKeyDictionary()
        self.modules = [m for m in modules if m is not None]
        self.target = target if target is not None else (self.modules[0] if self.modules else None)
        self.outside: Counter[str] = Counter()
        self.inside: Counter[str] = Counter()
        self._depth = 0
        self.reading_scalar = False  # inside a scalar read already counted by the function mode
        #: Tensor operations dispatched outside the target's forward (our code and the proposer's):
        #: each is a kernel launch on an accelerator, so a load-independent measure of step overhead.
        self.ops_outside = 0
        self._handles: list[Any] = []
        self._modes: list[Any] = []

    def is_device_data(self, t: torch.Tensor) -> bool:
        return t.device != _HOST or t in self._device_data

    def taint(self, t: torch.Tensor) -> None:
        try:
            self._device_data[t] = True
        except TypeError:  # tensors that cannot be weakly referenced are never device data here
            pass

    def untaint(self, t: torch.Tensor) -> None:
        self._device_data.pop(t, None)

    def record(self, kind: str) -> None:
        (self.inside if self._depth else self.outside)[kind] += 1

    @property
    def total_outside(self) -> int:
        return sum(self.outside.values())

    @property
    def total_inside(self) -> int:
        return sum(self.inside.values())

    def __enter__(self) -> "HostSyncCounter":
        for module in self.modules:
            for t in list(module.parameters()) + list(module.buffers()):
                self.taint(t)
        if self.target is not None:
            def enter(*_):
                self._depth += 1

            def leave(*_):
                self._depth -= 1

            self._handles = [self.target.register_forward_pre_hook(enter), self.target.register_forward_hook(leave)]
        self._modes = [_Function(self), _Dispatch(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
