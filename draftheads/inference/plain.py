"""Plain decoding behind the `SpeculativeDecoder` interface, for batch sizes where speculation
does not pay (see `plans.batch_sizes`).

It is the target's own `generate` with the decoder's settings, so a plain-decoded batch is by
construction what `generate` gives (greedy: token for token; sampling: the same distribution,
drawn from the caller's generator). Only the settings speculative decoding applies reach it
(temperature, top-k, top-p, EOS, padding): generation-config settings that speculative decoding
ignores (repetition penalty and the like, see `sampling._UNAPPLIED`) are ignored here too, so a
plan switching mode never changes what the output means.
"""
from __future__ import annotations

import contextlib
import copy
import time
from typing import Any, Iterator

import torch

from .output import SpeculativeOutput
from .sampling import _UNAPPLIED, SamplingParams


@contextlib.contextmanager
def _without_unapplied_settings(target: torch.nn.Module) -> Iterator[None]:
    """The target's generation config with the settings speculative decoding ignores unset, for
    the duration of one `generate` call (`generate` fills unset values from it)."""
    config = getattr(target, "generation_config", None)
    if config is None or all(getattr(config, name, None) in (None, []) for name in _UNAPPLIED):
        yield
        return
    clean = copy.deepcopy(config)
    for name in _UNAPPLIED:
        if hasattr(clean, name):
            setattr(clean, name, None)
    target.generation_config = clean
    try:
        yield
    finally:
        target.generation_config = config


@contextlib.contextmanager
def _seeded_from(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """`generate` samples from the global RNG: seed it from ``generator`` (one draw, so equal
    generators give equal outputs) inside a fork, leaving the caller's global RNG untouched."""
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def rows_new_tokens(tail: torch.Tensor, eos: set[int]) -> list[int]:
    """Tokens each row generated: up to and including its first EOS (`generate` pads after it)."""
    counts = []
    for row in tail.tolist():
        n = len(row)
        for i, tok in enumerate(row):
            if tok in eos:
                n = i + 1
                break
        counts.append(n)
    return counts


def generate_plain(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    params: SamplingParams,
    eos: list[int],
    pad_token_id: int | None,
    generator: torch.Generator | None = None,
    streamer: Any = None,
) -> SpeculativeOutput:
    """Decode a left-padded batch (validated by `inputs.check_batch`) with ``target.generate``.

    The output's ``accept_lengths`` are 1 per row and step (one token per target forward) and its
    stats say ``"mode": "plain"``; the whole call is ``decode_seconds`` (`generate` does not
    report its prefill separately)."""
    device = target.device
    sampling: dict[str, Any] = {"do_sample": False}
    if not params.greedy:
        sampling = {"do_sample": True, "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p}
    t0 = time.perf_counter()
    with _without_unapplied_settings(target), _seeded_from(generator, device):
        sequences = target.generate(
            input_ids.to(device), attention_mask=attention_mask.to(device), max_new_tokens=max_new_tokens,
            eos_token_id=list(eos), pad_token_id=pad_token_id, streamer=streamer, **sampling,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    sequences = sequences.cpu()
    counts = rows_new_tokens(sequences[:, input_ids.shape[1]:], set(eos))
    return SpeculativeOutput(
        sequences=sequences,
        accept_lengths=[1] * sum(max(n - 1, 0) for n in counts),  # the first token of a row comes from the prefill
        prefill_seconds=0.0,
        decode_seconds=seconds,
        target_seconds=seconds,
        stats={"mode": "plain", "new_tokens": sum(counts), "steps": max(counts) - 1 if counts else 0,
               "batch_size": int(input_ids.shape[0]), "row_new_tokens": counts},
    )
