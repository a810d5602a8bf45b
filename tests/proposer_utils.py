"""Shared by the proposer tests: tiny peaked LMs, prompts, and the greedy-exactness check.

Models use a larger initializer range than the default so that their distributions are peaked
(greedy text loops, p and q differ a lot), which is what gives acceptance and the distribution
tests something to bite on.
"""
from __future__ import annotations

import torch

import draftheads as dh

from inference_utils import greedy_reference, tiny_target

VOCAB = 64


def tiny_lm(arch: str = "llama", seed: int = 0, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, **extra):
    return tiny_target(arch, seed=seed, vocab=vocab, hidden=hidden, layers=layers, **extra)


reference = greedy_reference


def prompts(vocab: int = VOCAB) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    random = torch.randint(4, vocab, (1, 9), generator=g)
    phrase = torch.randint(4, vocab, (5,), generator=g)
    repetitive = torch.cat([phrase, phrase, phrase[:3]])[None]  # the prompt repeats itself
    short = torch.tensor([[1]])
    return [random, repetitive, short]


ARCHS = ["llama", "qwen2"]


LENGTHS = [1, 2, 7, 40]


def check_greedy_exact(target, make_proposer, lengths=LENGTHS) -> list[int]:
    """Our greedy output equals `generate`'s for every prompt and length; returns the accept
    lengths of the longest runs (short runs are dominated by the max_new_tokens cut)."""
    accept: list[int] = []
    decoder = dh.SpeculativeDecoder(target, make_proposer())
    for ids in prompts():
        # Greedy decoding without EOS is deterministic: shorter runs are prefixes of the longest.
        ref = reference(target, ids, max(lengths))
        for n in lengths:
            out = decoder.generate(ids, max_new_tokens=n, eos_token_id=[])
            assert out.sequences.tolist() == ref[:, : ids.shape[1] + n].tolist(), (ids.tolist(), n)
            if n == max(lengths):
                accept += out.accept_lengths
    return accept
