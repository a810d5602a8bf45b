"""Training's unrolled draft steps attend tile by tile (`UnrolledStepMask`): the same attention as
the dense [n, (k+1) n] mask, for packed windows, padding and grouped-query heads, at a fraction of
the keys; and EAGLE-3's loss trains the same through it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import draftheads as dh
from draftheads.heads import unrolled_attention
from draftheads.heads.unrolled_attention import UnrolledStepMask
from draftheads.methods.eagle.loss import EagleLoss, _UnrolledBatch
from draftheads.train.head_loss import LossBatch
from conftest import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _packed_batch(seq: int = 61):
    """Two rows: three packed documents, and one document with right padding."""
    ids = torch.randint(4, 100, (2, seq), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(20), torch.arange(30), torch.arange(seq - 50)])[None]
    positions = torch.cat([positions, torch.arange(seq)[None]])
    attention = torch.ones_like(ids)
    attention[1, 45:] = 0
    return ids, attention, positions


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("packed", [False, True])
def test_tiles_attend_exactly_where_the_dense_mask_does(k, packed, monkeypatch):
    ids, attention, positions = _packed_batch()
    batch = _UnrolledBatch(ids, None, attention, positions if packed else None)
    n, g = batch.n, torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, n, 8, generator=g)
    keys, values = torch.randn(2, 2, (k + 1) * n, 8, generator=g), torch.randn(2, 2, (k + 1) * n, 8, generator=g)
    seen = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(unrolled_attention.F, "scaled_dot_product_attention",
                        lambda q_, k_, *a, **kw: seen.append(q_.shape[2] * k_.shape[2]) or sdpa(q_, k_, *a, **kw))
    mask = UnrolledStepMask(batch.causal, k, batch.starts, tile=16)  # 16 does not divide n = 60
    tiled = mask.attend(q, keys, values, enable_gqa=True)
    dense = sdpa(q, keys, values, attn_mask=mask.dense()[:, None], enable_gqa=True)
    torch.testing.assert_close(tiled, dense, rtol=1e-5, atol=1e-6)
    assert sum(seen) < 0.7 * n * (k + 1) * n, "the tiles must skip most masked keys"


def test_eagle3_trains_the_same_through_the_tiles(monkeypatch):
    torch.manual_seed(0)
    target = make_tiny_model("llama")
    ids, attention, positions = _packed_batch()
    with torch.no_grad():
        out = target(ids, position_ids=positions, output_hidden_states=True)

    def step(tiled: bool):
        torch.manual_seed(0)
        heads = dh.Eagle3Head.for_target(target, num_heads=3, draft_vocab_size=48)
        heads.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0))
        heads.bind_target(target)
        if tiled:
            monkeypatch.setattr(unrolled_attention, "TILE", 16)  # several tiles over n = 60
        else:
            monkeypatch.setattr(_UnrolledBatch, "mask", lambda self, k: UnrolledStepMask(self.causal, k, self.starts).dense())
        feats = torch.cat([out.hidden_states[i] for i in heads.feature_layers], -1)
        loss = EagleLoss()(heads, LossBatch(ids, attention_mask=attention, position_ids=positions,
                                                 hidden=out.hidden_states[-1], features=feats)).loss
        loss.backward()
        monkeypatch.undo()
        return loss.detach(), {n: p.grad for n, p in heads.named_parameters() if p.grad is not None}

    (loss, grads), (dense_loss, dense_grads) = step(True), step(False)
    torch.testing.assert_close(loss, dense_loss, rtol=1e-6, atol=1e-6)
    for name in dense_grads:
        torch.testing.assert_close(grads[name], dense_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_long_windows_get_wider_tiles():
    """Autograd keeps every tile's key slice (~n^2 / (2 x tile) rows): past MAX_TILES tiles of TILE
    rows the tile widens, so that memory stays within a few windows' worth of keys."""
    def tile(n):
        return UnrolledStepMask(torch.ones(1, n, n, dtype=torch.bool).tril(), 1, starts=[0] * n).tile

    assert tile(300) == unrolled_attention.TILE == 128
    assert tile(unrolled_attention.MAX_TILES * 128) == 128
    assert tile(2048) == 256 and tile(2049) == 257
