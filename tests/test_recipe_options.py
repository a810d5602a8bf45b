"""The training-recipe knobs (heads.init, train.adam_betas, train.lr_schedule, train.max_grad_norm):
each is checked when the config is read, and each reaches the module, optimizer or schedule it
configures (every test here fails when its option is ignored)."""
from __future__ import annotations

import math
import shutil
import typing
from pathlib import Path

import pytest
import torch
from torch import nn

from draftheads.config import ConfigError, HeadsSpec, TrainConfig, config_from_dict, with_added_keys
from draftheads.heads.init import INIT_SCHEMES, apply_init
from draftheads.train.optim import SCHEDULES, build_optimizer, build_scheduler
from test_train import HEAD_TYPE_OVERRIDES, _cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC_OPTIONS = {
    "medusa": {"head_type": "medusa", "lm_head": "own"},
    "hydra": {"head_type": "hydra", "lm_head": "own"},
    "eagle": {"head_type": "eagle"},
    "eagle3": {"head_type": "eagle3", "draft_vocab_size": 64},
}


# ---------------------------------------------------------------------------------------------
# Reading the config
# ---------------------------------------------------------------------------------------------


def test_the_config_names_the_same_choices_as_the_code():
    hints = typing.get_type_hints(TrainConfig)
    assert typing.get_args(hints["lr_schedule"]) == SCHEDULES
    assert typing.get_args(typing.get_type_hints(HeadsSpec)["init"]) == INIT_SCHEMES


def test_defaults_are_todays_recipe():
    cfg = config_from_dict({})
    assert cfg.heads.init == "identity"
    assert cfg.train.lr_schedule == "cosine" and cfg.train.adam_betas == [0.9, 0.999] and cfg.train.max_grad_norm == 1.0


def test_overrides_set_every_knob():
    cfg = config_from_dict(
        {"heads": {"head_type": "eagle3"}},
        ["heads.init=torch", "train.lr_schedule=linear", "train.adam_betas=[0.9, 0.95]", "train.max_grad_norm=0.5"],
    )
    assert cfg.heads.init == "torch" and cfg.train.lr_schedule == "linear"
    assert cfg.train.adam_betas == [0.9, 0.95] and cfg.train.max_grad_norm == 0.5


@pytest.mark.parametrize("head_type", list(SPEC_OPTIONS))
def test_init_is_an_option_of_every_head_type(head_type):
    assert config_from_dict({"heads": {"head_type": head_type, "init": "torch"}}).heads.init == "torch"


def test_an_unknown_schedule_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["train.lr_schedule=cosine_restarts"])
    msg = str(e.value)
    assert "train.lr_schedule" in msg and "cosine_restarts" in msg
    assert all(repr(name) in msg for name in SCHEDULES)


def test_an_unknown_init_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["heads.init=xavier"])
    assert "heads.init" in str(e.value) and "'identity'" in str(e.value) and "'torch'" in str(e.value)


@pytest.mark.parametrize("betas", ["[0.9]", "[0.9, 0.95, 0.99]", "[0.9, 1.0]", "[-0.1, 0.9]", "[0.9, high]"])
def test_bad_betas_are_named(betas):
    with pytest.raises(ConfigError, match=r"train\.adam_betas"):
        config_from_dict({}, [f"train.adam_betas={betas}"])


def test_init_with_init_from_is_refused():
    with pytest.raises(ConfigError, match=r"heads\.init='torch' has no effect with heads\.init_from"):
        config_from_dict({"heads": {"init_from": "some/heads", "init": "torch"}})


def test_a_checkpoint_written_before_the_knobs_reads_as_the_recipe_it_used():
    """A saved config without the new keys was trained with what the code did then."""
    old = config_from_dict({}).to_dict()
    del old["heads"]["init"], old["train"]["lr_schedule"], old["train"]["adam_betas"]
    filled = with_added_keys(old)
    assert filled["heads"]["init"] == "identity" and filled["train"]["lr_schedule"] == "cosine"
    assert filled["train"]["adam_betas"] == [0.9, 0.999]
    assert "init" not in old["heads"], "the saved dict itself is left alone"
    from draftheads.train.run_dir import RunFolderError, check_resume_config

    check_resume_config(Path("ckpt"), old, config_from_dict({}).to_dict())  # today's defaults: the same run
    with pytest.raises(RunFolderError, match="train.lr_schedule: 'cosine' in the checkpoint, 'linear' now"):
        check_resume_config(Path("ckpt"), old, config_from_dict({}, ["train.lr_schedule=linear"]).to_dict())


