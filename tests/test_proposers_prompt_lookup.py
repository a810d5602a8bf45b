"""Prompt lookup proposer: exactness against `generate` and its n-gram matching."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.inference.sampling import SamplingParams

from proposer_utils import ARCHS, check_greedy_exact, tiny_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_lookup_greedy_matches_generate(arch):
    target = tiny_lm(arch)
    accept = check_greedy_exact(target, lambda: dh.PromptLookupProposer(max_ngram=3, num_tokens=6))
    # Tiny random models loop; the looping text is drafted from itself and accepted.
    assert sum(accept) / len(accept) > 1.3


def lookup_tree(proposer: dh.PromptLookupProposer, text: list[int], root: int, max_depth: int = 10) -> list[int]:
    proposer.start(torch.tensor(text), None, SamplingParams(), None)
    return proposer.propose(root, max_depth).tokens.tolist()


def test_prompt_lookup_longest_and_most_recent_match():
    p = dh.PromptLookupProposer(max_ngram=3, num_tokens=4, min_ngram=1)  # 1-grams too: the rule across n
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


def test_a_single_token_match_drafts_only_when_asked():
    """By default a draft needs a match of 2+ tokens (as behind the heads): the text's last token
    alone occurring earlier drafts nothing; ``min_ngram=1`` copies what followed it."""
    text = torch.tensor([5, 6, 7, 1, 2])  # then the root 5: the bigram (2, 5) is new, the token 5 is not
    for proposer, expected in ((dh.PromptLookupProposer(), [5]), (dh.PromptLookupProposer(min_ngram=1), [5, 6, 7])):
        proposer.start(text, None, SamplingParams(), None)
        assert proposer.propose(5, 2).tokens.tolist() == expected
