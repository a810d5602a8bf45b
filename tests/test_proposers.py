"""Prompt lookup and draft-model proposers: exactness against `generate`, the draft cache's
bookkeeping, the distribution of sampled outputs with stochastic drafts, the tokenizer check and
the adaptive draft length.

Everything runs on tiny random models built from configs; models use a larger initializer range
than the default so that their distributions are peaked (greedy text loops, p and q differ a lot),
which is what gives acceptance and the distribution tests something to bite on.
"""
from __future__ import annotations

import math

import pytest
import torch

import draftheads as dh
from draftheads.inference.proposers.draft_model import AdaptiveGamma, choose_gamma, expected_tokens
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.tree import Tree, TreeShape
from draftheads.inference.verify import TreeVerifier

from inference_utils import greedy_reference, tiny_target
from stats import biased_accept_sampling, chi_square_pvalue

VOCAB = 64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models are dominated by per-op overhead; extra threads only fight over shared cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def tiny_lm(arch: str = "llama", seed: int = 0, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, **extra):
    return tiny_target(arch, seed=seed, vocab=vocab, hidden=hidden, layers=layers, **extra)


reference = greedy_reference


def prompts(vocab: int = VOCAB) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    random = torch.randint(4, vocab, (1, 9), generator=g)
    phrase = torch.randint(4, vocab, (5,), generator=g)
    repetitive = torch.cat([phrase, phrase, phrase[:3]])[None]  # the prompt repeats itself
    short = torch.tensor([[1]])
    return [random, repetitive, short]


ARCHS = ["llama", "qwen2"]
LENGTHS = [1, 2, 7, 40]


def check_greedy_exact(target, make_proposer, lengths=LENGTHS) -> list[int]:
    """Our greedy output equals `generate`'s for every prompt and length; returns the accept
    lengths of the longest runs (short runs are dominated by the max_new_tokens cut)."""
    accept: list[int] = []
    decoder = dh.SpeculativeDecoder(target, make_proposer())
    for ids in prompts():
        # Greedy decoding without EOS is deterministic: shorter runs are prefixes of the longest.
        ref = reference(target, ids, max(lengths))
        for n in lengths:
            out = decoder.generate(ids, max_new_tokens=n, eos_token_id=[])
            assert out.sequences.tolist() == ref[:, : ids.shape[1] + n].tolist(), (ids.tolist(), n)
            if n == max(lengths):
                accept += out.accept_lengths
    return accept


# -- greedy exactness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_lookup_greedy_matches_generate(arch):
    target = tiny_lm(arch)
    accept = check_greedy_exact(target, lambda: dh.PromptLookupProposer(max_ngram=3, num_tokens=6))
    # Tiny random models loop; the looping text is drafted from itself and accepted.
    assert sum(accept) / len(accept) > 1.3


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


# -- draft cache bookkeeping and the q rows ------------------------------------------------------------------
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
    proposer = CheckedDraftProposer(draft, gamma=gamma, max_gamma=4, probe_every=2, max_probe_every=2)
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
    counts = world.run(TreeVerifier.accept_sampling, TRIALS, seed=0)
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
    counts, later = SiblingSampler(world, k=3).run(TreeVerifier.accept_sampling, 3000, seed=0)
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


# -- tokenizer check ------------------------------------------------------------------------------------
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


# -- adaptive gamma -------------------------------------------------------------------------------------
def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert math.isclose(expected_tokens(0.5, 2), 1.75)
    # one rate per position: 1 + a0 + a0 a1 + ...; a constant list is the geometric count
    assert math.isclose(expected_tokens([0.5, 0.5, 0.5], 2), 1.75)
    assert math.isclose(expected_tokens([0.9, 0.5, 1.0], 3), 1 + 0.9 + 0.45 + 0.45)
    assert expected_tokens([0.9, 0.5], 0) == 1.0
    with pytest.raises(ValueError, match="2 acceptance rates for a chain of 3"):
        expected_tokens([0.9, 0.5], 3)


def linear_verify(base: float, per_token: float):
    return lambda n: base + per_token * (n - 1)


