"""DFlash draft heads: a block of draft tokens filled in ONE forward (block diffusion drafting).

``head_type: dflash``. The draft reads the target's hidden states entering several layers
(``feature_layers``), concatenated in that order, fused by ``fc`` (m*H -> H, no bias) and
``hidden_norm``: the *context*, one vector per committed position. Every draft layer projects
the context with its own ``k_proj``/``v_proj`` (then ``k_norm`` and RoPE at the context's
positions; no input_layernorm on the context) and uses it as extra keys/values.

The query block is ``[last accepted token, mask x (B-1)]`` embedded with the target's frozen
embedding (the mask token is a fixed id whose embedding row the target never produces in text),
at positions anchor..anchor+B-1. It attends to every context position before the anchor and
bidirectionally within the block. After the final ``norm`` the target's frozen LM head scores
slots 1..B-1: the K = B-1 draft tokens of one step, all from one forward.

The layers are Qwen3 decoder layers (pre-RMSNorm, per-head ``q_norm``/``k_norm`` applied
unconditionally, SwiGLU), the architecture vLLM's DFlash drafter runs, so an export computes
exactly what draftheads computes. Module names follow that layout too (``layers.i.self_attn.q_proj``,
``layers.i.mlp.gate_proj``, ``fc``, ``hidden_norm``, ``norm``).

``config.num_heads`` is K (the drafted slots; the block is K+1 long) and ``config.num_layers``
the number of draft layers.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...schema import TARGET_LOSSES
from ...heads.base import DraftHeads
from ...heads.config import HeadsConfig, text_config
from ...heads.draft_layer import apply_rotary, inverse_frequencies, rope_settings, rotary

DEFAULT_BLOCK_SIZE = 16  # z-lab and SpecForge: B = 16, so engines serve K = 15
DEFAULT_NUM_FEATURE_LAYERS = 5
DEFAULT_GAMMA = 7.0  # SpecForge's per-slot weight decay for B = 16
DEFAULT_ANCHORS = 32  # blocks per training row (SpecForge draws up to 512 on long rows)


def default_feature_layers(num_target_layers: int, count: int = DEFAULT_NUM_FEATURE_LAYERS) -> list[int]:
    """z-lab's spread: the outputs of layers round(1 + i (L-4) / (n-1)), i.e. the states entering
    layers 2 .. L-2, as distinct ids (fewer on targets too shallow for ``count``)."""
    L = num_target_layers
    if L < 3:
        return list(range(1, L))  # no room for a spread: every layer output before the final one
    count = max(1, min(count, L - 1))
    if count == 1:
        return [L // 2]
    ids = sorted({min(L - 1, max(1, 1 + round(1 + i * (L - 4) / (count - 1)))) for i in range(count)})
    return ids


def check_dflash_feature_layers(layers: list[int], num_target_layers: int) -> None:
    """Feature f is the hidden state entering target layer f (``hidden_states[f]``). Refuse ids
    outside 1..L-1: 0 is the embedding (no engine layout numbers it: z-lab's ids are layer
    outputs, f-1), and L is the final hidden state, which transformers hands back after the final
    norm while vLLM captures it before, so a head trained on it would read other inputs there."""
    L = num_target_layers
    if not layers:
        raise ValueError("dflash heads need at least one feature layer (heads.feature_layers)")
    bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= L - 1]
    if bad:
        why = []
        if any(isinstance(i, int) and i == L for i in bad):
            why.append(f"{L} is the final hidden state (after the final norm in transformers, before it in vLLM)")
        if any(isinstance(i, int) and i == 0 for i in bad):
            why.append("0 is the embedding output, not a layer's")
        raise ValueError(
            f"dflash feature layer ids {bad} are out of range for a target of {L} layers: valid ids are 1..{L - 1} "
            f"(the hidden state entering layer f = the output of layer f-1)" + (f"; {'; '.join(why)}" if why else "")
        )
    if len(set(layers)) != len(layers):
        raise ValueError(f"dflash feature layers {layers} repeat a layer: engines capture each layer once")
    if list(layers) != sorted(layers):
        raise ValueError(f"dflash feature layers {layers} must be in increasing order (the engines concatenate them so)")


class QKNormAttention(nn.Module):
    """Qwen3 attention over the block's own keys plus the context's: per-head q/k RMSNorm, RoPE."""

    def __init__(self, hidden, num_heads, num_kv_heads, head_dim, eps, theta, rope_scaling, max_positions) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps)
        # Plain attributes (not buffers): never saved.
        self.inv_freq, self.rope_scale = inverse_frequencies(head_dim, theta, rope_scaling, max_positions)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary(positions, self.inv_freq, x.dtype, self.rope_scale)
        return apply_rotary(x, cos[:, None], sin[:, None])

    def keys_values(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k_norm, RoPE) and values [B, kv, n, hd] of ``h`` [B, n, H] at ``positions`` [B or 1, n]."""
        bsz, n, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(bsz, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return self._rope(k, positions), v

    def forward(self, h, positions, context_kv, mask) -> torch.Tensor:
        """``h`` [B, n, H] (normed block states), ``context_kv`` keys/values [B, kv, T, hd] of the
        context, ``mask`` bool [B, n, T + n] or None (= attend everywhere)."""
        bsz, n, _ = h.shape
        q = self.q_norm(self.q_proj(h).view(bsz, n, self.num_heads, self.head_dim)).transpose(1, 2)
        q = self._rope(q, positions)
        k, v = self.keys_values(h, positions)
        keys, values = torch.cat([context_kv[0], k], 2), torch.cat([context_kv[1], v], 2)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=None if mask is None else mask[:, None],
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(bsz, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    """One Qwen3 decoder layer whose attention also reads the context's keys/values."""

    def __init__(self, hidden, num_heads, num_kv_heads, head_dim, intermediate, eps, theta, rope_scaling, max_positions):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.self_attn = QKNormAttention(hidden, num_heads, num_kv_heads, head_dim, eps, theta, rope_scaling, max_positions)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.mlp = SwiGLU(hidden, intermediate)

    def forward(self, x, positions, context_kv, mask) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, context_kv, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashHeads(DraftHeads):
    """DFlash drafter (see the module docstring)."""

    head_type = "dflash"
    training_objective = "block"
    default_block_size = DEFAULT_BLOCK_SIZE
    spec_options: tuple[str, ...] = (
        "feature_layers", "block_size", "mask_token_id", "loss_gamma", "loss", "num_anchors", "greedy_path",
    )
    required_extra: tuple[str, ...] = (
        "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
        "feature_layers", "block_size", "mask_token_id",
    )

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__(config)
        ex = config.extra
        block = ex.get("block_size")
        first = self.first_draft_slot(ex)
        if isinstance(block, bool) or not isinstance(block, int) or block < 1 + first:
            raise ValueError(f"{self.head_type} block_size must be an integer >= {1 + first} (the root plus at least one "
                             f"{'mask slot' if first else 'drafted slot'}), got {block!r}")
        if config.num_heads != block - first:
            raise ValueError(f"{self.head_type} heads draft {block - first} tokens per block of {block}, config says "
                             f"num_heads {config.num_heads}")
        layers = list(ex.get("feature_layers") or [])
        if config.target is not None:
            check_dflash_feature_layers(layers, config.target.num_hidden_layers)
        mask_id = ex.get("mask_token_id")
        if mask_id is not None and (isinstance(mask_id, bool) or not isinstance(mask_id, int)
                                    or not 0 <= mask_id < config.vocab_size):
            raise ValueError(f"dflash mask_token_id must be a token id in 0..{config.vocab_size - 1}, got {mask_id!r}")
        if config.num_layers < 1:
            raise ValueError("dflash heads need at least one draft layer (heads.num_layers >= 1)")
        self.feature_layers: list[int] = layers
        self.block_size = block
        self.first_slot = first
        d = config.hidden_size
        eps = ex["rms_norm_eps"]
        self.fc = nn.Linear(d * len(layers), d, bias=False)
        self.hidden_norm = nn.RMSNorm(d, eps=eps)
        self.layers = nn.ModuleList([self.make_layer(ex) for _ in range(config.num_layers)])
        self.norm = nn.RMSNorm(d, eps=eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    # -- what the families built on this backbone (DSpark, DFlash2) change ------------------------
    @classmethod
    def first_draft_slot(cls, extra: dict) -> int:
        """Which block slot scores the first drafted token: 1 for DFlash (slot 0 holds the root and
        drafts nothing; slot k drafts the k-th token after it), 0 where the root's own slot drafts
        the first token (DSpark's ``sample_from_anchor``)."""
        return 1

    def make_layer(self, ex: dict) -> nn.Module:
        """One draft decoder layer (DFlash: a Qwen3 layer reading the context's keys/values)."""
        return DFlashLayer(self.config.hidden_size, ex["num_attention_heads"], ex["num_key_value_heads"], ex["head_dim"],
                           ex["intermediate_size"], ex["rms_norm_eps"], ex["rope_theta"], ex.get("rope_scaling"),
                           ex.get("max_position_embeddings"))

    @classmethod
    def family_options(cls, target: nn.Module, **options) -> dict:
        """config.json extra keys of the options `for_target` takes besides DFlash's own (DFlash:
        none; a family built on this backbone checks and records its own)."""
        if options:
            raise TypeError(f"{cls.head_type} heads take no option {', '.join(sorted(options))}")
        return {}

    @property
    def draft_slots(self) -> slice:
        """The block slots that score drafted tokens 1..K, in order."""
        return slice(self.first_slot, self.first_slot + self.config.num_heads)

    @property
    def span(self) -> int:
        """Positions a training block covers in the row: its root and the K tokens it drafts."""
        return self.config.num_heads + 1

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def for_target(
        cls,
        target: nn.Module,
        num_heads: int | None = None,
        num_layers: int = 1,
        lm_head: str = "auto",
        feature_layers: list[int] | None = None,
        block_size: int | None = None,
        mask_token_id: int | None = None,
        loss_gamma: float | None = None,
        loss: str = "soft_ce",
        num_anchors: int | None = None,
        greedy_path: bool = False,
        **options,
    ) -> "DFlashHeads":
        """Fresh heads for ``target``. ``block_size`` B (default 16) sets the drafted tokens K = B-1;
        ``num_heads`` is ignored when ``block_size`` is given (it is K) and sets B = num_heads + 1
        otherwise. ``mask_token_id`` None: chosen later from the tokenizer (`choose_mask_token`).
        ``options``: what a family built on this backbone adds (`family_options`)."""
        if lm_head not in ("auto", "shared"):
            raise ValueError(f"dflash heads score with the target's LM head (lm_head 'shared'); got lm_head={lm_head!r} (pass 'auto')")
        cfg = text_config(target)
        n_target = int(cfg.num_hidden_layers)
        layers = list(feature_layers) if feature_layers else default_feature_layers(n_target)
        check_dflash_feature_layers(layers, n_target)
        family = cls.family_options(target, **options)
        first = cls.first_draft_slot(family)
        if block_size is None:
            block_size = cls.default_block_size if num_heads is None else int(num_heads) + first
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1 + first:
            raise ValueError(f"heads.block_size must be an integer >= {1 + first}, got {block_size!r}")
        gamma = DEFAULT_GAMMA if loss_gamma is None else float(loss_gamma)
        if not math.isfinite(gamma) or gamma <= 0:
            raise ValueError(f"heads.loss_gamma must be > 0 (slot k weighs exp(-(k-1)/gamma)), got {loss_gamma!r}")
        if loss not in TARGET_LOSSES:
            raise ValueError(f"heads.loss: unknown loss {loss!r}; valid: {', '.join(TARGET_LOSSES)}")
        anchors = DEFAULT_ANCHORS if num_anchors is None else num_anchors
        if isinstance(anchors, bool) or not isinstance(anchors, int) or anchors < 1:
            raise ValueError(f"heads.num_anchors must be a positive integer, got {num_anchors!r}")
        heads_ = int(cfg.num_attention_heads)
        extra = {
            "num_attention_heads": heads_,
            "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None) or heads_),
            "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads_),
            "intermediate_size": int(cfg.intermediate_size),
            "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", 1e-6)),
            **rope_settings(cfg),
            "feature_layers": layers,
            "block_size": block_size,
            "mask_token_id": mask_token_id,
            "loss_gamma": gamma,
            "loss": loss,
            "num_anchors": anchors,
            "greedy_path": bool(greedy_path),
            **family,
        }
        config = cls.target_config(target, block_size - first, num_layers, "shared", extra)
        return cls.from_config_for(config, target)

    def settle_tokenizer(self, tokenizer) -> str:
        return f"mask token: id {self.choose_mask_token(tokenizer)}"

    def choose_mask_token(self, tokenizer) -> int:
        """Set (when unset) and check the mask token against the tokenizer: it must be an id whose
        embedding row ordinary text never produces, or a block's mask slots would look like a real
        token. Unset: the first embedding row the tokenizer has no token for (padded vocabularies,
        e.g. Qwen2.5), else the tokenizer's own mask token, else its pad token when that is a special
        token (padding is never a block's input), else refused (name one)."""
        ex = self.config.extra
        vocab = self.config.vocab_size
        known = len(tokenizer)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        mask_id = ex.get("mask_token_id")
        pad = getattr(tokenizer, "pad_token_id", None)
        ends = {getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "bos_token_id", None)}
        if mask_id is None:
            if known < vocab:
                mask_id = known
            elif getattr(tokenizer, "mask_token_id", None) is not None:
                mask_id = int(tokenizer.mask_token_id)
            elif pad is not None and pad in special and pad not in ends:
                mask_id = pad  # a special token only padding produces: never a block's input otherwise
            else:
                raise ValueError(
                    f"dflash heads need a mask token the tokenizer never produces from text, and this one has a token for "
                    f"every one of the {vocab} embedding rows and no mask or special pad token: set heads.mask_token_id to a reserved "
                    "special token's id (e.g. Llama-3's <|reserved_special_token_0|> = 128002)"
                )
        if not 0 <= mask_id < vocab:
            raise ValueError(f"heads.mask_token_id {mask_id} is outside the target's embedding rows 0..{vocab - 1}")
        if mask_id < known and mask_id not in special:
            piece = tokenizer.convert_ids_to_tokens(mask_id)
            raise ValueError(
                f"heads.mask_token_id {mask_id} is the ordinary token {piece!r}, which the tokenizer produces from text: "
                f"pick a special token the data never contains, or an id >= {known} if the embedding has such rows"
            )
        if mask_id in ends:
            raise ValueError(f"heads.mask_token_id {mask_id} is the tokenizer's BOS/EOS token, which every row contains")
        row = self.target_embedding().weight[mask_id]
        if not bool((row != 0).any()):
            raise ValueError(
                f"heads.mask_token_id {mask_id}: its embedding row is all zeros (a padding row), so every mask slot "
                "would enter the first draft layer with zero queries and keys and read its position nowhere: pick an id "
                "whose row is not zero (set heads.mask_token_id)"
            )
        ex["mask_token_id"] = int(mask_id)
        return int(mask_id)

    def default_tree(self, device_type: str) -> list[list[int]]:
        """The tree decoding uses when none was chosen: the chain of the whole block (what engines
        draft), on every device type: it costs one draft forward whatever its shape."""
        return [[0] * d for d in range(1, self.config.num_heads + 1)]

    @property
    def mask_token_id(self) -> int:
        mask_id = self.config.extra.get("mask_token_id")
        if mask_id is None:
            raise RuntimeError(
                "these dflash heads have no mask token yet: pass mask_token_id= or call heads.choose_mask_token(tokenizer) "
                "(training does it)"
            )
        return int(mask_id)

    # -- pieces used by training and drafting ----------------------------------------------------
    def context(self, features: torch.Tensor) -> torch.Tensor:
        """[.., m*H] target features -> [.., H] context states (fc, then hidden_norm)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the context's keys and values [B, kv, T, hd] at ``positions`` [B or 1, T]."""
        return [layer.self_attn.keys_values(context, positions) for layer in self.layers]

    def block_inputs(self, roots: torch.Tensor, slots: int | None = None) -> torch.Tensor:
        """Token ids [.., B] of blocks ``[root, mask x (B-1)]`` for ``roots`` [..]."""
        block = self.block_size if slots is None else slots
        out = torch.full((*roots.shape, block), self.mask_token_id, dtype=torch.long, device=roots.device)
        out[..., 0] = roots
        return out

    def block_states(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        context_kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Final-normed draft states [B, n, H] of the block tokens [B, n] at ``positions``, attending
        to ``context_kv`` and to the block under ``mask`` [B, n, T + n] (None: everything)."""
        x = self.embed(tokens)
        for layer, kv in zip(self.layers, context_kv):
            x = layer(x, positions, kv, mask)
        return self.norm(x)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The block's input vectors: the target's frozen embedding of its tokens."""
        return self.target_embedding()(tokens).to(self.fc.weight.dtype)

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (its frozen LM head)."""
        head = self.target_lm_head()
        return head(state.to(head.weight.dtype))

    def slot_weights(self, device=None) -> torch.Tensor:
        """[K]: slot k (1..K) weighs exp(-(k-1)/gamma) (slot 0, the root, weighs 0 and is left out)."""
        gamma = float(self.config.extra.get("loss_gamma", DEFAULT_GAMMA))
        return torch.exp(-torch.arange(self.config.num_heads, dtype=torch.float32, device=device) / gamma)

