"""Hydra heads: Medusa heads that also see the tokens drafted before them.

Head k (0-based) predicts token t+2+k from the target's hidden state h_t AND the embeddings of
tokens t+1 .. t+1+k (the target's own next token, then the drafts of heads 0..k-1). A Medusa
head must guess t+2 without knowing which t+1 the target picked; a Hydra head is told, so its
guesses stay coherent along a tree path. The price: drafting goes depth by depth (head k needs
its parent's token), which costs one small MLP call per depth instead of one for all heads.

Head k's input [h, e_1, .., e_{k+1}] ((k+2)·d wide) goes through a linear map to d, initialised
as [I | 0 .. 0] so a fresh head starts as exactly the identity on h (like a fresh Medusa head),
then the usual residual blocks and the vocab projection. The embedding is the target's (frozen,
never stored).
"""
from __future__ import annotations

import torch
from torch import nn

from ...heads.base import token_context  # noqa: F401 (re-exported)
from ..medusa.heads import MedusaHeads


class HydraHeads(MedusaHeads):
    head_type = "hydra"
    reads_tokens = True

    def __init__(self, config) -> None:
        super().__init__(config)
        d = config.hidden_size
        self.in_projs = nn.ModuleList([nn.Linear((k + 2) * d, d) for k in range(config.num_heads)])
        with torch.no_grad():
            for proj in self.in_projs:
                proj.weight.zero_()
                proj.weight[:, :d] = torch.eye(d)
                proj.bias.zero_()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.target_embedding()(tokens).to(self._param_dtype())

    def head_state(self, hidden: torch.Tensor, context: torch.Tensor, k: int) -> torch.Tensor:
        """Head k's hidden state from ``hidden`` [..., H] and ``context`` [..., >= k+1] token ids
        (t+1 .. t+1+k; extra columns are ignored)."""
        hidden = hidden.to(self._param_dtype())
        emb = self.embed(context[..., : k + 1])  # [..., k+1, H]
        x = torch.cat([hidden, emb.flatten(-2)], dim=-1)
        return self.blocks[k](self.in_projs[k](x))

    def head_states(self, hidden: torch.Tensor, context: torch.Tensor | None = None) -> list[torch.Tensor]:
        """All K heads' states; ``context`` [..., K] holds tokens t+1 .. t+K (teacher forcing)."""
        if context is None:
            raise ValueError("hydra heads need the tokens drafted before each head (context)")
        return [self.head_state(hidden, context, k) for k in range(self.config.num_heads)]

    def forward(self, hidden: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.project(s, k) for k, s in enumerate(self.head_states(hidden, context))], dim=-2)

    def _param_dtype(self) -> torch.dtype:
        return self.in_projs[0].weight.dtype
