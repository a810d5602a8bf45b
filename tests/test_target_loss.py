"""`heads.loss` (draftheads/train/target_loss.py): each loss's value against an independent
computation, the option read and refused by the config, and the chosen loss reaching the losses of
EAGLE, EAGLE-3, P-EAGLE and DFlash and the trained heads."""
from __future__ import annotations

import typing

import pytest
import torch
import torch.nn.functional as F

import draftheads as dh
from draftheads.config import ConfigError, HeadsSpec, config_from_dict
from draftheads.schema import TARGET_LOSSES
from draftheads.methods.eagle.loss import EagleLoss
from draftheads.train.head_loss import LossBatch, LossSettings
from draftheads.train.target_loss import loss_of, row_losses
from conftest import make_tiny_model
from test_train import HEAD_TYPE_OVERRIDES, _cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _distributions(seed: int = 0, rows: int = 12, vocab: int = 40):
    """Draft logits (with grad) and a peaked target distribution over the same tokens."""
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn(rows, vocab, generator=g, requires_grad=True)
    p = (3 * torch.randn(rows, vocab, generator=g)).softmax(-1)
    return draft, p, p.argmax(-1)


# ---------------------------------------------------------------------------------------------
# Each loss's value
# ---------------------------------------------------------------------------------------------


def test_soft_ce_is_cross_entropy_against_the_target_distribution():
    draft, p, top = _distributions()
    expected = F.cross_entropy(draft, p, reduction="none")  # torch's soft-label cross-entropy
    torch.testing.assert_close(row_losses("soft_ce", draft, p, top), expected)


def test_ce_is_cross_entropy_on_the_target_greedy_token():
    draft, p, top = _distributions()
    expected = F.cross_entropy(draft, top, reduction="none")
    torch.testing.assert_close(row_losses("ce", draft, None, top), expected)
    assert not torch.allclose(row_losses("ce", draft, None, top), row_losses("soft_ce", draft, p, top))


def test_kl_is_forward_kl_and_soft_ce_minus_the_target_entropy():
    draft, p, top = _distributions()
    kl = row_losses("kl", draft, p, top)
    torch.testing.assert_close(kl, F.kl_div(draft.log_softmax(-1), p, reduction="none").sum(-1))
    entropy = -(p * p.log()).sum(-1)
    torch.testing.assert_close(kl, row_losses("soft_ce", draft, p, top) - entropy)
    same = row_losses("kl", p.log().requires_grad_(), p, top)  # the draft equal to the target: KL 0
    torch.testing.assert_close(same, torch.zeros_like(same), atol=1e-6, rtol=0)


def test_kl_trains_exactly_like_soft_ce():
    """The entropy term is constant for the draft: the gradients are equal, not just close."""
    grads = {}
    for kind in ("soft_ce", "kl"):
        draft, p, top = _distributions()
        row_losses(kind, draft, p, top).sum().backward()
        grads[kind] = draft.grad
    assert torch.equal(grads["soft_ce"], grads["kl"])


def test_lk_is_minus_log_of_one_minus_total_variation():
    """alpha = sum min(p, q) = 1 - TV(p, q) = 1 - |p - q|_1 / 2: the acceptance rate of lossless
    speculative sampling drafting from q."""
    draft, p, top = _distributions()
    q = draft.softmax(-1)
    expected = -torch.log(1 - 0.5 * (p - q).abs().sum(-1))
    torch.testing.assert_close(row_losses("lk", draft, p, top), expected)


def test_lk_gradient_raises_acceptance():
    draft, p, top = _distributions()
    row_losses("lk", draft, p, top).sum().backward()
    stepped = (draft - 0.5 * draft.grad).detach()
    accept = lambda logits: torch.minimum(p, logits.softmax(-1)).sum(-1)  # noqa: E731
    assert bool((accept(stepped) > accept(draft.detach())).all())


def test_an_unknown_loss_in_code_lists_the_valid_ones():
    draft, p, top = _distributions()
    with pytest.raises(ValueError, match="unknown loss 'mse'; valid: soft_ce, kl, ce, lk"):
        row_losses("mse", draft, p, top)
    with pytest.raises(ValueError, match="valid: soft_ce, kl, ce, lk"):
        loss_of({"loss": "mse"})


def test_dflash_heads_saved_with_block_loss_read_as_what_they_trained_with():
    assert loss_of({"block_loss": "kl"}) == "soft_ce" and loss_of({"block_loss": "ce"}) == "ce"
    assert loss_of({}) == "soft_ce" and loss_of({"loss": "lk", "block_loss": "ce"}) == "lk"


# ---------------------------------------------------------------------------------------------
# The config
# ---------------------------------------------------------------------------------------------


