"""The draft budget inside the real decode loops: still lossless with plain and capped steps mixed
in (greedy == `generate`, sampling == the target's law), for every proposer and in batches; plain
steps when drafts never pay, the full draft again when they do.

Two budgets force the interesting cases: `Cycle` caps steps in a fixed cycle (full, plain, 1, 2,
...), whatever happens; `SyntheticCost` is the real online rule fed with step seconds computed
from the drafted depth instead of the clock, so its decisions are deterministic. The real online
budget (timed by the clock) runs the same exactness checks.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

import draftheads as dh
from draftheads.inference.draft_budget import CAPPED, FULL, PLAIN, DraftBudget, OnlineDraftBudget
from draftheads.inference.proposers import Proposer, as_drafter
from draftheads.methods.eagle.drafter import EagleDrafter
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.tree import Tree, TreeShape

from inference_utils import greedy_reference, self_distilled_heads, tiny_target
from stats import law_pvalue
from test_batch import batch_rows, left_padded, reference
from test_head_types import trained_heads
from test_sampling import TREE

pytestmark = [pytest.mark.online_draft_budget, pytest.mark.usefixtures("one_torch_thread")]


class Cycle(DraftBudget):
    """Caps in a fixed cycle over every step of every generation (None = the full draft)."""

    name = "cycle"

    def __init__(self, cycle=(None, 0, 1, None, 2, 0, 1)) -> None:
        super().__init__()
        self.cycle, self.step = cycle, 0

    def choose(self, rows: int) -> int | None:
        self.step += 1
        return self.cycle[(self.step - 1) % len(self.cycle)]


class SyntheticCost(OnlineDraftBudget):
    """The online rule, timed by the drafted depth (a plain step 1 s, each level 0.2 s more)."""

    def record(self, drafted, accepted, seconds):
        super().record(drafted, accepted, 1.0 + 0.2 * drafted)


# -- greedy: every proposer, plain and capped steps mixed in ----------------------------------------
METHODS = ("medusa", "hydra", "eagle", "eagle3", "prompt-lookup", "draft-model")
NEW = 30


@pytest.fixture(scope="module", params=("llama", "qwen2"))
def arch_setup(request):
    return request.param, tiny_target(request.param), {}


def source_for(arch_setup, method):
    arch, target, trained = arch_setup
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
        return dh.DraftModelProposer(tiny_target(arch, seed=1), gamma=3), prompts
    return heads, prompts


@pytest.mark.parametrize("budget", ["cycle", "online"])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_matches_generate_through_plain_and_capped_steps(arch_setup, method, budget):
    _, target, _ = arch_setup
    source, prompts = source_for(arch_setup, method)
    policy = Cycle() if budget == "cycle" else OnlineDraftBudget(warmup=2)
    decoder = dh.SpeculativeDecoder(target, source, draft_budget=policy)
    modes = Counter()
    for ids, new in [(prompts[:1], NEW), (prompts[1:2], NEW), (torch.tensor([[5, 9, 33, 17]]), 12), (prompts[2:3], 1)]:
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new)), f"{method}/{budget}: differs from generate"
        modes.update(out.stats["draft_budget"]["steps"])
        assert sum(out.stats["draft_budget"]["steps"].values()) == out.stats["steps"]
    rows = batch_rows(prompts)
    ids, mask = left_padded(rows)
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, mask, new=NEW)), f"{method}/{budget}: batch differs"
    modes.update(out.stats["draft_budget"]["steps"])
    if budget == "cycle":
        assert modes[PLAIN] >= 10 and modes[CAPPED] >= 10 and modes[FULL] >= 10, modes


def test_eagle_draft_cache_catches_up_on_the_tokens_of_plain_steps():
    """After plain steps the EAGLE draft layer must still have seen every committed position, in
    order, before it drafts again (a skipped catch-up would leave the tokens exact but the drafts bad)."""
    target = tiny_target("llama")
    heads, prompts = trained_heads(target, "eagle", steps=80)
    seen: list[tuple[int, int]] = []

    class Checked(EagleDrafter):
        def _catch_up(self, roots, drafting):
            state = super()._catch_up(roots, drafting)
            seen.extend((int(self._lengths[r]), len(self._ids[r])) for r, d in enumerate(drafting) if d)
            return state

    proposer = Checked(heads)
    ids = prompts[:1]
    out = dh.SpeculativeDecoder(target, proposer, draft_budget=Cycle((0, 0, None, 0, 2))).generate(
        ids, max_new_tokens=NEW, eos_token_id=[]
    )
    assert torch.equal(out.sequences, greedy_reference(target, ids, NEW))
    assert len(seen) >= 5 and all(cached == committed for cached, committed in seen), seen
    # drafting after plain steps is as good as drafting every step: the trained drafts still land
    full = dh.SpeculativeDecoder(target, heads, draft_budget=None).generate(ids, max_new_tokens=NEW, eos_token_id=[])
    drafting = [n for n, cap in zip(out.accept_lengths, itertools.cycle((0, 0, None, 0, 2))) if cap != 0]
    assert sum(drafting) / len(drafting) > 0.8 * full.mean_accept_length


@pytest.mark.parametrize("method", METHODS)
def test_every_proposer_drafts_nothing_at_max_depth_zero(method):
    arch_setup = ("llama", tiny_target("llama"), {})
    source, prompts = source_for(arch_setup, method)
    proposer = as_drafter(source) or source.proposer()
    proposer.bind_target(arch_setup[1])
    with torch.no_grad():
        out = arch_setup[1](prompts[:1], output_hidden_states=True)
    features = out.hidden_states[-1][0] if proposer.feature_layers == (-1,) else None
    if proposer.feature_layers not in ((), (-1,)):
        features = torch.cat([out.hidden_states[i][0] for i in proposer.feature_layers], dim=-1)
    proposer.start([prompts[0]], [features], SamplingParams(), None)
    (tree,) = proposer.propose([7], [0])
    assert tree.shape.size == 1 and tree.tokens.tolist() == [7]
    if isinstance(proposer, EagleDrafter):
        assert proposer._lengths == [0], "a plain step ran the EAGLE draft layer"


# -- sampling: the target's law with plain and capped steps mixed in --------------------------------------
VOCAB, SAMPLE_NEW, RUNS = 6, 4, 2500  # 4 new tokens: the second step can draft 2 deep, so caps bite


def exact_law(target, prompt, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1..x4 | prompt) by the chain rule over the processed distributions."""
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(VOCAB), repeat=SAMPLE_NEW - 1):
            ids = torch.cat([prompt, torch.tensor([seq], dtype=torch.long)], dim=1)
            probs = params.probs(target(ids).logits[0, -SAMPLE_NEW:])
            prefix = math.prod(float(probs[i, seq[i]]) for i in range(SAMPLE_NEW - 1))
            for last in range(VOCAB):
                law[(*seq, last)] = prefix * float(probs[-1, last])
    return law