def test_choose_gamma():
    verify = linear_verify(0.020, 0.0005)  # a target forward; extra tree tokens are nearly free
    # a good, cheap draft: draft the maximum
    assert choose_gamma(0.9, 0.001, verify, 8) == 8
    # a useless draft: plain decoding
    assert choose_gamma(0.01, 0.001, verify, 8) == 0
    # a good but expensive draft (as slow as the target): plain decoding
    assert choose_gamma(0.7, 0.030, verify, 8) == 0
    # in between: a short draft
    assert 1 <= choose_gamma(0.6, 0.004, verify, 8) <= 4
    # the limit is respected
    assert choose_gamma(0.9, 0.001, verify, 3) == 3


def test_choose_gamma_counts_the_per_step_overhead():
    verify = linear_verify(0.010, 0.0005)
    # a weak draft: not worth a 2 ms draft forward on top of a 10 ms step ...
    assert choose_gamma(0.2, 0.002, verify, 8) == 0
    # ... but worth it when every step also pays 5 ms of loop overhead, whatever its length
    assert choose_gamma(0.2, 0.002, verify, 8, overhead=0.005) >= 1
    ad = AdaptiveGamma(max_gamma=4)
    ad.record_draft_time(0.002)
    ad.record_step(0, 0, 0.010)
    ad.record_step(1, 0, 0.0105)
    ad._succ, ad._fail = 0.2, 0.8  # acceptance 0.2 at every position (the pooled rate, no per-position trials)
    ad._position_hits, ad._position_trials = [0.0] * 4, [0.0] * 4
    assert ad.acceptance_rates() == pytest.approx([0.2] * 4)
    assert ad.choose() == 1  # plain decoding predicted ahead by 4%: within fallback_margin, keep drafting
    ad.fallback_margin = 0.0
    assert ad.choose() == 0
    ad.record_overhead(0.005)
    assert ad.choose() >= 1 and ad.stats()["t_overhead"] == 0.005


def test_draft_model_measures_the_loop_overhead():
    target = tiny_lm("llama")
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    out = dh.SpeculativeDecoder(target, dh.DraftModelProposer(draft, gamma="auto")).generate(
        prompts()[0], max_new_tokens=12, eos_token_id=[]
    )
    assert out.stats["t_overhead"] is not None and 0.0 <= out.stats["t_overhead"] < out.decode_seconds


def test_adaptive_gamma_learns_falls_back_and_probes():
    ad = AdaptiveGamma(max_gamma=6, initial_gamma=3, probe_every=8, max_probe_every=8)  # no backoff here
    assert ad.choose() == 3  # nothing measured yet
    # a cheap draft that is always accepted: gamma goes to the maximum
    for _ in range(30):
        g = ad.choose()
        ad.record_draft_time(0.001)
        ad.record_step(g, g, 0.02 + 0.0005 * g)
    assert ad.choose() == 6 and ad.alpha > 0.95
    # the draft turns useless: fall back to plain decoding, but probe with one token now and then
    # (gamma shrinks as alpha decays: one cheap draft token still pays while alpha > ~0.08)
    chosen = []
    for _ in range(100):
        g = ad.choose()
        chosen.append(g)
        if g:
            ad.record_draft_time(0.001)
        ad.record_step(g, 0, 0.02 + 0.0005 * g)
    tail = chosen[-40:]
    assert tail.count(0) >= 34 and tail.count(2) >= 4 and set(tail) == {0, 2}  # probes draft 2 tokens
    stats = ad.stats()
    assert stats["fallback_steps"] >= 34 and stats["probe_steps"] >= 4 and stats["alpha"] < 0.1
    # the draft becomes good again: probes pick it up
    for _ in range(80):
        g = ad.choose()
        if g:
            ad.record_draft_time(0.001)
        ad.record_step(g, g, 0.02 + 0.0005 * g)
    assert ad.choose() >= 4
    # a limit of 0 (no room left) is not a fallback
    before = ad.fallback_steps
    assert ad.choose(0) == 0 and ad.fallback_steps == before