# ---------------------------------------------------------------------------------------------
# Optimizer and schedule
# ---------------------------------------------------------------------------------------------


def _train_cfg(*overrides: str, **train) -> TrainConfig:
    return config_from_dict({"train": train}, list(overrides)).train


def test_betas_and_lr_reach_adamw():
    opt = build_optimizer([nn.Parameter(torch.zeros(3))], _train_cfg("train.adam_betas=[0.8, 0.95]", lr=0.5, weight_decay=0.1))
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.AdamW)
    assert group["betas"] == (0.8, 0.95) and group["lr"] == 0.5 and group["weight_decay"] == 0.1


def _lrs(schedule: str, steps: int = 20, warmup: int = 4) -> list[float]:
    t = _train_cfg(f"train.lr_schedule={schedule}", lr=1.0, warmup_steps=warmup)
    opt = build_optimizer([nn.Parameter(torch.zeros(1))], t)
    sched = build_scheduler(opt, t, steps)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_each_schedule_has_its_shape_after_the_same_warmup():
    cosine, linear, constant = _lrs("cosine"), _lrs("linear"), _lrs("constant")
    for lrs in (cosine, linear, constant):
        assert lrs[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])  # linear warmup over 4 steps
    # a quarter of the way through the decay (step 4 + 16/4 = 8)
    assert linear[8] == pytest.approx(0.75)
    assert cosine[8] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))
    assert constant[8:] == pytest.approx([1.0] * 12)
    assert linear[-1] == pytest.approx(1 / 16)


def test_an_unknown_schedule_name_in_code_is_named():
    t = _train_cfg()
    object.__setattr__(t, "lr_schedule", "step")
    with pytest.raises(ValueError, match="unknown schedule 'step'; valid: cosine, linear, constant"):
        build_scheduler(build_optimizer([nn.Parameter(torch.zeros(1))], t), t, 10)


# ---------------------------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------------------------


def _linears(heads: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in heads.named_modules() if isinstance(m, nn.Linear)}


@pytest.mark.parametrize("head_type", list(SPEC_OPTIONS))
def test_torch_init_gives_every_linear_pytorchs_default(tiny_llama, head_type):
    from draftheads.train.loop import build_heads

    torch.manual_seed(0)
    identity = build_heads(HeadsSpec(**SPEC_OPTIONS[head_type]), tiny_llama)
    torch.manual_seed(0)
    reset = build_heads(HeadsSpec(**SPEC_OPTIONS[head_type], init="torch"), tiny_llama)
    copied = "lm_heads." if head_type in ("medusa", "hydra") else None  # own LM heads: copies of the target's
    lin_id, lin_reset = _linears(identity), _linears(reset)
    assert lin_reset and lin_id.keys() == lin_reset.keys()
    for name, lin in lin_reset.items():
        w = lin.weight.detach()
        if copied and name.startswith(copied):  # copied from the target under every scheme
            torch.testing.assert_close(w, tiny_llama.get_output_embeddings().weight.float())
            continue
        bound = 1 / math.sqrt(lin.in_features)  # kaiming_uniform(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        assert float(w.abs().max()) <= bound + 1e-7, name
        assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.1), name
        assert not torch.equal(w, lin_id[name].weight), f"{name} kept the identity scheme's weights"
    for name, m in reset.named_modules():
        if isinstance(m, nn.RMSNorm):
            assert bool((m.weight == 1).all()), name


@pytest.mark.parametrize("head_type", ["eagle", "eagle3"])
def test_identity_init_keeps_zero_output_projections(tiny_llama, head_type):
    from draftheads.train.loop import build_heads

    heads = build_heads(HeadsSpec(**SPEC_OPTIONS[head_type]), tiny_llama)
    for layer in heads.layers:
        assert not layer.o_proj.weight.any() and not layer.down_proj.weight.any()


def test_apply_init_names_an_unknown_scheme(tiny_llama):
    from draftheads.train.loop import build_heads

    with pytest.raises(ValueError, match="unknown heads init scheme 'xavier'; valid: identity, torch"):
        apply_init(build_heads(HeadsSpec(), tiny_llama), "xavier", tiny_llama)


# ---------------------------------------------------------------------------------------------
# Through the training loop
# ---------------------------------------------------------------------------------------------


