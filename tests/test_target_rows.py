"""`TargetRows` (train/target_loss.py): the target's labels of a window computed once per position.

EAGLE's unrolled steps, P-EAGLE's depths and DFlash's overlapping blocks score many draft rows
against the same window positions. The losses must run the target's LM head over each position
once (not once per scoring row) and train exactly as when every chunk computes its own rows'
labels, which is what they fall back to when the table would not fit in memory."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.train import target_loss
from draftheads.train.model import TargetWithHeads
from draftheads.train.target_loss import TargetRows
from conftest import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BATCH, SEQ = 2, 24


def _heads(kind: str, target):
    torch.manual_seed(0)
    vocab = target.config.vocab_size
    if kind.endswith("+greedy_path"):  # the greedy path reads the target's greedy tokens from the same table
        heads = _heads(kind.removesuffix("+greedy_path"), target)
        heads.config.extra["greedy_path"] = True
        return heads
    if kind == "eagle":
        return dh.EagleHead.for_target(target, num_heads=3).eval()  # eval: no feature noise
    if kind == "dflash":
        return dh.DFlashHeads.for_target(target, num_layers=1, block_size=4, mask_token_id=vocab - 1, num_anchors=16)
    if kind == "eagle3":
        heads = dh.Eagle3Head.for_target(target, num_heads=3, draft_vocab_size=48)
    else:
        heads = dh.PEagleHead.for_target(target, num_heads=3, num_layers=1, draft_vocab_size=48, mask_token_id=0)
    heads.set_draft_vocab(torch.arange(vocab).flip(0).index_fill(0, torch.tensor([0]), 0))
    return heads


def _step(kind: str, table: bool, monkeypatch):
    """(loss, gradients, rows the target's LM head scored) of one training step."""
    monkeypatch.setattr(target_loss, "LABEL_TABLE_BYTES", target_loss.LABEL_TABLE_BYTES if table else -1)
    target = make_tiny_model("llama")
    heads = _heads(kind, target)
    model = TargetWithHeads(target, heads, loss_chunk_size=16)
    ids = torch.randint(4, target.config.vocab_size - 1, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    scored = []  # rows the target's LM head labels (no grad; EAGLE's own drafts also pass it, with grad)
    hook = target.get_output_embeddings().register_forward_hook(
        lambda _m, args, _o: None if torch.is_grad_enabled() else scored.append(args[0].shape[0]))
    model.reseed_noise(0, ids.device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    hook.remove()
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in heads.named_parameters() if p.grad is not None}
    return out["loss"].detach(), grads, sum(scored)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "peagle", "dflash", "peagle+greedy_path", "dflash+greedy_path"])
def test_each_window_position_is_scored_once_and_trains_as_before(kind, monkeypatch):
    loss, grads, scored = _step(kind, True, monkeypatch)
    loss_rows, grads_rows, scored_rows = _step(kind, False, monkeypatch)
    assert scored == BATCH * SEQ, "the label table runs the target's LM head once per window position"
    assert scored_rows > scored, "the test needs rows that several draft rows score"
    torch.testing.assert_close(loss, loss_rows, rtol=1e-6, atol=1e-6)
    assert grads.keys() == grads_rows.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], grads_rows[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", ["soft_ce", "ce"])
def test_the_table_and_the_rows_computed_on_the_fly_agree(kind, monkeypatch):
    target = make_tiny_model("llama")
    hidden = torch.randn(BATCH, SEQ, target.config.hidden_size, generator=torch.Generator().manual_seed(2))
    vocab = target.config.vocab_size
    ids = torch.arange(0, vocab, 3)
    to_draft = torch.full((vocab,), -1, dtype=torch.long)
    to_draft[ids] = torch.arange(ids.numel())
    positions = torch.tensor([0, 5, 5, 47, 13])
    lm_head = target.get_output_embeddings()
    kept = TargetRows(lm_head, hidden, kind, ids, to_draft, chunk_size=7)
    monkeypatch.setattr(target_loss, "LABEL_TABLE_BYTES", -1)
    fly = TargetRows(lm_head, hidden, kind, ids, to_draft, chunk_size=7)
    assert kept.table is not None and fly.table is None
    for a, b in zip(kept.rows(positions), fly.rows(positions)):
        if a is None:
            assert b is None and kind == "ce"
        else:
            torch.testing.assert_close(a, b)
    top, inside, p, rows = kept.rows(positions)
    with torch.no_grad():
        logits = lm_head(hidden.reshape(-1, hidden.shape[-1])[positions])
    assert torch.equal(inside, to_draft[logits.argmax(-1)] >= 0)
    assert torch.equal(top, to_draft[logits.argmax(-1)].clamp(min=0))
    if p is not None:
        torch.testing.assert_close(p, logits[:, ids].softmax(-1))
    with torch.no_grad():
        greedy = lm_head(hidden.reshape(-1, hidden.shape[-1])).argmax(-1)  # target ids, whole vocabulary
    assert torch.equal(kept.greedy_ids(), greedy) and torch.equal(fly.greedy_ids(), greedy)
