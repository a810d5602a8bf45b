"""Draft-model proposer: exactness against `generate`, the draft cache's bookkeeping, the
distribution of sampled outputs with stochastic drafts, the tokenizer check, and its stats."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.tree import Tree, TreeShape
from draftheads.inference import accept
from draftheads.inference.draft_budget import DraftBudget

from proposer_utils import ARCHS, VOCAB, check_greedy_exact, prompts, reference, tiny_lm
from stats import biased_accept_sampling, chi_square_pvalue

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_model_self_draft_accepts_everything(arch):
    """The target as its own draft: every drafted token must be accepted. This only holds if the
    draft cache is rolled back and fed exactly right (positions, pending tokens, the root)."""
    target = tiny_lm(arch)
    accept = check_greedy_exact(target, lambda: dh.DraftModelProposer(target, gamma=4))
    # Every step commits gamma + 1 tokens, except the last, where max_new_tokens cuts the chain.
    assert accept.count(5) >= len(accept) - len(prompts())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_draft_model_greedy_matches_generate(arch, gamma):
    target = tiny_lm(arch)
    draft = tiny_lm(arch, seed=1, hidden=16, layers=1)
    check_greedy_exact(target, lambda: dh.DraftModelProposer(draft, gamma=gamma))


def test_self_draft_with_sliding_window_draft():
    """A sliding-window draft (Mistral) past its window: crop/rollback must still line up."""
    target = tiny_lm("mistral", sliding_window=8)
    accept = check_greedy_exact(target, lambda: dh.DraftModelProposer(target, gamma=3), lengths=[30])
    assert accept.count(4) >= len(accept) - len(prompts())


@pytest.mark.parametrize(
    "make",
    [lambda t, d: dh.PromptLookupProposer(), lambda t, d: dh.DraftModelProposer(d, gamma=3)],
    ids=["lookup", "draft"],
)
def test_eos_stops_where_generate_stops(make):
    target = tiny_lm("llama")
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    ids = prompts()[1]
    free = reference(target, ids, 30)[0, ids.shape[1] :].tolist()
    eos = free[9]  # a token the greedy text contains; generation must stop at its first occurrence
    stop = free.index(eos) + 1
    ref = reference(target, ids, 30, eos=eos)
    out = dh.SpeculativeDecoder(target, make(target, draft)).generate(ids, max_new_tokens=30, eos_token_id=eos)
    assert ref.shape[1] == ids.shape[1] + stop
    assert out.sequences.tolist() == ref.tolist()


class CheckedDraftProposer(dh.DraftModelProposer):
    """Checks after every call that cache + pending == committed tokens, and records each tree."""

    def start(self, input_ids, hidden, params, generator):
        super().start(input_ids, hidden, params, generator)
        self.committed = input_ids.tolist()
        self.records = []

    def propose(self, root, max_depth):
        tree = super().propose(root, max_depth)
        self.records.append((self.committed + [root], tree))
        gamma = tree.shape.size - 1
        # gamma > 0: root and all drafts but the last are in the cache; gamma == 0: root pending.
        assert self.cache_length + len(self.pending) == len(self.committed) + max(gamma, 1)
        return tree

    def accepted(self, tokens, hidden=None):
        super().accepted(tokens, hidden)
        self.committed += tokens.tolist()
        assert self.cache_length + len(self.pending) == len(self.committed)


@pytest.mark.parametrize("gamma", [3, "auto"])
# top_k=0 explicit: left unset it would be the generation config default (50), as in `generate`
@pytest.mark.parametrize("sampling", [dict(temperature=1.0, top_k=0), dict(temperature=0.7, top_k=20, top_p=0.9)])
def test_draft_probs_are_the_drafts_distribution(gamma, sampling):
    """Row i of draft_probs is the draft's processed distribution after the root and drafts < i,
    computed from scratch (no cache): the cache holds exactly the committed tokens, and the verifier
    gets the q each draft was really sampled from."""
    target = tiny_lm("qwen2")
    draft = tiny_lm("qwen2", seed=1, hidden=16, layers=1)
    proposer = CheckedDraftProposer(draft, gamma=gamma, max_gamma=4)
    ids = prompts()[0]
    out = dh.SpeculativeDecoder(target, proposer).generate(ids, max_new_tokens=25, seed=3, eos_token_id=[], **sampling)
    assert out.sequences.shape[1] == ids.shape[1] + 25
    params = SamplingParams(**sampling)
    checked = 0
    with torch.no_grad():
        for context, tree in proposer.records:
            if tree.shape.size == 1:
                assert tree.draft_probs is None
                continue
            tokens = tree.tokens.tolist()
            assert tree.draft_probs is not None and tree.draft_probs.shape == (len(tokens), VOCAB)
            for i in range(1, len(tokens)):
                seq = torch.tensor([context + tokens[1:i]])
                q = params.probs(draft(input_ids=seq).logits[0, -1])
                torch.testing.assert_close(tree.draft_probs[i], q, atol=1e-5, rtol=1e-4)
                assert q[tokens[i]] > 0
                checked += 1
    assert checked >= 10


def test_sampling_self_draft_accepts_almost_everything():
    """Sampled drafts from the target itself: p == q, so min(1, p/q) accepts (almost) always."""
    target = tiny_lm("llama")
    out = dh.SpeculativeDecoder(target, dh.DraftModelProposer(target, gamma=4)).generate(
        prompts()[0], max_new_tokens=40, temperature=1.0, seed=0
    )
    assert out.mean_accept_length > 4.0


# -- output distribution with stochastic drafts -----------------------------------------------------------
SMALL_V = 8


class SmallWorld:
    """Tiny-vocab target and draft, and every logit the first two emitted tokens can depend on,
    computed once: the decode loop's step (root -> 2 sampled drafts -> verify) can then be
    replayed thousands of times with nothing but the verifier's acceptance rule in the loop."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        target = tiny_lm("llama", seed=11, vocab=SMALL_V, hidden=16, layers=1, initializer_range=0.3)
        draft = tiny_lm("qwen2", seed=12, vocab=SMALL_V, hidden=16, layers=1, initializer_range=0.3)
        self.root = 5
        prefix = [1, 4, 6, 2, self.root]
        pairs = torch.cartesian_prod(torch.arange(SMALL_V), torch.arange(SMALL_V))  # [V*V, 2]
        seqs = torch.cat([torch.tensor(prefix).expand(len(pairs), -1), pairs], dim=1)
        with torch.no_grad():
            t = target(input_ids=seqs).logits.float()
            d = draft(input_ids=seqs).logits.float()
        v = SMALL_V
        # logits after the root, after root+a, after root+a+b
        self.lp0, self.lp1, self.lp2 = t[0, -3], t[::v, -2], t[:, -1].reshape(v, v, v)
        self.q0 = params.probs(d[0, -3])
        self.q1 = params.probs(d[::v, -2])
        self.p0 = params.probs(self.lp0)
        self.p1 = params.probs(self.lp1)
        # exact law of the first two tokens after the root: p(e1) p(e2 | e1)
        self.exact = self.p0[:, None] * self.p1

    def run(self, accept_sampling, trials: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        d1 = torch.multinomial(self.q0, trials, replacement=True, generator=gen)
        d2 = torch.multinomial(self.q1[d1], 1, generator=gen)[:, 0]
        counts = torch.zeros(SMALL_V, SMALL_V)
        shape = TreeShape.chain(2)
        zeros = torch.zeros(SMALL_V)
        for a, b in zip(d1.tolist(), d2.tolist()):
            tree = Tree(shape, torch.tensor([self.root, a, b]), torch.stack([zeros, self.q0, self.q1[a]]))
            logits = torch.stack([self.lp0, self.lp1[a], self.lp2[a, b]])
            acc = accept_sampling(tree, logits, self.params, gen)
            emitted = tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
            if len(emitted) == 1:  # all drafts rejected: the next step decodes e2 from the target
                emitted.append(int(torch.multinomial(self.p1[emitted[0]], 1, generator=gen)))
            counts[emitted[0], emitted[1]] += 1
        return counts


# With these models the wrong rules shift the law of (e1, e2) by a chi-square non-centrality of
# about 0.15 (resampling from p) to 80 (q/p) per trial: with 1500 trials their p-values are
# below 1e-20 (q/p even produces impossible outcomes), while the exact rule's p-value is an
# ordinary uniform draw (about 0.9 with these seeds).
TRIALS = 1500
SAMPLING = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.5, top_k=6, top_p=0.95)]


