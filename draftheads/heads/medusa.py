"""Medusa heads: K small residual MLPs on the target's last hidden state, one per future position.

Head k (0-based) reads the hidden state at position t (after the final norm, the tensor the
target's LM head consumes) and predicts token t+2+k; the target's own LM head predicts t+1.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import HeadsConfig, TargetInfo


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


class MedusaHeads(nn.Module):
    head_type = "medusa"
    #: Whether head_states also takes the tokens before each head's target (Hydra).
    reads_tokens = False
    #: Drafts a tree whose shape is fixed per heads folder (calibrated from rank accuracies), not
    #: grown per step from draft confidences (EAGLE).
    dynamic_tree = False
    #: "future_tokens": head k is trained on the token k+1 ahead (train/losses.py);
    #: "draft_steps": draft steps unrolled on their own outputs (train/eagle_loss.py).
    training_objective = "future_tokens"
    #: The `HeadsSpec` (config ``heads:``) fields that `for_target` takes besides num_heads/num_layers.
    spec_options: tuple[str, ...] = ("lm_head",)

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
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
        # The target's frozen LM head for lm_head="shared". Kept in a tuple so it is not registered
        # as a submodule: it must never be saved, trained or moved with the heads.
        self._target_lm_head: tuple[nn.Module, ...] = ()
        # How often each token was a training label: ranks the vocabulary so that drafting can
        # project onto the most frequent tokens only (a full-vocab projection per head costs as
        # much as the target's own LM head). int64, so dtype casts of the heads leave it alone.
        self.register_buffer("token_counts", torch.zeros(v, dtype=torch.long))
        # Calibrated tree shape (list of rank paths) read from / written to the heads folder.
        self.tree: list[list[int]] | None = None
        self.draft_vocab_size: int | None = None  # calibrated; None = draft over the whole vocabulary

    # -- construction -------------------------------------------------------------------------
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
        info = TargetInfo.from_model(target)
        if lm_head == "auto":
            lm_head = "shared" if info.vocab_size > 64_000 else "own"
        config = HeadsConfig(
            head_type=cls.head_type,
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=info.hidden_size,
            vocab_size=info.vocab_size,
            lm_head=lm_head,
            target=info,
        )
        heads = cls(config)
        target_head = target.get_output_embeddings()
        if heads.lm_heads is not None:
            with torch.no_grad():
                for proj in heads.lm_heads:
                    proj.weight.copy_(target_head.weight.float())
        heads.bind_target(target)
        ref = target_head.weight
        return heads.to(device=ref.device)

    def save_pretrained(self, path, tree: list[list[int]] | None = None):
        """Write ``config.json`` + ``model.safetensors`` (heads only), atomically."""
        from .io import save_heads

        return save_heads(self, path, tree=tree)

    def proposer(self, tree: list[list[int]] | None = None, draft_vocab_size: int | None = None):
        """The drafting strategy for these heads: top-k of every head filling a static tree."""
        from ..inference.proposers import MedusaProposer

        return MedusaProposer(self, tree=tree, draft_vocab_size=draft_vocab_size)

    def bind_target(self, target: nn.Module) -> "MedusaHeads":
        """Check that ``target`` is the model these heads were trained for and remember its LM head."""
        check_target(self.config, target)
        self._target_lm_head = (target.get_output_embeddings(),)
        return self

    # -- forward --------------------------------------------------------------------------------
    def head_states(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """The K heads' hidden states for ``hidden`` [..., H]: a list of K tensors [..., H]."""
        hidden = hidden.to(self._param_dtype())
        return [blocks(hidden) for blocks in self.blocks]

    def projection_module(self, k: int) -> nn.Module:
        """Head k's vocab projection: its own Linear, or the target's LM head it shares."""
        if self.lm_heads is not None:
            return self.lm_heads[k]
        if not self._target_lm_head:
            raise RuntimeError("these heads share the target's LM head: call heads.bind_target(target) first")
        return self._target_lm_head[0]

    def project(self, state: torch.Tensor, k: int) -> torch.Tensor:
        """Vocab logits of head ``k`` for its hidden state. Calls the module (not its raw weight)
        so that ZeRO-3 gathers partitioned weights through its hooks."""
        proj = self.projection_module(k)
        return proj(state.to(proj.weight.dtype))

    def draft_vocab(self, size: int | None) -> torch.Tensor | None:
        """The ``size`` most frequent training tokens (None: the whole vocabulary, also when the
        heads carry no counts)."""
        if size is None or size >= self.config.vocab_size or int(self.token_counts.sum()) == 0:
            return None
        return self.token_counts.topk(size).indices.sort().values

    def projection_weight(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weight (and bias) of head k's vocab projection, for drafting from a row subset."""
        proj = self.projection_module(k)
        return proj.weight, getattr(proj, "bias", None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of every head, stacked: [..., K, V]. Meant for a few positions at a time (the
        decode loop); training computes per-head logits in chunks instead (train/losses.py)."""
        return torch.stack([self.project(s, k) for k, s in enumerate(self.head_states(hidden))], dim=-2)

    def _param_dtype(self) -> torch.dtype:
        return self.blocks[0][0].linear.weight.dtype if self.config.num_layers else (
            self.lm_heads[0].weight.dtype if self.lm_heads is not None else torch.float32
        )


def check_target(config: HeadsConfig, target: nn.Module) -> None:
    """Raise a ValueError naming every difference between the heads' recorded target and ``target``."""
    actual = TargetInfo.from_model(target)
    problems = []
    if config.hidden_size != actual.hidden_size:
        problems.append(f"hidden_size: heads expect {config.hidden_size}, target has {actual.hidden_size}")
    if config.vocab_size != actual.vocab_size:
        problems.append(f"vocab_size: heads expect {config.vocab_size}, target has {actual.vocab_size}")
    if not problems and config.target is not None:
        problems = config.target.mismatches(actual)
    if problems:
        trained_for = config.target.name_or_path if config.target else "an unknown target"
        raise ValueError(
            f"these {config.head_type} heads were trained for {trained_for or 'another model'!s} and do not fit "
            f"the target {actual.name_or_path or type(target).__name__}:\n  - " + "\n  - ".join(problems)
        )
