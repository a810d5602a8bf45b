"""EAGLE draft heads: one decoder layer that drafts autoregressively in the target's feature space.

EAGLE (1/2), ``head_type: eagle``: the input at position t is the target's feature f_t (its last
hidden state after the final norm, what its LM head reads) fused with the embedding of token t+1
by a linear 2d -> d. One decoder layer turns that into a prediction of f_{t+1}, which the
target's frozen LM head turns into logits for token t+2. Deeper drafts feed the predicted feature
back in with the drafted token. The embedding and LM head are the target's, never stored.

EAGLE-3, ``head_type: eagle3``: the input fuses the hidden states entering three target layers
(default 2, L/2, L-3) through a linear 3d -> d; the attention reads [norm(embedding), norm(fused)]
(2d) while the residual stream carries the fused state; the output goes through the head's own
norm and its own LM head over a reduced draft vocabulary (the N most frequent training tokens,
mapped back to target ids by tensors stored with the weights). Deeper drafts feed the layer's own
output back, and training unrolls those steps (training-time test, eagle_loss in train/losses.py).

The decoder layer is written here (attention with RoPE + SwiGLU MLP, ~60 lines) instead of
borrowing a transformers layer: drafting needs a KV cache that tree nodes append to and discard
with an arbitrary ancestor mask, which plain tensors do directly for every target family.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import DraftHeads
from .config import HeadsConfig, TargetInfo, text_config


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [..., n, head_dim] for integer ``positions`` [..., n] (rotate-half layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftLayer(nn.Module):
    """Pre-norm decoder layer whose attention reads ``attn_in`` (d or 2d wide) and adds to ``x``.

    The output projections (o_proj, down_proj) start at zero, so a fresh layer is the identity on
    its residual stream: a fresh EAGLE head predicts f_{t+1} = f_t (the target's own next-token
    guess, repeated), the same starting point as a fresh Medusa head, and learns from there."""

    def __init__(
        self,
        hidden: int,
        attn_in: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        intermediate: int,
        eps: float,
        theta: float,
        input_norm: bool,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.theta = num_heads, num_kv_heads, head_dim, theta
        self.input_layernorm = RMSNorm(attn_in, eps) if input_norm else None
        self.q_proj = nn.Linear(attn_in, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(attn_in, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(attn_in, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.gate_proj, self.up_proj):
            nn.init.normal_(lin.weight, std=0.02)
        nn.init.zeros_(self.o_proj.weight)
        nn.init.zeros_(self.down_proj.weight)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos/sin by position
        self._fused_cache: dict[str, tuple[tuple, torch.Tensor]] = {}

    # Drafting runs this layer once per tree depth on a handful of tokens, where the number of
    # kernel calls, not FLOPs, sets the cost: without autograd, q/k/v and gate/up are one matmul
    # each and RoPE is a table lookup.
    def _fused(self, name: str, *linears: nn.Linear) -> torch.Tensor:
        key = tuple((id(lin.weight), lin.weight._version, lin.weight.device, lin.weight.dtype) for lin in linears)
        hit = self._fused_cache.get(name)
        if hit is None or hit[0] != key:
            hit = (key, torch.cat([lin.weight.detach() for lin in linears]))
            self._fused_cache[name] = hit
        return hit[1]

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.is_grad_enabled():
            return rotary(positions, self.head_dim, self.theta, dtype)
        needed = int(positions.max()) + 1
        if self._rope is None or self._rope[0].shape[0] < needed or self._rope[0].dtype != dtype or self._rope[0].device != positions.device:
            size = max(needed, 2 * (0 if self._rope is None else self._rope[0].shape[0]), 512)
            self._rope = rotary(torch.arange(size, device=positions.device), self.head_dim, self.theta, dtype)
        return self._rope[0][positions], self._rope[1][positions]

    def forward(
        self,
        x: torch.Tensor,
        attn_in: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` [B, n, d], ``attn_in`` [B, n, a], ``positions`` [B or 1, n], ``mask`` bool
        [B or 1, n, T + n] (True = attend; T = rows in ``past``). Returns the output [B, n, d] and
        the keys/values [B, kv, n, hd] of the n new rows (the caller keeps or drops them).

        ``cache`` = (K, V, T): preallocated buffers [B, kv, capacity, hd] whose first T rows are
        the past; the new rows are written at T..T+n in place (drafting: no copies per step)."""
        bsz, n, _ = attn_in.shape
        if self.input_layernorm is not None:
            attn_in = self.input_layernorm(attn_in)
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)
        # Not under autograd, nor under ZeRO-3 (its hooks gather a weight only when its module runs).
        fast = not torch.is_grad_enabled() and not hasattr(self.q_proj.weight, "ds_id")
        if not fast:
            q, k, v = self.q_proj(attn_in), self.k_proj(attn_in), self.v_proj(attn_in)
        else:
            q, k, v = F.linear(attn_in, self._fused("qkv", self.q_proj, self.k_proj, self.v_proj)).split(sizes, -1)
        q = q.view(bsz, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self._rotary(positions, q.dtype)
        q, k = apply_rotary(q, cos[:, None], sin[:, None]), apply_rotary(k, cos[:, None], sin[:, None])
        if cache is not None:
            keys_buf, values_buf, length = cache
            keys_buf[:, :, length : length + n] = k
            values_buf[:, :, length : length + n] = v
            keys, values = keys_buf[:, :, : length + n], values_buf[:, :, : length + n]
        elif past is not None:
            keys, values = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        else:
            keys, values = k, v
        attn = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask[:, None], enable_gqa=self.num_heads != self.num_kv_heads
        )
        h = x + self.o_proj(attn.transpose(1, 2).reshape(bsz, n, -1))
        mlp_in = self.post_attention_layernorm(h)
        if not fast:
            gate, up = self.gate_proj(mlp_in), self.up_proj(mlp_in)
        else:
            gate, up = F.linear(mlp_in, self._fused("gate_up", self.gate_proj, self.up_proj)).chunk(2, -1)
        out = h + self.down_proj(F.silu(gate) * up)
        return out, (k, v)


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's choice: the inputs of layers 2, L/2 and L-3 (low, middle and high features).
    Shallow targets, where those collide, get three distinct evenly spaced ids instead."""
    layers = [2, num_layers // 2, num_layers - 3]
    if len(set(layers)) == 3 and min(layers) >= 0:
        return layers
    return sorted({min(num_layers, max(0, round(i * num_layers / 4))) for i in (1, 2, 3)})


def _layer_geometry(target: nn.Module) -> dict:
    cfg = text_config(target)
    heads = int(cfg.num_attention_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = getattr(cfg, "rope_theta", None) or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "intermediate_size": int(cfg.intermediate_size),
        "rope_theta": float(theta),
        "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", 1e-6)),
    }


class EagleHead(DraftHeads):
    """EAGLE-1/2 draft layer (``head_type`` "eagle"); `Eagle3Head` adds fusion and its own vocabulary.

    ``config.num_heads`` is the number of draft steps unrolled in training (1 = EAGLE-1's
    teacher-forced recipe); ``config.num_layers`` the number of decoder layers (1 in EAGLE)."""

    head_type = "eagle"
    dynamic_tree = True
    training_objective = "draft_steps"
    spec_options: tuple[str, ...] = ("noise", "fc_bias")
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

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def for_target(
        cls,
        target: nn.Module,
        num_heads: int = 1,
        num_layers: int = 1,
        lm_head: str = "auto",  # accepted for a uniform signature; EAGLE always scores with the target's
        **extra,
    ) -> "EagleHead":
        defaults = {} if cls.fuses_layers else {"fc_bias": False}
        extra = {**_layer_geometry(target), **defaults, **extra}
        lm_head = "own" if cls.fuses_layers else "shared"
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
        mask: torch.Tensor,
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

    def new_cache(self, capacity: int, device, dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Empty per-layer key/value buffers for drafting one sequence."""
        ex = self.config.extra
        shape = (1, ex["num_key_value_heads"], capacity, ex["head_dim"])
        return [(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype)) for _ in self.layers]

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (EAGLE: the target's own LM head on the predicted feature)."""
        head = self.target_lm_head()
        return head(state.to(head.weight.dtype))

    def vocab_ids(self) -> torch.Tensor | None:
        """Target id of each draft-vocabulary index (None: the draft vocabulary is the target's)."""
        return None



class Eagle3Head(EagleHead):
    """EAGLE-3: fused multi-layer features, its own norm + LM head over a reduced vocabulary.

    ``draft_to_target`` [N] (target id of each draft index) and ``target_to_draft`` [V] (draft
    index of each target id, -1 outside) are buffers saved in model.safetensors. They are set from
    training-token counts (`set_draft_vocab`) before training; heads whose mapping was never set
    are refused when drafting, never silently treated as an identity."""

    head_type = "eagle3"
    spec_options = ("feature_layers", "draft_vocab_size")
    required_extra = EagleHead.required_extra + ("feature_layers", "draft_vocab_size")
    fuses_layers = True

    def __init__(self, config: HeadsConfig) -> None:
        ex = config.extra
        if not ex.get("feature_layers") or len(ex["feature_layers"]) < 1:
            raise ValueError("eagle3 heads need extra.feature_layers (target layer indices)")
        n_vocab = ex.get("draft_vocab_size")
        if not isinstance(n_vocab, int) or not 1 <= n_vocab <= config.vocab_size:
            raise ValueError(f"eagle3 draft_vocab_size must be an integer in 1..{config.vocab_size}, got {n_vocab!r}")
        if config.target is not None:  # known at build time: refuse here, not in the first forward
            check_feature_layers(list(ex["feature_layers"]), config.target.num_hidden_layers)
        super().__init__(config)
        d = config.hidden_size
        eps = ex["rms_norm_eps"]
        self.embed_norm = RMSNorm(d, eps)
        self.hidden_norm = RMSNorm(d, eps)
        self.norm = RMSNorm(d, eps)
        self.lm_head = nn.Linear(d, n_vocab, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        self.register_buffer("draft_to_target", torch.full((n_vocab,), -1, dtype=torch.long))
        self.register_buffer("target_to_draft", torch.full((config.vocab_size,), -1, dtype=torch.long))

    def _init_fc_as_identity(self) -> None:
        """The fused input has no single "feature" to pass through: keep a small random init."""
        nn.init.normal_(self.fc.weight, std=0.02)

    @classmethod
    def for_target(
        cls, target, num_heads=4, num_layers=1, lm_head="auto", feature_layers=None, draft_vocab_size=None, **extra
    ):
        layers = int(text_config(target).num_hidden_layers)
        feature_layers = list(feature_layers) if feature_layers else default_feature_layers(layers)
        check_feature_layers(feature_layers, layers)
        vocab = TargetInfo.from_model(target).vocab_size
        if draft_vocab_size is not None and (isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int)
                                             or draft_vocab_size < 1):
            raise ValueError(
                f"draft_vocab_size must be a positive integer (None: 32000, capped at the vocabulary), got {draft_vocab_size!r}"
            )
        size = min(draft_vocab_size or 32_000, vocab)
        return super().for_target(
            target, num_heads, num_layers, feature_layers=feature_layers, draft_vocab_size=size, **extra
        )

    @torch.no_grad()
    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Keep the N most frequent training tokens (ties by id), sorted by id."""
        n = self.draft_to_target.numel()
        if token_counts.numel() != self.config.vocab_size:
            raise ValueError(f"token_counts has {token_counts.numel()} entries, the vocabulary {self.config.vocab_size}")
        order = sorted(range(token_counts.numel()), key=lambda i: (-int(token_counts[i]), i))[:n]
        ids = torch.tensor(sorted(order), dtype=torch.long, device=self.draft_to_target.device)
        self.draft_to_target.copy_(ids)
        self.target_to_draft.fill_(-1)
        self.target_to_draft[ids] = torch.arange(n, device=ids.device)

    def validate_loaded(self) -> None:
        self.check_vocab_mapping()

    def check_vocab_mapping(self) -> None:
        """Raise unless the two mapping tensors are set and are inverse bijections."""
        d2t, t2d = self.draft_to_target.cpu(), self.target_to_draft.cpu()
        if bool((d2t < 0).any()):
            raise ValueError(
                "eagle3 heads have no draft-vocabulary mapping (draft_to_target unset): they were never trained "
                "(training sets it from token counts); refusing to guess one"
            )
        if bool((d2t >= self.config.vocab_size).any()) or not bool((d2t[1:] > d2t[:-1]).all()):
            raise ValueError("eagle3 draft_to_target must hold distinct target ids in increasing order")
        if not bool((t2d[d2t] == torch.arange(d2t.numel())).all()) or int((t2d >= 0).sum()) != d2t.numel():
            raise ValueError("eagle3 target_to_draft is not the inverse of draft_to_target (corrupt mapping)")

    def first_input(self, features, tokens):
        g = self.fc(features.to(self.fc.weight.dtype))
        return g, torch.cat([self.embed_norm(self.embed(tokens)), self.hidden_norm(g)], dim=-1)

    def next_input(self, state, tokens):
        """EAGLE-3 feeds back its own output (not a target-feature prediction)."""
        return state, torch.cat([self.embed_norm(self.embed(tokens)), self.hidden_norm(state)], dim=-1)

    def logits(self, state):
        return self.lm_head(self.norm(state))

    def vocab_ids(self):
        return self.draft_to_target



def check_feature_layers(layers: list[int], num_layers: int) -> None:
    bad = [i for i in layers if not isinstance(i, int) or not 0 <= i < num_layers + 1]
    if bad:
        raise ValueError(
            f"feature layer ids {bad} are outside the target's layer range: it has {num_layers} layers, so valid ids "
            f"are 0..{num_layers} (hidden state entering layer i; {num_layers} = the final output)"
        )
