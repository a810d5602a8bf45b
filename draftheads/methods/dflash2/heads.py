"""DFlash2 draft heads: DFlash's block drafting with a grouped dynamic convolution in every layer
and a candidate selector (``head_type: dflash2``; Inco AI / z-lab's DFlash 2, as vLLM 0.32 runs
it in vllm/model_executor/models/qwen3_dflash2.py and speculators 0.8 trains it in
speculators/models/dflash2/).

The backbone is DFlash's (methods/dflash/heads.py): block ``[root, mask x (B-1)]``, slot k drafts
the k-th token after the root. Two additions:

- **grouped dynamic convolution** around each sublayer: a layer's normed input x goes through
  ``conv_in`` before attention (and before the MLP), the sublayer's output through ``conv_out``,
  ``out[i, c] = sum_t (base[t, c] + delta[i, t, g(c)]) * x[i - t, c]`` over t < taps, zero where
  i - t falls before the block's first slot. ``base`` [2, taps, H] is static (side 0 = in,
  1 = out), ``delta`` [i, 2, taps, G] is projected from the sublayer's INPUT (``kernel_projection``,
  H -> 2 taps G, channels in groups of ``conv_group_size``): so a slot mixes in the slots before
  it without another forward. The context (keys/values from the target's features) never goes
  through it. Fresh layers start at the identity (base tap 0 = 1, projection 0), i.e. as DFlash;
- **candidate selector**: instead of each slot's own argmax, keep the top ``selector_top_k``
  candidates of each slot's LM-head logits (the *unary* scores) and score a candidate c after a
  predecessor p as ``unary[c] + <A[p] * P h, B[c]>`` (``predecessor_codebook`` A and
  ``successor_codebook`` B [V, r], ``hidden_projection`` P [r, H] of the slot's state h). Drafting
  walks the block left to right from the root (`inference/proposers/chained.py`).

vLLM's optional checkpoint scalars are kept for imports: ``input_embedding_scale`` multiplies the
block's embeddings, ``final_logit_softcapping`` and ``output_multiplier`` shape the unary logits
(tanh soft cap, then scale). Fresh heads have 1, none, 1.
"""
from __future__ import annotations

import torch
from torch import nn

from ..dflash.heads import DFlashHeads, DFlashLayer

DEFAULT_BLOCK_SIZE = 8  # z-lab/Qwen3.8-27B-DFlash2, verl-SpeCo's defaults: 7 drafted tokens
DEFAULT_TAPS = 2  # "two-tap dynamic convolution"
DEFAULT_GROUP = 16
DEFAULT_SELECTOR_RANK = 256
DEFAULT_SELECTOR_TOP_K = 16


def check_dflash2_options(taps, group, rank, top_k, hidden: int, vocab: int, block: int) -> None:
    """Refuse, naming each, sizes vLLM or the convolution cannot run: taps outside 1..block (a tap
    reaching before the block's first slot is always zero), a group width that does not divide the
    hidden size (vLLM: "conv_group_size must divide hidden_size"), a selector rank < 1, and a
    candidate count outside 1..vocabulary."""
    def whole(v) -> bool:
        return not isinstance(v, bool) and isinstance(v, int)

    if not whole(taps) or not 1 <= taps <= block:
        raise ValueError(f"heads.conv_kernel_size must be a whole number in 1..{block} (the block size: a tap reaching "
                         f"before the block's first slot reads nothing), got {taps!r}")
    if not whole(group) or group < 1 or hidden % group:
        raise ValueError(f"heads.conv_group_size {group!r} must be a whole number dividing the hidden size {hidden} "
                         "(the convolution's channels form groups of that width sharing one dynamic kernel; vLLM refuses "
                         "a width that does not divide it)")
    if not whole(rank) or rank < 1:
        raise ValueError(f"heads.selector_rank must be a whole number >= 1, got {rank!r}")
    if not whole(top_k) or not 1 <= top_k <= vocab:
        raise ValueError(f"heads.selector_top_k must be a whole number in 1..{vocab} (the vocabulary), got {top_k!r}")


class GroupedConv(nn.Module):
    """The in/out pair of grouped dynamic convolutions around one sublayer (module docstring)."""

    def __init__(self, hidden: int, taps: int, group: int, block: int) -> None:
        super().__init__()
        self.taps, self.group, self.groups, self.block = taps, group, hidden // group, block
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The identity: tap 0 weighs 1, the others 0, and no dynamic part."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """``x`` [B, n, H] (n = whole blocks), ``delta`` [B, n, taps, G]."""
        bsz, n, hidden = x.shape
        blocks = x.view(bsz, n // self.block, self.block, self.groups, self.group)
        coef = self.base_kernel[side].view(1, 1, 1, self.taps, self.groups, self.group).to(x.dtype) \
            + delta.view(bsz, n // self.block, self.block, self.taps, self.groups, 1).to(x.dtype)
        out = coef[:, :, :, 0] * blocks
        for tap in range(1, min(self.taps, self.block)):
            shifted = torch.zeros_like(blocks)
            shifted[:, :, tap:] = blocks[:, :, :-tap]  # zero before the block's first slot
            out = out + coef[:, :, :, tap] * shifted
        return out.reshape(bsz, n, hidden)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's convolved input, and the dynamic kernel its output is convolved with."""
        delta = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
        return self._convolve(x, delta[..., 0, :, :], 0), delta[..., 1, :, :]

    def finish(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, delta, 1)


