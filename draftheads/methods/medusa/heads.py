"""Medusa heads: K small residual MLPs on the target's last hidden state, one per future position.

Head k (0-based) reads the hidden state at position t (after the final norm, the tensor the
target's LM head consumes) and predicts token t+2+k; the target's own LM head predicts t+1.
"""
from __future__ import annotations

import torch
from torch import nn

from ...heads.base import DraftHeads, check_target  # noqa: F401 (check_target re-exported)
from ...heads.config import HeadsConfig, TargetInfo


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)`` with W and b zero-initialised: SiLU(0) = 0, so a fresh block is exactly
    the identity and a fresh head with a copied LM head predicts exactly what the target's LM head
    predicts (training starts from "repeat the next-token guess"). The gradient at zero is
    SiLU'(0) x = x / 2, so the block still learns. (Medusa zero-inits W only, leaving b random.)"""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(DraftHeads):
    head_type = "medusa"
    spec_options: tuple[str, ...] = ("lm_head",)
    weights_per_head = True

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__(config)
        h, v = config.hidden_size, config.vocab_size
        # One module per block: `[ResBlock(h)] * n` would share a single block's weights.
        self.blocks = nn.ModuleList(
            [nn.Sequential(*[ResBlock(h) for _ in range(config.num_layers)]) for _ in range(config.num_heads)]
        )
        self.lm_heads = (
            nn.ModuleList([nn.Linear(h, v, bias=False) for _ in range(config.num_heads)])
            if config.lm_head == "own"
            else None
        )

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def card_rows(cls, config: dict) -> list[tuple[str, object]]:
        own = config.get("lm_head", "own")
        return [("heads (draft positions)", config["num_heads"]), ("layers per head", config["num_layers"]),
                ("LM head", f"{own} ({'a copy per head' if own == 'own' else 'the target' + chr(39) + 's, not stored'})")]

    @classmethod
    def for_target(
        cls,
        target: nn.Module,
        num_heads: int = 4,
        num_layers: int = 1,
        lm_head: str = "auto",
    ) -> "MedusaHeads":
        """Fresh heads sized for ``target``. ``lm_head="auto"`` shares the target's LM head for
        vocabularies above 64k (a copy per head would cost K x vocab x hidden parameters)."""
        if lm_head == "auto":
            lm_head = "shared" if TargetInfo.from_model(target).vocab_size > 64_000 else "own"
        return cls.from_config_for(cls.target_config(target, num_heads, num_layers, lm_head), target)

    def init_from_target(self, target: nn.Module) -> None:
        """Own LM heads start as copies of the target's."""
        if self.lm_heads is not None:
            with torch.no_grad():
                for proj in self.lm_heads:
                    proj.weight.copy_(target.get_output_embeddings().weight.float())

    # -- forward --------------------------------------------------------------------------------
    def head_states(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """The K heads' hidden states for ``hidden`` [..., H]: a list of K tensors [..., H]."""
        hidden = hidden.to(self._param_dtype())
        return [blocks(hidden) for blocks in self.blocks]

    def projection_module(self, k: int) -> nn.Module:
        """Head k's vocab projection: its own Linear, or the target's LM head it shares."""
        if self.lm_heads is not None:
            return self.lm_heads[k]
        return self.target_lm_head()

    def project(self, state: torch.Tensor, k: int) -> torch.Tensor:
        """Vocab logits of head ``k`` for its hidden state. Calls the module (not its raw weight)
        so that ZeRO-3 gathers partitioned weights through its hooks."""
        proj = self.projection_module(k)
        return proj(state.to(proj.weight.dtype))

    def projection_weight(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weight (and bias) of head k's vocab projection, for drafting from a row subset."""
        proj = self.projection_module(k)
        return proj.weight, getattr(proj, "bias", None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of every head, stacked: [..., K, V]. Meant for a few positions at a time (the
        decode loop); training computes per-head logits in chunks instead (methods/medusa/loss.py)."""
        return torch.stack([self.project(s, k) for k, s in enumerate(self.head_states(hidden))], dim=-2)

    def _param_dtype(self) -> torch.dtype:
        return self.blocks[0][0].linear.weight.dtype if self.config.num_layers else (
            self.lm_heads[0].weight.dtype if self.lm_heads is not None else torch.float32
        )