def test_adaptive_gamma_probes_back_off_and_reset():
    ad = AdaptiveGamma(max_gamma=4, initial_gamma=2, probe_every=4, max_probe_every=16)
    ad.record_draft_time(0.010)  # half a target forward: a draft that never hits is a clear loss
    chosen = []
    for _ in range(120):  # a useless draft: every probe fails
        g = ad.choose()
        chosen.append(g)
        ad.record_step(g, 0, 0.02 + 0.0005 * g)
    first_plain = chosen.index(0)  # alpha has decayed from its prior: plain decoding wins
    probes = [i for i, g in enumerate(chosen) if g == 2 and i > first_plain]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # The first probe comes as plain decoding just overtook the decaying prior (marginal: no
    # back-off); from then on each failed probe doubles the wait, capped at 16.
    assert gaps[:3] == [4, 8, 16] and set(gaps[3:]) == {16}, gaps
    assert ad.probe_interval == 16
    assert ad.stats()["probe_interval"] == 16
    # the draft turns perfect: the next probe succeeds, drafting resumes and the wait resets
    for _ in range(40):
        g = ad.choose()
        ad.record_step(g, g, 0.02 + 0.0005 * g)
    assert ad.choose() >= 1 and ad.probe_interval == 4
    with pytest.raises(ValueError, match="max_probe_every"):
        AdaptiveGamma(probe_every=8, max_probe_every=4)
    assert AdaptiveGamma(probe_every=300).max_probe_every == 300


def test_adaptive_gamma_learns_acceptance_by_position():
    """The demo's draft on code: the first draft is accepted ~90% of the time, the second ~50%,
    later ones ~95%. One pooled rate (~0.8) makes 2+ drafts look worth it; the rates per
    position say one draft token is best, and the loop settles there."""
    import random

    rnd = random.Random(0)
    rates = [0.9, 0.5, 0.95, 0.95, 0.95, 0.95]

    def accepted(g: int) -> int:
        k = 0
        while k < g and rnd.random() < rates[k]:
            k += 1
        return k

    def verify(n):  # a CPU-like target: every verified token costs a fifth of a forward
        return 0.010 + 0.002 * (n - 1)

    t_draft = 0.003
    ad = AdaptiveGamma(max_gamma=6, initial_gamma=4)
    chosen = []
    for _ in range(400):
        g = ad.choose()
        chosen.append(g)
        if g:
            ad.record_draft_time(t_draft)
        ad.record_step(g, accepted(g), verify(g + 1))
    learned = ad.acceptance_rates()
    # (position 2 is rarely reached at gamma 1: its evidence ages back towards the pooled rate,
    # which is what sends the loop to try two drafts again now and then)
    assert learned[0] == pytest.approx(0.9, abs=0.12) and learned[1] < learned[0]
    assert ad.stats()["acceptance_by_position"] == learned
    # What each choice is worth under the true rates: gamma 1 is the best, by 7% over gamma 2.
    rate = {g: expected_tokens(rates, g) / (g * t_draft + verify(g + 1)) for g in range(7)}
    assert max(rate, key=rate.get) == 1 and rate[1] > 1.05 * rate[2]
    assert max(rate, key=lambda g: expected_tokens(0.8, g) / (g * t_draft + verify(g + 1))) >= 2  # pooled: wrong
    # What the loop's choices are worth (expected tokens per second under the true rates, last
    # 200 steps): within 5% of the best fixed gamma (the rest is exploring 2+ drafts now and
    # then), where one pooled rate would settle on gamma 2, 7% behind.
    def worth(choices):
        return sum(expected_tokens(rates, g) for g in choices) / sum(g * t_draft + verify(g + 1) for g in choices)

    assert worth(chosen[-200:]) >= 0.95 * rate[1] > worth([2] * 200)
    assert chosen[-200:].count(1) > 100
    # a step that drafts 3 and has the first rejected is a trial at position 1 only; every
    # position's evidence ages by position_decay
    before = list(ad._position_trials)
    ad.record_step(3, 0, verify(4))
    assert ad._position_trials == pytest.approx([0.9 * before[0] + 1] + [0.9 * n for n in before[1:]])
    with pytest.raises(ValueError, match="position_decay"):
        AdaptiveGamma(position_decay=1.0)
    with pytest.raises(ValueError, match="prior_strength"):
        AdaptiveGamma(prior_strength=0.0)


