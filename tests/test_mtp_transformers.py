"""MTP heads accept, step by step, what transformers' own MTP drafting accepts: ``generate(use_mtp=True)``
(`MTPCandidateGenerator`, its `MtpModel` reading the layer from the target's safetensors), greedy,
one drafted token per step (transformers drafts one per MTP layer), on the same prompts.

transformers runs MTP for models whose config counts the layers in ``num_mtp_layers``: Mellum
(Qwen's checkpoint layout, ``mtp.*``) and DeepSeek-V3 (its layer is decoder layer 61). Qwen3.5
counts it in ``mtp_num_hidden_layers``, which transformers does not read, so that test sets
``num_mtp_layers`` / ``mtp_layer_types`` on the config first: the drafting, its cache and the
acceptance are still transformers' own.

The DeepSeek-V3 and Mellum layers are written by draftheads' own export writer (a layer built from
the target's own last layer, perturbed, in the family's checkpoint layout, into the target's folder): transformers
loading them and accepting what draftheads accepts checks the export's names (MLA, experts split
back per expert) as well as the drafting.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

import draftheads as dh
from draftheads.methods.mtp.heads import MtpHead

import mtp_utils as mu

NEW = 30
ONE = {"total_tokens": 2, "depth": 1, "top_k": 1}  # one drafted token per step, as transformers drafts


def transformers_matches(target, ids: torch.Tensor, monkeypatch) -> tuple[list[int], list[int]]:
    """``generate(use_mtp=True)``'s tokens and its accepted drafts per verify step."""
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    matches: list[int] = []
    original = MTPCandidateGenerator.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        matches.append(int(num_matches))
        return original(self, input_ids, scores, num_matches)

    monkeypatch.setattr(MTPCandidateGenerator, "update_candidate_strategy", record)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                          min_new_tokens=NEW, use_mtp=True, pad_token_id=0)
    monkeypatch.undo()
    # The first call follows transformers' prefill, which drafts nothing (draftheads' prefill neither).
    return out[0, ids.shape[1]:].tolist(), matches[1:]


def draftheads_matches(target, heads, ids: torch.Tensor) -> tuple[list[int], list[int]]:
    decoder = dh.SpeculativeDecoder(target, heads, tree=ONE, draft_budget=None, batch_plan=None)
    out = decoder.generate(ids, max_new_tokens=NEW, eos_token_id=[])
    return out.sequences[0, ids.shape[1]:].tolist(), [n - 1 for n in out.accept_lengths]


def check_same_acceptance(target, heads, monkeypatch, rows: int = 4) -> None:
    accepted = steps = 0
    for ids in mu.prompts(rows, seed=11).split(1):
        want = mu.greedy(target, ids, NEW)[0, ids.shape[1]:].tolist()
        tokens, theirs = transformers_matches(target, ids, monkeypatch)
        ours_tokens, ours = draftheads_matches(target, heads, ids)
        assert ours_tokens == want and tokens == want
        assert ours == theirs[: len(ours)] and len(theirs) - len(ours) <= 1, (ours, theirs)  # at most a last, empty step
        accepted, steps = accepted + sum(ours), steps + len(ours)
    assert 0.1 * steps < accepted < steps, f"{accepted} of {steps} drafts accepted: the comparison would be vacuous"


def test_qwen35_mtp_accepts_what_transformers_mtp_accepts(tmp_path, monkeypatch):
    target = mu.load(mu.save_with_mtp(mu.qwen35_config(), tmp_path / "qwen35"))
    heads = dh.load_heads("builtin-mtp", target=target)
    text = target.config.get_text_config()
    text.num_mtp_layers, text.mtp_layer_types = 1, ["full_attention"]  # what transformers counts (module docstring)
    check_same_acceptance(target, heads, monkeypatch)