@pytest.mark.parametrize("params", SAMPLING, ids=["t1", "topk-topp"])
def test_rejection_sampling_with_stochastic_drafts_is_exact(params):
    world = SmallWorld(params)
    # the test has teeth only if the draft is far from the target
    assert float((world.p0 - world.q0).abs().sum()) / 2 > 0.2
    counts = world.run(accept.accept_sampling, TRIALS, seed=0)
    assert chi_square_pvalue(counts, world.exact) > 1e-3


@pytest.mark.parametrize("bug", ["resample_from_p", "q_over_p"])
@pytest.mark.parametrize("params", SAMPLING, ids=["t1", "topk-topp"])
def test_distribution_test_catches_a_biased_rule(params, bug):
    world = SmallWorld(params)
    counts = world.run(biased_accept_sampling(bug), TRIALS, seed=0)
    assert chi_square_pvalue(counts, world.exact) < 1e-6


class SiblingSampler:
    """A proposer's step that drafts ``k`` SIBLINGS, each drawn independently from the draft's q
    after the root (SpecInfer's multi-candidate drafts). No proposer of the library drafts that
    way, but the verifier supports it (its residual rule for sampled siblings): this reaches it."""

    def __init__(self, world: SmallWorld, k: int) -> None:
        self.world, self.shape = world, TreeShape.from_choices([[i] for i in range(k)])

    def propose(self, generator: torch.Generator) -> Tree:
        w, k = self.world, self.shape.size - 1
        drafts = torch.multinomial(w.q0, k, replacement=True, generator=generator)
        return Tree(self.shape, torch.cat([torch.tensor([w.root]), drafts]), torch.stack([torch.zeros(SMALL_V), *[w.q0] * k]))

    def run(self, accept_sampling, trials: int, seed: int) -> tuple[torch.Tensor, int]:
        """Counts of the first two emitted tokens, and how often a second sibling was accepted."""
        w, gen = self.world, torch.Generator().manual_seed(seed)
        counts, later = torch.zeros(SMALL_V, SMALL_V), 0
        for _ in range(trials):
            tree = self.propose(gen)
            logits = torch.stack([w.lp0, *[w.lp1[int(t)] for t in tree.tokens[1:]]])
            acc = accept_sampling(tree, logits, w.params, gen)
            emitted = tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
            later += len(acc.path) > 1 and int(acc.path[1]) > 1
            if len(emitted) == 1:  # every sibling rejected: the next step decodes e2 from the target
                emitted.append(int(torch.multinomial(w.p1[emitted[0]], 1, generator=gen)))
            counts[emitted[0], emitted[1]] += 1
        return counts, later