@pytest.fixture(scope="module")
def sharp_target():
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    return target


def sampling_source(target, kind):
    torch.manual_seed(0)
    if kind == "medusa":
        return dh.MedusaHeads.for_target(target, num_heads=2), {"tree": TREE}
    if kind == "eagle":
        return dh.EagleHead.for_target(target), {"tree": {"total_tokens": 6, "depth": 2, "top_k": 2}}
    # sampled drafts with their own q (the min(1, p/q) rule), from a second tiny LM
    draft = tiny_target("llama", seed=4, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():
        draft.get_output_embeddings().weight.mul_(4.0)
    return dh.DraftModelProposer(draft, gamma=2), {}


@pytest.mark.parametrize("kind,temperature,budget", [
    ("medusa", 0.7, "cycle"), ("medusa", 1.0, "cycle"), ("eagle", 1.0, "cycle"), ("draft-model", 0.7, "cycle"),
    ("medusa", 1.0, "online"),
])
def test_sampling_follows_the_target_law_through_plain_and_capped_steps(sharp_target, kind, temperature, budget):
    target, prompt = sharp_target, torch.tensor([[1, 4, 3]])
    source, kwargs = sampling_source(target, kind)
    policy = Cycle() if budget == "cycle" else OnlineDraftBudget(warmup=1)
    decoder = dh.SpeculativeDecoder(target, source, draft_budget=policy, **kwargs)
    params = SamplingParams(temperature=temperature, top_k=0)
    gen = torch.Generator().manual_seed(1234)
    counts: Counter = Counter()
    modes: Counter = Counter()
    drafted_and_accepted = 0
    for _ in range(RUNS):
        out = decoder.generate(prompt, max_new_tokens=SAMPLE_NEW, temperature=temperature, top_k=0,
                               eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, prompt.shape[1]:].tolist())] += 1
        modes.update(out.stats["draft_budget"]["steps"])
        drafted_and_accepted += max(out.accept_lengths) > 1
    pvalue = law_pvalue(counts, exact_law(target, prompt, params))
    assert pvalue > 1e-3, f"{kind} T={temperature} {budget}: chi-square p-value {pvalue:.2g}: not the target's law"
    assert drafted_and_accepted >= RUNS // 20, f"drafts accepted in {drafted_and_accepted} runs: the test would be vacuous"
    if budget == "cycle":
        assert min(modes[FULL], modes[CAPPED], modes[PLAIN]) >= RUNS // 4, modes