def test_the_config_offers_every_loss_and_the_default_is_soft_ce():
    assert typing.get_args(typing.get_type_hints(HeadsSpec)["loss"]) == TARGET_LOSSES
    assert config_from_dict({}).heads.loss == "soft_ce"
    draft, p, top = _distributions()
    for kind in TARGET_LOSSES:  # every name the config accepts has a loss
        assert row_losses(kind, draft, p, top).shape == (12,)


@pytest.mark.parametrize("head_type", ["eagle", "eagle3", "peagle", "dflash"])
@pytest.mark.parametrize("loss", TARGET_LOSSES)
def test_the_loss_round_trips_through_the_config(head_type, loss):
    cfg = config_from_dict({"heads": {"head_type": head_type}}, [f"heads.loss={loss}"])
    assert cfg.heads.loss == loss
    assert config_from_dict(cfg.to_dict()).heads.loss == loss


def test_an_unknown_loss_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"heads": {"head_type": "eagle3"}}, ["heads.loss=kl_div"])
    msg = str(e.value)
    assert "heads.loss" in msg and "kl_div" in msg and all(repr(name) in msg for name in TARGET_LOSSES)


def test_a_head_type_without_the_option_refuses_it():
    with pytest.raises(ConfigError, match="heads.loss is set .'ce'. but medusa heads do not use it"):
        config_from_dict({"heads": {"head_type": "medusa", "loss": "ce"}})


def test_dflash_block_loss_is_read_as_the_loss_it_computed():
    """`heads.block_loss` was DFlash's name for the option; its `kl` computed soft CE."""
    assert config_from_dict({"heads": {"head_type": "dflash", "block_loss": "ce"}}).heads.loss == "ce"
    assert config_from_dict({"heads": {"head_type": "dflash", "block_loss": "kl"}}).heads.loss == "soft_ce"
    assert config_from_dict({"heads": {"head_type": "dflash"}}, ["heads.block_loss=ce"]).heads.loss == "ce"
    with pytest.raises(ConfigError, match="heads.block_loss is the old name of heads.loss"):
        config_from_dict({"heads": {"head_type": "dflash", "block_loss": "ce", "loss": "ce"}})


def test_a_dflash_checkpoint_from_before_resumes_under_the_new_name():
    from pathlib import Path

    from draftheads.train.run_dir import check_resume_config

    old = config_from_dict({"heads": {"head_type": "dflash"}}).to_dict()
    del old["heads"]["loss"]
    old["heads"]["block_loss"] = "kl"  # what every DFlash run wrote before
    check_resume_config(Path("ckpt"), old, config_from_dict({"heads": {"head_type": "dflash"}}).to_dict())


# ---------------------------------------------------------------------------------------------
# Inside the losses
# ---------------------------------------------------------------------------------------------


def _eagle3(loss: str, steps: int = 1):
    torch.manual_seed(0)
    target = make_tiny_model("llama")
    heads = dh.Eagle3Head.for_target(target, num_heads=steps, draft_vocab_size=64, loss=loss)
    counts = torch.zeros(target.config.vocab_size, dtype=torch.long)
    counts[:80] = torch.arange(80, 0, -1)  # the draft vocabulary: ids 0..63
    heads.set_draft_vocab(counts)
    heads.bind_target(target)
    ids = torch.randint(4, 120, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in heads.feature_layers], -1)
    return target, heads, ids, feats, out.hidden_states[-1], out.logits


def test_eagle3_ce_is_cross_entropy_on_the_target_argmax_at_trained_rows():
    """Step 0, row t predicts token t+2: its label is the target's argmax at position t+1, in the
    draft vocabulary, counted only where that argmax lies inside it."""
    target, heads, ids, feats, last, target_logits = _eagle3("ce")
    seen = []
    logits_fn = heads.logits
    heads.logits = lambda state: seen.append(logits_fn(state)) or seen[-1]
    out = EagleLoss(LossSettings(chunk_size=4096))(heads, LossBatch(ids, hidden=last, features=feats))
    draft = torch.cat(seen).float()  # rows (b, t) for t = 0 .. S-3, in order
    top = target_logits[:, 1:-1].argmax(-1).reshape(-1)
    inside = heads.target_to_draft[top] >= 0
    assert 0 < int(inside.sum()) < top.numel(), "the test needs rows on both sides of the draft vocabulary"
    expected = F.cross_entropy(draft[inside], heads.target_to_draft[top[inside]], reduction="sum")
    torch.testing.assert_close(out.ce_sum[0], expected.detach())
    assert int(out.count[0]) == int(inside.sum())
    torch.testing.assert_close(out.loss, expected / inside.sum())


def _loss_and_grads(heads, fn):
    heads.zero_grad()
    out = fn()
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in heads.named_parameters() if p.grad is not None}