@pytest.mark.parametrize("params", SAMPLING, ids=["t1", "topk-topp"])
def test_sampled_sibling_drafts_keep_the_target_distribution(params):
    world = SmallWorld(params)
    counts, later = SiblingSampler(world, k=3).run(accept.accept_sampling, 3000, seed=0)
    assert later > 300, "later siblings were (almost) never accepted: the residual rule went untested"
    assert chi_square_pvalue(counts, world.exact) > 1e-3
    biased, _ = SiblingSampler(world, k=3).run(biased_accept_sampling("resample_from_p"), 3000, seed=0)
    assert chi_square_pvalue(biased, world.exact) < 1e-6


def test_generate_with_sampled_drafts_matches_target_distribution():
    """The same law end to end through `generate`: 3 new tokens, so the second step drafts and
    verifies a sampled token; the empirical law of (t2, t3) must match the target's."""
    params = SamplingParams(temperature=1.0)
    target = tiny_lm("llama", seed=11, vocab=SMALL_V, hidden=16, layers=1, initializer_range=0.3)
    draft = tiny_lm("qwen2", seed=12, vocab=SMALL_V, hidden=16, layers=1, initializer_range=0.3)
    ids = torch.tensor([[1, 4, 6, 2]])
    v = SMALL_V
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))
    with torch.no_grad():
        logits = target(input_ids=torch.cat([ids.expand(len(pairs), -1), pairs], dim=1)).logits
    p1 = params.probs(logits[0, -3])  # t1
    p2 = params.probs(logits[::v, -2])  # t2 | t1
    p3 = params.probs(logits[:, -1]).reshape(v, v, v)  # t3 | t1, t2
    exact = (p1[:, None, None] * p2[:, :, None] * p3).sum(0)  # law of (t2, t3)

    decoder = dh.SpeculativeDecoder(target, dh.DraftModelProposer(draft, gamma=2))
    gen = torch.Generator().manual_seed(0)
    runs = 500  # ~15 ms each: this checks the wiring; the power is in the tests above
    counts = torch.zeros(v, v)
    drafted = 0
    for _ in range(runs):
        out = decoder.generate(ids, max_new_tokens=3, temperature=1.0, generator=gen, eos_token_id=[])
        t2, t3 = out.sequences[0, -2:].tolist()
        counts[t2, t3] += 1
        drafted += out.stats["gamma_histogram"].get(1, 0)
    assert drafted == runs  # every run went through a sampled draft and the min(1, p/q) rule
    assert chi_square_pvalue(counts.sum(1), exact.sum(1)) > 1e-3  # t2: where drafts are judged
    assert chi_square_pvalue(counts, exact) > 1e-3