# -- the decision, through the loop: plain when drafts never pay, the full draft again when they do ------------
class Oracle(Proposer):
    """Drafts a chain from the target's known greedy continuation: wrong (every token shifted by
    one) before new token ``switch``, right from there on."""

    feature_layers = ()

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], switch: int, depth: int = 4) -> None:
        self.continuations, self.switch, self.depth = continuations, switch, depth
        self.log: list[tuple[int, int]] = []  # (new tokens before the root, max_depth) per step
        self.forks: list[Oracle] = []  # the per-row copies the batched loop drafts with

    def fork(self) -> "Oracle":
        clone = super().fork()
        self.forks.append(clone)
        return clone

    def start(self, input_ids, hidden, params, generator) -> None:
        self.text, self.n, self.log = self.continuations[tuple(input_ids.tolist())], 0, []

    def propose(self, root: int, max_depth: int) -> Tree:
        self.log.append((self.n, max_depth))
        drafts = self.text[self.n + 1 : self.n + 1 + min(self.depth, max_depth)]
        if self.n < self.switch:
            drafts = [(t + 1) % VOCAB_ORACLE for t in drafts]
        return Tree(TreeShape.chain(len(drafts)), torch.tensor([root, *drafts]))

    def accepted(self, tokens, hidden) -> None:
        self.n += tokens.numel()


VOCAB_ORACLE, ORACLE_NEW, SWITCH = 64, 240, 80


@pytest.mark.parametrize("batch", [False, True])
def test_plain_steps_while_drafts_fail_and_the_full_draft_once_they_land(batch):
    target = tiny_target("llama")
    prompts = [[5, 9, 33, 17, 8, 3], [12, 40, 7, 22, 5]]
    refs = {tuple(p): greedy_reference(target, torch.tensor([p]), ORACLE_NEW)[0, len(p):].tolist() for p in prompts}
    oracle = Oracle(refs, SWITCH)
    decoder = dh.SpeculativeDecoder(target, oracle, draft_budget=SyntheticCost())
    if batch:
        ids, mask = left_padded(prompts)
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=ORACLE_NEW, eos_token_id=[])
        assert torch.equal(out.sequences, reference(target, ids, mask, new=ORACLE_NEW))
        log = oracle.forks[0].log  # one cap for all rows: the first row's steps show the pattern
    else:
        ids = torch.tensor([prompts[0]])
        out = decoder.generate(ids, max_new_tokens=ORACLE_NEW, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, ORACLE_NEW))
        log = oracle.log
    failing = [cap for n, cap in log if 20 <= n < SWITCH]
    assert sum(cap == 0 for cap in failing) >= 0.8 * len(failing), failing
    landing = [cap for n, cap in log if n >= SWITCH]
    back = next(i for i, cap in enumerate(landing) if cap >= 4)
    assert back <= 64 + 2, f"{back} plain steps after the drafts started landing"
    # max_depth = tokens left after the root, minus the bonus token: max_new_tokens - (n + 1) - 1
    assert all(cap >= min(4, ORACLE_NEW - 2 - n) for n, cap in log[len(log) - len(landing) + back :])
    counts = out.stats["draft_budget"]["steps"]
    assert counts[PLAIN] > 20 and counts[FULL] > 10 and sum(counts.values()) == out.stats["steps"]


