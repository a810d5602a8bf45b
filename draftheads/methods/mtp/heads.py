"""MTP heads: the target's own multi-token-prediction layer as a draft layer (``head_type: mtp``).

An MTP layer (DeepSeek-V3, Qwen3.5/3.6, Qwen3-Next, GLM-4.5, MiMo, ...) is an EAGLE-like draft
layer that the model's authors trained with the model: at position t it fuses the embedding of
token t+1 with the target's hidden state at t (``eh_proj`` over [enorm(embedding), hnorm(hidden)]),
runs ONE decoder layer of the target's own kind and a final norm, and the target's LM head turns
the result into logits for token t+2. Chained, it feeds its own output back as the hidden state
with the token it drafted, as EAGLE does. So these heads draft with EAGLE's drafter (chains, EAGLE-2
trees, drawn chains at temperature > 0) and train with EAGLE's unrolled loss (training-time test),
only the layer is the target's kind: transformers' `MtpLayer` around the target's decoder-layer
class (`layer.py`), never a copy of its modeling code.

Fresh heads start from the target checkpoint's own first MTP layer when its config declares one
(`shipped.py`: read by transformers' `MtpModel.from_pretrained`, the layer `generate(use_mtp=True)`
drafts with); for a target that ships none the layer starts fresh: the target's last attention
layer's weights with its output projections at zero (the identity, as every fresh draft layer here
starts), said once. The embedding, rotary embedding and LM head are the target's, never stored.

Positions: the layer at position t reads token t+1, and runs at position t+1 (transformers'
`MtpModel` and the DeepSeek-V3 recipe; vLLM runs it at t, the same attention up to rounding, RoPE
being relative).
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from ...heads.base import DraftHeads
from ...heads.config import HeadsConfig, target_decoder, text_config
from ...heads.draft_layer import within_window
from ...heads.unrolled_attention import UnrolledStepMask
from .families import family_of
from .layer import DraftKV, build_layer, class_path, config_from_dict, import_class
from .shipped import find_shipped, mtp_config, read_shipped

#: Residual output projections of a decoder layer: zero in a fresh layer, so that it is the identity.
OUTPUT_PROJECTIONS = ("o_proj", "down_proj", "out_proj")


def _decoder_layers(target: nn.Module) -> nn.ModuleList:
    layers = getattr(target_decoder(target), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"MTP heads build their layer from the target's own decoder layers; {type(target).__name__} "
                         "has no decoder with a `layers` list")
    return layers


def _norm_class(layer: nn.Module) -> type:
    """The RMSNorm class of a decoder layer (its input norm; else the first module named *norm*,
    transformers' `MtpModel` rule)."""
    norm = getattr(layer, "input_layernorm", None)
    if isinstance(norm, nn.Module):
        return type(norm)
    return next(type(m) for name, m in layer.named_modules() if "norm" in name)


def _attention_type(config) -> str:
    types = getattr(config, "layer_types", None)
    return types[0] if types else "full_attention"


class MtpHead(DraftHeads):
    """One MTP layer (``head_type`` "mtp"). ``config.num_heads``: the draft steps unrolled in
    training (1 = the layer's own one-step objective); ``config.num_layers``: 1 (an MTP layer holds
    one decoder layer; a checkpoint's further MTP layers are not drafted with, as in vLLM)."""

    head_type = "mtp"
    training_objective = "draft_steps"
    spec_options: tuple[str, ...] = ("loss",)
    required_extra: tuple[str, ...] = ("mtp_config", "decoder_layer", "norm")
    fuses_layers = False
    #: EAGLE-1 also regresses onto the next feature; an MTP layer is trained on tokens only.
    regresses_features = False
    #: The layer runs at the position of the token it reads (module docstring).
    position_offset = 1

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__(config)
        if config.num_layers != 1:
            raise ValueError(f"MTP heads hold one MTP layer (num_layers 1), got num_layers={config.num_layers}")
        ex = config.extra
        if ex.get("chain_hidden_post_norm"):
            raise ValueError("MTP layers with one post-norm shared by the chain (chain_hidden_post_norm) are not supported")
        self.layer_config = config_from_dict(ex["mtp_config"])
        layer_cls = import_class(ex["decoder_layer"], "decoder_layer")
        norm_cls = import_class(ex["norm"], "norm")
        self.layers = nn.ModuleList([build_layer(self.layer_config, layer_cls, norm_cls, bool(ex.get("use_post_norm", True)))])
        kind = _attention_type(self.layer_config)
        window = getattr(self.layer_config, "sliding_window", None)
        self.sliding_window: int | None = int(window) if kind == "sliding_attention" and window else None
        self._kv_shapes: list[tuple[tuple[int, int], tuple[int, int]]] | None = None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def for_target(cls, target: nn.Module, num_heads: int = 1, num_layers: int = 1, lm_head: str = "auto",
                   **extra) -> "MtpHead":
        """Heads for ``target``: its checkpoint's first MTP layer where it ships one, else a fresh
        layer of its kind (a warning says which and why)."""
        if lm_head not in ("auto", "shared"):
            raise ValueError(f"MTP heads score with the target's LM head (lm_head 'shared'); got lm_head={lm_head!r}")
        if num_layers != 1:
            raise ValueError(f"MTP heads hold one MTP layer: heads.num_layers must be 1, got {num_layers}")
        shipped = find_shipped(target)
        layer = _decoder_layers(target)[-1]
        layer_config = mtp_config(target)
        if getattr(layer_config, "chain_hidden_post_norm", None) is not None:
            raise ValueError(f"{type(target).__name__}: MTP layers whose chain shares one post-norm are not supported")
        name = getattr(target.config, "_name_or_path", "") or type(target).__name__
        if shipped.layers:
            origin = "shipped"
        else:
            origin = "fresh"
            warnings.warn(f"head_type mtp: {name} ships no MTP layer to start from ({shipped.reason}); the MTP layer "
                          "starts fresh (the target's last attention layer, its output projections at zero)",
                          UserWarning, stacklevel=2)
        if shipped.layers > 1:
            warnings.warn(f"head_type mtp: {name} ships {shipped.layers} MTP layers; the heads take the first and draft "
                          "every depth with it (as vLLM's MTP drafters do)", UserWarning, stacklevel=2)
        data = layer_config.to_dict()
        data.pop("per_layer_config", None)
        extra = {
            "mtp_config": data,
            "decoder_layer": class_path(type(layer)),
            "norm": class_path(_norm_class(layer)),
            "use_post_norm": True,
            "family": shipped.family.name if shipped.family else None,
            "origin": origin,
            "shipped_layers": shipped.layers,
            **extra,
        }
        return cls.from_config_for(cls.target_config(target, num_heads, 1, "shared", extra), target)

    def init_from_target(self, target: nn.Module) -> None:
        """The shipped layer's weights (``extra.origin`` "shipped"), else a fresh identity layer."""
        if self.config.extra.get("origin") == "shipped":
            state = read_shipped(target, int(self.config.extra.get("shipped_layers") or 1))
            self.layers[0].load_state_dict(state, strict=True)
            return
        self._init_fresh(target)

    def _init_fresh(self, target: nn.Module) -> None:
        """The target's last decoder layer of the MTP layer's attention type (its weights where
        names and shapes agree), output projections at zero; fc passes the hidden state through."""
        layers = _decoder_layers(target)
        kind = _attention_type(self.layer_config)
        types = getattr(text_config(target), "layer_types", None) or []
        index = max((i for i, t in enumerate(types) if t == kind), default=len(layers) - 1)
        block = self.layers[0].mtp_block
        mine = block.state_dict()
        theirs = {k: v for k, v in layers[index].state_dict().items() if k in mine and mine[k].shape == v.shape}
        with torch.no_grad():
            block.load_state_dict(theirs, strict=False)
            for name, param in block.named_parameters():
                if any(f"{proj}." in name or name.endswith(proj) for proj in OUTPUT_PROJECTIONS):
                    param.zero_()
            d = self.config.hidden_size
            first = bool(getattr(self.layer_config, "mtp_hidden_states_first", False))
            self.fc.weight.zero_()
            self.fc.weight[:, slice(0, d) if first else slice(d, 2 * d)] = torch.eye(d)

    # -- what the target lends --------------------------------------------------------------------
    def bind_target(self, target: nn.Module):
        super().bind_target(target)
        decoder = target_decoder(target)
        self._bound["rotary"] = getattr(decoder, "rotary_emb", None)
        return self

    @property
    def fc(self) -> nn.Linear:
        """The fusion of [embedding, hidden state] (``eh_proj``; vLLM's Qwen3.5 calls it ``fc``)."""
        return self.layers[0].eh_proj

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.target_embedding()
        if hasattr(emb, "embed_norm"):  # as transformers' MtpModel: the embedding without its own norm
            return nn.functional.embedding(tokens, emb.weight).to(self.fc.weight.dtype)
        return emb(tokens).to(self.fc.weight.dtype)

    # -- pieces used by training and drafting (EAGLE's, methods/eagle) ---------------------------
    def first_input(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, attention input): eh_proj over [enorm(embedding of ``tokens``), hnorm(``features``)]."""
        layer = self.layers[0]
        emb, hidden = layer.enorm(self.embed(tokens)), layer.hnorm(features.to(self.fc.weight.dtype))
        pair = [hidden, emb] if getattr(self.layer_config, "mtp_hidden_states_first", False) else [emb, hidden]
        g = layer.eh_proj(torch.cat(pair, dim=-1))
        return g, g

    def next_input(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A deeper step reads the layer's own output as the hidden state (as vLLM and MtpModel chain it)."""
        return self.first_input(state, tokens)

    def _position_embeddings(self, x: torch.Tensor, position_ids: torch.Tensor):
        rotary = self._bound.get("rotary")
        if rotary is None:
            if "lm_head" not in self._bound:
                raise RuntimeError("these mtp heads read the target's rotary embedding: call heads.bind_target(target) first")
            return None
        kwargs = {}
        nested = getattr(self.layer_config, "nested_rope_parameter_keys", None)
        if callable(nested) and nested(self.layer_config.rope_parameters):
            kwargs["layer_type"] = _attention_type(self.layer_config)
        return rotary(x, position_ids=position_ids, **kwargs)

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
        """The MTP block and its final norm over ``g`` [B, n, d] at ``positions`` [B or 1, n];
        ``mask`` [B or 1, n, T + n] (True = attend) or training's `UnrolledStepMask`; ``past``
        (training's earlier steps) or ``cache`` buffers holding ``cache_length`` slots (drafting),
        as `EagleHead.run_layers`. Returns the output [B, n, d] and the new keys/values per layer."""
        bsz, n, _ = g.shape
        if isinstance(mask, UnrolledStepMask):
            mask = mask.dense()
        if self.sliding_window is not None:
            mask = within_window(mask, self.sliding_window)
        mask = mask.expand(bsz, n, mask.shape[-1])[:, None]
        position_ids = (positions + self.position_offset).expand(bsz, n)
        kv = DraftKV(buffers=cache, length=cache_length, past=past)
        layer = self.layers[0]
        out = layer.mtp_block(g, attention_mask=mask, position_embeddings=self._position_embeddings(g, position_ids),
                              position_ids=position_ids, cache=kv)
        if isinstance(out, tuple):
            out = out[0]
        if layer.post_norm is not None:
            out = layer.post_norm(out)
        return out, [kv.new[i] for i in sorted(kv.new)]

    def kv_shapes(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Per attention layer of the block, (heads, dim) of its keys and of its values: learnt once
        from one token through the bound block (MLA's keys and values differ in width)."""
        if self._kv_shapes is None:
            w = self.fc.weight
            g = torch.zeros(1, 1, self.config.hidden_size, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                _, new = self.run_layers(g, g, torch.zeros(1, 1, dtype=torch.long, device=w.device),
                                         torch.ones(1, 1, 1, dtype=torch.bool, device=w.device))
            self._kv_shapes = [((k.shape[1], k.shape[3]), (v.shape[1], v.shape[3])) for k, v in new]
        return self._kv_shapes

    def new_cache(self, capacity: int, device, dtype, rows: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Empty key/value buffers [rows, heads, capacity, dim] per attention layer of the block."""
        return [(torch.empty(rows, kh, capacity, kd, device=device, dtype=dtype),
                 torch.empty(rows, vh, capacity, vd, device=device, dtype=dtype))
                for (kh, kd), (vh, vd) in self.kv_shapes()]

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """The target's LM head on the layer's output, as transformers' `MtpModel` projects it."""
        multiplier = getattr(self.layer_config, "logits_mup_width_multiplier", None)
        if multiplier is not None:
            state = state / multiplier
        head = self.target_lm_head()
        out = head(state.to(head.weight.dtype))
        unpadded = getattr(self.layer_config, "unpadded_vocab_size", None)
        return out[..., :unpadded] if unpadded is not None and unpadded < out.shape[-1] else out

    def vocab_ids(self) -> torch.Tensor | None:
        return None

    def default_tree(self, device_type: str) -> dict:
        """Untrained deeper steps accept less than the first: a short chain on a CPU (verify cost
        grows fast with tokens there), a small EAGLE-2 tree on a GPU; calibrate measures better."""
        if device_type == "cuda":
            return {"total_tokens": 16, "depth": 4, "top_k": 4}
        return {"total_tokens": 4, "depth": 3, "top_k": 1}

    @classmethod
    def card_rows(cls, config: dict) -> list[tuple[str, object]]:
        extra = config.get("extra") or {}
        family = family_of(str((extra.get("mtp_config") or {}).get("model_type", "")))
        rows: list[tuple[str, object]] = [("draft steps in training", config["num_heads"]),
                                          ("MTP layer", extra.get("decoder_layer", "?").rsplit(".", 1)[-1]),
                                          ("started from", "the target's own MTP layer" if extra.get("origin") == "shipped"
                                           else "a fresh layer (the target ships none)")]
        if family is not None:
            rows.append(("family", family.name))
        return rows