def word_tokenizer(words: list[str], specials=("<unk>", "<s>", "</s>", "<pad>"), eos="</s>"):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*specials, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token=eos, pad_token="<pad>"
    )


WORDS = [f"w{i}" for i in range(40)]


def test_tokenizer_check_accepts_identical_tokenizers():
    dh.check_same_tokenizer(word_tokenizer(WORDS), word_tokenizer(WORDS))


def test_tokenizer_check_rejects_a_different_size():
    with pytest.raises(ValueError, match="vocabulary size differs.*44.*45"):
        dh.check_same_tokenizer(word_tokenizer(WORDS), word_tokenizer(WORDS + ["extra"]))


def test_tokenizer_check_rejects_swapped_ids():
    swapped = list(WORDS)
    swapped[3], swapped[17] = swapped[17], swapped[3]
    with pytest.raises(ValueError, match=r"2 token\(s\) have different ids.*'w3': target id 7, draft id 21"):
        dh.check_same_tokenizer(word_tokenizer(WORDS), word_tokenizer(swapped))


def test_tokenizer_check_rejects_other_tokens_of_the_same_size():
    other = WORDS[:-1] + ["zz"]
    with pytest.raises(ValueError, match=r"only in the target tokenizer, e.g. 'w39'"):
        dh.check_same_tokenizer(word_tokenizer(WORDS), word_tokenizer(other))


def test_tokenizer_check_rejects_different_special_tokens():
    with pytest.raises(ValueError, match=r"eos_token differs: target '</s>' \(id 2\), draft '<pad>' \(id 3\)"):
        dh.check_same_tokenizer(word_tokenizer(WORDS), word_tokenizer(WORDS, eos="<pad>"))


def test_draft_model_proposer_runs_the_tokenizer_check():
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    swapped = list(WORDS)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    with pytest.raises(ValueError, match="different ids"):
        dh.DraftModelProposer(draft, tokenizers=(word_tokenizer(WORDS), word_tokenizer(swapped)))
    with pytest.raises(ValueError, match="different ids"):
        dh.DraftModelProposer(draft, target_tokenizer=word_tokenizer(WORDS), draft_tokenizer=word_tokenizer(swapped))
    dh.DraftModelProposer(draft, tokenizers=(word_tokenizer(WORDS), word_tokenizer(WORDS)))


