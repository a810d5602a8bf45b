"""EAGLE-3, ``head_type: eagle3``: the input fuses the hidden states entering three target layers
(default 2, L/2, L-3) through a linear 3d -> d; the attention reads [norm(embedding), norm(fused)]
(2d) while the residual stream carries the fused state; the output goes through the head's own
norm and its own LM head over a reduced draft vocabulary (the N most frequent training tokens,
mapped back to target ids by tensors stored with the weights). Deeper drafts feed the layer's own
output back, and training unrolls those steps (training-time test, methods/eagle/loss.py).

EAGLE 3.1 options of EAGLE-3 heads (``extra.fc_norm``, ``extra.norm_output``; off by default and
absent from heads saved before they existed), computed as vLLM's EAGLE-3 draft computes the config
keys of the same names (vllm/model_executor/models/llama_eagle3.py since vLLM PR #42764; the
speculators config reaches it through vllm/transformers_utils/configs/speculators/algos.py
``update_eagle3``, PR #46488):
- ``fc_norm``: before ``fc``, each target layer's feature (one [H] chunk of the fused input) goes
  through its own RMSNorm: ``fc(cat(norm_0(h_a), norm_1(h_b), ...))``. Weights ``fc_norm.{i}.weight``
  [H], epsilon ``rms_norm_eps``; engine chunk i is the i-th captured layer in layer order (vLLM's
  ``combine_hidden_states``). Only where the draft reads target features: a deeper step reads the
  draft's own state, which never passes through ``fc``.
- ``norm_output``: the state a step hands on is the final ``norm``'s OUTPUT (vLLM returns it as the
  auxiliary hidden state it feeds to the next draft step instead of the pre-norm sum), and the LM
  head reads that state directly (no second norm: logits are ``lm_head(norm(out))`` either way).
  No new tensor: it reuses ``norm.weight`` and its epsilon. The speculators trainer's EAGLE-3 model
  (vllm-project/speculators, ``--fc-norm`` / ``--norm-output``) computes the same.
- ``norm_before_fc`` (``extra.norm_before_fc``): ONE RMSNorm over the whole fused input
  [n*H] (weight ``input_norm.weight``, epsilon ``rms_norm_eps``) before ``fc``, and before
  ``fc_norm`` when both are set: ``fc(fc_norms(input_norm(cat(h_a, h_b, ...))))``, as vLLM's
  ``combine_hidden_states`` orders them. Its weight is in draftheads' feature order, like fc's
  columns; exports permute it with them. The speculators trainer turns it on by default with
  ``norm_output``, so speculators-trained EAGLE-3 checkpoints need it to import. Only where the
  draft reads target features, like ``fc_norm``.

The EAGLE(-1/2) head it extends is in methods/eagle/heads.py; the draft decoder layer in heads/draft_layer.py.
"""
from __future__ import annotations

import torch
from torch import nn

