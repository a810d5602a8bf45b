"""Batch > 1: every row of a left-padded batch decodes exactly as `generate` decodes it.

Greedy rows are compared with `generate` on the same padded batch AND with each row decoded
alone, for every head type and proposer, rows of different prompt lengths and EOS at different
steps; sampled rows must follow the target's exact law (chi-square per row, batch 4).
"""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.inference.sampling import SamplingParams

from inference_utils import self_distilled_heads, tiny_target
from test_head_types import trained_heads
from stats import law_pvalue
from test_sampling import TREE, exact_distribution

NEW = 24
PAD = 0


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def batch_rows(prompts: torch.Tensor) -> list[list[int]]:
    """Four rows of different lengths: three the heads trained on (drafts accepted), one fresh."""
    return [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]


def reference(target, ids, mask, eos=None, new=NEW) -> torch.Tensor:
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                           eos_token_id=eos, pad_token_id=PAD)


def check_rows_exact(target, source, rows, eos=None, new=NEW, compaction=None):
    """Decode ``rows`` as one batch; compare with generate on the batch and on every row alone."""
    ids, mask = left_padded(rows)
    decoder = dh.SpeculativeDecoder(target, source, compaction="auto" if compaction is None else compaction)
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=[] if eos is None else eos)
    batched = reference(target, ids, mask, eos=eos, new=new)
    assert out.sequences.shape == batched.shape, f"{tuple(out.sequences.shape)} vs generate's {tuple(batched.shape)}"
    assert torch.equal(out.sequences, batched), "batched output differs from generate on the same padded batch"
    width = ids.shape[1]
    for r, row in enumerate(rows):
        alone = reference(target, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long), eos=eos, new=new)
        got = out.sequences[r, width:]
        assert torch.equal(got[: alone.shape[1] - len(row)], alone[0, len(row):]), f"row {r} differs from decoding it alone"
        assert (got[alone.shape[1] - len(row):] == PAD).all(), f"row {r} is not padded after its end"
    return out


# -- greedy, every head type and proposer, two architectures --------------------------------------
ARCHS = ("llama", "qwen2")
METHODS = ("medusa", "hydra", "eagle", "eagle3", "prompt-lookup", "draft-model")


@pytest.fixture(scope="module", params=ARCHS)
def arch_setup(request):
    target = tiny_target(request.param)
    return request.param, target, {}


def method_source(arch_setup, method):
    """(heads or proposer, prompts the heads trained on); heads trained once per module and arch."""
    _, target, trained = arch_setup
    if method not in trained:
        if method == "medusa":
            trained[method] = self_distilled_heads(target, steps=60)
        elif method in ("hydra", "eagle", "eagle3"):
            trained[method] = trained_heads(target, method, steps=80)
        else:
            gen = torch.Generator().manual_seed(5)
            trained[method] = (None, torch.randint(3, target.config.vocab_size, (4, 6), generator=gen))
    heads, prompts = trained[method]
    if method == "prompt-lookup":
        return dh.PromptLookupProposer(max_ngram=2, num_tokens=4), prompts
    if method == "draft-model":
        return dh.DraftModelProposer(tiny_target(arch_setup[0], seed=1), gamma=3), prompts
    return heads, prompts


@pytest.mark.parametrize("method", METHODS)
def test_greedy_rows_match_generate(arch_setup, method, one_torch_thread):
    _, target, _ = arch_setup
    source, prompts = method_source(arch_setup, method)
    out = check_rows_exact(target, source, batch_rows(prompts))
    if method in ("medusa", "hydra", "eagle", "eagle3"):
        assert out.mean_accept_length > 1.2, f"{method}: drafts were (almost) never accepted, the test would be vacuous"
    assert out.stats["batch_size"] == 4
    if method in ("eagle", "eagle3"):
        # Drafting all rows together grows each row's own tree: every row accepts, step by step,
        # what it accepts decoded alone (a drafting bug leaves the tokens exact but not this).
        for r, row in enumerate(batch_rows(prompts)):
            alone = dh.SpeculativeDecoder(target, source).generate(torch.tensor([row]), max_new_tokens=NEW, eos_token_id=[])
            assert out.stats["row_accept_lengths"][r] == alone.accept_lengths, f"row {r} drafted differently in the batch"