def test_vocab_size_policy():
    """Logit sizes must match, unless the tokenizers are given and both cover len(tokenizer):
    then the sizes may differ by LM-head padding and decoding stays exact."""
    tok = word_tokenizer(WORDS)  # 44 tokens
    target = tiny_lm("llama", vocab=48)
    bigger = tiny_lm("llama", seed=1, vocab=64, hidden=16, layers=1)
    smaller = tiny_lm("llama", seed=2, vocab=46, hidden=16, layers=1)
    too_small = tiny_lm("llama", seed=3, vocab=40, hidden=16, layers=1)
    with pytest.raises(ValueError, match="draft model has 64 logits but the target has 48"):
        dh.SpeculativeDecoder(target, dh.DraftModelProposer(bigger))
    with pytest.raises(ValueError, match="cover 40 ids but the tokenizer has 44"):
        dh.DraftModelProposer(too_small, tokenizers=(tok, tok))
    ids = torch.tensor([[1, 5, 9, 5, 9, 12]])
    ref = reference(target, ids, 20)
    checked = 0
    for draft in (bigger, smaller):
        for sampling in ({}, {"temperature": 1.0, "seed": 0}):
            proposer = CheckedDraftProposer(draft, gamma=3, tokenizers=(tok, tok))
            out = dh.SpeculativeDecoder(target, proposer).generate(ids, max_new_tokens=20, eos_token_id=[], **sampling)
            assert out.sequences.shape == ref.shape
            if not sampling:
                assert out.sequences.tolist() == ref.tolist()
                continue
            # Sampled drafts: each q row (what the verifier's min(1, p/q) divides by) is the draft's
            # distribution over the TARGET's 48 ids: cut, or padded with impossible ids.
            with torch.no_grad():
                for context, tree in proposer.records:
                    tokens = tree.tokens.tolist()
                    for i in range(1, len(tokens)):
                        row = tree.draft_probs[i]
                        assert row.shape == (48,) and abs(float(row.sum()) - 1) < 1e-5
                        assert float(row[draft.config.vocab_size :].sum()) == 0.0 and row[tokens[i]] > 0
                        seq = context + tokens[1:i]
                        if max(seq) >= draft.config.vocab_size:
                            continue  # an id the draft cannot read (the proposer substitutes it)
                        logits = draft(input_ids=torch.tensor([seq])).logits[0, -1]
                        fitted = torch.full((48,), float("-inf"))
                        fitted[: min(48, logits.numel())] = logits[:48]
                        torch.testing.assert_close(row, SamplingParams(temperature=1.0).probs(fitted), atol=1e-5, rtol=1e-4)
                        checked += 1
    assert checked >= 5


class ScriptedBudget(DraftBudget):
    """A draft budget that caps the steps in a fixed cycle (plain steps included)."""

    name = "scripted"

    def __init__(self, cycle):
        super().__init__()
        self.cycle, self.asked = cycle, []

    def choose(self, rows):
        cap = self.cycle[len(self.asked) % len(self.cycle)]
        self.asked.append(cap)
        return cap


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=0)])
def test_the_decoders_budget_sizes_the_draft_models_chain(sampling):
    """The draft length is the decoder's draft budget's (the rule every proposer has): each step
    drafts the cap it is given, plain steps included, the draft's cache stays exactly the committed
    tokens through them, and greedy output still equals generate."""
    target = tiny_lm("llama")
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    budget = ScriptedBudget([0, 3, 0, 0, 1, 5, 2])
    proposer = CheckedDraftProposer(draft, gamma="auto", max_gamma=4)
    ids = prompts()[0]
    out = dh.SpeculativeDecoder(target, proposer, draft_budget=budget).generate(
        ids, max_new_tokens=30, eos_token_id=[], seed=0, **sampling)
    drafted = [tree.shape.size - 1 for _, tree in proposer.records]
    limits = [min(cap, 4) for cap in budget.asked]
    assert all(d <= cap for d, cap in zip(drafted, limits)) and drafted[:4] == limits[:4]
    assert out.stats["gamma_histogram"].get(0, 0) >= 3 and out.stats["draft_budget"]["steps"]["plain"] >= 3
    if not sampling["temperature"]:
        assert torch.equal(out.sequences, reference(target, ids, 30))


def test_draft_model_stats():
    target = tiny_lm("llama")
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    out = dh.SpeculativeDecoder(target, dh.DraftModelProposer(draft, gamma="auto", max_gamma=5)).generate(
        prompts()[0], max_new_tokens=20, eos_token_id=[]
    )
    stats = out.stats
    assert stats["proposer"] == "draft_model" and stats["gamma_mode"] == "auto"
    assert sum(stats["gamma_histogram"].values()) == stats["steps"]
    assert max(stats["gamma_histogram"]) == 5 and 0.0 < stats["gamma_mean"] <= 5  # the full draft: "auto" = max_gamma


def test_draft_model_argument_errors():
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    with pytest.raises(ValueError, match="gamma"):
        dh.DraftModelProposer(draft, gamma="fast")
    with pytest.raises(ValueError, match="gamma"):
        dh.DraftModelProposer(draft, gamma=-1)
    with pytest.raises(ValueError, match="max_gamma"):
        dh.DraftModelProposer(draft, max_gamma=0)
    with pytest.raises(ValueError, match="both"):
        dh.DraftModelProposer(draft, target_tokenizer=word_tokenizer(WORDS))
