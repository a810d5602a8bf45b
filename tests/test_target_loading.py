"""One rule picks a target's dtype, and every command that loads a target goes through it."""
from __future__ import annotations

import argparse

import pytest
import torch

from draftheads.config import TargetConfig
from draftheads.device import resolve_dtype


def fake_cuda(monkeypatch, available: bool, bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


@pytest.mark.parametrize(
    "available, bf16, device, expected",
    [
        (False, False, None, torch.float32),
        (True, True, None, torch.bfloat16),
        (True, False, None, torch.float16),
        (True, True, "cpu", torch.float32),  # the device it runs on decides, not what the machine has
        (True, True, "cuda:0", torch.bfloat16),
        (True, False, torch.device("cuda"), torch.float16),
    ],
)
def test_auto_dtype_rule(monkeypatch, available, bf16, device, expected):
    fake_cuda(monkeypatch, available, bf16)
    assert resolve_dtype("auto", device) == expected


def test_explicit_dtypes_are_honoured_and_unknown_ones_named(monkeypatch):
    fake_cuda(monkeypatch, True, False)
    assert resolve_dtype("bfloat16", "cuda") == torch.bfloat16
    assert resolve_dtype("fp16", "cpu") == torch.float16
    with pytest.raises(ValueError, match=r"unknown dtype 'float64'; valid: auto, float32"):
        resolve_dtype("float64")


@pytest.fixture
def captured(monkeypatch):
    """Record what each command asks transformers for, without loading anything."""
    import transformers

    calls: list[dict] = []

    def model(path, **kwargs):
        calls.append({"path": path, **kwargs})
        return torch.nn.Linear(2, 2)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kwargs: object())
    return calls


def test_cli_and_training_load_the_same_dtype(monkeypatch, captured):
    """On a CUDA device without bf16 "auto" used to be fp16 for the CLI and fp32 for training."""
    fake_cuda(monkeypatch, True, False)
    from draftheads import cli
    from draftheads.train.loop import load_target

    cli._load_target("some/model", "cuda", "auto", False)
    target, _ = load_target(TargetConfig(name_or_path="some/model"), device=torch.device("cuda"))
    assert not any(p.requires_grad for p in target.parameters()) and not target.training
    assert [c["dtype"] for c in captured] == [torch.float16] * 2
    assert all(c["device_map"] == {"": torch.device("cuda")} for c in captured)


def test_training_on_a_sharded_gpu_run_chooses_for_the_gpu(monkeypatch, captured):
    """ZeRO-3 loads on the CPU (device None) but runs on the GPU: the dtype follows the GPU."""
    fake_cuda(monkeypatch, True, True)
    from draftheads.train.loop import load_target

    accelerator = argparse.Namespace(device=torch.device("cuda"), main_process_first=lambda: __import__("contextlib").nullcontext())
    load_target(TargetConfig(name_or_path="some/model"), accelerator, device=None)
    assert captured[0]["dtype"] == torch.bfloat16 and "device_map" not in captured[0]
