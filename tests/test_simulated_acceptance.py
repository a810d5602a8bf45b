"""The simulated acceptance length training logs (training side): per-head, per-rank
accuracies from evaluation, the expected tokens per step of the actual tree, the best-checkpoint
export it selects, and whether it predicts what decoding really accepts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import draftheads as dh
from draftheads.plans import given_tree
from draftheads.tune.calibrate import expected_tokens_per_step
from draftheads.inference.tree import default_choices
from draftheads.train.head_loss import LossBatch, LossSettings
from draftheads.methods.medusa.loss import IGNORE, MedusaLoss, medusa_targets, token_context
from draftheads.train.metrics import EVAL_RANKS, HeadStats, ranks_for, static_tree
from draftheads.train.model import TargetWithHeads
from inference_utils import self_distilled_heads, tiny_target
from test_train import _batch, _cfg


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _perturbed(cls, target, num_heads=3, seed=0):
    heads = cls.for_target(target, num_heads=num_heads, num_layers=1)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return heads


# ---------------------------------------------------------------------------------------------
# Rank statistics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [dh.MedusaHeads, dh.HydraHeads])
@pytest.mark.parametrize("chunk_size", [5, 4096])
def test_rank_hits_equal_a_naive_recount(tiny_llama, cls, chunk_size):
    heads = _perturbed(cls, tiny_llama).eval()
    ids, attn, loss_mask = _batch()
    hidden = TargetWithHeads(tiny_llama, heads).target_hidden(ids, attn)
    with torch.no_grad():
        out = MedusaLoss(LossSettings(chunk_size=chunk_size))(
            heads, LossBatch(ids, attention_mask=attn, loss_mask=loss_mask, hidden=hidden, ranks=EVAL_RANKS))
        logits = heads(hidden, token_context(ids, 3)) if cls is dh.HydraHeads else heads(hidden)
    targets = medusa_targets(ids, 3, loss_mask, attn)
    naive = torch.zeros(3, EVAL_RANKS, dtype=torch.long)
    for k in range(3):
        valid = targets[..., k] != IGNORE
        top = logits[..., k, :].float().topk(EVAL_RANKS, dim=-1).indices[valid]  # [positions, R]
        naive[k] = (top == targets[..., k][valid][:, None]).sum(0)
    assert torch.equal(out.rank_hits, naive)
    assert torch.equal(out.rank_hits[:, 0], out.top1)  # rank 0 is the argmax (no ties here)
    assert torch.equal(out.rank_hits[:, :5].sum(1), out.topk)

    # One tensor for one reduce; the table and the tree estimate follow from it.
    stats = HeadStats(3, ranks=EVAL_RANKS)
    stats.add(out.stats())
    acc = naive.double() / out.count[:, None].double()
    torch.testing.assert_close(stats.rank_accuracy().double(), acc, rtol=1e-6, atol=1e-7)
    tree = default_choices(3)
    summary = stats.summary(prefix="eval/", tree=tree)
    assert summary["eval/simulated_acceptance"] == pytest.approx(expected_tokens_per_step(tree, acc))


def test_training_steps_do_not_count_ranks(tiny_llama):
    heads = _perturbed(dh.MedusaHeads, tiny_llama)
    ids, attn, loss_mask = _batch()
    model = TargetWithHeads(tiny_llama, heads)
    assert model(ids, attn, loss_mask)["stats"].shape == (4, 3)
    assert model(ids, attn, loss_mask, rank_stats=12)["stats"].shape == (4 + 12, 3)


def test_the_tree_and_ranks_are_those_decoding_uses(tiny_llama):
    heads = dh.MedusaHeads.for_target(tiny_llama, num_heads=2)
    assert static_tree(heads) == default_choices(2)
    heads.plans = given_tree([[0], [11], [0, 3]])  # a calibrated tree travels with the heads
    assert static_tree(heads) == [[0], [11], [0, 3]] and ranks_for(static_tree(heads)) == 12
    assert ranks_for(None) == 0


# ---------------------------------------------------------------------------------------------
# The loop: logged, printed, and the best heads kept
# ---------------------------------------------------------------------------------------------


def test_best_simulated_acceptance_is_exported(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch, capsys):
    """Evaluations at steps 2, 4, 6 and the final 8. Their simulated acceptance is replaced by a
    scripted sequence whose best is step 4 (real values only ever improve this early), and the
    heads are snapshotted at each evaluation: best/ must hold exactly the step-4 heads."""
    from draftheads.train import loop, trainer

    scripted = {2: 1.5, 4: 2.0, 6: 1.8, 8: 1.9}
    snapshots, real = {}, {}
    original = trainer.evaluate_and_log

    def eval_and_log(accelerator, model, eval_dl, t, num_heads, step, progress):
        record = original(accelerator, model, eval_dl, t, num_heads, step, progress)
        heads = accelerator.unwrap_model(model).heads
        snapshots[step] = {k: v.detach().clone() for k, v in heads.state_dict().items()}
        real[step] = record["eval/simulated_acceptance"]
        return {**record, "eval/simulated_acceptance": scripted[step]}

    monkeypatch.setattr(trainer, "evaluate_and_log", eval_and_log)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, eval_every=2)
    result = loop.run(cfg)
    out = Path(cfg.train.output_dir)

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best"]["step"] == 4 and metrics["best"]["simulated_acceptance"] == 2.0
    best = load_file(str(out / "best" / "model.safetensors"))
    assert best.keys() == snapshots[4].keys()
    for k in best:
        if k != "token_counts":
            assert torch.equal(best[k], snapshots[4][k]), k
    assert 0 < int(best["token_counts"].sum()) < int(result.heads.token_counts.sum())  # counts up to step 4
    final = load_file(str(out / "heads" / "model.safetensors"))
    assert any(not torch.equal(final[k], best[k]) for k in best), "heads/ is the final step, best/ step 4"
    assert dh.load_heads(out / "best").config.num_heads == 3

    # The real figure: logged with the per-rank table, printed next to the chain estimate.
    final_eval = metrics["final_eval"]
    assert 1.0 <= real[8] <= 1 + len(default_choices(3))
    acc = torch.tensor(final_eval["eval/rank_accuracy"])
    assert acc.shape == (3, EVAL_RANKS) and float(acc.sum(1).max()) <= 1.0 + 1e-6
    assert real[8] == pytest.approx(expected_tokens_per_step(default_choices(3), acc), rel=1e-5)
    printed = capsys.readouterr()
    assert "simulated acceptance" in printed.out + printed.err


def test_eagle_keeps_the_best_by_its_chain_estimate(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    # lm_head=auto: the shared base config's `lm_head: own` is a Medusa/Hydra option, refused for EAGLE
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "heads.head_type=eagle", "heads.lm_head=auto", max_steps=4, eval_every=2)
    run(cfg)
    out = Path(cfg.train.output_dir)
    metrics = json.loads((out / "metrics.json").read_text())
    for record in metrics["evals"] + [metrics["final_eval"]]:
        assert record["eval/simulated_acceptance"] == record["eval/acceptance_length"]
        assert "eval/rank_accuracy" not in record
    values = {e["step"]: e["eval/simulated_acceptance"] for e in metrics["evals"] + [{"step": 4, **metrics["final_eval"]}]}
    assert metrics["best"]["simulated_acceptance"] == max(values.values())
    assert values[metrics["best"]["step"]] == max(values.values())
    assert dh.load_heads(out / "best").head_type == "eagle"


# ---------------------------------------------------------------------------------------------
# Does it predict decoding?
# ---------------------------------------------------------------------------------------------


def test_simulated_acceptance_predicts_measured_within_15_percent():
    """Heads self-distilled on a tiny target; on held-out prompts (not trained on), the estimate
    from the training-side rank statistics of the target's greedy continuations vs the mean
    accepted tokens per step of real greedy tree decoding (bonus token included in both)."""
    target = tiny_target("llama", seed=0)
    heads, train_prompts = self_distilled_heads(target, num_heads=3)
    gen = torch.Generator().manual_seed(1234)
    prompts = torch.randint(3, target.config.vocab_size, (12, train_prompts.shape[1]), generator=gen)
    assert not (prompts[:, None] == train_prompts[None]).all(-1).any(), "held-out prompts"
    tree = default_choices(3)
    new_tokens = 40

    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    outs = [decoder.generate(p[None], max_new_tokens=new_tokens, eos_token_id=[]) for p in prompts]
    lengths = [n for o in outs for n in o.accept_lengths]
    measured = sum(lengths) / len(lengths)
    assert measured > 1.5, "the heads must draft well for the comparison to mean anything"

    # Greedy decoding is lossless, so its output is the target's greedy continuation. Statistics as
    # evaluation computes them: the prompt is context, the generated tokens are the labels.
    seqs = torch.cat([o.sequences for o in outs])
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompts.shape[1] + 1 :] = 1  # decoding's first heads read the last prompt token: head 0's first label is new token 2
    ranks = ranks_for(tree)
    with torch.no_grad():
        stats = TargetWithHeads(target, heads).eval()(seqs, torch.ones_like(seqs), loss_mask, rank_stats=ranks)["stats"]
    summary = HeadStats(3, ranks=ranks)
    summary.add(stats)
    simulated = summary.summary(tree=tree)["simulated_acceptance"]
    assert abs(simulated - measured) / measured < 0.15, (simulated, measured)
