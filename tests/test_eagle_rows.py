"""Batched EAGLE drafting (`EagleDrafter` over a batch) grows, for every row, the tree the same
drafter grows for that row alone (a batch of one): same shape, same tokens, step after step, with rows of different prompt
lengths (holes in the shared draft cache from the first step), different accepted counts, rows
drafting shallower near their token budget, and a row leaving the batch.

The drafters are driven directly (random features and accepted paths), so every quantity the
draft cache holds is exercised without a target in the loop; the heads' weights are randomised
(a fresh head's output projections are zero, which would make attention, and so the masks,
irrelevant). float64 keeps reduction-order differences far from top-k ties.
"""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.inference.host_syncs import HostSyncCounter
from draftheads.methods.eagle.drafter import EagleDrafter
from draftheads.inference.sampling import SamplingParams

from inference_utils import tiny_target
from rows_driver import PROMPT_LENGTHS, STEPS, accepted_path, drive_alike

TREE = {"total_tokens": 10, "depth": 4, "top_k": 3}


def random_heads(head_type: str, target) -> torch.nn.Module:
    torch.manual_seed(7)
    if head_type == "eagle":
        heads = dh.EagleHead.for_target(target)
    else:
        heads = dh.Eagle3Head.for_target(target, draft_vocab_size=48)
        heads.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0))
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return heads.double().eval()


def same_tree(a, b) -> bool:
    return a.shape.parents == b.shape.parents and torch.equal(a.tokens, b.tokens)


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama").double()


@pytest.mark.parametrize("compaction", ["never", "always", "auto"])
@pytest.mark.parametrize("head_type", ["eagle", "eagle3"])
def test_batched_trees_equal_forked_trees(target, head_type, compaction, one_torch_thread):
    heads = random_heads(head_type, target)
    feat = heads.fc.weight.shape[1] - (0 if heads.fuses_layers else heads.config.hidden_size)
    batched = dh.EagleDrafter(heads, **TREE, compaction=compaction)
    compared = shallow = 0

    def check(step, r, pos, mine, alone):
        nonlocal compared, shallow
        assert same_tree(mine, alone), (
            f"step {step}, row {r}: batched tree {mine.shape.parents} {mine.tokens.tolist()} differs "
            f"from the row's drafted alone {alone.shape.parents} {alone.tokens.tolist()}"
        )
        compared += alone.shape.size > 1
        shallow += 1 < alone.shape.size and alone.shape.max_depth < TREE["depth"]

    drive_alike(batched, lambda: dh.EagleDrafter(heads, **TREE), feat, target.config.vocab_size, check)
    assert compared >= STEPS * 3 and shallow >= 1, "too few trees compared: the test would be vacuous"
    stats = batched.stats()["draft_cache"]
    if compaction == "never":
        assert stats["max_excess_slots"] > 0, "the draft cache never had holes: the masks were not exercised"
    if compaction == "always":
        assert stats["compactions"] > 1


def test_eagle_heads_draft_rows_together(target):
    """EAGLE and EAGLE-3 heads draft through `EagleDrafter` (every row at once), not one fork per
    row; the decoder hands it its compaction policy."""
    for head_type in ("eagle", "eagle3"):
        decoder = dh.SpeculativeDecoder(target, random_heads(head_type, target).float(), compaction="always",
                                        check_model=False)
        assert isinstance(decoder.proposer, EagleDrafter) and decoder.proposer.compaction == "always"


def test_bad_compaction_is_refused(target):
    with pytest.raises(ValueError, match="compaction"):
        EagleDrafter(random_heads("eagle", target), compaction="sometimes")


@pytest.mark.parametrize("compaction", ["auto", "always"])
def test_batched_drafting_reads_the_device_once_per_step(compaction, one_torch_thread):
    """All rows' trees come to the host in one transfer per step, whatever the rows' lengths, a
    compaction or a row leaving: the draft cache's layout is planned from host bookkeeping (one
    drafter per row would read the device once per row)."""
    target = tiny_target("llama")
    heads = random_heads("eagle", target).float()
    feat = heads.config.hidden_size
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 64, (n,), generator=gen) for n in PROMPT_LENGTHS]
    batched = EagleDrafter(heads, **TREE, compaction=compaction)
    steps = 5
    with HostSyncCounter(target, heads) as syncs:
        hidden = [torch.randn(n, feat, generator=gen) for n in PROMPT_LENGTHS]
        for h in hidden:
            syncs.taint(h)  # target features live on the accelerator
        batched.start(prompts, hidden, SamplingParams(), None)
        rows = len(prompts)
        for step in range(steps):
            trees = batched.propose([5] * rows, [64] * rows)
            paths = [accepted_path(t, gen) for t in trees]
            feats = [torch.randn(p.numel(), feat, generator=gen) for p in paths]
            for f in feats:
                syncs.taint(f)
            batched.accepted([t.tokens[p] for t, p in zip(trees, paths)], feats)
            if step == 1:
                batched.keep([0, 2, 3])
                rows = 3
    assert syncs.total_outside <= steps, f"{dict(syncs.outside)} host reads in {steps} steps"
    assert batched.compactions >= 1