def test_adaptive_gamma_keeps_probing_a_marginal_draft():
    """Plain decoding predicted only slightly ahead (within ``marginal``): the wait between probes
    does not grow, since the fallback may be noise and every plain step forgoes a gain."""
    def run(t_draft: float) -> list[int]:
        ad = AdaptiveGamma(max_gamma=4, initial_gamma=1, probe_every=4, max_probe_every=16)
        chosen = []
        for _ in range(100):
            g = ad.choose()
            chosen.append(g)
            ad.record_draft_time(t_draft)
            ad.record_step(g, 0, 0.02 + 0.0005 * g)
        return chosen

    # a useless draft costing 1 ms against a 20 ms target step: plain is ahead by 7%, marginal
    chosen = run(0.001)
    probes = [i for i, g in enumerate(chosen) if g == 2 and i > 30]  # once the prior has decayed
    assert len(probes) > 10 and {b - a for a, b in zip(probes, probes[1:])} == {4}  # 3 plain steps, then a probe
    # the same draft costing 10 ms: plain is ahead by a third, the waits grow
    chosen = run(0.010)
    probes = [i for i, g in enumerate(chosen) if g == 2 and i > 30]
    assert max(b - a for a, b in zip(probes, probes[1:])) == 16
    with pytest.raises(ValueError, match="marginal"):
        AdaptiveGamma(marginal=1.5)


def test_adaptive_gamma_verify_time_estimates():
    ad = AdaptiveGamma(max_gamma=8)
    ad.record_step(3, 1, 0.030)  # size 4
    assert ad.verify_time(1) == 0.030 and ad.verify_time(9) == 0.030
    ad.record_step(7, 1, 0.050)  # size 8
    assert math.isclose(ad.verify_time(6), 0.040)
    assert math.isclose(ad.verify_time(9), 0.055)
    assert ad.verify_time(2) == 0.030
    # noisy sizes: the fit pools them (weighted by sample counts) into one monotone line
    for _ in range(20):
        ad.record_step(0, 0, 0.020)  # size 1, measured often
    ad.record_step(4, 1, 0.060)  # size 5 once, slow (a load spike)
    times = [ad.verify_time(s) for s in range(1, 10)]
    assert times == sorted(times) and times[0] < 0.030 and ad.verify_time(5) < 0.060


def test_adaptive_gamma_a_slow_plain_step_does_not_make_a_useless_draft_pay():
    ad = AdaptiveGamma(max_gamma=4)
    ad.record_draft_time(0.002)
    ad.record_step(1, 0, 0.005)  # size 2: 5 ms
    ad.record_step(0, 0, 0.009)  # size 1: one slow step (load spike) at 9 ms
    ad._succ, ad._fail = 0.02, 0.98  # the draft is useless
    assert ad.verify_time(1) <= ad.verify_time(2)  # the fit is monotone whatever the samples
    assert ad.choose() == 0


def test_draft_model_stats():
    target = tiny_lm("llama")
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    out = dh.SpeculativeDecoder(target, dh.DraftModelProposer(draft, gamma="auto", max_gamma=5)).generate(
        prompts()[0], max_new_tokens=20, eos_token_id=[]
    )
    stats = out.stats
    assert stats["proposer"] == "draft_model" and stats["gamma_mode"] == "auto"
    assert sum(stats["gamma_histogram"].values()) == stats["steps"]
    assert 0.0 <= stats["alpha"] <= 1.0 and 0.0 <= stats["gamma_mean"] <= 5
    assert {"fallback_steps", "probe_steps", "t_draft", "t_verify"} <= stats.keys()


def test_draft_model_argument_errors():
    draft = tiny_lm("llama", seed=1, hidden=16, layers=1)
    with pytest.raises(ValueError, match="gamma"):
        dh.DraftModelProposer(draft, gamma="fast")
    with pytest.raises(ValueError, match="gamma"):
        dh.DraftModelProposer(draft, gamma=-1)
    with pytest.raises(ValueError, match="both"):
        dh.DraftModelProposer(draft, target_tokenizer=word_tokenizer(WORDS))


# -- prompt lookup unit tests ---------------------------------------------------------------------------
def lookup_tree(proposer: dh.PromptLookupProposer, text: list[int], root: int, max_depth: int = 10) -> list[int]:
    proposer.start(torch.tensor(text), None, SamplingParams(), None)
    return proposer.propose(root, max_depth).tokens.tolist()


