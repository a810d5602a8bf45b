"""EAGLE draft heads: one decoder layer that drafts autoregressively in the target's feature space.

EAGLE (1/2), ``head_type: eagle``: the input at position t is the target's feature f_t (its last
hidden state after the final norm, what its LM head reads) fused with the embedding of token t+1
by a linear 2d -> d. One decoder layer turns that into a prediction of f_{t+1}, which the
target's frozen LM head turns into logits for token t+2. Deeper drafts feed the predicted feature
back in with the drafted token. The embedding and LM head are the target's, never stored.

EAGLE-3 (methods/eagle3/heads.py) builds on this head.

The draft decoder layer itself is in heads/draft_layer.py.
"""
from __future__ import annotations

import torch
from torch import nn

from ...heads.base import DraftHeads
from ...heads.config import HeadsConfig, text_config
from ...heads.draft_layer import DraftLayer, check_sliding_window, rope_settings
from ...heads.unrolled_attention import UnrolledStepMask


def _layer_geometry(target: nn.Module) -> dict:
    cfg = text_config(target)
    heads = int(cfg.num_attention_heads)
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "intermediate_size": int(cfg.intermediate_size),
        "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", 1e-6)),
        **rope_settings(cfg),  # rope_theta, and the target's rope scaling when it has one
    }


class EagleHead(DraftHeads):
    """EAGLE-1/2 draft layer (``head_type`` "eagle"); `Eagle3Head` adds fusion and its own vocabulary.

    ``config.num_heads`` is the number of draft steps unrolled in training (1 = EAGLE-1's
    teacher-forced recipe); ``config.num_layers`` the number of decoder layers (1 in EAGLE)."""

    head_type = "eagle"
    training_objective = "draft_steps"
    spec_options: tuple[str, ...] = ("noise", "fc_bias", "loss")
    #: config.json "extra" keys the draft layer is built from (checked at load).
    required_extra: tuple[str, ...] = (
        "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta"
    )
    #: EAGLE-3: the input fuses several target layers (no single feature to regress onto).
    fuses_layers = False

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__(config)
        ex = config.extra
        d = config.hidden_size
        self.feature_layers: list[int] | None = ex.get("feature_layers")
        fused = self.fuses_layers
        feat = d * len(self.feature_layers) if fused else d
        # EAGLE's fc bias: vLLM's EAGLE-1 has none (and drops one without a word), SGLang's has one.
        # New heads default to none (``fc_bias: false``); heads saved before the option existed had one.
        self.fc = nn.Linear(feat if fused else feat + d, d, bias=not fused and bool(ex.get("fc_bias", True)))
        attn_in = 2 * d if fused else d
        self.layers = nn.ModuleList([
            DraftLayer(
                d,
                attn_in if i == 0 else d,
                ex["num_attention_heads"],
                ex["num_key_value_heads"],
                ex["head_dim"],
                ex["intermediate_size"],
                ex["rms_norm_eps"],
                ex["rope_theta"],
                input_norm=i > 0,  # EAGLE's first layer reads the fused input without a norm
                rope_scaling=ex.get("rope_scaling"),
                max_position_embeddings=ex.get("max_position_embeddings"),
                sliding_window=ex.get("sliding_window"),
            )
            for i in range(config.num_layers)
        ])
        self._init_fc_as_identity()

    def _init_fc_as_identity(self) -> None:
        """fc passes the target feature through unchanged at init ([0 | I] for [emb, f])."""
        d = self.config.hidden_size
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, d : 2 * d] = torch.eye(d)
            if self.fc.bias is not None:
                self.fc.bias.zero_()

    def set_sliding_window(self, window: int | None) -> None:
        """Let every draft layer attend to the last ``window`` positions only (None: all of them);
        recorded in ``config.extra`` so that saved heads keep it. Drafting stays exact whatever
        the window (the target verifies every token); it changes what the drafter sees, e.g. for
        heads trained on windows shorter than the contexts they now draft in."""
        window = check_sliding_window(window)
        for layer in self.layers:
            layer.sliding_window = window
        if window is None:
            self.config.extra.pop("sliding_window", None)
        else:
            self.config.extra["sliding_window"] = window

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def for_target(
        cls,
        target: nn.Module,
        num_heads: int = 1,
        num_layers: int = 1,
        lm_head: str = "auto",
        **extra,
    ) -> "EagleHead":
        """Fresh heads sized for ``target``. The LM head is fixed by the type (EAGLE scores with the
        target's, EAGLE-3 with its own): ``lm_head`` is "auto" (the uniform signature of every
        head type) or that fixed value, anything else is refused rather than ignored."""
        fixed = "own" if cls.fuses_layers else "shared"
        if lm_head not in ("auto", fixed):
            raise ValueError(f"{cls.head_type} heads always use lm_head {fixed!r}; got lm_head={lm_head!r} (pass 'auto')")
        defaults = {} if cls.fuses_layers else {"fc_bias": False}
        extra = {**_layer_geometry(target), **defaults, **extra}
        lm_head = fixed
        return cls.from_config_for(cls.target_config(target, num_heads, num_layers, lm_head, extra), target)

    # -- pieces used by training and drafting ----------------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.target_embedding()(tokens).to(self.fc.weight.dtype)

    def first_input(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, attention input) from target features and the tokens one step ahead."""
        g = self.fc(torch.cat([self.embed(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        return g, g

    def next_input(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same for a deeper draft step: EAGLE feeds its predicted feature back as a feature."""
        return self.first_input(state, tokens)

    def run_layers(
        self,
        g: torch.Tensor,
        attn_in: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | UnrolledStepMask,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        cache_length: int = 0,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """All decoder layers; ``past`` (training) or preallocated ``cache`` buffers per layer
        holding ``cache_length`` rows (drafting), see `DraftLayer.forward`."""
        new_kv = []
        x = g
        for i, layer in enumerate(self.layers):
            x, kv = layer(
                x,
                attn_in if i == 0 else x,
                positions,
                mask,
                past=None if past is None else past[i],
                cache=None if cache is None else (*cache[i], cache_length),
            )
            new_kv.append(kv)
        return x, new_kv

    def new_cache(self, capacity: int, device, dtype, rows: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Empty per-layer key/value buffers for drafting ``rows`` sequences."""
        ex = self.config.extra
        shape = (rows, ex["num_key_value_heads"], capacity, ex["head_dim"])
        return [(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype)) for _ in self.layers]

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (EAGLE: the target's own LM head on the predicted feature)."""
        head = self.target_lm_head()
        return head(state.to(head.weight.dtype))

    def vocab_ids(self) -> torch.Tensor | None:
        """Target id of each draft-vocabulary index (None: the draft vocabulary is the target's)."""
        return None
