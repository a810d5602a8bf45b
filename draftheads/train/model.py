"""The one module that goes through ``accelerator.prepare``: a frozen target plus trainable heads.

Wrapping both in one ``nn.Module`` lets DDP, DeepSpeed ZeRO-2/3 (and FSDP) treat the pair as any
other model: the target's weights are sharded or replicated by the launcher's config like the
heads', while only the heads' parameters require gradients and reach the optimizer.
"""
from __future__ import annotations

import torch
from torch import nn

from ..registry import method_of
from .head_loss import HeadLoss, LossBatch, LossSettings
from .packing import target_inputs


class TargetWithHeads(nn.Module):
    def __init__(
        self,
        target: nn.Module,
        heads: nn.Module,
        *,
        loss_decay: float = 0.8,
        loss_chunk_size: int = 1024,
        topk: int = 5,
        labels: str = "data",
        checkpoint_loss_chunks: bool = True,
        loss: HeadLoss | None = None,
    ) -> None:
        """``checkpoint_loss_chunks``: every loss scores its rows in chunks of ``loss_chunk_size``
        and, when on, recomputes each chunk's vocab-sized logits in backward instead of keeping
        them (memory ~ rows x vocab x 12 bytes per unrolled step otherwise); off, backward reuses
        them: the same gradients bit for bit, fewer operations (config ``train.loss_checkpointing``).
        ``loss``: the heads' loss component; default: the one their method declares
        (draftheads/registry.py), built from these settings."""
        super().__init__()
        self.checkpoint_loss_chunks = checkpoint_loss_chunks
        if labels not in ("data", "target"):
            raise ValueError(f"labels must be 'data' or 'target', got {labels!r}")
        self.labels = labels
        self.target = target
        self.heads = heads
        self.loss_decay = loss_decay
        self.loss_chunk_size = loss_chunk_size
        self.topk = topk
        # DeepSpeed sizes its "auto" buckets from `model.config.hidden_size`.
        self.config = target.config
        self.noise_generator: torch.Generator | None = None  # see reseed_noise
        self.loss = loss if loss is not None else method_of(heads).loss(LossSettings(
            decay=loss_decay, chunk_size=loss_chunk_size, topk=topk, checkpoint_chunks=checkpoint_loss_chunks,
            labels=labels))
        target.requires_grad_(False)
        target.eval()
        self.check_frozen()

    # -- the invariants training relies on -------------------------------------------------------
    def check_frozen(self) -> None:
        """Raise unless every target parameter is frozen, the target is in eval mode, and every
        head parameter is trainable. A trainable target parameter would be silently updated (the
        reference Medusa trainer left the LM head trainable this way) or waste optimizer memory."""
        thawed = [name for name, p in self.target.named_parameters() if p.requires_grad]
        if thawed:
            raise RuntimeError(
                f"{len(thawed)} target parameter(s) require grad (e.g. {', '.join(thawed[:3])}); "
                "the target must stay frozen"
            )
        if self.target.training:
            raise RuntimeError("the target must be in eval mode (dropout off) while training heads")
        frozen_heads = [name for name, p in self.heads.named_parameters() if not p.requires_grad]
        if frozen_heads:
            raise RuntimeError(f"head parameter(s) do not require grad: {', '.join(frozen_heads[:3])}")

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters to optimise: the heads', and only the heads'."""
        params = [p for p in self.parameters() if p.requires_grad]
        head_ids = {id(p) for p in self.heads.parameters()}
        stray = [p for p in params if id(p) not in head_ids]
        if stray:
            raise RuntimeError(f"{len(stray)} trainable parameter(s) outside the heads")
        return params

    def train(self, mode: bool = True) -> "TargetWithHeads":
        """``model.train()`` switches the heads only; the target stays in eval mode."""
        super().train(mode)
        self.target.eval()
        return self

    def loss_counts(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[K]``: the positions each head (EAGLE: each step) is trained on in this batch, from
        the masks alone. Summed over a step's micro-batches and processes, they are the
        ``loss_denominators`` that make the loss a mean over the step's tokens, wherever they fell.
        ``position_ids``: a packed window's (pairs across documents do not count)."""
        batch = LossBatch(input_ids, attention_mask=attention_mask, loss_mask=loss_mask, position_ids=position_ids)
        return self.loss.counts(self.heads, batch)

    def reseed_noise(self, seed: int, device: torch.device) -> None:
        """Draw training noise (EAGLE's feature noise) from a generator seeded by the caller, not
        from the global RNG: the loop seeds it from the batch's position in the run, so a run
        resumed mid-epoch draws exactly the noise a straight run would have (the global RNG is
        also consumed by DataLoader iterators, which a resume creates at other moments)."""
        if self.noise_generator is None or self.noise_generator.device != device:
            self.noise_generator = torch.Generator(device=device)
        self.noise_generator.manual_seed(seed)

    # -- forward -------------------------------------------------------------------------------
    @torch.no_grad()
    def target_features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        layers: list[int],
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(last hidden state after the final norm, the hidden states entering ``layers``
        concatenated): EAGLE-3 reads several layers, and learns the target's final distribution.
        ``position_ids``: a packed window's (see ``packing.target_inputs``)."""
        base = getattr(self.target, getattr(self.target, "base_model_prefix", ""), None)
        model = base if isinstance(base, nn.Module) and base is not self.target else self.target
        out = model(input_ids=input_ids, **target_inputs(attention_mask, position_ids), use_cache=False, output_hidden_states=True)
        last = out.last_hidden_state if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None else out.hidden_states[-1]
        return last, torch.cat([out.hidden_states[i] for i in layers], dim=-1)

    @torch.no_grad()
    def target_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The target's last hidden state after the final norm: exactly what its LM head reads.

        Calls the decoder (``model.model`` for Llama/Qwen2) and takes ``last_hidden_state``, the
        tensor ``CausalLM.forward`` feeds its LM head. That equals ``output_hidden_states=True``'s
        ``hidden_states[-1]`` (checked in tests) without keeping every layer's states alive or
        computing the ``[batch, seq, vocab]`` target logits the heads never use. ``position_ids``:
        a packed window's (see ``packing.target_inputs``).
        """
        inputs = target_inputs(attention_mask, position_ids)
        base = getattr(self.target, getattr(self.target, "base_model_prefix", ""), None)
        if isinstance(base, nn.Module) and base is not self.target:
            out = base(input_ids=input_ids, **inputs, use_cache=False)
            return out.last_hidden_state
        out = self.target(input_ids=input_ids, **inputs, use_cache=False, output_hidden_states=True)
        return out.hidden_states[-1]

    @torch.no_grad()
    def target_labels(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Token ids whose position t+1 holds the target's greedy prediction after position t.

        Used in place of ``input_ids`` as labels for self-distillation: head k at position t then
        learns the token the target itself would produce at t+2+k after the true prefix up to
        t+1+k, which is what greedy verification accepts. Computed in chunks: the argmax over
        the vocabulary never needs the whole [batch, seq, vocab] logits at once."""
        lm_head = self.target.get_output_embeddings()
        flat = hidden.reshape(-1, hidden.shape[-1])
        preds = torch.cat([
            lm_head(flat[i : i + self.loss_chunk_size]).argmax(-1) for i in range(0, flat.shape[0], self.loss_chunk_size)
        ]).view(input_ids.shape)
        return torch.cat([input_ids[:, :1], preds[:, :-1]], dim=1)

    @torch.no_grad()
    def target_outputs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything the losses read from the target: (last hidden state, the heads' input
        features (= the hidden state unless EAGLE-3 fuses layers), the target's greedy labels).
        The offline feature cache stores exactly these (``features.py``)."""
        layers = self.heads.feature_layers
        if layers:
            hidden, features = self.target_features(input_ids, attention_mask, layers, position_ids)
        else:
            hidden = features = self.target_hidden(input_ids, attention_mask, position_ids)
        return hidden, features, self.target_labels(input_ids, hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        rank_stats: int = 0,
        loss_denominators: torch.Tensor | None = None,
        hidden: torch.Tensor | None = None,
        features: torch.Tensor | None = None,
        target_labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """``rank_stats`` > 0 (evaluation): Medusa/Hydra stats also count hits per rank r <
        ``rank_stats``, for the simulated acceptance of a tree; EAGLE's steps ignore it.
        ``loss_denominators``: see ``loss_counts``. ``hidden``/``features``/``target_labels``: the
        target's outputs from the feature cache (``data.features``); then the target is not run.
        ``position_ids``: a packed window's per-document positions (``data.packing``): the target
        and every loss keep its documents apart (``packing.py``)."""
        layers = self.heads.feature_layers
        if hidden is None:
            if layers:
                hidden, features = self.target_features(input_ids, attention_mask, layers, position_ids)
            else:
                hidden = features = self.target_hidden(input_ids, attention_mask, position_ids)
        else:
            dtype = self.target.get_output_embeddings().weight.dtype
            hidden = hidden.to(dtype)
            features = features.to(dtype) if layers else hidden
        batch = LossBatch(
            input_ids, attention_mask=attention_mask, loss_mask=loss_mask, position_ids=position_ids, hidden=hidden,
            features=features, denominators=loss_denominators, ranks=rank_stats, generator=self.noise_generator,
            greedy_labels=lambda: target_labels if target_labels is not None else self.target_labels(input_ids, hidden),
        )
        out = self.loss(self.heads, batch)
        labels = out.labels if out.labels is not None else input_ids
        tokens = attention_mask.sum() if attention_mask is not None else torch.tensor(input_ids.numel())
        mask = loss_mask if loss_mask is not None else torch.ones_like(labels)
        if attention_mask is not None:
            mask = mask * attention_mask
        # How often each token was a label on this process; the loop sums these across processes
        # into heads.token_counts (ranks the draft vocabulary at inference).
        label_counts = torch.bincount(labels[mask.bool()], minlength=self.heads.config.vocab_size)
        return {"loss": out.loss, "stats": out.stats(), "tokens": tokens.detach(), "label_counts": label_counts}