def exported_into(heads, folder: Path) -> None:
    """The heads' layer in their family's checkpoint layout (the export's writer; Mellum has no vLLM
    drafter, so not through ``draftheads export``), added to ``folder``'s safetensors."""
    from draftheads.export.common import verifier_config
    from draftheads.methods.mtp.export import checkpoint_tensors
    from draftheads.methods.mtp.families import family_of

    family = family_of(heads.config.target.model_type)
    written = checkpoint_tensors(heads, family, str(folder), verifier_config(str(folder)))
    state = load_file(folder / "model.safetensors")
    layer = {k: v for k, v in written.items() if k not in state}
    assert layer, "the export wrote no MTP tensors"
    save_file({**state, **layer}, folder / "model.safetensors", metadata={"format": "pt"})


def target_like_heads(target, seed: int = 0, noise: float = 0.05) -> MtpHead:
    """An MTP layer that is the target's own last layer applied to the next token's embedding (fc
    picks the embedding; the final norm is the target's), noise in every tensor: it drafts the
    target's next token often but not always, untrained, and every tensor changes its drafts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the target ships no MTP layer yet: a fresh one, as said
        heads = MtpHead.for_target(target)
    layer = heads.layers[0]
    d = heads.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        mine = layer.mtp_block.state_dict()  # DeepSeek's MTP block has experts where its last layer is dense
        layer.mtp_block.load_state_dict({k: v for k, v in target.model.layers[-1].state_dict().items()
                                         if k in mine and mine[k].shape == v.shape}, strict=False)
        layer.eh_proj.weight.zero_()
        rms = target.get_input_embeddings().weight.pow(2).mean().sqrt()  # the residual at the scale the target's has
        layer.eh_proj.weight[:, :d] = rms * torch.eye(d)
        layer.post_norm.weight.copy_(target.model.norm.weight)
        for param in heads.parameters():
            scale = float(param.detach().abs().mean()) or 0.02
            param.add_(noise * scale * torch.randn(param.shape, generator=gen))
    return heads.eval()


def native_case(tmp_path: Path, model_type: str, quiet_layers: bool = False, **values):
    """A tiny random ``model_type`` target whose config counts one MTP layer and whose checkpoint
    holds a target-like layer, written by draftheads; the target reloaded and the heads read back.
    ``quiet_layers``: every decoder layer but the last is the identity (its output projections
    zero), so that a target of many layers still computes what one layer can mimic."""
    torch.manual_seed(0)
    base = dict(vocab_size=mu.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                tie_word_embeddings=False, initializer_range=0.02, num_mtp_layers=1)
    config = AutoConfig.for_model(model_type, **{**base, **values})
    folder = tmp_path / model_type
    model = AutoModelForCausalLM.from_config(config).eval()
    if quiet_layers:
        with torch.no_grad():
            for layer in model.model.layers[:-1]:
                for name, param in layer.named_parameters():
                    if name.endswith(("o_proj.weight", "down_proj.weight")):
                        param.zero_()
    model.save_pretrained(folder)
    target = mu.load(folder)
    exported_into(target_like_heads(target), folder)
    target = mu.load(folder)
    heads = dh.load_heads("builtin-mtp", target=target)
    assert heads.config.extra["origin"] == "shipped"
    return target, heads


def test_mellum_mtp_with_a_sliding_window_accepts_what_transformers_accepts(tmp_path, monkeypatch):
    """Mellum keeps its MTP layer in Qwen's layout; this one attends through an 8-token window."""
    target, heads = native_case(tmp_path, "mellum", num_hidden_layers=2, head_dim=16,
                                layer_types=["sliding_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
                                mtp_layer_types=["sliding_attention"], mtp_mlp_layer_types=["dense"], sliding_window=8)
    assert heads.sliding_window == 8
    check_same_acceptance(target, heads, monkeypatch)


def test_deepseek_v3_mtp_accepts_what_transformers_accepts(tmp_path, monkeypatch):
    """MLA attention (keys and values of different widths) and a mixture of experts in the MTP block;
    61 main layers, as transformers finds DeepSeek-V3's MTP layer at model.layers.61 only (the last one
    has experts too, so that the target-like layer copies it whole)."""
    target, heads = native_case(tmp_path, "deepseek_v3", quiet_layers=True, num_hidden_layers=61, first_k_dense_replace=60, num_key_value_heads=4,
                                n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                                qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1)
    assert "experts" in " ".join(heads.state_dict())
    check_same_acceptance(target, heads, monkeypatch, rows=2)
