"""The EAGLE draft layer's norm and rotary embedding match the target's own."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.heads.draft_layer import DraftLayer

from inference_utils import tiny_target

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def previous_rms_norm(weight: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The hand-written norm the draft layer used before torch.nn.RMSNorm (upcast, normalise,
    cast back, scale)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_rms_norm_matches_the_previous_norm(x_dtype, w_dtype):
    layer = DraftLayer(32, 64, 4, 2, 8, 48, 1e-5, 10000.0, input_norm=True).to(w_dtype)
    torch.manual_seed(0)
    with torch.no_grad():
        layer.input_layernorm.weight.copy_(torch.randn(64))
    x = (torch.randn(3, 5, 64) * 4).to(x_dtype)
    ours = layer.input_layernorm(x)
    ref = previous_rms_norm(layer.input_layernorm.weight, x, 1e-5)
    assert ours.dtype == ref.dtype
    tol = 0 if x_dtype == torch.float32 else 1e-2  # bf16: one rounding of the last bit at most
    torch.testing.assert_close(ours.float(), ref.float(), rtol=tol or 1e-6, atol=tol or 1e-6)


@pytest.mark.parametrize("rope", [None, LLAMA3], ids=["default", "llama3"])
def test_draft_layer_rotary_matches_the_targets(rope):
    overrides = {"rope_theta": 500000.0} if rope is None else {"rope_parameters": {**LLAMA3, "rope_theta": 500000.0}}
    target = tiny_target("llama", head_dim=16, **overrides)
    head = dh.EagleHead.for_target(target)
    layer = head.layers[0]
    positions = torch.arange(0, 250, 7)[None]
    x = torch.zeros(1, positions.shape[1], 16)
    want_cos, want_sin = target.model.rotary_emb(x, positions)
    with torch.no_grad():  # the cached table (drafting) and the direct computation (training)
        got_cos, got_sin = layer._rotary(positions, torch.float32)
    torch.testing.assert_close(got_cos, want_cos, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_sin, want_sin, rtol=1e-5, atol=1e-6)
    cos, sin = layer._rotary(positions, torch.float32)
    torch.testing.assert_close(cos, want_cos, rtol=1e-5, atol=1e-6)
    if rope is not None:  # the scaling is real here: plain RoPE would differ
        plain = dh.EagleHead.for_target(tiny_target("llama", head_dim=16, rope_theta=500000.0)).layers[0]
        with torch.no_grad():
            assert not torch.allclose(plain._rotary(positions, torch.float32)[1], want_sin, atol=1e-3)


def test_rope_scaling_survives_save_and_load(tmp_path):
    target = tiny_target("llama", head_dim=16, rope_parameters={**LLAMA3, "rope_theta": 500000.0})
    head = dh.EagleHead.for_target(target)
    assert head.config.extra["rope_scaling"]["rope_type"] == "llama3"
    loaded = dh.load_heads(head.save_pretrained(tmp_path / "h"), target=target)
    torch.testing.assert_close(loaded.layers[0].inv_freq, head.layers[0].inv_freq, rtol=0, atol=0)
    plain = dh.EagleHead.for_target(tiny_target("llama", head_dim=16))
    assert "rope_scaling" not in plain.config.extra  # plain targets: config.json as before


def test_eagle_lm_head_argument_is_checked_not_ignored():
    target = tiny_target("llama")
    assert dh.EagleHead.for_target(target, lm_head="shared").config.lm_head == "shared"
    with pytest.raises(ValueError, match=r"eagle heads always use lm_head 'shared'; got lm_head='own'"):
        dh.EagleHead.for_target(target, lm_head="own")
    with pytest.raises(ValueError, match=r"eagle3 heads always use lm_head 'own'"):
        dh.Eagle3Head.for_target(target, lm_head="shared", draft_vocab_size=8)
