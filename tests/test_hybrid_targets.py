"""Hybrid targets (Qwen3-Next, Qwen3.5, LFM2, Falcon-H1, Nemotron-H, Jamba) decode exactly: greedy
output equals transformers' own `generate`, for single rows and left-padded batches, with chains and
trees, with every kind of drafter; sampling keeps the target's law. See `inference.recurrent`."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.inference.recurrent import recurrent_layout
from draftheads.inference.tree import Tree, TreeShape
from draftheads.inference.verify import TreeVerifier

from hybrid_utils import HYBRIDS, VOCAB, OracleDrafter, left_padded, reference, tiny_hybrid

FAMILIES = list(HYBRIDS)
NEW = 24


def prompt(seed: int = 1, length: int = 10) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def exact_decoder(target, drafter, **options) -> dh.SpeculativeDecoder:
    """Every draft drafted in full (no online budget), never plain by plan."""
    return dh.SpeculativeDecoder(target, drafter, draft_budget=None, batch_plan=None, **options)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kinds", [("chain", "plain"), ("tree", "plain"), ("chain", "tree", "plain")],
                         ids=["chains", "trees", "mixed"])
def test_one_row_equals_generate_with_chains_and_trees(family, kinds):
    target = tiny_hybrid(family)
    ids = prompt()
    want = reference(target, ids, NEW)
    out = exact_decoder(target, OracleDrafter([want[0, ids.shape[1]:]], VOCAB, kinds=kinds)).generate(
        ids, max_new_tokens=NEW, eos_token_id=[])
    assert out.sequences.tolist() == want.tolist()
    assert max(out.accept_lengths) >= 3, "drafts were hardly accepted: the rollback went untested"
    assert min(out.accept_lengths) == 1, "no draft was rejected: the rollback went untested"


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_equals_generate_row_by_row(family):
    """Rows of different lengths accept different numbers of tokens each step; each row's state rolls
    back to its own accepted length. The batch equals generate on the batch, and each row alone."""
    target = tiny_hybrid(family)
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(3, VOCAB, (n,), generator=gen) for n in (10, 7, 4)]
    ids, mask = left_padded(rows)
    want = reference(target, ids, NEW, mask)
    for r, row in enumerate(rows):
        assert want[r, ids.shape[1]:].tolist() == reference(target, row[None], NEW)[0, len(row):].tolist()
    drafter = OracleDrafter([want[r, ids.shape[1]:] for r in range(len(rows))], VOCAB)
    out = exact_decoder(target, drafter).generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert out.sequences.tolist() == want.tolist()
    assert len(set(map(tuple, out.stats["row_accept_lengths"]))) > 1  # the rows really advanced unevenly
    # A row that stops early (its EOS) leaves the batch: the others' states must follow them out.
    eos = int(want[1, ids.shape[1] + 5])
    want_eos = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=eos,
                               pad_token_id=0)
    stops = [(row == eos).nonzero()[0].item() if (row == eos).any() else NEW for row in want_eos[:, ids.shape[1]:]]
    assert len(set(stops)) > 1, stops  # the rows stop at different steps
    out = exact_decoder(target, drafter).generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
    assert out.sequences.tolist() == want_eos.tolist()


def one_token_states(target, layout, ids: torch.Tensor, path: list[int]):
    """Per state layer, the (conv, recurrent) state after prefilling ``ids`` and feeding ``path`` one token at a
    time: what `generate`'s steps hold there."""
    cache = layout.new_cache()
    with torch.no_grad():
        target(ids, cache=cache, use_cache=True)
        for j, token in enumerate(path):
            target(torch.tensor([[token]]), cache=cache, use_cache=True,
                   position_ids=torch.tensor([[ids.shape[1] + j]]))
    return {i: (dict(cache.layers[i].conv_states), dict(cache.layers[i].recurrent_states)) for i in layout.layers}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("parents", [(-1, 0, 1, 2), (-1, 0, 0, 1, 2, 2)], ids=["chain", "tree"])
