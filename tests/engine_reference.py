"""What the engines compute from a draft folder, written from their documented layouts (not from
draftheads): vLLM's MedusaModel, EAGLE-1 (llama_eagle.py) and EAGLE-3 (llama_eagle3.py) forwards,
and SGLang's EAGLE-1/EAGLE-3 (llama_eagle.py / llama_eagle3.py, sglang 0.5.23), for one sequence
with causal attention. Tests compare draftheads' heads with these on exported folders.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def read_folder(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((Path(path) / "config.json").read_text()), load_file(str(Path(path) / "model.safetensors"))


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = positions.float()[:, None] * inv  # [n, hd/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin  # neox style (Llama in vLLM / SGLang)


def attention(t: dict, p: str, x: torch.Tensor, positions: torch.Tensor, cfg: dict) -> torch.Tensor:
    n = x.shape[0]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (x @ t[f"{p}.self_attn.q_proj.weight"].T).view(n, heads, hd).transpose(0, 1)
    k = (x @ t[f"{p}.self_attn.k_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    v = (x @ t[f"{p}.self_attn.v_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    q, k = _rope(q, positions, theta), _rope(k, positions, theta)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = (q @ k.transpose(1, 2)) / hd**0.5
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, heads * hd)
    return out @ t[f"{p}.self_attn.o_proj.weight"].T


def mlp(t: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ t[f"{p}.mlp.gate_proj.weight"].T) * (x @ t[f"{p}.mlp.up_proj.weight"].T)) @ t[f"{p}.mlp.down_proj.weight"].T


# -- Medusa (vLLM) -------------------------------------------------------------------------------------
def medusa_logits(cfg: dict, t: dict, hidden: torch.Tensor) -> list[torch.Tensor]:
    """vLLM ResidualBlock: x + SiLU(Wx (+ b if medusa_fc_bias)); lm_heads.{h} or one shared lm_heads.0."""
    out = []
    for h in range(cfg["num_heads"]):
        x = hidden
        for l in range(cfg["num_hidden_layers"]):
            b = t[f"blocks.{h}.layers.{l}.bias"] if cfg.get("medusa_fc_bias", False) else 0
            x = x + F.silu(x @ t[f"blocks.{h}.layers.{l}.weight"].T + b)
        w = t["lm_heads.0.weight"] if cfg.get("original_lm_head", False) else t[f"lm_heads.{h}.weight"]
        out.append(x @ w.T)
    return out


# -- EAGLE-1 (vLLM: fc without bias; SGLang: fc with bias) ---------------------------------------------
def eagle1_forward(cfg: dict, t: dict, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                   fc_bias: bool) -> torch.Tensor:
    """Returns the draft's output hidden state (fed back as the next step's hidden; the target's
    LM head reads it directly: no final norm)."""
    x = torch.cat([embeds, hidden], -1) @ t["fc.weight"].T
    if fc_bias:
        x = x + t["fc.bias"]
    eps = cfg["rms_norm_eps"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}"
        a_in = x if i == 0 else rms(x, t[f"{p}.input_layernorm.weight"], eps)  # layer 0: no input_layernorm
        x = x + attention(t, p, a_in, positions, cfg)
        x = x + mlp(t, p, rms(x, t[f"{p}.post_attention_layernorm.weight"], eps))
    return x


# -- EAGLE-3 (vLLM via speculators, SGLang midlayer) ---------------------------------------------------
def eagle3_fuse(cfg: dict, t: dict, aux: torch.Tensor) -> torch.Tensor:
    """vLLM's ``combine_hidden_states``: the captured states [n, k*H] (layer order) through ``fc``;
    with ``fc_norm`` (EAGLE 3.1) chunk j first goes through RMSNorm ``fc_norm.{j}.weight``; with
    ``norm_before_fc`` the whole [n, k*H] input goes through RMSNorm ``input_norm.weight`` before that."""
    if cfg.get("norm_before_fc", False):
        aux = rms(aux, t["input_norm.weight"], cfg["rms_norm_eps"])
    if cfg.get("fc_norm", False):
        chunks = aux.chunk(sum(1 for k in t if k.startswith("fc_norm.")), dim=-1)
        aux = torch.cat([rms(c, t[f"fc_norm.{j}.weight"], cfg["rms_norm_eps"]) for j, c in enumerate(chunks)], -1)
    return aux @ t["fc.weight"].T


def eagle3_forward(cfg: dict, t: dict, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                   *, layer0: str, later_norm: str, norm_before_residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden``: `eagle3_fuse` of the captured states on the first step, after that what the
    previous step returned. Returns (logits over the target vocabulary, -inf outside the draft
    vocabulary; the state fed to the next step: the pre-norm output, or with ``norm_output``
    (EAGLE 3.1) the final norm's output, vLLM's auxiliary hidden state)."""
    eps = cfg["rms_norm_eps"]
    p = layer0
    normed = rms(hidden, t[f"{p}.hidden_norm.weight"], eps)
    residual = normed if norm_before_residual else hidden
    a_in = torch.cat([rms(embeds, t[f"{p}.input_layernorm.weight"], eps), normed], -1)
    x = residual + attention(t, p, a_in, positions, cfg)
    x = x + mlp(t, p, rms(x, t[f"{p}.post_attention_layernorm.weight"], eps))
    for i in range(1, cfg["num_hidden_layers"]):
        p = f"layers.{i}"
        x = x + attention(t, p, rms(x, t[f"{p}.{later_norm}.weight"], eps), positions, cfg)
        x = x + mlp(t, p, rms(x, t[f"{p}.post_attention_layernorm.weight"], eps))
    normed = rms(x, t["norm.weight"], eps)
    logits = normed @ t["lm_head.weight"].T
    vocab = cfg["vocab_size"]
    if "d2t" in t:
        full = torch.full((x.shape[0], vocab), float("-inf"), dtype=logits.dtype)
        full[:, torch.arange(t["d2t"].numel()) + t["d2t"]] = logits  # target id = i + d2t[i]
        logits = full
    return logits, (normed if cfg.get("norm_output", False) else x)


