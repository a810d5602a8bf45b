"""How vLLM counts speculative acceptance, replayed on draftheads' own per-step acceptance.

Pure Python (no torch, no vLLM): used by tests/test_vllm_engine.py and
benchmarks/bench_vllm_serving.py to put draftheads' chain decoding and vLLM's
``vllm:spec_decode_num_accepted_tokens_per_pos`` / ``num_drafts`` counters on the same footing.

vLLM 0.32.0 (vllm/v1/core/sched/scheduler.py): every decode step after the prefill verifies a full
chain of ``k`` drafts (it does not shorten drafts near ``max_tokens``; only ``max_model_len`` would
cut them); a step's accepted count is recorded before the request is stopped, so tokens accepted
past ``max_tokens`` are counted and then discarded; the request stops once it has ``max_tokens``
tokens. draftheads' decoder never drafts past ``max_new_tokens``, so decode ``max_tokens + k + 1``
tokens with it (its drafts are then never cut before the step where vLLM stops) and replay.
"""
from __future__ import annotations


def vllm_counts(accept_lengths: list[int], max_tokens: int, k: int) -> tuple[int, list[int]]:
    """(drafts, accepted per draft position) that vLLM records for one request, from draftheads'
    tokens committed per verify step (``SpeculativeOutput.accept_lengths``: accepted drafts + 1)."""
    drafts, per_pos, emitted = 0, [0] * k, 1  # the prefill emits the first token
    for length in accept_lengths:
        if emitted >= max_tokens:
            break
        drafts += 1
        for i in range(length - 1):
            per_pos[i] += 1
        emitted += length
    if emitted < max_tokens:
        raise ValueError(
            f"draftheads emitted {emitted} tokens, fewer than max_tokens={max_tokens}: decode max_tokens + k + 1 "
            "tokens so that every step vLLM counts is there"
        )
    return drafts, per_pos


def decode_budget(max_tokens: int, k: int) -> int:
    """``max_new_tokens`` for draftheads' decoder so that `vllm_counts` sees every step vLLM counts."""
    return max_tokens + k + 1
