"""DFlash heads drafting from a calibrated draft vocabulary (``draft_vocab_size``): the target LM
head's rows of the N most frequent training tokens score the block's slots, draft indices map back
to target ids. Decoding stays exact (greedy = generate, sampling = the target's law); the drafts are
the full draft's ranking restricted to that id set; batch rows draft what each row drafts alone;
training and calibration can choose a size; the vLLM export carries it as lm_head + d2t, and an
import of lm_head + d2t gives the same drafts back.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import draftheads as dh
from draftheads.methods.dflash.heads import DFlashHeads
from draftheads.methods.dflash.drafter import DFlashDrafter
from draftheads.inference.sampling import SamplingParams
from draftheads.plans import given_tree, primary

from inference_utils import greedy_reference, tiny_target
from rows_driver import STEPS, drive_alike
from stats import law_pvalue
from test_batch import check_rows_exact
from test_dflash import TREE, trained_dflash
from test_sampling import drafts_accepted, empirical_counts, exact_distribution

SIZE = 24  # of the tiny targets' 64 tokens


def counted(heads, seqs: torch.Tensor):
    """``heads`` with token counts from ``seqs`` (what training records: how often each token was a label)."""
    heads.token_counts.copy_(torch.bincount(seqs.reshape(-1), minlength=heads.config.vocab_size))
    return heads


@pytest.fixture(scope="module")
def trained():
    target = tiny_target("llama", layers=3)
    heads, prompts, _, _ = trained_dflash(target)
    with torch.no_grad():
        counted(heads, greedy_reference(target, prompts, 40))
    return target, heads, prompts


def started(heads, seq: torch.Tensor, features: torch.Tensor, size: int | None) -> DFlashDrafter:
    drafter = DFlashDrafter(heads, tree=TREE, draft_vocab_size=size)
    drafter.start([seq], [features], SamplingParams(), None)
    return drafter


def test_restricted_drafts_are_the_full_drafts_ranked_over_the_id_set(trained, one_torch_thread):
    target, heads, prompts = trained
    seq = greedy_reference(target, prompts[:1], 12)[0]
    features = torch.randn(seq.numel(), heads.fc.in_features)
    ids = heads.draft_vocab(SIZE)
    assert ids.numel() == SIZE and torch.equal(ids, heads.token_counts.topk(SIZE).indices.sort().values)
    full = started(heads, seq, features, heads.config.vocab_size)
    small = started(heads, seq, features, SIZE)
    assert full.vocab_ids is None and torch.equal(small.vocab_ids, ids)
    root = int(seq[-1])
    whole = full.block_logits([root])[0]  # [block, V]
    restricted = small.block_logits([root])[0]  # [block, SIZE]
    assert restricted.shape == (heads.block_size, SIZE)
    assert torch.allclose(restricted, whole[:, ids], atol=1e-6)
    # by hand: node (depth d, rank r) = the r-th best of slot d's logits among the ids, as a target id
    ranked = ids[whole[1:, ids].argsort(dim=-1, descending=True)]
    expected = [root] + [int(ranked[len(path) - 1, path[-1]]) for path in TREE]
    (tree,) = small.propose([root], [3])
    assert tree.tokens.tolist() == expected
    assert set(tree.tokens[1:].tolist()) <= set(ids.tolist())


def test_a_drafter_takes_its_vocabulary_as_an_argument_and_the_decoder_from_the_plan(trained):
    target, heads, _ = trained
    assert DFlashDrafter(heads).vocab_ids is None  # none given: the whole vocabulary
    assert DFlashDrafter(heads, draft_vocab_size=SIZE).vocab_ids.numel() == SIZE
    assert DFlashDrafter(heads, draft_vocab_size=heads.config.vocab_size).vocab_ids is None  # explicit whole
    with pytest.raises(ValueError, match="tree takes rank 30.*draft from 24 tokens"):
        DFlashDrafter(heads, tree=[[0], [30]], draft_vocab_size=SIZE)
    with pytest.raises(ValueError, match="positive integer"):
        DFlashDrafter(heads, draft_vocab_size=0)
    # the plan's entry carries it to the decoder's drafter; the heads themselves are not changed
    planned = dh.SpeculativeDecoder(target, heads, plans=given_tree(TREE, SIZE), check_model=False)
    assert planned.proposer.vocab_ids.numel() == SIZE and heads.plans is None
    assert dh.SpeculativeDecoder(target, heads, check_model=False).proposer.vocab_ids is None


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_with_a_draft_vocabulary_matches_generate(trained, tree, one_torch_thread):
    target, heads, prompts = trained
    decoder = dh.SpeculativeDecoder(target, heads.proposer(tree=tree, draft_vocab_size=SIZE))
    lengths = []
    for i, new in enumerate((40, 40, 7, 1)):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new)), f"{tree}: output differs from generate"
        assert out.stats["dflash"]["draft_vocab_size"] == SIZE
        lengths += out.accept_lengths
    fresh = torch.tensor([[5, 9, 33, 17]])  # never seen: rejections, and tokens outside the draft vocabulary
    assert torch.equal(decoder.generate(fresh, max_new_tokens=30, eos_token_id=[]).sequences,
                       greedy_reference(target, fresh, 30))
    assert sum(lengths) / len(lengths) > 1.3, "the restricted drafts are barely accepted: the test would be vacuous"
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11]]
    check_rows_exact(target, heads.proposer(tree=tree, draft_vocab_size=SIZE), rows)


def test_batch_rows_draft_what_each_row_drafts_alone(one_torch_thread):
    target = tiny_target("llama", layers=3).double()
    torch.manual_seed(7)
    vocab = target.config.vocab_size
    heads = DFlashHeads.for_target(target, num_layers=2, block_size=4, mask_token_id=vocab - 1)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        heads.token_counts.copy_(torch.arange(vocab).flip(0))  # the mask token (count 0) is never drafted
    heads = heads.double().eval()
    batched = heads.proposer(tree=TREE, draft_vocab_size=SIZE)
    assert isinstance(batched, DFlashDrafter) and torch.equal(batched.vocab_ids, heads.draft_vocab(SIZE))
    compared = 0

    def check(step, r, pos, mine, alone):
        nonlocal compared
        assert mine.shape.parents == alone.shape.parents and torch.equal(mine.tokens, alone.tokens), (
            f"step {step}, row {r}: batched {mine.tokens.tolist()} != alone {alone.tokens.tolist()}")
        assert all(0 <= t < SIZE for t in mine.tokens[1:].tolist()), "drafted outside the draft vocabulary"
        compared += mine.shape.size > 1

    drive_alike(batched, lambda: heads.proposer(tree=TREE, draft_vocab_size=SIZE), heads.fc.weight.shape[1], vocab - 1,
                check)
    assert compared >= STEPS * 3


@pytest.mark.parametrize("draws", [True, False], ids=["drawn", "ranked"])
def test_sampling_with_a_draft_vocabulary_follows_the_target_distribution(draws, one_torch_thread):
    """Drawn drafts come from the law over the 3 drafted tokens (zero elsewhere): the verifier must
    see that law over the target's vocabulary, or the output leaves the target's distribution."""
    target = tiny_target("llama", seed=3, vocab=6, hidden=32, layers=2)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    heads = DFlashHeads.for_target(target, num_layers=1, block_size=3, mask_token_id=5)
    heads.token_counts.copy_(torch.tensor([0, 3, 1, 5, 4, 0]))  # drafts only tokens 1, 3 and 4
    proposer = heads.proposer(tree=[[0], [1], [0, 0]], draft_vocab_size=3)
    assert proposer.vocab_ids.tolist() == [1, 3, 4]
    decoder = dh.SpeculativeDecoder(target, proposer, draw_drafts=draws)
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    pvalue = law_pvalue(empirical_counts(decoder, prompt, params, runs=1500), exact_distribution(target, prompt, params))
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: not the target's distribution"
    accepted = drafts_accepted(decoder, prompt, params)
    assert accepted >= 5, f"drafts accepted in only {accepted}/50 runs: the test would be vacuous"


# -- choosing a size ---------------------------------------------------------------------------------
def test_training_tree_choice_can_pick_a_draft_vocabulary(trained, monkeypatch, one_torch_thread):
    """With the restricted forward timed much cheaper (as on a target whose LM head dominates the
    draft), the choice takes a draft vocabulary and the plan entry carries it."""
    import draftheads.tune.training as training

    target, heads, prompts = trained
    rows = [r for r in greedy_reference(target, prompts[:3], 30)]
    monkeypatch.setattr(training, "measure_verify_times", lambda target, sizes, context: {n: 1e-3 for n in sizes})
    monkeypatch.setattr(training, "VOCAB_SIZES", (SIZE,))
    sizes = []

    def draft_seconds(heads, draft_vocab_size=None):
        sizes.append(draft_vocab_size)
        cost = 1e-3 if draft_vocab_size is None else 1e-5
        return {0: 0.0, **{d: cost for d in range(1, heads.config.num_heads + 1)}}

    monkeypatch.setattr(training, "one_forward_draft_seconds", draft_seconds)
    table = torch.tensor([[0.9, 0.05], [0.8, 0.05], [0.7, 0.05]])
    data = training.choose_block_tree(target, heads, table, rows)
    assert sizes == [None, SIZE] and data["draft_vocab_size"] == SIZE and data["tree"]
    kept = torch.tensor(data["accuracy"])
    assert (kept <= table + 1e-6).all(), "a draft vocabulary cannot raise a slot's hit rate"
    entries = training.entries_for(data["tree"], data["draft_vocab_size"], data, "cpu", 0.0)
    assert entries[0].draft_vocab_size == SIZE
    # P-EAGLE heads and heads without counts try the whole vocabulary only
    empty = DFlashHeads.for_target(target, num_layers=1, block_size=4, mask_token_id=63)
    sizes.clear()
    assert training.choose_block_tree(target, empty, table, rows)["draft_vocab_size"] is None and sizes == [None]


def test_calibrate_measures_dflash_draft_vocabularies(trained, monkeypatch, one_torch_thread):
    import draftheads.tune.calibrate as calibrate

    target, heads, prompts = trained
    monkeypatch.setattr(calibrate, "one_forward_vocab_sizes", lambda heads, sizes: [None, SIZE])
    seen = []

    def draft_seconds(heads, draft_vocab_size=None):
        seen.append(draft_vocab_size)
        cost = 1.0 if draft_vocab_size is None else 1e-6  # only the restricted draft pays on this "device"
        return {0: 0.0, **{d: cost for d in range(1, heads.config.num_heads + 1)}}

    monkeypatch.setattr(calibrate, "one_forward_draft_seconds", draft_seconds)
    result = calibrate.calibrate(target, heads, [prompts[0:1], prompts[1:2]], new_tokens=20, max_rank=3,
                                 verify={n: 1e-3 for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)})
    assert seen == [None, SIZE] and result.draft_vocab_size == SIZE and result.tree


# -- vLLM export / import ------------------------------------------------------------------------------
def test_vllm_export_carries_the_draft_vocabulary_and_import_gets_it_back(trained, tmp_path, one_torch_thread):
    from draftheads.export import export_heads, import_heads

    target, heads, prompts = trained
    verifier = tmp_path / "target"
    target.save_pretrained(verifier)
    heads.save_pretrained(tmp_path / "heads", plans=given_tree(TREE, SIZE))
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier=str(verifier))
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")
    ids = heads.draft_vocab(SIZE)
    assert config["draft_vocab_size"] == SIZE and config["vocab_size"] == heads.config.vocab_size
    d2t = tensors["d2t"]
    assert d2t.dtype == torch.int64 and torch.equal(torch.arange(SIZE) + d2t, ids)
    lm_head = tensors["lm_head.weight"]
    assert torch.equal(lm_head, target.get_output_embeddings().weight.detach()[ids].to(lm_head.dtype))
    # vLLM's compute_logits: logits over the draft vocabulary scattered to target ids, -inf elsewhere
    state = torch.randn(heads.block_size, heads.config.hidden_size)
    scattered = torch.full((heads.block_size, heads.config.vocab_size), float("-inf"))
    scattered[:, torch.arange(SIZE) + d2t] = state @ lm_head.T.float()
    proposer = DFlashDrafter(heads, draft_vocab_size=SIZE)
    mine = proposer.logits(state)
    assert torch.allclose(scattered[:, ids], mine, atol=1e-5)
    assert torch.equal(scattered.argmax(-1), proposer.target_ids(mine.argmax(-1)))

    # back: the same heads, drafting from the same id set by default
    imported = import_heads(out, tmp_path / "imported", target)
    loaded = dh.load_heads(imported, target=target)
    assert primary(loaded.plans).draft_vocab_size == SIZE and torch.equal(loaded.draft_vocab(SIZE), ids)
    seq = greedy_reference(target, prompts[:1], 12)[0]
    features = torch.randn(seq.numel(), heads.fc.in_features)
    a, b = DFlashDrafter(heads, draft_vocab_size=SIZE), dh.SpeculativeDecoder(target, loaded, check_model=False).proposer
    for p in (a, b):
        p.start([seq], [features], SamplingParams(), None)
    assert torch.allclose(a.block_logits([int(seq[-1])]), b.block_logits([int(seq[-1])]), atol=1e-5)


def test_vllm_export_without_a_draft_vocabulary_ships_no_lm_head(trained, tmp_path):
    from draftheads.export import export_heads

    target, heads, _ = trained
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm")
    assert "draft_vocab_size" not in json.loads((out / "config.json").read_text())
    assert not {"lm_head.weight", "d2t"} & set(load_file(out / "model.safetensors"))


def test_import_refuses_an_lm_head_that_is_not_the_targets_rows(trained, tmp_path):
    from draftheads.export import export_heads, import_heads
    from safetensors.torch import save_file

    target, heads, _ = trained
    target.save_pretrained(tmp_path / "target")
    heads.save_pretrained(tmp_path / "heads", plans=given_tree(TREE, SIZE))
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier=str(tmp_path / "target"))
    tensors = load_file(out / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * 1.5  # a trained draft head: not the target's
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="lm_head.weight.*not the target's"):
        import_heads(out, tmp_path / "imported", target)
