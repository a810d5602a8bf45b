"""A batch drafts every row in ONE draft forward for the parallel drafters (DFlash, P-EAGLE).

`DFlashDrafter` / `PEagleDrafter` drafting a batch must give each row the tree the same drafter
gives that row alone (a batch of one), step after step: rows of different prompt lengths (the
shared draft cache is ragged from the first step), different accepted counts, a row drafting
shallower near its budget, a row drafting nothing for a step (its context stays pending), and a
row leaving the batch. The drafters are driven directly with random features and accepted paths,
on heads with randomised weights (a fresh head's small weights would make the masks barely
matter), in float64 so that reduction-order differences stay far from top-k ties.

Then through the decode loop: greedy batches equal `generate` row by row (EOS at different steps,
chain and tree, two architectures) with one draft-layer forward per step for the whole batch, and
sampled batches with drawn drafts keep the target's law in every row (chi-square per row).
"""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
import draftheads.inference.loop as loop
from draftheads.methods.dflash.heads import DFlashHeads
from draftheads.inference.host_syncs import HostSyncCounter
from draftheads.methods.dflash.drafter import DFlashDrafter
from draftheads.methods.peagle.drafter import PEagleDrafter
from draftheads.inference.sampling import SamplingParams

from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from rows_driver import PROMPT_LENGTHS, STEPS, drive_alike
from test_batch import check_rows_exact, eos_for_different_stops, left_padded, reference
from test_sampling import exact_distribution

DEPTH = 4
TREES = {"chain": None, "tree": [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]]}


# -- a batch against each row drafted alone, row by row -----------------------------------
def random_heads(kind: str, target, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(7)
    vocab = target.config.vocab_size
    if kind == "dflash":
        heads = DFlashHeads.for_target(target, num_layers=2, block_size=DEPTH + 1, mask_token_id=vocab - 1)
    else:
        heads = dh.PEagleHead.for_target(target, num_heads=DEPTH, num_layers=2, draft_vocab_size=48,
                                         mask_token_id=vocab - 1)
        heads.set_draft_vocab(torch.arange(vocab).flip(0))  # the mask token (count 0) is never drafted
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return heads.to(dtype).eval()


def poisoned(rows):
    """``rows`` whose draft-cache buffers start as NaN instead of whatever memory they get: a slot
    read before it is written (even under a mask: 0 x NaN is NaN) turns its row's scores into NaN."""
    new = rows.cache._new

    def nan_filled(capacity, n):
        buffers = new(capacity, n)
        for k, v in buffers:
            k.fill_(float("nan"))
            v.fill_(float("nan"))
        return buffers

    rows.cache._new = nan_filled
    return rows


def recording_scores(rows) -> list[torch.Tensor]:
    """Every `scores` result of ``rows`` ([rows, D, V'] per draft forward), recorded."""
    seen, scores = [], rows.scores

    def recorded(roots, depths):
        out = scores(roots, depths)
        seen.append(out.clone())
        return out

    rows.scores = recorded
    return seen


@pytest.fixture(scope="module")
def double_target():
    return tiny_target("llama", layers=3).double()  # DFlash reads layers 1 and 2: below the last


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("kind", ["dflash", "peagle"])
def test_batched_trees_equal_each_rows_own_proposer(double_target, kind, tree, one_torch_thread):
    heads = random_heads(kind, double_target)
    batched = poisoned(heads.proposer(tree=TREES[tree]))
    assert isinstance(batched, DFlashDrafter if kind == "dflash" else PEagleDrafter)
    batch_scores = recording_scores(batched)
    alone_scores, read = {}, {}
    compared = shallow = 0

    def started(alone):
        for r, drafter in enumerate(alone):
            alone_scores[r], read[r] = recording_scores(drafter), 0

    def check(step, r, pos, mine, alone):
        nonlocal compared, shallow
        assert len(batch_scores) == step + 1, "not one draft forward for the whole batch"
        assert mine.shape.parents == alone.shape.parents and torch.equal(mine.tokens, alone.tokens), (
            f"step {step}, row {r}: batched tree {mine.tokens.tolist()} differs from the row's drafted alone "
            f"{alone.tokens.tolist()}"
        )
        if len(alone_scores[r]) > read[r]:  # the row drafted: its scores, position by position
            read[r] = len(alone_scores[r])
            own = alone_scores[r][-1][0]
            assert torch.allclose(batch_scores[-1][pos, : own.shape[0]], own, rtol=1e-9, atol=1e-9), (
                f"step {step}, row {r}: scores differ")
            compared += 1
        shallow += 1 < alone.shape.size and alone.shape.max_depth < DEPTH

    # vocab - 1 is the mask token: never a prompt token or a root
    drive_alike(batched, lambda: heads.proposer(tree=TREES[tree]), heads.fc.weight.shape[1], double_target.config.vocab_size - 1, check, started)
    assert compared >= STEPS * 3 and shallow >= 1, "too few trees compared: the test would be vacuous"
    assert not batched.cache.uniform, "the rows kept equal lengths: the ragged cache was not exercised"
    key = "dflash" if kind == "dflash" else "peagle"
    assert batched.stats()[key]["draft_forwards"] == STEPS


# -- through the decode loop: exact, and one draft forward per step ---------------------------------
@pytest.fixture(scope="module", params=[("dflash", "llama"), ("dflash", "qwen2"), ("peagle", "llama"),
                                        ("peagle", "qwen2")], ids=lambda p: "-".join(p))
def trained(request):
    from test_dflash import trained_dflash
    from test_peagle import trained_peagle

    kind, arch = request.param
    if kind == "dflash":
        target = tiny_target(arch, layers=3)
        heads, prompts = trained_dflash(target, steps=40)[:2]
    else:
        target = tiny_target(arch)
        heads, prompts = trained_peagle(target, steps=40)[:2]
    return kind, target, heads, prompts


LOOP_TREE = [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0]]  # within the trained heads' 3 (DFlash) and 4 depths