def test_the_loop_builds_its_optimizer_and_schedule_from_the_config(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """The step-4 checkpoint holds the optimizer's betas and the schedule's lr: linear decay over
    8 steps after 2 of warmup is at 4/6 of the peak there, cosine would be at 0.75."""
    from draftheads.train.loop import run

    cfg = _cfg(
        tmp_path, tiny_target_dir, tiny_text_jsonl, "train.lr_schedule=linear", "train.adam_betas=[0.8, 0.95]",
        max_steps=8, save_every=4, eval_every=0, lr=1e-2, warmup_steps=2,
    )  # fmt: skip
    run(cfg)
    ckpt = Path(cfg.train.output_dir) / "checkpoints" / "step-4"
    opt = torch.load(ckpt / "optimizer.bin", weights_only=False)
    assert tuple(opt["param_groups"][0]["betas"]) == (0.8, 0.95)
    sched = torch.load(ckpt / "scheduler.bin", weights_only=False)
    assert sched["_last_lr"][0] == pytest.approx(1e-2 * 4 / 6)


def test_the_loop_clips_at_the_configured_norm(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """Gradients clipped to a norm of 1e-12 sit far below AdamW's eps: the heads barely move.
    Unclipped, the same two steps move them by about the learning rate."""
    from draftheads.train.loop import run

    moved = {}
    for name, clip in (("clipped", "1e-12"), ("free", "null")):
        cfg = _cfg(tmp_path / name, tiny_target_dir, tiny_text_jsonl, f"train.max_grad_norm={clip}",
                   max_steps=2, eval_every=0, warmup_steps=0, lr=1e-2)  # fmt: skip
        heads = run(cfg).heads
        moved[name] = max(float(b.linear.weight.detach().abs().max()) for blocks in heads.blocks for b in blocks)  # zero at init
    assert moved["free"] > 1e-3 and moved["clipped"] < 1e-3 * moved["free"], moved


def test_the_loop_initialises_heads_as_configured(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """Zero steps of learning (lr 0 throughout): the exported heads are the initial ones."""
    from draftheads.train.loop import run

    extra = HEAD_TYPE_OVERRIDES["eagle3"]
    outs = {}
    for init in INIT_SCHEMES:
        cfg = _cfg(tmp_path / init, tiny_target_dir, tiny_text_jsonl, *extra, f"heads.init={init}",
                   "train.lr_schedule=constant", max_steps=1, eval_every=0, warmup_steps=1)  # fmt: skip
        outs[init] = run(cfg).heads
    assert not outs["identity"].layers[0].o_proj.weight.any()
    assert outs["torch"].layers[0].o_proj.weight.any()
    bound = 1 / math.sqrt(outs["torch"].lm_head.in_features)
    assert float(outs["torch"].lm_head.weight.std()) == pytest.approx(bound / math.sqrt(3), rel=0.1)


# ---------------------------------------------------------------------------------------------
# Where EAGLE-3's own LM head starts (heads.lm_head_init)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_type", ["medusa", "hydra", "eagle", "dflash"])
def test_lm_head_init_is_refused_by_name_for_heads_without_their_own_draft_lm_head(head_type):
    with pytest.raises(ConfigError, match=rf"heads\.lm_head_init is set \('target'\) but {head_type} heads do not use it: "
                                          r"it applies to eagle3, peagle heads only"):
        config_from_dict({"heads": {"head_type": head_type, "lm_head_init": "target"}})


def test_lm_head_init_with_init_from_is_refused():
    with pytest.raises(ConfigError, match=r"heads\.lm_head_init='target' has no effect with heads\.init_from"):
        config_from_dict({"heads": {"head_type": "eagle3", "init_from": "some/heads", "lm_head_init": "target"}})


def test_an_unknown_lm_head_init_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"heads": {"head_type": "eagle3"}}, ["heads.lm_head_init=copy"])
    assert "heads.lm_head_init" in str(e.value) and "'random'" in str(e.value) and "'target'" in str(e.value)


def test_a_run_before_lm_head_init_reads_as_a_random_lm_head():
    old = config_from_dict({"heads": {"head_type": "eagle3"}}).to_dict()
    del old["heads"]["lm_head_init"]
    assert with_added_keys(old)["heads"]["lm_head_init"] == "random"


@pytest.mark.parametrize("head_type", ["eagle3", "peagle"])
def test_the_loop_starts_the_lm_head_from_the_targets_rows(tmp_path, tiny_target_dir, tiny_text_jsonl, head_type):
    """Zero steps of learning (lr 0 throughout): with `target` the exported LM head holds the
    target's LM head rows of the draft vocabulary and the final norm the target's gain; with
    `random` neither (the same seed otherwise)."""
    from draftheads.target import load_target
    from draftheads.train.loop import run

    target_dir = tmp_path / "target"  # a copy: the session's tiny target stays as other tests expect it
    shutil.copytree(tiny_target_dir, target_dir)
    target, _ = load_target(target_dir)
    with torch.no_grad():  # a gain that is not the RMSNorm's default of ones, so a copy shows
        target.model.norm.weight.copy_(torch.linspace(0.5, 1.5, target.model.norm.weight.numel()))
    target.save_pretrained(target_dir)
    outs = {}
    for init in ("random", "target"):
        cfg = _cfg(tmp_path / init, target_dir, tiny_text_jsonl, *HEAD_TYPE_OVERRIDES[head_type],
                   f"heads.lm_head_init={init}", "train.lr_schedule=constant", max_steps=1, eval_every=0,
                   warmup_steps=1)  # fmt: skip
        outs[init] = run(cfg).heads
    rows = target.get_output_embeddings().weight[outs["target"].draft_to_target]
    assert torch.equal(outs["target"].lm_head.weight, rows.to(outs["target"].lm_head.weight))
    assert torch.equal(outs["target"].norm.weight, target.model.norm.weight)
    assert not torch.equal(outs["random"].lm_head.weight, rows.to(outs["random"].lm_head.weight))
    assert torch.equal(outs["random"].norm.weight, torch.ones_like(outs["random"].norm.weight))


# ---------------------------------------------------------------------------------------------
# train.loss_checkpointing: memory vs recompute, never the gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_type", list(HEAD_TYPE_OVERRIDES))
def test_loss_chunks_kept_or_recomputed_give_the_same_gradients_bit_for_bit(tiny_llama, head_type, monkeypatch):
    """Several chunks per step (chunk size 7), every head type: the loss and every gradient are
    equal with checkpointed chunks and with kept ones, and only the first checkpoints."""
    from draftheads.config import config_from_dict
    from draftheads.methods.dflash import loss as dflash_loss
    from draftheads.methods.eagle import loss as eagle_loss
    from draftheads.methods.medusa import loss as losses
    from draftheads.methods.peagle import loss as peagle_loss
    from draftheads.train.components import build_heads
    from draftheads.train.model import TargetWithHeads

    calls = []
    for module in (dflash_loss, eagle_loss, losses, peagle_loss):
        original = module.checkpoint
        monkeypatch.setattr(module, "checkpoint", lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))

    mask = ("heads.mask_token_id=0",) if head_type == "peagle" else ()  # no tokenizer to choose one from
    spec = config_from_dict({}, [*HEAD_TYPE_OVERRIDES[head_type], *mask]).heads
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    out = {}
    for keep in (False, True):
        torch.manual_seed(0)  # the same fresh heads, the same DFlash anchors
        heads = build_heads(spec, tiny_llama)
        if heads.own_draft_vocabulary:
            heads.set_draft_vocab(torch.arange(heads.config.vocab_size).flip(0).index_fill(0, torch.tensor([0]), 0))
        model = TargetWithHeads(tiny_llama, heads, loss_chunk_size=7, labels="target", checkpoint_loss_chunks=not keep)
        calls.clear()
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids))["loss"]
        loss.backward()
        out[keep] = (loss.detach(), [p.grad.clone() for p in model.trainable_parameters()])
        assert (len(calls) == 0) if keep else (len(calls) > 1), (keep, len(calls))
    assert torch.equal(out[False][0], out[True][0])
    assert len(out[False][1]) == len(out[True][1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(out[False][1], out[True][1]))


def test_the_loop_passes_loss_checkpointing_to_the_model(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    heads = {}
    for keep in ("true", "false"):
        cfg = _cfg(tmp_path / keep, tiny_target_dir, tiny_text_jsonl, *HEAD_TYPE_OVERRIDES["eagle3"],
                   f"train.loss_checkpointing={keep}", max_steps=2, eval_every=0, warmup_steps=0)  # fmt: skip
        result = run(cfg)
        heads[keep] = result.heads.state_dict()
    assert all(torch.equal(heads["true"][k], heads["false"][k]) for k in heads["true"])
