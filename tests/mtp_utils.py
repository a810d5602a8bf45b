"""Tiny targets that ship MTP layers the way real checkpoints do, for the MTP tests.

transformers saves a Qwen3.5 without its MTP layer (it never builds one), so the folder is saved
first and the MTP tensors are added to its safetensors afterwards, under the exact names a real
Qwen3.5 checkpoint uses: the names vLLM's ``qwen3_5_mtp.py`` loads (`QWEN35_MTP_NAMES`, read off its
``Qwen3_5MultiTokenPredictor``: ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``norm``
and a full-attention ``Qwen3_5DecoderLayer`` under ``layers.0``, all under ``mtp.``). DeepSeek-V3
keeps its MTP layer as decoder layer ``num_hidden_layers`` of the model (`DEEPSEEK_MTP_NAMES`:
``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``, the decoder layer, as vLLM's
``deepseek_mtp.py`` loads them).

The MTP weights drafted with are "target-like": the layer is the target's own last attention layer
applied to the (normed) embedding of the next token, fc picking the embedding, with noise in every
tensor. That drafts the target's next token often but not always, without training (a test must
not spend minutes on it), and every tensor changes what it drafts.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 256

#: The tensors of a Qwen3.5 (dense) MTP layer, as vLLM's qwen3_5_mtp.py loads them.
QWEN35_MTP_NAMES = (
    "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.self_attn.k_proj.weight",
    "mtp.layers.0.self_attn.v_proj.weight", "mtp.layers.0.self_attn.o_proj.weight",
    "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.self_attn.k_norm.weight",
    "mtp.layers.0.mlp.gate_proj.weight", "mtp.layers.0.mlp.up_proj.weight", "mtp.layers.0.mlp.down_proj.weight",
)

QWEN35 = dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
              linear_num_key_heads=2, linear_conv_kernel_dim=4, mtp_num_hidden_layers=1)


def qwen35_config(width: int = 64, head_dim: int = 16, linear_head_dim: int = 16, **overrides):
    """A tiny Qwen3.5 text config (one Gated DeltaNet layer, one gated-attention layer)."""
    values = dict(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=head_dim, linear_key_head_dim=linear_head_dim,
                  linear_value_head_dim=linear_head_dim, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, tie_word_embeddings=False, initializer_range=0.03, **QWEN35)
    values.update(overrides)
    return AutoConfig.for_model("qwen3_5_text", **values)


def save_with_mtp(config, path: Path, seed: int = 0, noise: float = 0.05, tokenizer=None, mtp: bool = True) -> Path:
    """Save a random model of ``config`` to ``path``, then add a target-like MTP layer (module
    docstring) to its safetensors under the checkpoint's own names (``mtp=False``: none)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if mtp:
        add_qwen_mtp(model, path, seed=seed, noise=noise)
    return path


def attention_layer_index(config) -> int:
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return max(i for i, t in enumerate(types) if t == "full_attention")


def target_like_layer(model, noise: float, gen: torch.Generator, state: dict) -> dict[str, torch.Tensor]:
    """The target's last attention layer's tensors as its checkpoint ``state`` names them (experts
    one by one), names inside a decoder layer, with noise."""
    index = attention_layer_index(model.config)
    prefix = f"model.layers.{index}."
    out = {}
    for name, value in state.items():
        if name.startswith(prefix):
            out[name[len(prefix):]] = value + noise * value.abs().mean().clamp(min=0.05) * torch.randn(value.shape, generator=gen)
    return out


def fusion(width: int, noise: float, gen: torch.Generator) -> torch.Tensor:
    """fc over [embedding, hidden]: the embedding through, a little of the hidden state."""
    fc = torch.zeros(width, 2 * width)
    fc[:, :width] = torch.eye(width)
    return fc + noise * torch.randn(fc.shape, generator=gen) / width**0.5