class DFlash2Layer(DFlashLayer):
    """DFlash's Qwen3 layer with a grouped dynamic convolution around attention and around the MLP."""

    def __init__(self, hidden, num_heads, num_kv_heads, head_dim, intermediate, eps, theta, rope_scaling, max_positions,
                 taps: int, group: int, block: int):
        super().__init__(hidden, num_heads, num_kv_heads, head_dim, intermediate, eps, theta, rope_scaling, max_positions)
        self.attention_conv = GroupedConv(hidden, taps, group, block)
        self.mlp_conv = GroupedConv(hidden, taps, group, block)

    def forward(self, x, positions, context_kv, mask) -> torch.Tensor:
        h, delta = self.attention_conv.prepare(self.input_layernorm(x))
        h = x + self.attention_conv.finish(self.self_attn(h, positions, context_kv, mask), delta)
        m, delta = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(m), delta)


class CandidateSelector(nn.Module):
    """Scores a slot's candidates given the token before them (module docstring)."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab, rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.randn(vocab, rank) * 0.02)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=0.02)

    def reset_parameters(self) -> None:  # the "torch" init scheme (heads/init.py) redraws these too
        nn.init.normal_(self.predecessor_codebook, std=0.02)
        nn.init.normal_(self.successor_codebook, std=0.02)

    def transition(self, states: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """[.., K]: ``<A[previous] * P states, B[candidates]>`` for states [.., H], previous [..],
        candidates [.., K]."""
        context = self.predecessor_codebook[previous] * self.hidden_projection(states.to(self.hidden_projection.weight.dtype))
        return (context.unsqueeze(-2) * self.successor_codebook[candidates]).sum(-1)


class DFlash2Heads(DFlashHeads):
    """DFlash2 drafter (see the module docstring)."""

    head_type = "dflash2"
    default_block_size = DEFAULT_BLOCK_SIZE
    spec_options: tuple[str, ...] = DFlashHeads.spec_options + (
        "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "selector_alpha",
    )
    required_extra: tuple[str, ...] = DFlashHeads.required_extra + (
        "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k",
    )

    def __init__(self, config) -> None:
        ex = config.extra
        block = ex.get("block_size")
        if not isinstance(block, bool) and isinstance(block, int):  # else DFlash's check names it
            check_dflash2_options(ex.get("conv_kernel_size"), ex.get("conv_group_size"), ex.get("selector_rank"),
                                  ex.get("selector_top_k"), config.hidden_size, config.vocab_size, block)
        super().__init__(config)
        for layer in self.layers:  # the DFlash init loop drew the projections: start at the identity
            layer.attention_conv.reset_parameters()
            layer.mlp_conv.reset_parameters()
        self.candidate_selector = CandidateSelector(config.hidden_size, config.vocab_size, ex["selector_rank"],
                                                    ex["selector_top_k"])
        self.input_embedding_scale = float(ex.get("input_embedding_scale", 1.0))
        self.output_multiplier = float(ex.get("output_multiplier", 1.0))
        self.softcap = float(ex.get("final_logit_softcapping") or 0.0)

    def make_layer(self, ex: dict) -> nn.Module:
        return DFlash2Layer(self.config.hidden_size, ex["num_attention_heads"], ex["num_key_value_heads"], ex["head_dim"],
                            ex["intermediate_size"], ex["rms_norm_eps"], ex["rope_theta"], ex.get("rope_scaling"),
                            ex.get("max_position_embeddings"), ex["conv_kernel_size"], ex["conv_group_size"],
                            ex["block_size"])

    @classmethod
    def family_options(cls, target: nn.Module, conv_kernel_size: int | None = None, conv_group_size: int | None = None,
                       selector_rank: int | None = None, selector_top_k: int | None = None,
                       selector_alpha: float | None = None) -> dict:
        alpha = 1.0 if selector_alpha is None else float(selector_alpha)
        if not alpha >= 0.0:
            raise ValueError(f"heads.selector_alpha must be >= 0 (the selector loss's weight), got {selector_alpha!r}")
        return {"conv_kernel_size": DEFAULT_TAPS if conv_kernel_size is None else conv_kernel_size,
                "conv_group_size": DEFAULT_GROUP if conv_group_size is None else conv_group_size,
                "selector_rank": DEFAULT_SELECTOR_RANK if selector_rank is None else selector_rank,
                "selector_top_k": DEFAULT_SELECTOR_TOP_K if selector_top_k is None else selector_top_k,
                "selector_alpha": alpha}

    @property
    def selector_top_k(self) -> int:
        return self.candidate_selector.top_k

    # -- what DFlash2 changes in the backbone's pieces --------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = super().embed(tokens)
        return x if self.input_embedding_scale == 1.0 else x * self.input_embedding_scale

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """The unary logits: the target's LM head, then the soft cap and the multiplier if any."""
        logits = super().logits(state)
        if self.softcap > 0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits if self.output_multiplier == 1.0 else logits * self.output_multiplier

    def candidate_scores(self, states: torch.Tensor, unary: torch.Tensor, previous: torch.Tensor,
                         candidates: torch.Tensor) -> torch.Tensor:
        """[.., K] selector scores of ``candidates`` [.., K] (target ids) whose unary logits are
        ``unary`` [.., K], after ``previous`` [..], for slot states [.., H]."""
        return unary + self.candidate_selector.transition(states, previous, candidates).to(unary.dtype)

    @classmethod
    def card_rows(cls, config: dict) -> list[tuple[str, object]]:
        extra = config.get("extra") or {}
        return super().card_rows(config) + [(key.replace("_", " "), extra.get(key)) for key in
                                            ("block_size", "conv_kernel_size", "conv_group_size", "selector_rank",
                                             "selector_top_k")]
