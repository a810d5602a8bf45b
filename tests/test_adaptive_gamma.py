"""Adaptive draft length (`AdaptiveGamma`): the expected-tokens model, the choice of gamma,
fallback to plain decoding and probing."""
from __future__ import annotations

import math

import pytest

from draftheads.inference.proposers.adaptive_gamma import AdaptiveGamma, choose_gamma, expected_tokens


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
