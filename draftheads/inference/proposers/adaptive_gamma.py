"""Adaptive draft length for a draft-model proposer: pick gamma each step to maximise expected
tokens per second, from online estimates of acceptance by draft position, draft step time,
verify time by tree size and per-step overhead.

gamma 0 means plain decoding; while it wins, the draft is probed again now and then so that a
draft that becomes useful is picked up again.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Callable, Sequence


def expected_tokens(alpha: float | Sequence[float], gamma: int) -> float:
    """Expected tokens per step for a chain of ``gamma`` drafts plus the target's own (bonus) token.

    ``alpha`` is either one acceptance rate for every position (drafts accepted independently
    until the first rejection: a geometric count) or a rate per position, ``alpha[k]`` being the
    probability that draft k + 1 is accepted given that the k before it were:
    1 + a0 + a0 a1 + ... + a0 ... a(gamma-1)."""
    if not isinstance(alpha, (int, float)):
        if len(alpha) < gamma:
            raise ValueError(f"{len(alpha)} acceptance rates for a chain of {gamma} drafts")
        total, reach = 1.0, 1.0
        for rate in alpha[:gamma]:
            reach *= rate
            total += reach
        return total
    if alpha >= 1.0 - 1e-12:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_rates(
    alpha: float | Sequence[float],
    t_draft: float,
    verify_time: Callable[[int], float],
    max_gamma: int,
    overhead: float = 0.0,
) -> list[float]:
    """Expected tokens per second for each draft length 0..max_gamma:
    E[tokens](gamma) / (overhead + gamma * t_draft + verify_time(gamma + 1)), ``alpha`` one rate
    or one per position (see `expected_tokens`). ``overhead`` is the per-step time outside the
    draft and verify forwards (the decode loop's bookkeeping): the same for every gamma, but
    leaving it out makes short steps look relatively cheaper than they are, which biases the
    choice towards short drafts and fallback."""
    rates = []
    for gamma in range(max_gamma + 1):
        seconds = overhead + gamma * t_draft + verify_time(gamma + 1)
        rates.append(expected_tokens(alpha, gamma) / max(seconds, 1e-12))
    return rates


def best_gamma(rates: Sequence[float]) -> int:
    """The draft length with the highest predicted rate; ties go to the shorter draft."""
    best = 0
    for gamma, rate in enumerate(rates):
        if rate > rates[best] * (1.0 + 1e-9):
            best = gamma
    return best


def choose_gamma(
    alpha: float | Sequence[float],
    t_draft: float,
    verify_time: Callable[[int], float],
    max_gamma: int,
    overhead: float = 0.0,
) -> int:
    """The draft length in 0..max_gamma with the most expected tokens per second (`predicted_rates`)."""
    return best_gamma(predicted_rates(alpha, t_draft, verify_time, max_gamma, overhead))


class AdaptiveGamma:
    """Online estimates for `choose_gamma`, plus the probing that keeps a fallback revisable.

    - acceptance by position: ``acceptance_rates()[k]`` estimates the probability that draft
      k + 1 is accepted given that the k before it were. Every step that reaches position k
      (drafted it, all earlier drafts accepted) is one trial there; hits and trials are counts
      that every drafting step decays by ``position_decay`` (at every position, so a position not
      reached lately drifts back to the pooled rate), shrunk towards the pooled rate with
      ``prior_strength`` pseudo-trials.
    - alpha (pooled): a chain step with k of g drafts accepted is k successes and, if k < g, one
      failure; alpha = EMA(successes) / (EMA(successes) + EMA(failures)), the exponentially
      weighted maximum-likelihood estimate for this censored geometric count. Reported, and the
      prior of the positions.
    - times are medians of the last ``window`` samples (robust to single slow samples): t_draft
      is one single-token draft forward (catch-up forwards are not counted); verify time is an
      affine fit over tree sizes (`verify_time`); overhead is each step's time outside the draft
      and verify forwards, added to every gamma's step time.
    - until both a draft time and a verify time are known, ``initial_gamma`` is used.
    - fallback to plain decoding (gamma 0) needs plain predicted ahead of the best draft length
      by more than ``fallback_margin``.
    - while falling back, every ``probe_interval`` plain steps a probe drafts two tokens (two: the
      first draft forward of a probe is a catch-up, no t_draft sample), refreshing the estimates.
      A probe while plain is predicted clearly faster (the best draft rate below ``marginal`` x
      plain's) doubles the interval, up to ``max_probe_every``; a draft length > 0 winning resets it.

    Why these choices, with the measurements behind them: benchmarks/README.md (adaptive gamma).
    """

    def __init__(
        self,
        max_gamma: int = 8,
        initial_gamma: int | None = None,
        initial_alpha: float = 0.5,
        decay: float = 0.9,
        probe_every: int = 16,
        max_probe_every: int | None = None,
        window: int = 15,
        marginal: float = 0.85,
        position_decay: float = 0.9,
        prior_strength: float = 2.0,
        fallback_margin: float = 0.05,
    ) -> None:
        if max_gamma < 1:
            raise ValueError(f"max_gamma must be >= 1 for adaptive gamma, got {max_gamma}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        if max_probe_every is None:
            max_probe_every = max(64, probe_every)
        if max_probe_every < probe_every:
            raise ValueError(f"max_probe_every ({max_probe_every}) must be >= probe_every ({probe_every})")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not 0.0 < position_decay < 1.0:
            raise ValueError(f"position_decay must be in (0, 1), got {position_decay}")
        if prior_strength <= 0.0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        if not 0.0 <= initial_alpha < 1.0:
            raise ValueError(f"initial_alpha must be in [0, 1), got {initial_alpha}")
        if not 0.0 < marginal <= 1.0:
            raise ValueError(f"marginal must be in (0, 1], got {marginal}")
        if fallback_margin < 0.0:
            raise ValueError(f"fallback_margin must be >= 0, got {fallback_margin}")
        self.max_gamma = max_gamma
        self.initial_gamma = min(max_gamma, 4) if initial_gamma is None else min(max(initial_gamma, 0), max_gamma)
        self.decay = decay
        self.fallback_margin = fallback_margin
        self.probe_every = probe_every
        self.max_probe_every = max_probe_every
        self.marginal = marginal
        self.probe_interval = probe_every  # current wait between probes (backs off while falling back)
        self._succ = initial_alpha  # one pseudo-observation at the prior rate
        self._fail = 1.0 - initial_alpha
        self.position_decay = position_decay
        self.prior_strength = prior_strength
        self._position_hits = [0.0] * max_gamma  # decayed counts per draft position
        self._position_trials = [0.0] * max_gamma
        self.window = window
        self.t_draft: float | None = None
        self.overhead: float | None = None
        self._draft_samples: deque[float] = deque(maxlen=window)
        self._overhead_samples: deque[float] = deque(maxlen=window)
        self._verify_samples: dict[int, deque[float]] = {}
        self._verify: dict[int, float] = {}  # median verify seconds per tree size
        self._verify_count: dict[int, int] = {}
        self._fit: tuple[float, float, int] | None = None  # (a, b, smallest size): see verify_time
        self._since_probe = 0
        self.reset_counts()

    def reset_counts(self) -> None:
        """Per-generation statistics (the estimates themselves persist across generations)."""
        self.histogram: dict[int, int] = {}
        self.fallback_steps = 0
        self.probe_steps = 0

    # -- estimates --------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        return self._succ / max(self._succ + self._fail, 1e-12)

    def record_draft_time(self, seconds_per_forward: float) -> None:
        self._draft_samples.append(seconds_per_forward)
        self.t_draft = statistics.median(self._draft_samples)

    def record_overhead(self, seconds: float) -> None:
        self._overhead_samples.append(max(seconds, 0.0))
        self.overhead = statistics.median(self._overhead_samples)

    def record_step(self, num_drafted: int, accepted: int, verify_seconds: float) -> None:
        size = num_drafted + 1
        samples = self._verify_samples.setdefault(size, deque(maxlen=self.window))
        samples.append(verify_seconds)
        self._verify[size] = statistics.median(samples)
        self._verify_count[size] = self._verify_count.get(size, 0) + 1
        self._refit()
        if num_drafted > 0:
            rejected = 1.0 if accepted < num_drafted else 0.0
            self._succ = self.decay * self._succ + (1.0 - self.decay) * accepted
            self._fail = self.decay * self._fail + (1.0 - self.decay) * rejected
            # Every position's evidence ages each drafting step; positions 1..accepted were hits,
            # position accepted + 1 (if drafted) the miss.
            reached = min(accepted + 1, num_drafted, self.max_gamma)
            d = self.position_decay
            for k in range(self.max_gamma):
                self._position_trials[k] = d * self._position_trials[k] + (1.0 if k < reached else 0.0)
                self._position_hits[k] = d * self._position_hits[k] + (1.0 if k < accepted else 0.0)

    def acceptance_rates(self) -> list[float]:
        """Estimated acceptance of draft k + 1 given the k before it were accepted, k < max_gamma."""
        prior, m = self.alpha, self.prior_strength
        return [(h + m * prior) / (n + m) for h, n in zip(self._position_hits, self._position_trials)]

    def verify_time(self, size: int) -> float:
        """Estimated verify seconds for ``size`` tokens: one measured size is taken as is; with
        several, the affine fit a + b * size (b >= 0) weighted by each size's sample count (capped
        at 32), evaluated no lower than the smallest measured size (a plain step never looks
        cheaper than measured: fallback needs evidence). A fit pools every step's evidence and is
        monotone in the size by construction, which per-size estimates on a loaded machine are not."""
        if self._fit is None:
            raise ValueError("no verify time measured yet")
        a, b, smallest = self._fit
        return a + b * max(size, smallest)

    def _refit(self) -> None:
        known = self._verify
        smallest = min(known)
        if len(known) == 1:
            self._fit = (known[smallest], 0.0, smallest)
            return
        w = {s: min(self._verify_count[s], 32) for s in known}
        total = sum(w.values())
        mean_s = sum(w[s] * s for s in known) / total
        mean_t = sum(w[s] * t for s, t in known.items()) / total
        var = sum(w[s] * (s - mean_s) ** 2 for s in known)
        b = max(sum(w[s] * (s - mean_s) * (t - mean_t) for s, t in known.items()) / var, 0.0)
        self._fit = (mean_t - b * mean_s, b, smallest)

    # -- the decision -----------------------------------------------------------------------------
    def choose(self, limit: int | None = None) -> int:
        """Draft length for the next step, at most ``limit`` (tokens left before max_new_tokens)."""
        limit = self.max_gamma if limit is None else min(limit, self.max_gamma)
        if limit <= 0:
            gamma = 0
        elif self.t_draft is None or not self._verify:
            gamma = min(self.initial_gamma, limit)
        else:
            rates = predicted_rates(
                self.acceptance_rates(), self.t_draft, self.verify_time, limit, self.overhead or 0.0
            )
            gamma = best_gamma(rates)
            if gamma == 0:
                drafting = 1 + best_gamma(rates[1:])  # the best draft length, and its rate below
                # The margin needs a measured plain step: unmeasured, its cost is taken as the smallest
                # measured size's (see verify_time), and with a margin on top it would never be measured.
                margin = self.fallback_margin if 1 in self._verify else 0.0
                if rates[drafting] * (1.0 + margin) >= rates[0]:
                    gamma = drafting  # plain decoding not clearly ahead: keep drafting (see docstring)
            if gamma == 0:
                self._since_probe += 1
                if self._since_probe >= self.probe_interval:
                    # A probe. If the estimates so far put plain decoding clearly ahead (a draft that
                    # keeps failing its probes), the next one waits twice as long.
                    self._since_probe = 0
                    self.probe_steps += 1
                    if rates[drafting] < self.marginal * rates[0]:
                        self.probe_interval = min(2 * self.probe_interval, self.max_probe_every)
                    else:
                        self.probe_interval = self.probe_every
                    gamma = min(2, limit)
                else:
                    self.fallback_steps += 1
            else:
                self._since_probe = 0
                self.probe_interval = self.probe_every
        self.histogram[gamma] = self.histogram.get(gamma, 0) + 1
        return gamma

    def stats(self) -> dict[str, Any]:
        steps = sum(self.histogram.values())
        mean = sum(g * c for g, c in self.histogram.items()) / max(steps, 1)
        return {
            "gamma_mean": mean,
            "gamma_histogram": dict(sorted(self.histogram.items())),
            "fallback_steps": self.fallback_steps,
            "probe_steps": self.probe_steps,
            "probe_interval": self.probe_interval,
            "alpha": self.alpha,
            "acceptance_by_position": self.acceptance_rates(),
            "t_draft": self.t_draft,
            "t_overhead": self.overhead,
            "t_verify": dict(sorted(self._verify.items())),
        }
