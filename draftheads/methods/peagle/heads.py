"""P-EAGLE draft heads (``head_type: peagle``): an EAGLE-3 draft that drafts K tokens in ONE forward.

The draft is EAGLE-3's (fused target layers through ``fc``, layer 0 reading
[norm(embedding), norm(state)], its own norm and LM head over a reduced vocabulary, see methods/eagle3/heads.py).
P-EAGLE adds two learned inputs that stand for what a sequential draft would have fed back:

- ``mask_hidden`` [1, 1, m*Ht]: a placeholder target feature; its state is ``fuse(mask_hidden)``:
  ``fc(mask_hidden)``, or with ``norm_before_fc`` ``fc(input_norm(mask_hidden))``, exactly what a
  real feature goes through (see `PEagleHead.mask_input` for where vLLM and speculators do this);
- the mask token: an id whose row of the draft's own embedding (``embed_tokens``, trained here,
  initialised from the target's) is the placeholder token.

Drafting after the root: the usual EAGLE input for the committed positions (feature t, token
t+1) ending with the root, then K-1 slots holding (mask token, fuse(mask_hidden)) at the next
positions, under causal attention. The root's slot predicts draft 1, mask slot j draft j+1: K
tokens from one forward, none of them fed back. Training (methods/peagle/loss.py) samples which
depths each position learns (COD) and shows each element exactly what drafting shows it.

The mask token id must never be a token the data holds (it would share the placeholder's
embedding row); `resolve_mask_token` picks one and training refuses one that occurs in the data.
"""
from __future__ import annotations

import torch
from torch import nn

from ...heads.config import HeadsConfig, text_config
from ..eagle3.heads import Eagle3Head, default_feature_layers

DEFAULT_COD_RATIO = 0.7  # speculators' defaults: depth d keeps max(0.7^d, 0.2) of the positions
DEFAULT_COD_MIN_RATIO = 0.2