def test_stats_say_which_budget_ran_and_what_it_measured():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, steps=30)
    on = dh.SpeculativeDecoder(target, heads, draft_budget=OnlineDraftBudget()).generate(prompts[:1], max_new_tokens=30,
                                                                                       eos_token_id=[])
    budget = on.stats["draft_budget"]
    assert budget["policy"] == "online" and sum(budget["steps"].values()) == on.stats["steps"]
    assert budget["full_depth"] == 3 and all(s > 0 for s in budget["step_seconds"][1].values())
    off = dh.SpeculativeDecoder(target, heads, draft_budget=None).generate(prompts[:1], max_new_tokens=30, eos_token_id=[])
    assert off.stats["draft_budget"] == {"policy": "off", "steps": {FULL: off.stats["steps"], CAPPED: 0, PLAIN: 0}}


@pytest.mark.online_draft_budget
def test_the_default_is_the_online_budget_for_every_proposer_a_draft_model_too():
    target = tiny_target("llama")
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    assert isinstance(dh.SpeculativeDecoder(target, heads).draft_budget, OnlineDraftBudget)
    draft = dh.DraftModelProposer(tiny_target("llama", seed=1), gamma="auto")
    out = dh.SpeculativeDecoder(target, draft).generate(torch.tensor([[1, 5, 9]]), max_new_tokens=20, eos_token_id=[])
    assert out.stats["draft_budget"]["policy"] == "online" and "gamma_histogram" in out.stats
    assert sum(out.stats["draft_budget"]["steps"].values()) == out.stats["steps"]
    with pytest.raises(ValueError, match="draft_budget must be 'auto'"):
        dh.SpeculativeDecoder(target, heads, draft_budget="sometimes")


@pytest.mark.parametrize("method", ["dflash", "peagle"])
def test_parallel_drafters_stay_exact_through_plain_and_capped_steps(method):
    """The block drafters draft one forward per step whatever the cap; after plain steps (nothing
    drafted, their context still pending) they must catch up and stay exact, one row and a batch."""
    from test_dflash import trained_dflash
    from test_peagle import trained_peagle

    target = tiny_target("llama")
    heads, prompts = (trained_dflash(target, steps=30) if method == "dflash" else trained_peagle(target, steps=30))[:2]
    decoder = dh.SpeculativeDecoder(target, heads, draft_budget=Cycle((0, 0, None, 1, 0, 2)))
    modes = Counter()
    for ids in (prompts[:1], prompts[1:2]):
        out = decoder.generate(ids, max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, NEW)), f"{method}: differs from generate"
        modes.update(out.stats["draft_budget"]["steps"])
    ids, mask = left_padded(batch_rows(prompts))
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, mask, new=NEW)), f"{method}: batch differs"
    assert modes[PLAIN] >= 4 and modes[CAPPED] >= 2 and modes[FULL] >= 2, modes
    # full-draft steps after plain ones accept what drafting every step accepts (a lost context would not)
    ids = prompts[:1]
    cycled = dh.SpeculativeDecoder(target, heads, draft_budget=Cycle((0, None))).generate(ids, max_new_tokens=NEW,
                                                                                          eos_token_id=[])
    full = dh.SpeculativeDecoder(target, heads, draft_budget=None).generate(ids, max_new_tokens=NEW, eos_token_id=[])
    drafting = cycled.accept_lengths[1::2]
    assert full.mean_accept_length > 1.3, f"{method}: the heads accept too little to tell ({full.mean_accept_length})"
    assert sum(drafting) / len(drafting) > 0.8 * full.mean_accept_length, (drafting, full.accept_lengths)
