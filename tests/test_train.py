"""Training: the chunked Medusa loss, the frozen-target wrapper, and the accelerate loop end to end
(export, metrics, bit-exact resume, shared LM head, offline W&B), all on tiny random models."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_utils import naive_medusa_loss

from draftheads import MedusaHeads, load_heads
from draftheads.config import config_from_dict
from draftheads.train.head_loss import LossBatch, LossSettings
from draftheads.methods.medusa.loss import IGNORE, MedusaLoss, medusa_targets
from draftheads.train.metrics import chain_acceptance_length
from draftheads.train.model import TargetWithHeads


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    # Tiny matmuls: one thread is faster, and immune to other processes competing for the cores.
    monkeypatch.setenv("DRAFTHEADS_NUM_THREADS", "1")  # what run() would otherwise widen to all cores
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _perturbed_heads(target, lm_head="own", num_heads=3, seed=0):
    """Heads with non-trivial weights (fresh heads start from zero-initialised blocks)."""
    heads = MedusaHeads.for_target(target, num_heads=num_heads, num_layers=1, lm_head=lm_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return heads


def _batch(seed=0, bsz=3, seq=24, vocab=256):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (bsz, seq), generator=g)
    attn = torch.ones_like(ids)
    attn[1, seq - 7 :] = 0  # right padding
    loss_mask = attn.clone()
    loss_mask[:, :5] = 0  # a prompt
    loss_mask[2, 10:13] = 0  # an untrained span in the middle
    return ids, attn, loss_mask


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------


def test_targets_are_token_t_plus_2_plus_k_where_trainable():
    ids = torch.arange(10).unsqueeze(0) + 100
    loss_mask = torch.ones_like(ids)
    loss_mask[0, 6] = 0
    attn = torch.ones_like(ids)
    attn[0, 8:] = 0
    t = medusa_targets(ids, 3, loss_mask, attn)[0]
    assert t.shape == (10, 3)
    for pos in range(10):
        for k in range(3):
            j = pos + 2 + k
            ok = j < 10 and loss_mask[0, j] == 1 and attn[0, j] == 1 and attn[0, pos] == 1
            assert t[pos, k].item() == (ids[0, j].item() if ok else IGNORE), (pos, k)


@pytest.mark.parametrize("lm_head", ["own", "shared"])
@pytest.mark.parametrize("chunk_size", [1, 7, 4096])
def test_chunked_loss_and_grads_equal_naive(tiny_model, lm_head, chunk_size):
    heads = _perturbed_heads(tiny_model, lm_head)
    ids, attn, loss_mask = _batch()
    model = TargetWithHeads(tiny_model, heads)
    hidden = model.target_hidden(ids, attn)

    out = MedusaLoss(LossSettings(decay=0.8, chunk_size=chunk_size, topk=5))(
        heads, LossBatch(ids, attention_mask=attn, loss_mask=loss_mask, hidden=hidden))
    out.loss.backward()
    chunked = {n: p.grad.clone() for n, p in heads.named_parameters()}
    heads.zero_grad()
    ref = naive_medusa_loss(heads, hidden, ids, loss_mask, attn, decay=0.8)
    ref.backward()

    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    for n, p in heads.named_parameters():
        torch.testing.assert_close(chunked[n], p.grad, rtol=1e-4, atol=1e-7, msg=n)
    assert all(p.grad is None for p in tiny_model.parameters())

    # The no-grad statistics come from the same logits.
    with torch.no_grad():
        logits = heads(hidden).float()
    targets = medusa_targets(ids, heads.config.num_heads, loss_mask, attn)
    for k in range(heads.config.num_heads):
        valid = targets[..., k] != IGNORE
        assert out.count[k] == valid.sum()
        assert out.top1[k] == (logits[..., k, :].argmax(-1) == targets[..., k])[valid].sum()
        top5 = logits[..., k, :].topk(5, dim=-1).indices
        assert out.topk[k] == (top5 == targets[..., k, None]).any(-1)[valid].sum()
        ce = torch.nn.functional.cross_entropy(logits[..., k, :][valid], targets[..., k][valid], reduction="sum")
        torch.testing.assert_close(out.ce_sum[k], ce, rtol=1e-5, atol=1e-5)


def test_loss_with_a_head_that_has_no_targets_still_touches_every_parameter(tiny_llama):
    # Sequences of 4 tokens: head 2 (t+4) never has a target; DDP needs a (zero) grad for it anyway.
    heads = _perturbed_heads(tiny_llama)
    ids = torch.randint(4, 256, (2, 4))
    hidden = TargetWithHeads(tiny_llama, heads).target_hidden(ids)
    out = MedusaLoss()(heads, LossBatch(ids, hidden=hidden))
    assert out.count.tolist() == [4, 2, 0]
    out.loss.backward()
    assert all(p.grad is not None for p in heads.parameters())
    assert torch.count_nonzero(heads.lm_heads[2].weight.grad) == 0


def test_chain_acceptance_length():
    assert chain_acceptance_length([]) == 1.0
    assert chain_acceptance_length([1.0, 1.0, 1.0]) == 4.0
    assert chain_acceptance_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)


# ---------------------------------------------------------------------------------------------
# The frozen target + heads module
# ---------------------------------------------------------------------------------------------


def test_hidden_is_the_post_norm_state_the_lm_head_reads(tiny_model):
    ids, attn, _ = _batch()
    model = TargetWithHeads(tiny_model, MedusaHeads.for_target(tiny_model, num_heads=2))
    hidden = model.target_hidden(ids, attn)
    ref = tiny_model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
    torch.testing.assert_close(hidden, ref.hidden_states[-1], rtol=0, atol=0)
    torch.testing.assert_close(tiny_model.lm_head(hidden), ref.logits, rtol=1e-6, atol=1e-6)


def test_target_labels_are_the_targets_own_greedy_predictions(tiny_model):
    ids, attn, _ = _batch()
    model = TargetWithHeads(tiny_model, MedusaHeads.for_target(tiny_model, num_heads=2), labels="target",
                            loss_chunk_size=7)
    hidden = model.target_hidden(ids, attn)
    labels = model.target_labels(ids, hidden)
    greedy_next = tiny_model(input_ids=ids, attention_mask=attn).logits.argmax(-1)
    assert torch.equal(labels[:, 0], ids[:, 0])
    assert torch.equal(labels[:, 1:], greedy_next[:, :-1])
    # head k at position t is trained on the target's prediction for t+2+k
    targets = medusa_targets(labels, 2, None, None)
    assert int(targets[0, 3, 1]) == int(greedy_next[0, 3 + 1 + 1])
    with pytest.raises(ValueError, match="labels must be"):
        TargetWithHeads(tiny_model, MedusaHeads.for_target(tiny_model, num_heads=2), labels="teacher")


def test_only_heads_are_trainable_and_target_stays_frozen_in_eval(tiny_llama):
    tiny_llama.train()
    model = TargetWithHeads(tiny_llama, MedusaHeads.for_target(tiny_llama, num_heads=2))
    assert not any(p.requires_grad for p in tiny_llama.parameters())
    assert not tiny_llama.training
    params = model.trainable_parameters()
    assert {id(p) for p in params} == {id(p) for p in model.heads.parameters()}
    model.train()
    assert model.heads.training and not model.target.training
    model.check_frozen()

    next(tiny_llama.parameters()).requires_grad_(True)
    with pytest.raises(RuntimeError, match="target parameter"):
        model.check_frozen()
    with pytest.raises(RuntimeError, match="outside the heads"):
        model.trainable_parameters()
    next(tiny_llama.parameters()).requires_grad_(False)
    tiny_llama.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        model.check_frozen()


@pytest.mark.parametrize("lm_head", ["own", "shared"])
def test_loss_decreases_on_a_fixed_batch(tiny_model, lm_head):
    torch.manual_seed(0)
    model = TargetWithHeads(tiny_model, MedusaHeads.for_target(tiny_model, num_heads=3, lm_head=lm_head))
    target_before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=2e-2)
    ids, attn, loss_mask = _batch(bsz=4, seq=32)
    model.train()
    losses = []
    for _ in range(30):
        loss = model(ids, attn, loss_mask)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0], losses  # random tokens, memorised
    for k, v in tiny_model.state_dict().items():
        assert torch.equal(v, target_before[k]), k


# ---------------------------------------------------------------------------------------------
# The loop, end to end
# ---------------------------------------------------------------------------------------------


def _cfg(tmp_path: Path, target_dir: Path, data: Path, *overrides: str, **train):
    base = {
        "target": {"name_or_path": str(target_dir), "dtype": "float32"},
        "heads": {"num_heads": 3, "num_layers": 1, "lm_head": "own"},
        "data": {
            "path": str(data),
            "format": "text",
            "max_length": 48,
            "eval_fraction": 0.1,
            "cache_dir": str(tmp_path / "hf-cache"),
        },
        "train": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 8,
            "batch_size": 4,
            "lr": 1e-2,
            "warmup_steps": 2,
            "eval_every": 4,
            "eval_batches": 2,
            "save_every": 0,
            "log_every": 2,
            "choose_tree": False,  # ~20 s of timed decoding per run; test_export_tree tests the choice
            **train,
        },
    }
    return config_from_dict(base, list(overrides))


def _assert_same_state(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_run_exports_heads_and_metrics(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl)
    result = run(cfg)
    out = Path(cfg.train.output_dir)
    assert result.step == 8 and result.heads_dir == out / "heads"

    exported = load_heads(result.heads_dir)
    _assert_same_state(exported.state_dict(), {k: v.cpu() for k, v in result.heads.state_dict().items()})
    assert exported.config.num_heads == 3 and exported.config.lm_head == "own"
    # every trained label was counted once: 8 steps x batch 4, each row's trainable tokens
    assert 0 < int(exported.token_counts.sum()) <= 8 * 4 * cfg.data.max_length
    from transformers import AutoModelForCausalLM

    load_heads(result.heads_dir, target=AutoModelForCausalLM.from_pretrained(tiny_target_dir))  # binds

    metrics = json.loads((out / "metrics.json").read_text())
    final = metrics["final_eval"]
    for k in range(3):
        assert 0.0 <= final[f"eval/top1_head{k}"] <= final[f"eval/top5_head{k}"] <= 1.0
        assert final[f"eval/loss_head{k}"] > 0
    assert 1.0 <= final["eval/acceptance_length"] <= 4.0
    assert metrics["train_tokens_per_second"] > 0 and metrics["step"] == 8
    assert {"load_target", "build_data", "train", "eval", "export"} <= metrics["stage_seconds"].keys()
    assert [e["step"] for e in metrics["evals"]] == [4]
    assert json.loads((out / "config.json").read_text())["heads"]["num_heads"] == 3
    printed = capsys.readouterr()
    assert "eval @ 8" in printed.out + printed.err and "heads exported to" in printed.out


HEAD_TYPE_OVERRIDES = {
    "medusa": (),
    "hydra": ("heads.head_type=hydra",),
    "eagle": ("heads.head_type=eagle", "heads.lm_head=auto"),
    "eagle3": ("heads.head_type=eagle3", "heads.lm_head=auto", "heads.draft_vocab_size=64"),
    # COD sampling draws from the reseeded noise generator: a resume draws the same depths
    "peagle": ("heads.head_type=peagle", "heads.lm_head=auto", "heads.draft_vocab_size=64", "heads.num_layers=2"),
    # <unk> (0): a special token with a real embedding row (the pad row is zero: padding_idx)
    "dflash": ("heads.head_type=dflash", "heads.lm_head=auto", "heads.block_size=4", "heads.num_anchors=4",
               "heads.mask_token_id=0"),
}


# The other recipe (heads.init, betas, schedule, clip norm): its optimizer and scheduler states resume too.
RESUME_CASES = {
    **HEAD_TYPE_OVERRIDES,
    "eagle3-reference-recipe": HEAD_TYPE_OVERRIDES["eagle3"] + (
        "heads.init=torch", "train.adam_betas=[0.9, 0.95]", "train.lr_schedule=linear", "train.max_grad_norm=0.5",
    ),
}


@pytest.mark.parametrize("head_type", list(RESUME_CASES))
def test_resume_continues_bit_exact(tmp_path, tiny_target_dir, tiny_text_jsonl, tiny_text_jsonl_without_unk, head_type):
    """A straight 10-step run (checkpoints every 5) vs. a run resumed from its step-5 checkpoint,
    which lies mid-epoch (9 steps per epoch). Gradient accumulation 2 and an epoch boundary inside
    the resumed half. Every head type: EAGLE's training noise must not depend on the global RNG,
    which a resume consumes differently (DataLoader iterators)."""
    from draftheads.train.loop import run

    extra = RESUME_CASES[head_type]
    if head_type == "dflash":  # its mask token (<unk>) must not occur in the rows
        tiny_text_jsonl = tiny_text_jsonl_without_unk
    straight = _cfg(tmp_path / "a", tiny_target_dir, tiny_text_jsonl, *extra, max_steps=10, save_every=5, grad_accum=2)
    run(straight)
    ckpts = Path(straight.train.output_dir) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-10", "step-5"]
    state = json.loads((ckpts / "step-5" / "trainer_state.json").read_text())
    assert state["step"] == 5 and state["epoch"] == 0 and state["batches_in_epoch"] == 10  # mid-epoch
    saved = load_file(str(ckpts / "step-5" / "model.safetensors"))
    assert saved and all(k.startswith("heads.") for k in saved), "the frozen target is not checkpointed"

    resumed = _cfg(tmp_path / "b", tiny_target_dir, tiny_text_jsonl, *extra, max_steps=10, save_every=5, grad_accum=2)
    shutil.copytree(ckpts / "step-5", Path(resumed.train.output_dir) / "checkpoints" / "step-5")
    resumed.train.resume = "auto"
    result = run(resumed)
    assert result.step == 10

    a = load_file(str(Path(straight.train.output_dir) / "heads" / "model.safetensors"))
    b = load_file(str(Path(resumed.train.output_dir) / "heads" / "model.safetensors"))
    _assert_same_state(a, b)
    ma = json.loads((Path(straight.train.output_dir) / "metrics.json").read_text())["final_eval"]
    mb = json.loads((Path(resumed.train.output_dir) / "metrics.json").read_text())["final_eval"]
    assert ma == mb


def test_resume_from_a_path_that_is_not_a_checkpoint(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, resume=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        run(cfg)


def test_shared_lm_head_trains(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from transformers import AutoModelForCausalLM

    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "heads.lm_head=shared", max_steps=6, eval_every=0)
    result = run(cfg)
    state = load_file(str(result.heads_dir / "model.safetensors"))
    assert not any(k.startswith("lm_heads") for k in state), "a shared head stores no vocab projection"
    assert any(torch.count_nonzero(v) for k, v in state.items() if k.endswith("linear.weight")), "blocks trained"
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    heads = load_heads(result.heads_dir, target=target)
    assert heads.config.lm_head == "shared"
    assert heads(torch.zeros(1, target.config.hidden_size)).shape == (1, 3, target.config.vocab_size)


def keyless_wandb(monkeypatch, tmp_path: Path) -> Path:
    """W&B without an API key (so offline), writing under ``tmp_path``: its run folders' parent."""
    pytest.importorskip("wandb")
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path / "wandb"


