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

The draft decoder layer itself is in draft_layer.py.
"""
from __future__ import annotations

import torch
from torch import nn

from .base import DraftHeads
from .config import HeadsConfig, TargetInfo, target_final_norm, text_config
from .draft_layer import DraftLayer, check_sliding_window, rope_settings
from .unrolled_attention import UnrolledStepMask


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