def add_qwen_mtp(model, path: Path, seed: int = 0, noise: float = 0.05) -> None:
    """``mtp.*`` tensors (vLLM's qwen3_5_mtp names) added to ``path``'s safetensors."""
    gen = torch.Generator().manual_seed(seed + 100)
    width = model.config.hidden_size
    state = load_file(path / "model.safetensors")
    for name, value in target_like_layer(model, noise, gen, state).items():
        state[f"mtp.layers.0.{name}"] = value
    state["mtp.fc.weight"] = fusion(width, noise, gen)
    final = model.state_dict()["model.norm.weight"]
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        state[f"mtp.{name}.weight"] = noise * torch.randn(width, generator=gen)  # zero-centred norms: gain 1 + w
    state["mtp.norm.weight"] = final + noise * torch.randn(width, generator=gen)
    save_file({k: v.contiguous() for k, v in state.items()}, path / "model.safetensors", metadata={"format": "pt"})


def load(path: Path, dtype=torch.float32):
    """The target read back from its folder (so heads record the folder), greedy to full length."""
    target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    target.generation_config.eos_token_id = None
    return target


def tiny_qwen35(path: Path, **options):
    """A tiny Qwen3.5 folder that ships an MTP layer, and the target loaded from it."""
    save_with_mtp(qwen35_config(), path, **options)
    return load(path)


def prompts(n: int, length: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def greedy(target, ids: torch.Tensor, new: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                           pad_token_id=0)


#: Qwen3-Next's mixture of experts, tiny (its MTP layer has experts too).
QWEN3_NEXT = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                  num_nextn_predict_layers=1)


def margined(path: Path, model_type: str = "qwen3_5_text", keep: float = 0.5, seed: int = 0, scale: float = 0.1) -> Path:
    """A Qwen3.5 or Qwen3-Next (vocab = width = 128) whose every greedy choice, the target's and its MTP layer's,
    wins by a wide logit margin, for engines that compute in bf16 with kernels of their own (vLLM's
    CPU build): near ties there would make two correct engines disagree.

    The embedding rows are orthonormal; the LM head maps row x to token pi(x) (a fixed permutation),
    so the target continues x with pi(x) by a margin of ~sqrt(128) logits; its layers add to the
    residual only a little (their output projections scaled by ``scale``), which moves no argmax.
    The MTP layer's fc passes the next token's embedding on for a ``keep`` share of the vocabulary
    (it then drafts pi(x): right) and another token's for the rest (wrong), so its drafts are right
    about half the time at each depth, each by the same margin; its block is the target's attention
    layer (outputs scaled likewise). What this cannot show is a block tensor lost in an export: the
    margins hide its small contribution (test_mtp_transformers.py checks those in fp32)."""
    config = qwen35_config(width=128, head_dim=32, linear_head_dim=128, vocab_size=128)
    if model_type != "qwen3_5_text":
        values = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "mtp_num_hidden_layers",
                                                                          "transformers_version", "architectures")}
        config = AutoConfig.for_model(model_type, **{**values, **QWEN3_NEXT})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    d = config.hidden_size
    basis = torch.linalg.qr(torch.randn(d, d, generator=gen))[0]  # orthonormal rows: token x's embedding
    perm = torch.randperm(d, generator=gen)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(basis)
        model.lm_head.weight.copy_(basis[perm.argsort()])  # row y scores embedding pi^-1(y): x -> pi(x)
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj", "out_proj.weight")):
                param.mul_(scale)
    model.save_pretrained(path)
    wrong = torch.randperm(d, generator=gen)
    passed = torch.rand(d, generator=gen) < keep
    tau = torch.where(passed, torch.arange(d), wrong)  # the embedding fc hands on for token x
    state = load_file(path / "model.safetensors")
    for name, value in target_like_layer(model, 0.0, gen, state).items():
        state[f"mtp.layers.0.{name}"] = value
    fc = torch.zeros(d, 2 * d)
    fc[:, :d] = basis[tau].T @ basis  # enorm(e_x) -> e_tau(x)
    state["mtp.fc.weight"] = fc
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        state[f"mtp.{name}.weight"] = torch.zeros(d)  # zero-centred: gain 1
    save_file({k: v.contiguous() for k, v in state.items()}, path / "model.safetensors", metadata={"format": "pt"})
    return path