def test_wandb_goes_offline_without_a_key(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch, capsys):
    from draftheads.train.loop import run

    keyless_wandb(monkeypatch, tmp_path)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "tracking.report_to=wandb", max_steps=2, eval_every=0)
    run(cfg)
    assert os.environ["WANDB_MODE"] == "offline"
    assert "logging offline" in capsys.readouterr().out
    runs = list((tmp_path / "wandb").rglob("offline-run-*"))
    assert runs, "an offline W&B run folder was written under WANDB_DIR"


def test_tensorboard_missing_is_a_clear_error(monkeypatch):
    """Both ways, whatever is installed: a None entry in sys.modules makes a package unfindable,
    a module with a spec makes it findable."""
    import importlib.machinery
    import sys
    import types

    from draftheads.config import TrackingConfig
    from draftheads.train.tracking import prepare_tracker

    cfg = TrackingConfig(report_to="tensorboard")
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(RuntimeError, match="tracking.report_to=tensorboard needs TensorBoard: pip install tensorboard"):
        prepare_tracker(cfg)
    for name in ("tensorboard", "tensorboardX"):  # either package is enough
        present = types.ModuleType(name)
        present.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, present)
        assert prepare_tracker(cfg) == "tensorboard"
        monkeypatch.setitem(sys.modules, name, None)