def test_verify_records_every_nodes_state_as_one_token_steps_reach_it(family, parents):
    """The verify forward leaves the row's state as it was and records, for every node, the state a
    one-token step reaches after the node's path: siblings never see each other."""
    target = tiny_hybrid(family)
    verifier = TreeVerifier(target)
    layout = verifier.recurrent
    ids = prompt(3)
    shape = TreeShape(parents)
    tokens = torch.randint(3, VOCAB, (shape.size,), generator=torch.Generator().manual_seed(4))
    cache = verifier.new_cache()
    with torch.no_grad():
        target(ids, cache=cache, use_cache=True)
        before = {i: ({s: t.clone() for s, t in cache.layers[i].conv_states.items() if t is not None},
                      {s: t.clone() for s, t in cache.layers[i].recurrent_states.items() if t is not None})
                  for i in layout.layers}
        *_, step = verifier.forward_tree(cache, Tree(shape, tokens), ids.shape[1])
    for i in layout.layers:  # the row's own state is untouched
        for s, state in before[i][0].items():
            assert torch.equal(cache.layers[i].conv_states[s], state)
        for s, state in before[i][1].items():
            assert torch.equal(cache.layers[i].recurrent_states[s], state)
    for node in range(shape.size):
        path = [int(tokens[j]) for j in next(p for p in shape.leaf_paths if node in p)[: 1 + int(shape.depth[node])]]
        want = one_token_states(target, layout, ids, path)
        for i in layout.layers:
            for s, state in want[i][0].items():
                torch.testing.assert_close(step.conv[i][s][0, node + 1], state[0], rtol=1e-5, atol=1e-6)
            for s, state in want[i][1].items():
                if state is not None:
                    torch.testing.assert_close(step.rec[i][s][0, node + 1], state[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_drafter_decodes_a_hybrid_target_exactly(family):
    """Prompt lookup, every head type (Medusa with a tree, EAGLE-3 and the parallel drafters reading
    features of mixed layer types; untrained, so mostly rejected: the verifier's rollback is what is
    checked) and a draft model, each through the one verifier. MTP heads on a hybrid that ships them:
    tests/test_mtp.py."""
    target = tiny_hybrid(family)
    phrase = prompt(5, 6)
    ids = torch.cat([phrase, phrase, phrase[:, :3]], dim=1)  # repeats itself: lookup drafts
    want = reference(target, ids, NEW)
    draft_model = tiny_hybrid(family, seed=9)  # a hybrid draft model too: its own state rolls back
    eagle3 = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=64)
    eagle3.set_draft_vocab(torch.arange(VOCAB).flip(0))  # untrained: any draft vocabulary
    peagle = dh.PEagleHead.for_target(target, num_heads=2, draft_vocab_size=64, mask_token_id=VOCAB - 1)
    peagle.set_draft_vocab(torch.arange(VOCAB).flip(0))
    drafters = {
        "prompt lookup": dh.PromptLookupProposer(),
        "medusa": dh.MedusaHeads.for_target(target, num_heads=2),
        "eagle3": eagle3,
        "hydra": dh.HydraHeads.for_target(target, num_heads=2),
        "eagle": dh.EagleHead.for_target(target, num_heads=2),
        "peagle": peagle,
        "dflash": dh.DFlashHeads.for_target(target, num_layers=1, block_size=3, mask_token_id=VOCAB - 1),
        "dspark": dh.DSparkHeads.for_target(target, num_layers=1, block_size=3, mask_token_id=VOCAB - 1, markov_rank=4),
        "dflash2": dh.DFlash2Heads.for_target(target, num_layers=1, block_size=3, mask_token_id=VOCAB - 1,
                                              selector_rank=4),
        "draft model": dh.DraftModelProposer(draft_model, gamma=3),
    }
    trees = {"medusa": [[0], [1], [0, 0], [1, 0]], "eagle3": {"total_tokens": 6, "depth": 3, "top_k": 2}}
    for name, drafter in drafters.items():
        decoder = exact_decoder(target, drafter, **({"tree": trees[name]} if name in trees else {}))
        out = decoder.generate(ids, max_new_tokens=NEW, eos_token_id=[])
        assert out.sequences.tolist() == want.tolist(), name


@pytest.mark.parametrize("family", ["qwen3_5_text", "nemotron_h"])
@pytest.mark.parametrize("drafts", ["medusa-top-k", "eagle-drawn"])
def test_sampling_keeps_the_target_law_on_a_hybrid(family, drafts):
    """The first three tokens' law, by the chain rule over the target, against 1500 seeded decodes
    with trees (siblings at both depths): Medusa's top-k candidates (point masses), and EAGLE's drawn
    siblings (each told its law without the earlier siblings: `drawn_trees`)."""
    import itertools
    import math
    from collections import Counter

    from draftheads.inference.sampling import SamplingParams
    from stats import law_pvalue

    vocab, new, runs = 6, 3, 1500
    target = tiny_hybrid(family, seed=3, vocab=vocab, init=0.3)
    if drafts == "medusa-top-k":
        heads = dh.MedusaHeads.for_target(target, num_heads=2)
        decoder = exact_decoder(target, heads, tree=[[0], [1], [0, 0], [0, 1], [1, 0]], draw_drafts=False)
    else:
        torch.manual_seed(0)
        heads = dh.EagleHead.for_target(target, num_heads=1)
        decoder = exact_decoder(target, heads, tree={"total_tokens": 6, "depth": 5, "top_k": 2})  # cut to 2 deep
    ids = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=new - 1):
            probs = params.probs(target(torch.cat([ids, torch.tensor([seq])], dim=1)).logits[0, -new:])
            head = math.prod(float(probs[i, seq[i]]) for i in range(new - 1))
            for last in range(vocab):
                law[(*seq, last)] = head * float(probs[-1, last])
    gen = torch.Generator().manual_seed(1234)
    counts, drafted = Counter(), 0
    for _ in range(runs):
        out = decoder.generate(ids, max_new_tokens=new, temperature=0.9, top_k=5, eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, ids.shape[1]:].tolist())] += 1
        drafted += max(out.accept_lengths) > 1
    pvalue = law_pvalue(counts, law)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: the decoded law differs from the target's"
    assert drafted > runs // 10, "drafts were (almost) never accepted: the test would be vacuous"
    if drafts == "eagle-drawn":
        assert out.stats.get("drawn_sibling_acceptance"), "EAGLE drew no tree"


