"""Head options are checked where they are given: an option of another head type is an error
naming the types that use it, draft_vocab_size=0 is refused, EAGLE-3 feature layers are checked
against the target's depth when the heads are built (not reported later as a failing forward)."""
from __future__ import annotations

import json
import re

import pytest
import torch

import draftheads as dh
from draftheads.config import ConfigError, config_from_dict

from inference_utils import tiny_target


@pytest.mark.parametrize(
    "heads, message",
    [
        ({"head_type": "medusa", "feature_layers": [1, 2]}, r"heads.feature_layers is set \(\[1, 2\]\) but medusa heads do not use it: it applies to dflash, dflash2, dspark, eagle3, peagle heads only"),
        ({"head_type": "medusa", "draft_vocab_size": 1000}, "heads.draft_vocab_size is set .* it applies to eagle3, peagle heads only"),
        ({"head_type": "eagle3", "cod_ratio": 0.5}, r"heads.cod_ratio is set \(0.5\) but eagle3 heads do not use it: it applies to peagle heads only"),
        ({"head_type": "hydra", "noise": 0.3}, r"heads.noise is set \(0.3\) but hydra heads do not use it: it applies to eagle heads only"),
        ({"head_type": "eagle", "lm_head": "own"}, "heads.lm_head is set .* it applies to hydra, medusa heads only"),
        ({"head_type": "eagle3", "draft_vocab_size": 0}, "heads.draft_vocab_size must be >= 1 or null"),
        ({"head_type": "eagle3", "feature_layers": [-1, 2]}, "heads.feature_layers must be a non-empty list of target layer ids >= 0"),
        ({"head_type": "eagle3", "feature_layers": []}, "heads.feature_layers must be a non-empty list"),
        ({"head_type": "eagle", "noise": -0.1}, "heads.noise must be >= 0"),
    ],
)
def test_head_options_are_checked_in_the_config(heads, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"heads": heads})


def test_default_valued_options_of_other_types_are_accepted():
    """A config that spells out a default (``noise: 0.1``) still works for every head type."""
    assert config_from_dict({"heads": {"head_type": "medusa", "noise": 0.1, "lm_head": "own"}}).heads.head_type == "medusa"
    assert config_from_dict({"heads": {"head_type": "eagle3", "feature_layers": [0, 1], "draft_vocab_size": 16}}).heads.draft_vocab_size == 16


def test_zero_draft_vocab_size_is_refused_not_widened():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match="draft_vocab_size must be a positive integer"):
        dh.Eagle3Head.for_target(target, draft_vocab_size=0)


def test_feature_layers_beyond_the_target_are_refused_when_heads_are_built(tmp_path):
    target = tiny_target("llama")  # 2 layers: hidden states 0..2
    with pytest.raises(ValueError, match=r"feature layer ids \[3\] are outside the target's layer range"):
        dh.Eagle3Head.for_target(target, feature_layers=[0, 3])
    heads = dh.Eagle3Head.for_target(target, num_heads=1, feature_layers=[0, 2], draft_vocab_size=16)
    heads.set_draft_vocab(torch.arange(target.config.vocab_size))
    folder = heads.save_pretrained(tmp_path / "h")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["extra"]["feature_layers"] = [0, 9]  # the weights' shapes still fit: only the range is wrong
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=re.escape(str(folder / "config.json")) + r".*feature layer ids \[9\] are outside"):
        dh.load_heads(folder, target=target)