def test_prompt_lookup_longest_and_most_recent_match():
    p = dh.PromptLookupProposer(max_ngram=3, num_tokens=4)
    # suffix (7, 8, 9) occurred twice; the most recent occurrence is followed by 30 31 ...
    text = [7, 8, 9, 20, 21, 5, 7, 8, 9, 30, 31, 32, 33, 34, 7, 8]
    assert lookup_tree(p, text, root=9) == [9, 30, 31, 32, 33]
    # only a 1-gram matches: 9 -> what followed the last 9
    assert lookup_tree(p, [9, 40, 41, 1, 2], root=9) == [9, 40, 41, 1, 2]
    # a 2-gram match beats a more recent 1-gram match
    text = [4, 5, 60, 61, 5, 70, 71, 4]
    assert lookup_tree(p, text, root=5) == [5, 60, 61, 5, 70]
    # no match: the root alone (a plain decoding step)
    assert lookup_tree(p, [1, 2, 3], root=4) == [4]
    # max_depth caps the draft; depth 0 = root only
    assert lookup_tree(p, text, root=5, max_depth=2) == [5, 60, 61]
    assert lookup_tree(p, text, root=5, max_depth=0) == [5]


def test_prompt_lookup_continues_a_repetition_past_the_end_of_the_text():
    p = dh.PromptLookupProposer(max_ngram=3, num_tokens=8)
    # period 3: the latest (1, 2, 3) is 3 tokens back, the copy wraps around onto itself
    assert lookup_tree(p, [1, 2, 3, 1, 2, 3, 1, 2], root=3) == [3, 1, 2, 3, 1, 2, 3, 1, 2]
    # period 1
    assert lookup_tree(p, [5, 6, 6], root=6) == [6] + [6] * 8
    # a far match is copied as is (and capped by max_depth)
    assert lookup_tree(p, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2], root=3, max_depth=5) == [3, 4, 5, 6, 7, 8]


def test_prompt_lookup_uses_generated_text_and_min_ngram():
    p = dh.PromptLookupProposer(max_ngram=2, num_tokens=3, min_ngram=2)
    p.start(torch.tensor([1, 2, 3]), None, SamplingParams(), None)
    assert p.propose(10, 5).tokens.tolist() == [10]  # (3, 10) never seen
    p.accepted(torch.tensor([10]), None)
    assert p.propose(11, 5).tokens.tolist() == [11]
    p.accepted(torch.tensor([11]), None)
    p.propose(12, 5)
    p.accepted(torch.tensor([12]), None)
    # text is now 1 2 3 10 11 12; the root 10 after 12 gives the bigram (12, 10): unseen
    assert p.propose(10, 5).tokens.tolist() == [10]
    p.accepted(torch.tensor([10]), None)
    # (10, 11) was generated earlier, followed by 12 10
    assert p.propose(11, 5).tokens.tolist() == [11, 12, 10, 11]


def brute_force_lookup(tokens: list[int], max_ngram: int, min_ngram: int, max_tokens: int) -> list[int]:
    """The prompt-lookup draft by scanning the whole text: the continuation of the most recent
    earlier occurrence of the longest suffix n-gram, copied on into itself past the end."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for j in range(len(tokens) - 1, n - 1, -1):  # j: where the occurrence's continuation starts
            if tokens[j - n : j] == suffix:
                draft = tokens[j : j + max_tokens]
                while len(draft) < max_tokens:
                    draft.append(draft[j + len(draft) - len(tokens)])
                return draft
    return []


def test_prompt_lookup_long_sequence_matches_a_brute_force_search():
    """A few thousand tokens, 200 steps: the n-gram index (one dict lookup per n and step) proposes
    exactly what a scan of the whole text finds. (Named for what it checks; it times nothing.)"""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 50, (4000,), generator=g).tolist()
    p = dh.PromptLookupProposer(max_ngram=3, num_tokens=10, min_ngram=1)
    p.start(torch.tensor(text), None, SamplingParams(), None)
    matched = 0
    for i in range(200):
        root = text[i]
        tree = p.propose(root, 10)
        text.append(root)
        expected = brute_force_lookup(text, 3, 1, 10)
        assert tree.tokens.tolist() == [root, *expected], f"step {i}"
        matched += bool(expected)
        accepted = tree.tokens[: 1 + i % 3]  # accept 0 to 2 drafts, as a verifier would
        p.accepted(accepted, None)
        text.extend(accepted[1:].tolist())
    assert p.stats()["lookup_steps"] == 200 and matched > 150


def test_prompt_lookup_argument_errors():
    with pytest.raises(ValueError, match="min_ngram"):
        dh.PromptLookupProposer(min_ngram=0)
    with pytest.raises(ValueError, match="max_ngram"):
        dh.PromptLookupProposer(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="num_tokens"):
        dh.PromptLookupProposer(num_tokens=0)