@pytest.mark.parametrize("compaction", ["never", "always", "auto"])
def test_every_compaction_policy_is_exact(arch_setup, compaction, one_torch_thread):
    """Holes kept (masked), removed every step, or removed when cheap: the same tokens."""
    _, target, _ = arch_setup
    heads, prompts = method_source(arch_setup, "medusa")
    out = check_rows_exact(target, heads, batch_rows(prompts), compaction=compaction)
    if compaction == "never":
        assert out.stats["max_holes"] > 0 and out.stats["compactions"] == 0, "rows accepted alike: no holes exercised"
    if compaction == "always":
        assert out.stats["compactions"] > 0


@pytest.mark.parametrize("arch", ["mistral", "gemma3_text"])
def test_windowed_attention_rows_match_generate(arch, one_torch_thread):
    """A sliding window (Mistral) and mixed sliding/full layers (Gemma 3) past the window."""
    target = tiny_target(arch)
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(3, 64, (n,), generator=gen).tolist() for n in (20, 9, 14)]
    check_rows_exact(target, dh.PromptLookupProposer(max_ngram=2, num_tokens=4), rows, new=30)


def eos_for_different_stops(target, ids, mask) -> int:
    """A token that ends some rows early, at different steps, and leaves another row running."""
    free = reference(target, ids, mask)[:, ids.shape[1]:]
    for tok in free[0, 1:].tolist():
        stops = [(row == tok).nonzero().flatten()[:1].tolist() for row in free]
        ends = {s[0] for s in stops if s}
        if len(ends) >= 2 and any(not s for s in stops):
            return tok
    for tok in free[0, 1:].tolist():
        stops = [(row == tok).nonzero().flatten()[:1].tolist() for row in free]
        if len({s[0] if s else NEW for s in stops}) >= 2:
            return tok
    raise AssertionError("no token ends the rows at different steps: pick other prompts")


@pytest.mark.parametrize("method", ["medusa", "prompt-lookup"])
def test_rows_stop_at_their_own_eos(arch_setup, method, one_torch_thread):
    _, target, _ = arch_setup
    source, prompts = method_source(arch_setup, method)
    rows = batch_rows(prompts)
    ids, mask = left_padded(rows)
    eos = eos_for_different_stops(target, ids, mask)
    out = check_rows_exact(target, source, rows, eos=eos)
    lengths = out.stats["row_new_tokens"]
    assert len(set(lengths)) >= 2, f"rows ended together ({lengths}): EOS at different steps not exercised"
    if method == "medusa":  # finished rows leave the batch: fewer tokens verified than all rows, every step
        tree_size = dh.SpeculativeDecoder(target, source).proposer.shape.size
        assert out.stats["verify_tokens"] < out.stats["steps"] * len(rows) * tree_size


def test_padded_single_row_matches_generate(tiny_llama, one_torch_thread):
    ids, mask = left_padded([[1, 5, 9]])
    ids = torch.cat([torch.full((1, 2), PAD), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), mask], dim=1)
    out = dh.SpeculativeDecoder(tiny_llama, dh.PromptLookupProposer()).generate(
        ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.sequences, reference(tiny_llama, ids, mask, new=12))


def test_unpadded_rows_given_as_lists_decode_every_row(tiny_llama, one_torch_thread):
    """Plain Python lists with no mask take the batched path too (not only row 0)."""
    rows = [[1, 5, 9], [2, 6, 7]]
    out = dh.SpeculativeDecoder(tiny_llama, dh.PromptLookupProposer()).generate(rows, max_new_tokens=8, eos_token_id=[])
    ids = torch.tensor(rows)
    assert torch.equal(out.sequences, reference(tiny_llama, ids, torch.ones_like(ids), new=8))


# -- sampling: each row follows the target's exact law --------------------------------------------
VOCAB = 6
SAMPLE_NEW = 3
RUNS = 1500  # batches; every row gets its own chi-square test over RUNS draws


