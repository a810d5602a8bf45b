"""One EOS rule and one pad rule for every decode mode, both `generate`'s: a finished row is padded
with the config's pad id, else with the first EOS id."""
from __future__ import annotations

from types import SimpleNamespace

import torch

import draftheads as dh
from draftheads.inference.inputs import eos_ids, left_pad, pad_id

from inference_utils import tiny_target


def with_config(**settings) -> SimpleNamespace:
    return SimpleNamespace(generation_config=SimpleNamespace(**settings))


def test_eos_ids_keep_the_order_given_and_fall_back_to_the_config():
    target = with_config(eos_token_id=[9, 4], pad_token_id=None)
    assert eos_ids(target, None) == [9, 4]
    assert eos_ids(target, 5) == [5]
    assert eos_ids(target, []) == []
    assert eos_ids(with_config(eos_token_id=None), None) == []


def test_pad_id_is_the_config_pad_else_the_first_eos():
    assert pad_id(with_config(pad_token_id=2), [9, 4]) == 2
    assert pad_id(with_config(pad_token_id=None), [9, 4]) == 9
    assert pad_id(with_config(pad_token_id=None), []) is None


def test_rows_stopping_early_are_padded_as_generate_pads_them():
    """No pad id in the config: rows that hit EOS early are padded with the first EOS id, in the
    speculative loop exactly as in `generate`."""
    target = tiny_target("llama")
    target.generation_config.pad_token_id = None
    ids, mask = left_pad([torch.tensor([5, 6, 7, 5, 6, 7]), torch.tensor([11, 3, 8])], 0)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, eos_token_id=[], pad_token_id=0)
    row0 = free[0, ids.shape[1]:].tolist()
    row1 = free[1, ids.shape[1]:].tolist()
    stop = next(t for t in row0[1:6] if t not in row1)  # row 0 stops early, row 1 runs to the end
    eos = [stop, stop + 1 if stop + 1 not in row1 else stop + 2]
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, eos_token_id=eos)
    out = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(num_tokens=3)).generate(
        ids, attention_mask=mask, max_new_tokens=10, eos_token_id=eos)
    assert torch.equal(out.sequences, reference)
    assert out.stats["row_new_tokens"][0] < 10 and (out.sequences[0, -1] == eos[0])
