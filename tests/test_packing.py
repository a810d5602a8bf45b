"""Sequence packing: the target and every head type see each packed document as if it ran alone.

The target's equality is checked against each document's own forward on several architectures
(a sliding window included); the heads' against the same documents as padded rows: same loss
counts, same loss, same gradients, and the same weights after a few optimizer steps.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import draftheads as dh
from draftheads.config import ConfigError, config_from_dict
from draftheads.data import Collator
from draftheads.data.packing import PackedDataset, PackingCollator, pack_dataset, pack_rows, split_row
from draftheads.train.features import FeatureCollator
from draftheads.train.model import TargetWithHeads
from draftheads.train.packing import PackingError, check_target_packing, pack_for_training

from conftest import make_tiny_model

PAD = 3
WINDOW = 40
LENGTHS = [(23, 9, 14, 31, 6, 17, 12, 20), (30, 11, 8, 25, 16, 5, 19, 13), (9, 27, 15, 22, 7, 33, 10, 18)]


def documents(lengths, vocab: int, seed: int = 0) -> list[dict]:
    """Rows like the tokenizer's: a prompt part without loss, then trained tokens."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(4, vocab, (n,), generator=gen).tolist()
        prompt = int(torch.randint(1, max(2, n // 2), (1,), generator=gen))
        rows.append({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (n - prompt)})
    return rows


def unpacked_batch(rows) -> dict:
    return Collator(PAD)(rows)


def packed_batch(rows, window: int = WINDOW) -> dict:
    ds, stats = pack_dataset(rows, [len(r["input_ids"]) for r in rows], window)
    assert stats.windows < len(rows), "the test needs windows holding several documents"
    return PackingCollator(Collator(PAD))([ds[i] for i in range(len(ds))])


# -- the packer ------------------------------------------------------------------------------------


def test_every_token_is_placed_once_in_windows_that_fit():
    lengths = [5, 40, 17, 1, 33, 8, 8, 22, 39, 2]
    windows, stats = pack_rows(lengths, 40)
    placed = sorted((row, a, b) for w in windows for row, a, b in w)
    assert placed == sorted((i, 0, n) for i, n in enumerate(lengths))
    assert all(sum(b - a for _, a, b in w) <= 40 for w in windows)
    assert stats.tokens == sum(lengths) and stats.windows == len(windows) == 5  # 175 tokens need 5 windows
    assert stats.padding_fraction == pytest.approx(1 - 175 / 200)
    assert pack_rows(lengths, 40) == (windows, stats)  # a pure function of the lengths


def test_long_rows_are_split_or_dropped_counted_and_reported():
    rows = [{"input_ids": list(range(10, 35)), "loss_mask": [0] + [1] * 24}, {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}]
    assert split_row(25, 10) == [(0, 10), (9, 19), (18, 25)]
    ds, stats = pack_dataset(rows, [25, 3], 10, "split")
    assert (stats.long_rows, stats.pieces, stats.tokens) == (1, 3, 10 + 10 + 7 + 3)
    assert "1 rows longer than the window were split into 3 pieces" in stats.summary()
    items = [ds[i] for i in range(len(ds))]
    second = next(it for it in items if it["input_ids"][0] == 19)  # the piece starting at token 9 (id 19)
    assert second["loss_mask"][0] == 0 and second["loss_mask"][1:10] == [1] * 9  # the shared token is context
    assert sum(sum(it["loss_mask"]) for it in items) == 24 + 2  # every trained token still trained once
    ds, stats = pack_dataset(rows, [25, 3], 10, "drop")
    assert (stats.long_rows, stats.dropped_tokens, stats.windows) == (1, 25, 1)
    assert "DROPPED (25 tokens)" in stats.summary() and "pack_overflow: split" in stats.summary()


def test_collated_positions_restart_per_document_and_over_the_padding():
    rows = [{"input_ids": [5] * 3, "loss_mask": [0, 1, 1]}, {"input_ids": [6] * 2, "loss_mask": [0, 1]}, {"input_ids": [7] * 6, "loss_mask": [0] + [1] * 5}]
    ds = PackedDataset(rows, [[(0, 0, 3), (1, 0, 2)], [(2, 0, 6)]])
    batch = PackingCollator(Collator(PAD))([ds[0], ds[1]])
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1] * 6]
    assert batch["loss_mask"].tolist() == [[0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 1]]


# -- the target: each packed document sees only itself --------------------------------------------


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_target_hidden_states_and_logits_of_a_packed_window_equal_each_document_alone(arch, attention):
    target = make_tiny_model(arch)  # mistral: sliding window 24, exercised by the 31-token document
    target.config._attn_implementation = attention
    rows = documents((31, 9, 14, 6, 23), target.config.vocab_size)
    batch = packed_batch(rows, window=48)
    model = TargetWithHeads(target, dh.MedusaHeads.for_target(target, num_heads=2))
    with torch.no_grad():
        hidden = model.target_hidden(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        logits = target(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        crossed = model.target_hidden(batch["input_ids"], batch["attention_mask"])  # no per-document attention
    starts = (batch["position_ids"] == 0) & batch["attention_mask"].bool()
    checked = leaked = 0
    for b, t in starts.nonzero().tolist():
        ids = batch["input_ids"][b, t:]
        n = int(((batch["position_ids"][b, t:] == torch.arange(ids.numel()))).cumprod(0).sum())
        with torch.no_grad():
            alone = target(input_ids=ids[None, :n], output_hidden_states=True)
        torch.testing.assert_close(hidden[b, t : t + n], alone.hidden_states[-1][0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(logits[b, t : t + n], alone.logits[0], atol=2e-5, rtol=1e-5)
        leaked += int(t > 0 and not torch.allclose(crossed[b, t : t + n], alone.hidden_states[-1][0], atol=1e-3))
        checked += 1
    assert checked == len(rows) and leaked > 0  # without position ids, later documents do see earlier ones


def test_a_target_that_ignores_packed_positions_is_refused_by_name():
    class IgnoresPositions(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids, position_ids=None, **kwargs):
            return self.inner(input_ids=input_ids, **kwargs)

    target = make_tiny_model("llama")
    check_target_packing(target)  # the real one keeps documents apart
    with pytest.raises(PackingError, match=r"IgnoresPositions.*does not keep packed documents apart.*data.packing: false"):
        check_target_packing(IgnoresPositions(target))


# -- every head type: packed training equals unpacked training -------------------------------------

HEADS = {
    "medusa": lambda t: dh.MedusaHeads.for_target(t, num_heads=3),
    "hydra": lambda t: dh.HydraHeads.for_target(t, num_heads=3),
    "eagle": lambda t: dh.EagleHead.for_target(t, num_heads=3),
    "eagle3": lambda t: dh.Eagle3Head.for_target(t, num_heads=3, draft_vocab_size=48),
    # every candidate anchor / chain is drawn, so both layouts train on the same blocks and depths
    "dflash": lambda t: dh.DFlashHeads.for_target(t, num_layers=1, block_size=4, mask_token_id=63, num_anchors=4096),
    "peagle": lambda t: dh.PEagleHead.for_target(
        t, num_heads=4, num_layers=1, draft_vocab_size=48, mask_token_id=0, cod_ratio=1.0, cod_min_ratio=1.0
    ),
}


def fresh_heads(target, head_type: str, seed: int = 0, std: float = 0.05):
    torch.manual_seed(seed)
    heads = HEADS[head_type](target)
    if heads.own_draft_vocabulary:
        heads.set_draft_vocab(torch.arange(target.config.vocab_size).float())  # id 0 (P-EAGLE's mask) never seen
    for p in heads.parameters():  # a random start: zero-initialised projections would hide mistakes
        torch.nn.init.normal_(p, std=std)
    return heads


def step_once(model, batch, opt) -> tuple[float, torch.Tensor]:
    counts = model.loss_counts(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], batch.get("position_ids"))
    out = model(**batch, loss_denominators=counts.float())
    opt.zero_grad()
    out["loss"].backward()
    opt.step()
    return float(out["loss"]), counts


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("head_type", list(HEADS))
def test_heads_trained_on_packed_windows_equal_heads_trained_on_padded_rows(head_type, arch):
    target = make_tiny_model(arch)
    padded = TargetWithHeads(target, fresh_heads(target, head_type))
    packed = TargetWithHeads(target, copy.deepcopy(padded.heads))
    # plain SGD: the weights move by the gradients themselves (Adam would blow float noise in
    # near-zero gradients up to full steps), so equal weights mean equal gradients at every step
    opt_padded = torch.optim.SGD(padded.heads.parameters(), lr=0.5)
    opt_packed = torch.optim.SGD(packed.heads.parameters(), lr=0.5)
    for step, lengths in enumerate(LENGTHS):  # three steps, each on its own documents
        rows = documents(lengths, target.config.vocab_size, seed=step)
        a, b = unpacked_batch(rows), packed_batch(rows)
        assert b["input_ids"].numel() < a["input_ids"].numel()
        loss_a, counts_a = step_once(padded, a, opt_padded)
        loss_b, counts_b = step_once(packed, b, opt_packed)
        assert counts_a.tolist() == counts_b.tolist() and int(counts_a[0]) > 0
        assert loss_b == pytest.approx(loss_a, rel=1e-5, abs=1e-6), f"step {step}"
        for (name, pa), pb in zip(padded.heads.named_parameters(), packed.heads.parameters()):
            if pa.grad is not None:
                torch.testing.assert_close(pb.grad, pa.grad, atol=1e-6, rtol=1e-4, msg=f"step {step}: {name}")
    for (name, pa), pb in zip(padded.heads.named_parameters(), packed.heads.parameters()):
        torch.testing.assert_close(pb, pa, atol=2e-5, rtol=1e-4, msg=name)
    moved = any(not torch.equal(pa, pb) for pa, pb in zip(padded.heads.parameters(), fresh_heads(target, head_type).parameters()))
    assert moved, "the heads did not train"


@pytest.mark.parametrize("head_type", ["eagle", "dflash", "peagle", "medusa"])
def test_a_document_boundary_changes_nothing_before_it(head_type):
    """Crossing documents would show: the loss of a window changes when its second document
    changes, while the separate runs of the first document do not."""
    target = make_tiny_model("llama")
    # large weights: fresh heads' near-uniform drafts would hide a change in what they attend to
    model = TargetWithHeads(target, fresh_heads(target, head_type, std=0.5)).eval()
    first = documents((20,), target.config.vocab_size, seed=5)
    other = [documents((15,), target.config.vocab_size, seed=s) for s in (6, 7)]
    with torch.no_grad():
        alone = model(**unpacked_batch(first))["stats"]
        together = [model(**_window(first + o))["stats"] for o in other]
        second = [model(**unpacked_batch(o))["stats"] for o in other]
    for stats, extra in zip(together, second):
        torch.testing.assert_close(stats[:2], alone[:2] + extra[:2], atol=1e-4, rtol=1e-5)  # CE sums and counts add up


def _window(rows) -> dict:
    """All ``rows`` in one window."""
    ds = PackedDataset(rows, [[(i, 0, len(r["input_ids"])) for i, r in enumerate(rows)]])
    return PackingCollator(Collator(PAD))([ds[0]])


# -- the feature cache: cached rows, packed, equal the target run on the packed window ------------


@pytest.mark.parametrize("head_type", ["eagle3", "medusa"])
def test_cached_features_packed_equal_the_target_run_on_the_window(head_type):
    target = make_tiny_model("qwen2")
    model = TargetWithHeads(target, fresh_heads(target, head_type), labels="target")
    rows = documents(LENGTHS[0], target.config.vocab_size)
    cached = []
    for r in rows:  # what cache-features stores: each row's own target run
        hidden, features, labels = model.target_outputs(torch.tensor([r["input_ids"]]))
        item = {**r, "hidden": hidden[0], "target_labels": labels[0].int()}
        if head_type == "eagle3":
            item["features"] = features[0]
        cached.append(item)
    ds, _ = pack_dataset(cached, [len(r["input_ids"]) for r in rows], WINDOW)
    batch = PackingCollator(FeatureCollator(Collator(PAD)))([ds[i] for i in range(len(ds))])
    assert "hidden" in batch and batch["hidden"].shape[:2] == batch["input_ids"].shape
    from_cache = model(**batch)
    from_target = model(**{k: v for k, v in batch.items() if k not in FeatureCollator.KEYS})
    assert float(from_cache["loss"]) == pytest.approx(float(from_target["loss"]), rel=1e-5)
    torch.testing.assert_close(from_cache["stats"], from_target["stats"], atol=1e-3, rtol=1e-5)


# -- configuration ----------------------------------------------------------------------------------


def test_packing_options_are_validated_by_name():
    base = {"data": {"path": "rows.jsonl"}, "heads": {"head_type": "medusa"}}
    cfg = config_from_dict({**base, "data": {"path": "rows.jsonl", "packing": True, "pack_length": 64}})
    assert cfg.data.packing and cfg.data.packing_window == 64
    assert config_from_dict(base).data.packing is False  # off unless asked for
    with pytest.raises(ConfigError, match="pack_overflow='cut' is not one of split, drop"):
        config_from_dict({**base, "data": {"path": "rows.jsonl", "packing": True, "pack_overflow": "cut"}})
    with pytest.raises(ConfigError, match="data.packing and train.group_by_length are both on"):  # before any load
        config_from_dict({**base, "data": {"path": "rows.jsonl", "packing": True}, "train": {"group_by_length": True}})
    both = config_from_dict({**base, "data": {"path": "rows.jsonl", "packing": True}})
    both.train.group_by_length = True  # set after the config check: packing still refuses it
    with pytest.raises(PackingError, match="data.packing and train.group_by_length are both on"):
        pack_for_training(both, None, [], Collator(PAD))


def test_pack_for_training_reports_and_keeps_documents():
    cfg = config_from_dict({"data": {"path": "rows.jsonl", "packing": True, "max_length": 40, "pack_length": 20}})
    from datasets import Dataset

    rows = Dataset.from_list(documents((30, 9, 14, 6), 200))
    said = []
    ds, collator = pack_for_training(cfg, make_tiny_model("llama"), rows, Collator(PAD), said.append)
    assert isinstance(collator, PackingCollator) and len(ds) < 5
    assert "1 rows longer than the window were split into 2 pieces" in said[0] and "evaluation stays unpacked" in said[0]


# -- the training loop ------------------------------------------------------------------------------


def test_training_runs_on_packed_windows_and_resumes_bit_exact(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys):
    """``data.packing`` through ``run``: the log reports the windows, evaluation stays unpacked,
    and a run resumed mid-epoch from a checkpoint ends with the straight run's heads."""
    import shutil

    from safetensors.torch import load_file

    from draftheads.train.loop import run
    from test_train import HEAD_TYPE_OVERRIDES, _assert_same_state, _cfg

    extra = (*HEAD_TYPE_OVERRIDES["eagle3"], "data.packing=true", "data.pack_length=96")
    straight = _cfg(tmp_path / "a", tiny_target_dir, tiny_text_jsonl, *extra, max_steps=6, save_every=3, batch_size=2)
    result = run(straight)
    printed = capsys.readouterr()
    assert result.step == 6
    assert "packing:" in printed.out and "windows of 96 tokens" in printed.out and "evaluation stays unpacked" in printed.out
    resumed = _cfg(tmp_path / "b", tiny_target_dir, tiny_text_jsonl, *extra, max_steps=6, save_every=3, batch_size=2)
    ckpt = Path(straight.train.output_dir) / "checkpoints" / "step-3"
    shutil.copytree(ckpt, Path(resumed.train.output_dir) / "checkpoints" / "step-3")
    resumed.train.resume = "auto"
    assert run(resumed).step == 6
    a = load_file(str(Path(straight.train.output_dir) / "heads" / "model.safetensors"))
    b = load_file(str(Path(resumed.train.output_dir) / "heads" / "model.safetensors"))
    _assert_same_state(a, b)
