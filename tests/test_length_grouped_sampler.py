"""Length-grouped batches: a permutation per epoch, far less padding, batch boundaries the
DataLoader keeps, resume-exact, and the training loop uses it when asked."""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import BatchSampler

from draftheads.data.sampling import LengthGroupedSampler, padding_fraction


def _lengths(n=1000, seed=0):
    rng = random.Random(seed)
    return [max(2, min(1024, int(rng.lognormvariate(5.3, 0.9)))) for _ in range(n)]


def test_each_epoch_is_a_permutation_and_batches_survive_the_dataloader():
    lengths = _lengths(1003)
    s = LengthGroupedSampler(lengths, batch_size=8, seed=3, group=16)
    for epoch in range(3):
        s.set_epoch(epoch)
        order = list(s)
        assert sorted(order) == list(range(1003))
        # the DataLoader cuts consecutive indices into batches of 8: exactly the sampler's batches
        assert [list(b) for b in BatchSampler(s, 8, drop_last=False)] == s.batches()
        assert all(len(b) == 8 for b in s.batches()[:-1]) and len(s.batches()[-1]) == 1003 % 8
    s.set_epoch(0)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    assert list(s) == first  # seeded: the same on every process and after a resume


def test_grouping_cuts_padding():
    lengths = _lengths()
    s = LengthGroupedSampler(lengths, batch_size=8, seed=0)
    perm = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
    random_batches = [perm[i : i + 8] for i in range(0, len(perm), 8)]
    before, after = padding_fraction(lengths, random_batches), padding_fraction(lengths, s.batches())
    assert before > 0.4 and after < 0.05, (before, after)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="batch_size and group must be >= 1"):
        LengthGroupedSampler([3, 4], batch_size=0)


def test_training_with_group_by_length(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    from draftheads.config import config_from_dict
    from draftheads.data import sampling
    from draftheads.train.loop import run

    torch.set_num_threads(1)
    seen = []
    orig = sampling.LengthGroupedSampler.batches
    monkeypatch.setattr(sampling.LengthGroupedSampler, "batches", lambda self: seen.append(1) or orig(self))
    cfg = config_from_dict({
        "target": {"name_or_path": str(tiny_target_dir), "dtype": "float32"},
        "heads": {"num_heads": 2, "num_layers": 1, "lm_head": "own"},
        "data": {"path": str(tiny_text_jsonl), "format": "text", "max_length": 40, "eval_fraction": 0.1,
                 "cache_dir": str(tmp_path / "hf")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 3, "batch_size": 4, "eval_every": 0,
                  "eval_batches": 1, "save_every": 0, "log_every": 1, "group_by_length": True,
                  "choose_tree": False},
    })
    assert run(cfg).step == 3 and seen