class ForwardCounter:
    """Calls of the first draft layer's forward: one per draft forward of the batch."""

    def __init__(self, heads) -> None:
        self.calls = 0
        self.hook = heads.layers[0].register_forward_hook(self._count)

    def _count(self, module, args, out) -> None:
        self.calls += 1

    def __enter__(self) -> "ForwardCounter":
        return self

    def __exit__(self, *exc) -> None:
        self.hook.remove()


@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_rows_stop_at_their_own_eos_like_generate(trained, tree, one_torch_thread):
    kind, target, heads, prompts = trained
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]
    ids, mask = left_padded(rows)
    eos = eos_for_different_stops(target, ids, mask)
    shape = LOOP_TREE if tree == "tree" else [[0] * d for d in range(1, heads.config.num_heads + 1)]
    with ForwardCounter(heads) as forwards:
        out = check_rows_exact(target, heads.proposer(tree=shape), rows, eos=eos)
    assert len(set(out.stats["row_new_tokens"])) >= 2, "rows ended together: EOS at different steps not exercised"
    drafted = out.stats[kind]["draft_forwards"]
    assert forwards.calls == drafted <= out.stats["steps"], (
        f"{forwards.calls} draft-layer forwards for {out.stats['steps']} steps of {len(rows)} rows"
    )
    assert out.mean_accept_length > 1.2, f"{kind}: drafts were (almost) never accepted, the test would be vacuous"


def test_a_batch_of_three_runs_one_draft_forward_per_step(trained, one_torch_thread):
    """3 rows, every step drafting (no draft budget): as many draft-layer forwards as steps, not 3 per step."""
    kind, target, heads, prompts = trained
    rows = [prompts[0].tolist(), prompts[1, 1:].tolist(), prompts[3].tolist() + [7]]
    ids, mask = left_padded(rows)
    decoder = dh.SpeculativeDecoder(target, heads, draft_budget=None)
    with ForwardCounter(heads) as forwards:
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, mask, new=20)), f"{kind}: batch differs from generate"
    steps = out.stats["steps"]
    assert steps >= 4 and forwards.calls == out.stats[kind]["draft_forwards"]
    # every step but possibly the last (one token left: a plain step) drafts, once for all rows
    assert steps - 1 <= forwards.calls <= steps, f"{forwards.calls} draft forwards in {steps} steps of 3 rows"


@pytest.mark.parametrize("kind", ["dflash", "peagle"])
def test_static_cache_decodes_one_row_the_same(kind, one_torch_thread):
    target = tiny_target("llama", layers=3)
    heads = random_heads(kind, target, torch.float32)
    ids = torch.tensor([[1, 5, 9, 17, 4]])
    for cache in ("static", "dynamic"):
        out = dh.SpeculativeDecoder(target, heads, cache=cache).generate(ids, max_new_tokens=12, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, 12)), f"{kind} {cache} cache differs"


# -- sampling with drawn drafts: every row keeps the target's law ----------------------------------
VOCAB = 6
SAMPLE_NEW = 3
RUNS = 400  # batches of 8 rows, each prompt twice: 800 draws per prompt
SAMPLE_TREE = [[0], [1], [0, 0], [0, 1], [1, 0]]  # two deep: each row draws a chain two deep


def sampling_heads(kind: str, target) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "dflash":
        return DFlashHeads.for_target(target, num_layers=1, block_size=3, mask_token_id=5)
    heads = dh.PEagleHead.for_target(target, num_heads=2, draft_vocab_size=5, mask_token_id=0)
    heads.set_draft_vocab(torch.tensor([0, 5, 4, 3, 2, 6]))  # the mask token is never drafted
    return heads