def test_a_state_layer_without_a_known_mixer_is_refused_by_name():
    target = tiny_hybrid("qwen3_5_text")
    block = target.model.layers[0]
    del block.linear_attn.layer_idx  # the module that advances layer 0's state is no longer recognisable
    with pytest.raises(dh.UnsupportedModelError, match=r"layer 0 \(type 'linear_attention', cache layer "
                                                        r"LinearAttentionLayer\) keeps a recurrent state"):
        recurrent_layout(target)


def test_the_static_cache_refuses_hybrid_targets_by_name():
    target = tiny_hybrid("lfm2")
    with pytest.raises(ValueError, match="cache='static'.*recurrent state.*LFM2|cache='static'.*Lfm2"):
        dh.SpeculativeDecoder(target, dh.PromptLookupProposer(), cache="static")


def test_calibrate_times_verify_forwards_on_a_hybrid_and_leaves_its_state():
    """calibrate's cost curve runs uncommitted verify forwards over one cache: on a hybrid each forward
    records its states aside, so the prefix state every timed forward starts from stays the prompt's."""
    from draftheads.tune.calibrate import measure_verify_times

    times = measure_verify_times(tiny_hybrid("qwen3_5_text"), sizes=[1, 2, 4], context=16, repeats=2)
    assert sorted(times) == [1, 2, 4] and all(t > 0 for t in times.values())


def test_plans_measured_on_a_hybrid_are_refused_for_heads_of_a_transformer(tmp_path):
    """Plans are per target: a folder whose heads were trained for a hybrid does not plan a Llama's."""
    from draftheads.plans import PlanEntry, TreePlans
    from inference_utils import tiny_target

    hybrid = tiny_hybrid("qwen3_5_text", vocab=64)
    dh.MedusaHeads.for_target(hybrid, num_heads=2).save_pretrained(
        tmp_path / "hybrid-heads", plans=TreePlans((PlanEntry(tree=[[0]], device_type="cpu"),)))
    llama = tiny_target("llama")
    heads = dh.MedusaHeads.for_target(llama, num_heads=2)
    with pytest.raises(ValueError, match=r"plans=.*hybrid-heads were measured with heads for another target "
                                         r"\(Qwen3_5ForCausalLM.*model_type"):
        dh.SpeculativeDecoder(llama, heads, plans=tmp_path / "hybrid-heads")


@pytest.mark.parametrize("family,kernel", [("qwen3_5_text", "torch_chunk_gated_delta_rule"),
                                           ("nemotron_h", "mamba2_chunk_scan")])
def test_recording_a_chain_answers_the_zero_token_chunked_calls_as_the_kernel_does(family, kernel, monkeypatch):
    """Under past recording a mixer calls its chunked kernel on zero tokens before its per-token loop; the
    recorder answers those calls itself (they cost a kernel call per layer) with what the kernel returns,
    and the module's kernel is back after the forward."""
    import sys

    from draftheads.inference import recurrent

    target = tiny_hybrid(family)
    module = sys.modules[type(target).__module__]
    own = getattr(module, kernel)
    calls = []

    def spy(first, *args, **kwargs):
        calls.append((first, args, kwargs))
        return own(first, *args, **kwargs)

    monkeypatch.setattr(module, kernel, spy)
    verifier = TreeVerifier(target)
    ids, shape = prompt(3), TreeShape.chain(3)
    tokens = torch.randint(3, VOCAB, (shape.size,), generator=torch.Generator().manual_seed(4))

    def verify_chain():
        cache = verifier.new_cache()
        with torch.no_grad():
            target(ids, cache=cache, use_cache=True)
            calls.clear()
            return verifier.forward_tree(cache, Tree(shape, tokens), ids.shape[1])

    answered = verify_chain()
    assert getattr(module, kernel) is spy  # restored
    assert calls == []  # the chain's chunked calls (all on zero tokens) were answered without the kernel

    answer = recurrent._EMPTY_CHUNK_ANSWERS[kernel][0]
    monkeypatch.setattr(recurrent, "_EMPTY_CHUNK_ANSWERS", {})  # the kernel runs on zero tokens
    ran = verify_chain()
    zero = [c for c in calls if c[0].shape[1] == 0]
    assert len(zero) == len(verifier.recurrent.layers)
    for first, args, kwargs in zero:
        want, got = own(first, *args, **kwargs), answer(first, *args, **kwargs)
        for w, g in zip(want, got):
            assert w.shape == g.shape and w.dtype == g.dtype
            assert torch.equal(w, g)
    assert torch.equal(answered[1], ran[1])  # the same logits either way
    for i in verifier.recurrent.layers:
        for s, slots in ran[3].rec[i].items():
            assert torch.equal(answered[3].rec[i][s], slots)