def test_eagle3_losses_differ_and_kl_has_soft_ce_gradients():
    results = {}
    for loss in TARGET_LOSSES:
        _, heads, ids, feats, last, _ = _eagle3(loss, steps=3)
        results[loss] = _loss_and_grads(heads, lambda: EagleLoss()(heads, LossBatch(ids, hidden=last, features=feats)))
    soft, kl = results["soft_ce"], results["kl"]
    assert all(torch.equal(soft[1][n], kl[1][n]) for n in soft[1])
    assert bool((kl[0].ce_sum < soft[0].ce_sum).all()), "KL = soft CE - the target's entropy (> 0)"
    for other in ("ce", "lk"):
        assert not torch.allclose(results[other][0].loss, soft[0].loss)
        assert any(not torch.allclose(results[other][1][n], soft[1][n]) for n in soft[1])


def test_eagle_classification_term_follows_the_loss():
    """EAGLE: SmoothL1 + 0.1 x the classification term; only the latter changes with the loss."""
    torch.manual_seed(0)
    target = make_tiny_model("llama")
    ids = torch.randint(4, 120, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        last = target(ids, output_hidden_states=True).hidden_states[-1]
    outs = {}
    for loss in ("soft_ce", "kl", "ce"):
        torch.manual_seed(0)
        heads = dh.EagleHead.for_target(target, num_heads=1, loss=loss).eval()  # eval: no feature noise
        heads.bind_target(target)
        outs[loss] = EagleLoss()(heads, LossBatch(ids, hidden=last, features=last))
    reg = outs["soft_ce"].loss - 0.1 * outs["soft_ce"].ce_sum[0] / outs["soft_ce"].count[0]
    for loss in ("kl", "ce"):
        torch.testing.assert_close(outs[loss].loss, reg + 0.1 * outs[loss].ce_sum[0] / outs[loss].count[0])
    assert outs["ce"].ce_sum[0] != outs["soft_ce"].ce_sum[0] and outs["kl"].ce_sum[0] < outs["soft_ce"].ce_sum[0]


# ---------------------------------------------------------------------------------------------
# Through the training loop: the configured loss reaches the trained heads
# ---------------------------------------------------------------------------------------------


def _trained(tmp_path, target_dir, data, head_type: str, loss: str) -> dict[str, torch.Tensor]:
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path / f"{head_type}-{loss}", target_dir, data, *HEAD_TYPE_OVERRIDES[head_type],
               f"heads.loss={loss}", max_steps=2, eval_every=0, warmup_steps=0, lr=1e-2)  # fmt: skip
    heads = run(cfg).heads
    assert heads.config.extra["loss"] == loss
    return {n: p.detach().clone() for n, p in heads.state_dict().items()}


@pytest.mark.parametrize("head_type", ["eagle3", "peagle", "dflash"])
def test_the_configured_loss_reaches_the_trained_heads(tmp_path, tiny_target_dir, tiny_text_jsonl,
                                                       tiny_text_jsonl_without_unk, head_type):
    """Two optimizer steps: CE on greedy labels trains other weights than soft CE; KL the same ones,
    bit for bit (the same objective)."""
    if head_type == "dflash":  # its mask token (<unk>) must not occur in the rows
        tiny_text_jsonl = tiny_text_jsonl_without_unk
    weights = {loss: _trained(tmp_path, tiny_target_dir, tiny_text_jsonl, head_type, loss) for loss in ("soft_ce", "kl", "ce")}
    soft = weights["soft_ce"]
    assert all(torch.equal(soft[n], weights["kl"][n]) for n in soft)
    assert any(not torch.equal(soft[n], weights["ce"][n]) for n in soft)


# ---------------------------------------------------------------------------------------------
# Per-step weights (train.loss_decay) with every loss
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", TARGET_LOSSES)
@pytest.mark.parametrize("decay", [1.0, 0.8, 0.5])
def test_eagle3_steps_weigh_decay_to_the_k(loss, decay):
    """The loss is sum_k decay^k x (step k's summed loss / its trained rows), from the per-step sums."""
    _, heads, ids, feats, last, _ = _eagle3(loss, steps=3)
    out = EagleLoss(LossSettings(decay=decay))(heads, LossBatch(ids, hidden=last, features=feats))
    expected = sum(decay**k * out.ce_sum[k] / out.count[k] for k in range(3))
    torch.testing.assert_close(out.loss.detach(), expected)


def test_the_step_decay_reaches_the_loop(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    weights = {}
    for decay in ("0.8", "1.0"):
        cfg = _cfg(tmp_path / decay, tiny_target_dir, tiny_text_jsonl, *HEAD_TYPE_OVERRIDES["eagle3"],
                   f"train.loss_decay={decay}", max_steps=2, eval_every=0, warmup_steps=0, lr=1e-2)  # fmt: skip
        weights[decay] = {n: p.detach().clone() for n, p in run(cfg).heads.state_dict().items()}
    assert any(not torch.equal(weights["0.8"][n], weights["1.0"][n]) for n in weights["0.8"])