@pytest.mark.parametrize("kind", ["dflash", "peagle"])
def test_sampled_rows_with_drawn_drafts_follow_the_target_distribution(kind, monkeypatch, one_torch_thread):
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=2)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    decoder = dh.SpeculativeDecoder(target, sampling_heads(kind, target), tree=SAMPLE_TREE)
    seen = []
    accept = loop.accept_rows

    def recording(trees, *args, **kwargs):
        if len(seen) < 200:
            seen.extend(trees)
        return accept(trees, *args, **kwargs)

    monkeypatch.setattr(loop, "accept_rows", recording)
    prompts = [[1, 4, 3], [2, 5], [1, 1, 4, 3], [3, 2, 4]]
    ids, mask = left_padded(prompts * 2)  # each prompt in two rows (independent draws): twice the samples per batch
    params = SamplingParams(temperature=0.9, top_k=5)
    gen = torch.Generator().manual_seed(1234)
    counts = [dict() for _ in prompts]
    deep = steps = 0
    with ForwardCounter(decoder.proposer.heads if kind == "dflash" else decoder.proposer.head) as forwards:
        for _ in range(RUNS):
            # 4 new tokens, the first 3 tested: the first step after the prefill drafts 2 deep
            out = decoder.generate(ids, attention_mask=mask, max_new_tokens=SAMPLE_NEW + 1, temperature=0.9, top_k=5,
                                   eos_token_id=[], generator=gen)
            deep += max(out.accept_lengths) >= 3
            steps += out.stats["steps"]
            for r in range(ids.shape[0]):
                key = tuple(out.sequences[r, ids.shape[1] : ids.shape[1] + SAMPLE_NEW].tolist())
                counts[r % len(prompts)][key] = counts[r % len(prompts)].get(key, 0) + 1
    for p, prompt in enumerate(prompts):
        pvalue = law_pvalue(counts[p], exact_distribution(target, torch.tensor([prompt]), params))
        assert pvalue > 1e-3, f"{kind} prompt {p}: chi-square p-value {pvalue:.2e}: not the target's distribution"
    assert deep >= RUNS // 20, f"{kind}: a depth-2 draft was accepted in only {deep}/{RUNS} batches: vacuous"
    assert 0 < forwards.calls <= steps, "more than one draft forward per step for the batch"
    drafted = [t for t in seen if t.shape.size > 1]
    assert drafted and all(t.draft_probs is not None for t in drafted), "sampling did not draw its drafts"
    assert all(t.shape.parents == tuple(range(-1, t.shape.size - 1)) for t in drafted), "a drawn draft is a chain"


@pytest.mark.parametrize("draws", [False, True], ids=["ranked", "drawn"])
@pytest.mark.parametrize("kind", ["dflash", "peagle"])
def test_batched_drafting_reads_nothing_back_from_the_device(kind, draws, one_torch_thread):
    """The rows' layout (lengths, padding, masks) is planned from host bookkeeping and the trees
    stay where the scores are: drafting a batch never waits on the device (the verifier reads the
    trees once, per step, for all rows)."""
    target = tiny_target("llama", layers=3)
    heads = random_heads(kind, target, torch.float32)
    batched = heads.proposer(tree=TREES["tree"])
    feat = heads.fc.weight.shape[1]
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 60, (n,), generator=gen) for n in PROMPT_LENGTHS]
    params = SamplingParams(temperature=0.8, sample_drafts=True) if draws else SamplingParams()
    with HostSyncCounter(target, heads) as syncs:
        hidden = [torch.randn(n, feat, generator=gen) for n in PROMPT_LENGTHS]
        for h in hidden:
            syncs.taint(h)  # target features live on the accelerator
        batched.start(prompts, hidden, params, torch.Generator().manual_seed(0))
        rows, reads = len(prompts), 0
        for step in range(5):
            before = syncs.total_outside
            trees = batched.propose([5] * rows, [64, 2, 0] if step == 2 else [64] * rows)  # shallow, plain rows
            reads += syncs.total_outside - before
            counts = [int(torch.randint(1, t.shape.max_depth + 2, (1,), generator=gen)) for t in trees]
            feats = [torch.randn(c, feat, generator=gen) for c in counts]
            for f in feats:
                syncs.taint(f)
            batched.accepted([torch.full((c,), 7) for c in counts], feats)  # host tokens, as the loop gives
            if step == 1:
                batched.keep([0, 2, 3])
                rows = 3
    assert reads == 0, f"{dict(syncs.outside)} host reads while drafting"
    assert batched.forwards == 5
