"""Every experiment config the repository ships is valid, and the real small target's configs train
on the chats shipped in data/ (the main job must run from a clean clone)."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftheads.config import load_config
from draftheads.registry import methods

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SMOLLM2 = [p for p in CONFIGS if p.name.startswith("smollm2")]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    cfg = load_config(path)
    assert cfg.data.path, f"{path.name} names no data"


def test_the_real_target_has_a_config_per_head_type():
    types = {load_config(p).heads.head_type for p in SMOLLM2}
    assert types == {m.name for m in methods()}


@pytest.mark.parametrize("path", SMOLLM2, ids=lambda p: p.name)
def test_the_real_targets_configs_train_on_shipped_data(path):
    cfg = load_config(path)
    assert cfg.target.name_or_path == "smollm2"
    assert (ROOT / cfg.data.path).is_file(), f"{path.name}: {cfg.data.path} is not in the repository"