# -- P-EAGLE (vLLM: EAGLE-3 + parallel_drafting, a speculators "peagle" folder) ------------------------
def peagle_draft_logits(cfg: dict, t: dict, aux: torch.Tensor, next_ids: torch.Tensor, depth: int,
                        mask_hidden_normed: bool = True, **kw) -> torch.Tensor:
    """vLLM's one parallel-drafting forward after a root: the committed positions (captured states
    ``aux`` [m, k*H] in layer order through `eagle3_fuse`, tokens ``next_ids`` [m] = token t+1 of
    each, the root last) then ``depth - 1`` mask slots (token ``cfg["mask_token_id"]``, hidden state
    ``combine_hidden_states(mask_hidden)``, which vLLM computes once at load and writes over those
    slots' fused states: with ``norm_before_fc`` mask_hidden goes through ``input_norm`` too). Token
    embeddings are the draft's own ``embed_tokens.weight``. Returns the logits [depth, V] of the
    root's slot and the mask slots. ``mask_hidden_normed=False``: the mask state skips input_norm
    (what vLLM does NOT do; tests show the difference is visible)."""
    fused = eagle3_fuse(cfg, t, aux)
    mask_cfg = cfg if mask_hidden_normed else {**cfg, "norm_before_fc": False}
    mask_state = eagle3_fuse(mask_cfg, t, t["mask_hidden"].reshape(1, -1))
    m = next_ids.numel()
    ids = torch.cat([next_ids, torch.full((depth - 1,), int(cfg["mask_token_id"]), dtype=next_ids.dtype)])
    hidden = torch.cat([fused, mask_state.expand(depth - 1, -1)])
    logits, _ = eagle3_forward(cfg, t, t["embed_tokens.weight"][ids], hidden, torch.arange(m + depth - 1), **kw)
    return logits[m - 1 :]