def resolve_mask_token(tokenizer, vocab_size: int, requested: int | None) -> int:
    """The mask token id: ``requested`` if given, else the tokenizer's mask token, else the first
    embedding row past the tokenizer's vocabulary (a padded vocabulary's unused row, as SpecForge
    picks), else the pad token when it is neither BOS nor EOS (only padding holds it, and padding
    is never attended). Raises when none of these exists, or the id is a plain text token."""
    if requested is not None:
        if not 0 <= requested < vocab_size:
            raise ValueError(f"heads.mask_token_id {requested} is outside the target's vocabulary 0..{vocab_size - 1}")
        if tokenizer is not None and requested < len(tokenizer):
            special = set(getattr(tokenizer, "all_special_ids", []) or [])
            special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
            if requested not in special:
                token = tokenizer.convert_ids_to_tokens(requested)
                raise ValueError(
                    f"heads.mask_token_id {requested} is the text token {token!r}, which the tokenizer emits: the "
                    "P-EAGLE placeholder would share its embedding row. Pass an id the data never holds (a reserved "
                    f"special token, or an unused row >= {len(tokenizer)} when the vocabulary is padded)"
                )
        return requested
    if tokenizer is None:
        raise ValueError("peagle heads need heads.mask_token_id (no tokenizer to choose one from)")
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is not None and 0 <= mask < vocab_size:
        return int(mask)
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None and pad not in (getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        return int(pad)
    raise ValueError(
        f"no id is free for the P-EAGLE mask token: the tokenizer has no mask token, uses all {vocab_size} embedding "
        "rows and no distinct pad token; set heads.mask_token_id to a reserved special token the data never holds"
    )


class PEagleHead(Eagle3Head):
    """EAGLE-3 draft + ``mask_hidden`` + its own trained embedding; K drafts in one forward.

    ``config.num_heads`` is the number of trained depths (K: drafting may ask for at most that
    many tokens); ``config.num_layers`` the decoder layers (4 in the published drafts)."""

    head_type = "peagle"
    training_objective = "parallel_depths"
    # Not EAGLE 3.1's fc_norm / norm_output: vLLM's speculators P-EAGLE mapping does not forward
    # them (methods/peagle/export.py), so a P-EAGLE draft using them could not be served as trained.
    # norm_before_fc is taken: vLLM's mapping forwards it and normalises mask_hidden with the same
    # input_norm before fc, as this head does (see mask_input).
    spec_options = tuple(o for o in Eagle3Head.spec_options if o not in ("fc_norm", "norm_output")) + (
        "mask_token_id", "cod_ratio", "cod_min_ratio", "greedy_path")
    required_extra = Eagle3Head.required_extra + ("mask_token_id",)

    def __init__(self, config: HeadsConfig) -> None:
        ex = config.extra
        mask = ex.get("mask_token_id")
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < config.vocab_size:
            raise ValueError(f"peagle mask_token_id must be an integer in 0..{config.vocab_size - 1}, got {mask!r}")
        ratio, floor = ex.get("cod_ratio", DEFAULT_COD_RATIO), ex.get("cod_min_ratio", DEFAULT_COD_MIN_RATIO)
        if not (0 < floor <= 1 and 0 < ratio <= 1):
            raise ValueError(f"peagle cod_ratio and cod_min_ratio must be in (0, 1], got {ratio!r} and {floor!r}")
        if config.target is not None and config.target.num_hidden_layers in (ex.get("feature_layers") or []):
            raise ValueError(
                f"peagle feature layer {config.target.num_hidden_layers} is the target's final output, which "
                "transformers returns AFTER the final norm and vLLM captures before it: an exported draft would read "
                f"other features than it was trained on; pick ids 0..{config.target.num_hidden_layers - 1}"
            )
        on = [key for key in ("fc_norm", "norm_output") if ex.get(key)]
        if on:
            raise ValueError(f"peagle heads do not take {', '.join(on)} (EAGLE 3.1 options of eagle3 heads): vLLM's "
                             "P-EAGLE loader does not forward them, so the served draft would differ")
        super().__init__(config)
        self.mask_token_id = int(mask)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, config.hidden_size * len(self.feature_layers)))
        nn.init.normal_(self.mask_hidden, std=0.02)

    @classmethod
    def for_target(cls, target, num_heads=5, num_layers=1, lm_head="auto", mask_token_id=None,
                   cod_ratio=None, cod_min_ratio=None, greedy_path=False, **extra):
        """Fresh P-EAGLE heads; ``mask_token_id`` is required here (training resolves it from the
        tokenizer with `resolve_mask_token`)."""
        if mask_token_id is None:
            raise ValueError("peagle heads need a mask_token_id (see resolve_mask_token)")
        extra = {**extra, "mask_token_id": int(mask_token_id),
                 "cod_ratio": DEFAULT_COD_RATIO if cod_ratio is None else float(cod_ratio),
                 "cod_min_ratio": DEFAULT_COD_MIN_RATIO if cod_min_ratio is None else float(cod_min_ratio),
                 "greedy_path": bool(greedy_path)}
        if extra.get("feature_layers") is None:  # EAGLE-3's default may pick the final output on shallow targets
            layers = int(text_config(target).num_hidden_layers)
            extra["feature_layers"] = _default_layers(layers)
        return super().for_target(target, num_heads, num_layers, lm_head, **extra)

    @classmethod
    def resolve_options(cls, options: dict, target: nn.Module, tokenizer) -> dict:
        """The configured options with the mask token settled (see `resolve_mask_token`)."""
        vocab = int(target.get_output_embeddings().weight.shape[0])
        return {**options, "mask_token_id": resolve_mask_token(tokenizer, vocab, options.get("mask_token_id"))}

    def init_from_target(self, target: nn.Module) -> None:
        """The draft's embedding starts as the target's (P-EAGLE then trains it)."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(target.get_input_embeddings().weight.to(self.embed_tokens.weight.dtype))

    @torch.no_grad()
    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """EAGLE-3's draft vocabulary, after refusing training data that holds the mask token."""
        seen = int(token_counts[self.mask_token_id])
        if seen:
            raise ValueError(
                f"the P-EAGLE mask token id {self.mask_token_id} occurs {seen} time(s) in the training data: its "
                "embedding row would mean both a real token and the placeholder; set heads.mask_token_id to an id "
                "the data never holds"
            )
        super().set_draft_vocab(token_counts)

    # -- pieces used by training and drafting ----------------------------------------------------
    def default_tree(self, device_type: str) -> list[list[int]]:
        """The tree decoding uses when none was chosen: the chain of every trained depth (what
        engines draft), on every device type: one draft forward whatever its shape."""
        return [[0] * d for d in range(1, self.config.num_heads + 1)]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)

    def mask_input(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual stream, attention input) of mask slots, broadcast to ``shape`` = (B, n).

        The state is ``fuse(mask_hidden)``: with ``norm_before_fc`` mask_hidden goes through the
        same ``input_norm`` as the target features, then ``fc``. vLLM 0.32 computes exactly that:
        at load it stores ``combine_hidden_states(mask_hidden)`` (= fc(input_norm(x)),
        vllm/model_executor/models/llama_eagle3.py:397-418, vllm/model_executor/models/qwen3_eagle3.py:376-396)
        as the mask slots' hidden state (vllm/v1/spec_decode/llm_base_proposer.py:1401-1414) and
        writes it over the already fused target states of those slots (same file, 920-930; the
        real slots are fused at 549-552). The speculators trainer's P-EAGLE forward substitutes
        mask_hidden before its input_norm and fc (speculators/models/peagle/core.py in vllm-project/speculators,
        forward)."""
        g = self.fuse(self.mask_hidden).reshape(1, 1, -1)
        tok = torch.full((1, 1), self.mask_token_id, dtype=torch.long, device=g.device)
        attn = torch.cat([self.embed_norm(self.embed(tok)), self.hidden_norm(g)], dim=-1)
        return g.expand(*shape, -1), attn.expand(*shape, -1)


def _default_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default feature layers, kept below the final output (see PEagleHead)."""

    return sorted({min(i, num_layers - 1) for i in default_feature_layers(num_layers)})
