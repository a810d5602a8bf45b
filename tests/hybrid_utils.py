"""Tiny hybrid targets (linear attention, state-space and convolution layers beside attention) and a
drafter that knows what they will write, for the exactness tests of `inference.recurrent`.

The models are random, built from transformers' own configs in well under a second, with a larger
initializer range than the default: with the default, a random model's recurrent layers hardly move
its logits, and a wrong state would still give generate's tokens (a test that cannot fail).
"""
from __future__ import annotations

import random

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from draftheads.inference.proposers.drafter import Drafter
from draftheads.inference.tree import Tree, TreeShape

VOCAB = 256

#: model_type -> config values of a 64-wide model: one layer (or block) of each kind it mixes.
HYBRIDS: dict[str, dict] = {
    # Qwen3-Next: Gated DeltaNet + gated attention, a tiny mixture of experts
    "qwen3_next": dict(num_hidden_layers=2, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, num_experts=2, num_experts_per_tok=1,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       layer_types=["linear_attention", "full_attention"]),
    # Qwen3.5 (text): Gated DeltaNet + gated attention
    "qwen3_5_text": dict(num_hidden_layers=2, head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
                         linear_key_head_dim=16, linear_value_head_dim=16,
                         layer_types=["linear_attention", "full_attention"]),
    # LFM2: short gated convolutions + attention
    "lfm2": dict(num_hidden_layers=2, layer_types=["conv", "full_attention"]),
    # Falcon-H1: Mamba-2 and attention side by side in every layer
    "falcon_h1": dict(num_hidden_layers=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                      mamba_d_state=8, mamba_n_groups=1, mamba_d_conv=4),
    # Nemotron-H: Mamba-2, attention and MLP blocks
    "nemotron_h": dict(num_hidden_layers=4, head_dim=16, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8,
                       n_groups=1, conv_kernel=4, hybrid_override_pattern="M*M-"),
    # Jamba: Mamba + attention, a tiny mixture of experts
    "jamba": dict(num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=2, num_experts_per_tok=1, mamba_d_state=8, mamba_d_conv=4,
                  mamba_expand=2, mamba_dt_rank=8),
}


def tiny_hybrid(model_type: str, seed: int = 0, vocab: int = VOCAB, init: float = 0.1, **overrides) -> torch.nn.Module:
    """A tiny random ``model_type`` causal LM (fp32, eval), EOS unset in its generation config so
    that greedy references run to their full length."""
    torch.manual_seed(seed)
    values = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, tie_word_embeddings=False, initializer_range=init)
    values.update(HYBRIDS[model_type])
    values.update(overrides)
    target = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **values)).eval()
    target.generation_config.eos_token_id = None
    return target


def reference(target, ids: torch.Tensor, new: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' greedy `generate`, ``new`` tokens exactly."""
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                           pad_token_id=0)


class OracleDrafter(Drafter):
    """Drafts from each row's known greedy continuation, right and wrong: chains that go wrong at a
    random depth (or never), and trees whose right child sits among wrong siblings (some of which
    have children of their own), or that have no right child at some level. Every accepted length,
    and the tree scan's siblings, get exercised; the verifier alone decides what is kept."""

    feature_layers = ()

    def __init__(self, continuations: list[torch.Tensor], vocab: int, seed: int = 0,
                 kinds: tuple[str, ...] = ("chain", "tree", "plain")) -> None:
        self.continuations = [c.tolist() for c in continuations]
        self.vocab, self.seed, self.kinds = vocab, seed, kinds

    def start(self, prompts, hidden, params, generator) -> None:
        self.rng = random.Random(self.seed)
        self.rows = list(range(len(prompts)))
        self.known = [1] * len(prompts)  # new tokens decided so far (the first is the root)

    def _wrong(self, token: int, k: int = 0) -> int:
        return (token + 1 + k) % self.vocab

    def _chain(self, ref: list[int], depth: int) -> tuple[list[int], list[int]]:
        wrong_from = self.rng.randint(0, depth)
        parents = list(range(depth))
        return parents, [t if d < wrong_from else self._wrong(t) for d, t in enumerate(ref[:depth])]

    def _tree(self, ref: list[int], depth: int) -> tuple[list[int], list[int]]:
        parents, tokens, right = [], [], 0  # node 0 is the root
        for d in range(depth):
            width = self.rng.randint(1, 3)
            slot = self.rng.randint(0, width)  # == width: no right child at this level
            children = []
            for w in range(width):
                parents.append(right)
                tokens.append(ref[d] if w == slot else self._wrong(ref[d], w))
                children.append(len(parents))
            wrong = [c for w, c in enumerate(children) if w != slot]
            if wrong and self.rng.random() < 0.5:  # a wrong sibling's child: it must never leak to the right one
                parents.append(self.rng.choice(wrong))
                tokens.append(ref[d + 1] if d + 1 < len(ref) else ref[d])
            if slot == width:
                break
            right = children[slot]
        return parents, tokens

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        trees = []
        for pos, (root, limit) in enumerate(zip(roots, max_depths)):
            ref = self.continuations[self.rows[pos]][self.known[pos]:]
            depth = min(limit, 4, len(ref))
            kind = self.rng.choice(self.kinds) if depth > 0 else "plain"
            parents, tokens = (self._chain(ref, depth) if kind == "chain" else
                               self._tree(ref, depth) if kind == "tree" else ([], []))
            trees.append(Tree(TreeShape((-1, *parents)), torch.tensor([root, *tokens])))
        return trees

    def accepted(self, tokens: list[torch.Tensor], hidden) -> None:
        for pos, path in enumerate(tokens):
            self.known[pos] += len(path)

    def keep(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]
        self.known = [self.known[r] for r in rows]


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch (pad id 0) and its attention mask, as `generate` takes them."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return ids, mask