@pytest.mark.parametrize("head_type", ["medusa", "eagle"])
def test_sampled_rows_follow_the_target_distribution(one_torch_thread, head_type):
    """Every row of a batch keeps the target's law with drawn drafts (the default when sampling):
    Medusa's rows drawn from one call, EAGLE's through the shared draft cache with holes."""
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    if head_type == "medusa":
        decoder = dh.SpeculativeDecoder(target, dh.MedusaHeads.for_target(target, num_heads=2), tree=TREE)
    else:
        decoder = dh.SpeculativeDecoder(target, dh.EagleHead.for_target(target, num_heads=1),
                                        tree={"total_tokens": 6, "depth": 2, "top_k": 2})
    rows = [[1, 4, 3], [2, 5], [1, 1, 4, 3], [3, 2, 4]]
    ids, mask = left_padded(rows)
    params = SamplingParams(temperature=0.9, top_k=5)
    gen = torch.Generator().manual_seed(1234)
    counts = [dict() for _ in rows]
    accepted = 0
    for _ in range(RUNS):
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=SAMPLE_NEW, temperature=0.9, top_k=5,
                               eos_token_id=[], generator=gen)
        accepted += max(out.accept_lengths) > 1
        for r in range(len(rows)):
            key = tuple(out.sequences[r, ids.shape[1]:].tolist())
            counts[r][key] = counts[r].get(key, 0) + 1
    for r, row in enumerate(rows):
        dist = exact_distribution(target, torch.tensor([row]), params)
        pvalue = law_pvalue(counts[r], dist)
        assert pvalue > 1e-3, f"row {r}: chi-square p-value {pvalue:.2e}: not the target's distribution"
    assert accepted >= RUNS // 10, f"drafts accepted in only {accepted}/{RUNS} batches: the test would be vacuous"


# -- bad input --------------------------------------------------------------------------------------
@pytest.fixture
def lookup_decoder(tiny_llama):
    return dh.SpeculativeDecoder(tiny_llama, dh.PromptLookupProposer())


def test_right_padded_batch_is_refused(lookup_decoder):
    ids = torch.tensor([[1, 5, 9, 4], [1, 5, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match=r"row\(s\) \[1\].*padded on the right.*padding_side = 'left'"):
        lookup_decoder.generate(ids, attention_mask=mask, max_new_tokens=4)


def test_row_without_tokens_is_refused(lookup_decoder):
    ids = torch.tensor([[1, 5, 9], [0, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match=r"row\(s\) \[1\].*no tokens"):
        lookup_decoder.generate(ids, attention_mask=mask, max_new_tokens=4)


def test_empty_prompts_are_refused(lookup_decoder):
    with pytest.raises(ValueError, match="prompts are empty"):
        lookup_decoder.generate(torch.zeros(2, 0, dtype=torch.long), max_new_tokens=4)


def test_attention_mask_of_another_shape_is_refused(lookup_decoder):
    ids = torch.tensor([[1, 5, 9], [1, 6, 7]])
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\) but input_ids has shape \(2, 3\)"):
        lookup_decoder.generate(ids, attention_mask=torch.ones(2, 4, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 3\) but input_ids has shape \(2, 3\)"):
        lookup_decoder.generate(ids, attention_mask=torch.ones(1, 3, dtype=torch.long), max_new_tokens=4)


def test_attention_mask_values_other_than_0_1_are_refused(lookup_decoder):
    ids = torch.tensor([[1, 5, 9], [1, 6, 7]])
    with pytest.raises(ValueError, match="only 0 .* and 1"):
        lookup_decoder.generate(ids, attention_mask=torch.full((2, 3), 2), max_new_tokens=4)


def test_streaming_a_batch_is_refused(lookup_decoder):
    class Streamer:
        def put(self, value):
            pass

        def end(self):
            pass

    with pytest.raises(ValueError, match="one sequence at a time"):
        lookup_decoder.generate(torch.tensor([[1, 5], [1, 6]]), max_new_tokens=4, streamer=Streamer())


def test_batch_past_the_context_is_refused(lookup_decoder):
    ids = torch.ones(2, 500, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the model's context of 512"):
        lookup_decoder.generate(ids, max_new_tokens=20)