from ...heads.config import HeadsConfig, TargetInfo, target_final_norm, text_config
from ..eagle.heads import EagleHead


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's choice: the inputs of layers 2, L/2 and L-3 (low, middle and high features).
    Shallow targets, where those collide, get three distinct evenly spaced ids instead."""
    layers = [2, num_layers // 2, num_layers - 3]
    if len(set(layers)) == 3 and min(layers) >= 0:
        return layers
    return sorted({min(num_layers, max(0, round(i * num_layers / 4))) for i in (1, 2, 3)})


class Eagle3Head(EagleHead):
    """EAGLE-3: fused multi-layer features, its own norm + LM head over a reduced vocabulary.

    ``draft_to_target`` [N] (target id of each draft index) and ``target_to_draft`` [V] (draft
    index of each target id, -1 outside) are buffers saved in model.safetensors. They are set from
    training-token counts (`set_draft_vocab`) before training; heads whose mapping was never set
    are refused when drafting, never silently treated as an identity."""

    head_type = "eagle3"
    own_draft_vocabulary = True
    spec_options = ("feature_layers", "draft_vocab_size", "loss", "fc_norm", "norm_output", "norm_before_fc")
    init_options = ("lm_head_init",)  # see start_lm_head_from_target
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
        self.embed_norm = nn.RMSNorm(d, eps=eps)
        self.hidden_norm = nn.RMSNorm(d, eps=eps)
        self.norm = nn.RMSNorm(d, eps=eps)
        fc_norm, self.norm_output = (_flag(ex, key) for key in ("fc_norm", "norm_output"))
        # EAGLE 3.1 (module docstring): one RMSNorm per fused target layer, in feature_layers order.
        self.fc_norm = nn.ModuleList([nn.RMSNorm(d, eps=eps) for _ in self.feature_layers]) if fc_norm else None
        # norm_before_fc (module docstring): one RMSNorm over the whole fused input, in feature_layers order.
        self.input_norm = nn.RMSNorm(self.fc.weight.shape[1], eps=eps) if _flag(ex, "norm_before_fc") else None
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
            target, num_heads, num_layers, lm_head, feature_layers=feature_layers, draft_vocab_size=size, **extra
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

    @torch.no_grad()
    def start_lm_head_from_target(self, target: nn.Module) -> bool:
        """Start the own LM head as the target's rows for the draft vocabulary (set it first) and the
        final norm as the target's (`heads.lm_head_init: target`): a fresh head then scores a state
        as the target scores its last hidden state, and training adapts the draft layer to that
        head instead of learning both from a random draw. Returns whether the norm gain was copied
        (a target without a final norm of [hidden] gains keeps the draft's own)."""
        self.check_vocab_mapping()
        weight = target.get_output_embeddings().weight
        ids = self.draft_to_target.to(weight.device)
        self.lm_head.weight.copy_(weight[ids].to(self.lm_head.weight))
        gain = getattr(target_final_norm(target), "weight", None)
        if not isinstance(gain, torch.Tensor) or tuple(gain.shape) != tuple(self.norm.weight.shape):
            return False
        self.norm.weight.copy_(gain.to(self.norm.weight))
        return True

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

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[.., n*H] target features -> [.., H] fused state; with ``norm_before_fc`` the whole input
        is normalised first, then with ``fc_norm`` each layer's [H] chunk by its own norm (EAGLE 3.1),
        the order vLLM's ``combine_hidden_states`` applies them in. Training's unrolled steps and
        every proposer reach the features only through here."""
        features = features.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def first_input(self, features, tokens):
        g = self.fuse(features)
        return g, torch.cat([self.embed_norm(self.embed(tokens)), self.hidden_norm(g)], dim=-1)

    def next_input(self, state, tokens):
        """EAGLE-3 feeds back its own output (not a target-feature prediction)."""
        return state, torch.cat([self.embed_norm(self.embed(tokens)), self.hidden_norm(state)], dim=-1)

    def run_layers(self, *args, **kwargs):
        """The decoder layers; with ``norm_output`` the state handed on (to `logits` and to the next
        step's `next_input`, in training's unrolled steps and in every proposer alike) is the final
        norm's output, as vLLM feeds it (EAGLE 3.1)."""
        state, kv = super().run_layers(*args, **kwargs)
        return (self.norm(state) if self.norm_output else state), kv

    def logits(self, state):
        """Draft-vocabulary logits of a state from `run_layers` (already normed with ``norm_output``)."""
        return self.lm_head(state if self.norm_output else self.norm(state))

    def vocab_ids(self):
        return self.draft_to_target



def _flag(extra: dict, key: str) -> bool:
    """A boolean head option; absent (heads saved before it existed) means off."""
    value = extra.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"eagle3 {key} must be true or false, got {value!r}")
    return value


def check_feature_layers(layers: list[int], num_layers: int) -> None:
    bad = [i for i in layers if not isinstance(i, int) or not 0 <= i < num_layers + 1]
    if bad:
        raise ValueError(
            f"feature layer ids {bad} are outside the target's layer range: it has {num_layers} layers, so valid ids "
            f"are 0..{num_layers} (hidden state entering layer i; {num_layers} = the final output)"
        )
