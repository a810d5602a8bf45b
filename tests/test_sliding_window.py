"""A sliding window in the EAGLE draft layer's attention: a position window, in training, drafting and ragged batches."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.heads.draft_layer import within_window
from draftheads.inference.sampling import SamplingParams

from inference_utils import greedy_reference, tiny_target
from rows_driver import OneRow
from test_eagle_rows import accepted_path, random_heads, same_tree

WINDOW = 4


def test_window_over_a_training_unroll_mask_is_a_position_window():
    """The training-time-test mask (causal over step 0, then one diagonal per earlier step) keeps
    exactly the keys fewer than ``window`` positions behind the query."""
    n, steps = 9, 3
    rows = torch.arange(n)
    causal = rows[None, :] <= rows[:, None]
    eye = torch.eye(n, dtype=torch.bool)
    for k in range(steps):
        mask = torch.cat([causal] + [eye] * k, dim=-1)[None]
        key_pos = torch.cat([rows] + [rows + i for i in range(1, k + 1)])  # step i's row t sits at t + i
        query_pos = rows + k
        want = mask & (query_pos[:, None] - key_pos[None, :] < WINDOW)
        assert torch.equal(within_window(mask, WINDOW), want), f"unroll step {k}"


def _head(head_type: str, target, window: int | None):
    heads = random_heads(head_type, target)
    heads.set_sliding_window(window)
    return heads


@pytest.mark.parametrize("head_type", ["eagle", "eagle3"])
def test_windowed_layer_reads_only_the_last_positions(head_type):
    """With a window of W, the draft state at position p equals the state computed from the last W
    inputs alone (RoPE is relative), in the training forward and in the drafting cache alike."""
    target = tiny_target("llama").double()
    heads = _head(head_type, target, WINDOW)
    n = 11
    gen = torch.Generator().manual_seed(0)
    feat = heads.fc.weight.shape[1] - (0 if heads.fuses_layers else heads.config.hidden_size)
    features = torch.randn(1, n, feat, generator=gen, dtype=torch.float64)
    tokens = torch.randint(3, target.config.vocab_size, (1, n), generator=gen)
    g, attn_in = heads.first_input(features, tokens)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        full, _ = heads.run_layers(g, attn_in, torch.arange(n)[None], causal)
        # The drafting path: a preallocated cache fed in two chunks, as the proposer catches up.
        cache = heads.new_cache(n + 4, g.device, g.dtype)
        first, _ = heads.run_layers(g[:, :7], attn_in[:, :7], torch.arange(7)[None], causal[:, :7, :7], cache=cache)
        mask = torch.ones(n - 7, n, dtype=torch.bool)
        mask[:, 7:] = torch.ones(n - 7, n - 7, dtype=torch.bool).tril()
        second, _ = heads.run_layers(g[:, 7:], attn_in[:, 7:], torch.arange(7, n)[None], mask[None], cache=cache,
                                     cache_length=7)
        for p in (WINDOW + 1, n - 1):
            lo = p - WINDOW + 1
            alone, _ = heads.run_layers(g[:, lo : p + 1], attn_in[:, lo : p + 1], torch.arange(WINDOW)[None],
                                        causal[:, :WINDOW, :WINDOW])
            # RoPE tables are float32 (as in the draft layer): shifting positions moves the last bits
            torch.testing.assert_close(full[0, p], alone[0, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.cat([first, second], 1), full)
        heads.set_sliding_window(None)
        unwindowed, _ = heads.run_layers(g, attn_in, torch.arange(n)[None], causal)
    torch.testing.assert_close(unwindowed[:, :WINDOW], full[:, :WINDOW])  # nothing is out of the window yet
    assert not torch.allclose(unwindowed[0, -1], full[0, -1]), "the window changed nothing: the test is vacuous"


def test_windowed_batched_trees_equal_each_rows_own(one_torch_thread):
    """Ragged batches keep holes in the draft cache; the window counts positions, not slots."""
    target = tiny_target("llama").double()
    heads = _head("eagle", target, WINDOW)
    tree = {"total_tokens": 10, "depth": 4, "top_k": 3}
    feat = heads.fc.weight.shape[1] - heads.config.hidden_size
    gen = torch.Generator().manual_seed(3)
    vocab = target.config.vocab_size
    lengths = [5, 9, 3]
    prompts = [torch.randint(3, vocab, (n,), generator=gen) for n in lengths]
    hidden = [torch.randn(n, feat, generator=gen, dtype=torch.float64) for n in lengths]
    batched = dh.EagleDrafter(heads, **tree, compaction="never")
    batched.start(prompts, hidden, SamplingParams(), None)
    forked = [OneRow(dh.EagleDrafter(heads, **tree)).start(ids, h) for ids, h in zip(prompts, hidden)]
    roots = [int(t) for t in torch.randint(3, vocab, (len(prompts),), generator=gen)]
    for step in range(5):
        trees = batched.propose(roots, [64] * len(prompts))
        for r, tree_r in enumerate(trees):
            assert same_tree(tree_r, forked[r].propose(roots[r], 64)), f"step {step}, row {r}"
        paths = [accepted_path(t, gen) for t in trees]
        toks = [t.tokens[p] for t, p in zip(trees, paths)]
        feats = [torch.randn(p.numel(), feat, generator=gen, dtype=torch.float64) for p in paths]
        batched.accepted(toks, feats)
        for r, (t, f) in enumerate(zip(toks, feats)):
            forked[r].accepted(t, f)
        roots = [int(t) for t in torch.randint(3, vocab, (len(prompts),), generator=gen)]
    assert batched.stats()["draft_cache"]["max_excess_slots"] > 0, "no holes: the masks were not exercised"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("head_type", ["eagle", "eagle3"])
def test_decoding_with_a_window_is_exact(arch, head_type):
    target = tiny_target(arch).double()
    ids = torch.randint(3, target.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(1))
    ref = greedy_reference(target, ids, 24)
    drafts = {}
    for window in (None, 3, 64):
        heads = _head(head_type, target, window)
        out = dh.SpeculativeDecoder(target, heads, tree={"total_tokens": 8, "depth": 3, "top_k": 2}).generate(
            ids, max_new_tokens=24, temperature=0.0)
        assert torch.equal(out.sequences, ref), f"window {window}"
        drafts[window] = out.accept_lengths
    assert drafts[64] == drafts[None]  # a window wider than the whole sequence changes nothing


def test_window_is_saved_and_bad_windows_are_refused(tmp_path):
    target = tiny_target("llama")
    heads = dh.Eagle3Head.for_target(target, draft_vocab_size=48)
    heads.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0))
    heads.set_sliding_window(16)
    loaded = dh.load_heads(heads.save_pretrained(tmp_path / "h"), target=target)
    assert loaded.config.extra["sliding_window"] == 16
    assert all(layer.sliding_window == 16 for layer in loaded.layers)
    heads.set_sliding_window(None)
    assert "sliding_window" not in heads.config.extra
    for bad in (0, -3, 2.5, True, "256"):
        with pytest.raises(ValueError, match="sliding_window must be a positive whole number"):
            heads.set_sliding_window(bad)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_export_refuses_a_window_by_name(tmp_path, fmt):
    from draftheads.export import ExportError, export_heads

    target = tiny_target("llama", layers=4)
    heads = dh.Eagle3Head.for_target(target, draft_vocab_size=48)
    heads.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0))
    heads.set_sliding_window(256)
    heads.save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=rf"sliding_window 256: the {fmt} export cannot carry"):
        export_heads(tmp_path / "heads", tmp_path / "out", fmt, verifier="org/target")
    assert not (tmp_path / "out").exists()
