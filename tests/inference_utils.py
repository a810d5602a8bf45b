"""Tiny targets of several architectures and heads that actually draft well for them.

Heads are self-distilled in a few seconds on the target's own greedy continuations (what a
Medusa user does with real models), so exactness tests run with drafts that are accepted often
enough to matter instead of passing by rejecting everything.
"""
from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import draftheads as dh

VOCAB = 64

ARCHS: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    # A small sliding window so that windowed tree masks are exercised, not just allowed.
    "mistral": {"sliding_window": 24},
    "gemma": {"head_dim": 16},
    # Gemma 3 mixes sliding and full-attention layers: one mask per layer type.
    "gemma3_text": {"head_dim": 16, "sliding_window": 24, "layer_types": ["sliding_attention", "full_attention"]},
    # Llama 4 text: chunked attention (a token sees only its own chunk of 16 positions) in the
    # RoPE layers, full attention in the NoPE layer; a tiny mixture of experts.
    "llama4_text": {
        "head_dim": 16,
        "attention_chunk_size": 16,
        "no_rope_layers": [1, 0],
        "intermediate_size_mlp": 128,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
    },
}


def tiny_target(
    arch: str, seed: int = 0, vocab: int = VOCAB, hidden: int = 64, layers: int = 2, **overrides
) -> torch.nn.Module:
    """A tiny random causal LM of ``arch`` (``overrides`` replace config values)."""
    torch.manual_seed(seed)
    config = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config.update(ARCHS.get(arch, {}))
    config.update(overrides)
    cfg = AutoConfig.for_model(arch, **config)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


def greedy_reference(target: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int, eos=None) -> torch.Tensor:
    """transformers' own greedy decoding (explicit attention mask: the prompt may contain the pad id)."""
    return target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
    )


def self_distilled_heads(target: torch.nn.Module, num_heads: int = 3, steps: int = 120, seed: int = 0):
    """Medusa heads trained on the target's greedy continuations of random prompts.

    Returns (heads, prompts): on those prompts the heads have seen the continuation, so drafts
    are accepted often (the tests assert it); fresh prompts exercise rejection paths."""
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (32, 6), generator=gen)
    with torch.no_grad():
        seqs = greedy_reference(target, prompts, 40)
        hidden = target(seqs, output_hidden_states=True).hidden_states[-1]
    torch.manual_seed(seed)
    heads = dh.MedusaHeads.for_target(target, num_heads=num_heads, num_layers=1)
    opt = torch.optim.Adam(heads.parameters(), lr=2e-2)
    start = prompts.shape[1] - 1  # learn on generated text only
    for _ in range(steps):
        loss = 0.0
        for k, state in enumerate(heads.head_states(hidden)):
            shift = 2 + k
            logits = heads.project(state[:, start:-shift], k)
            loss = loss + torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), seqs[:, start + shift :].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval(), prompts


def select_features(hidden_states: tuple[torch.Tensor, ...], layers: list[int] | None) -> torch.Tensor:
    """What a proposer reads from the target, from all of ``output_hidden_states``: the last hidden
    state after the final norm (``None``), or the hidden states entering the given layers,
    concatenated (EAGLE-3's fused features; ``hidden_states[i]`` is the input of decoder layer i).
    The reference `inference.features.FeatureTap` is checked against."""
    if layers is None:
        return hidden_states[-1]
    return torch.cat([hidden_states[i] for i in layers], dim=-1)
