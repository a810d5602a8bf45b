"""Classic speculative decoding: a small LM with the target's tokenizer drafts a chain.

The draft keeps its own KV cache. Invariant between steps: the draft cache holds a prefix of the
committed tokens (prompt + accepted), and ``_pending`` holds the committed tokens after it that
the draft has not processed yet. A propose feeds ``_pending + [root]`` in one forward, then one
token per forward; the last drafted token is never fed (its logits would be unused). After
verification the cache is cropped back to the accepted tokens it has seen, and whatever accepted
token it has not seen (the last draft, when all were accepted) becomes pending again. No step
re-processes the prefix.

At temperature 0 drafts are the draft's argmax (point masses for the verifier). Otherwise they
are SAMPLED from the draft's processed distribution q (the same temperature/top-k/top-p warpers
as the target) and ``Tree.draft_probs`` carries q, so the verifier applies min(1, p/q) with the
residual norm(max(p - q, 0)): the output is exactly the target's distribution whatever the draft.

``gamma="auto"`` picks the draft length each step to maximise expected tokens per second from the
measured acceptance rate of each draft position, draft step time and verify time per tree size
(see `AdaptiveGamma`); gamma 0 falls back to plain decoding and the draft is probed again now and then.
"""
from __future__ import annotations

import inspect
import statistics
import time
from collections import deque
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from ..sampling import SamplingParams, sample
from ..tokenizer_check import check_same_tokenizer, tokenizer_size
from ..tree import Tree, TreeShape
from ..verify import cache_kwarg
from .base import Proposer


def _logits_rows(model: torch.nn.Module) -> int:
    """Size of the model's logits (rows of the LM head; may exceed the tokenizer: padded vocabs)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


# -- adaptive draft length --------------------------------------------------------------------------
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
      that every drafting step decays by ``position_decay`` (at every position), shrunk towards
      the pooled rate below with ``prior_strength`` pseudo-trials.
      Why per position: one rate for every position (a geometric count) was wrong both ways on
      the demo. On code its draft's first token is accepted 88% of the time, the second 44-65%,
      later ones 85-99% (`benchmarks/draft_acceptance_by_position.py` gets the same figures
      from teacher forcing: a property of the text, not of the loop). A single rate, pulled down
      by the second position, made plain decoding look as good as one draft token; pulled up by
      the first, it made 3-8 drafts look worth it.
      Why decay every step: the rates belong to the current text (one prompt accepted the second
      draft 2% of the time, the next 100%). A position not reached lately drifts back to the
      pooled rate and is tried again, instead of a previous prompt's verdict pinning the length.
    - alpha (pooled): a chain step with k of g drafts accepted is k successes and, if k < g, one
      failure; alpha = EMA(successes) / (EMA(successes) + EMA(failures)) is the (exponentially
      weighted) maximum-likelihood estimate for this censored geometric count. Reported, and the
      prior for positions with few trials.
    - Times are medians of the last ``window`` samples, not EMAs: on a shared machine single
      samples run 2-3x slow, and an EMA seeded by one such sample (t_draft is only refreshed by
      probes while falling back) kept a good draft in fallback for a whole benchmark.
    - t_draft: one single-token draft forward (catch-up forwards of many pending tokens are not
      counted).
    - verify time: per tree size, and an affine fit over the sizes (see `verify_time`);
      below the smallest measured size it is taken equal to the smallest (so a plain step never
      looks cheaper than measured, and fallback needs evidence).
    - overhead: each step's time outside the draft and verify forwards (the loop's own
      cost, measured by the proposer between consecutive steps), added to every gamma's step time.
    - Until both a draft time and a verify time are known, ``initial_gamma`` is used.
    - Fallback needs plain decoding predicted ahead of the best draft length by more than
      ``fallback_margin`` (default 5%). The errors are not symmetric: drafting where plain is 3%
      faster costs 3%, but falling back freezes the draft's cost and acceptance estimates until
      a probe, and on the demo's code prompts noisy estimates held the loop in fallback for a
      whole prompt where one draft token paid 13%.
    - When gamma 0 (plain decoding) wins, a probe step drafts two tokens anyway after
      ``probe_every`` plain steps, refreshing alpha, t_draft and the verify times so that a draft
      that becomes useful is picked up again. Two, not one: a probe's first draft forward catches
      up on every token decoded since the last one and is no t_draft sample, so one-token probes
      left t_draft frozen at its value when fallback began (a load spike then meant fallback for
      good). A probe while plain decoding is predicted clearly faster (the best draft length's
      rate below ``marginal`` x plain's) doubles the wait, up to ``max_probe_every`` steps
      (default 64): a probe costs a catch-up draft forward, one more draft forward and a 3-token
      verify (about one plain step with the demo's draft), so probing a useless draft every 16
      steps cost ~4-6% of plain speed, every 64 ~1.5%. A marginal draft (within that factor)
      keeps the short wait: there fallback is as likely a noisy estimate as a real loss. Once a
      draft length > 0 wins the wait is reset.
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
        cheaper than measured: fallback needs evidence).

        A fit, not one EMA per size: per-size estimates on a loaded machine were non-monotone
        (a one-token step estimated slower than a two-token one after one slow sample, and 9
        tokens cheaper than 5), which made a useless draft look worth drafting, and a good one
        jump to gamma 7-8; a fit pools every step's evidence and is monotone by construction."""
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


# -- the proposer -----------------------------------------------------------------------------------
class DraftModelProposer(Proposer):
    """Drafts with ``draft_model`` (any HF causal LM sharing the target's tokenizer).

    ``gamma``: an int (fixed draft length; 0 = plain decoding) or ``"auto"`` (adaptive, at most
    ``max_gamma``). Pass ``tokenizers=(target_tok, draft_tok)`` (or ``target_tokenizer=`` and
    ``draft_tokenizer=``) to check that both tokenizers map every token to the same id.

    Vocabulary sizes: the draft's logits must have as many rows as the target's. Models that pad
    their LM head (e.g. to a multiple of 64) may differ in padding only; this is accepted when the
    tokenizers are given and both logit sizes cover ``len(tokenizer)``. The draft's logits are then
    cut or padded (with -inf) to the target's size, so q is a distribution over the target's ids
    and the draft never proposes an id the target does not have. Still lossless: q is exactly what
    the drafts are sampled from. Without tokenizers, differing sizes are refused.

    With ``gamma="auto"`` the draft length depends on measured timings, so sampled outputs with a
    fixed seed are not reproducible run to run (each run is still an exact sample of the target).
    Learned estimates persist across ``generate`` calls; the statistics are per call.
    """

    feature_layers = ()  # tokens only: the verifier captures no hidden state

    def __init__(
        self,
        draft_model: torch.nn.Module,
        gamma: int | str = "auto",
        max_gamma: int = 8,
        *,
        tokenizers: tuple[Any, Any] | None = None,
        target_tokenizer: Any = None,
        draft_tokenizer: Any = None,
        initial_gamma: int | None = None,
        probe_every: int = 16,
        max_probe_every: int | None = None,
        ema_decay: float = 0.9,
    ) -> None:
        if isinstance(gamma, str):
            if gamma != "auto":
                raise ValueError(f"gamma must be an int >= 0 or 'auto', got {gamma!r}")
            self.adaptive = AdaptiveGamma(
                max_gamma, initial_gamma, decay=ema_decay, probe_every=probe_every, max_probe_every=max_probe_every
            )
            self.gamma: int | None = None
        else:
            if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 0:
                raise ValueError(f"gamma must be an int >= 0 or 'auto', got {gamma!r}")
            self.gamma = int(gamma)
            # Estimates are still tracked (and reported), they just do not steer.
            self.adaptive = AdaptiveGamma(
                max(self.gamma, 1), decay=ema_decay, probe_every=probe_every, max_probe_every=max_probe_every
            )
        if tokenizers is not None:
            if target_tokenizer is not None or draft_tokenizer is not None:
                raise ValueError(
                    "pass either tokenizers=(target, draft) or target_tokenizer=/draft_tokenizer=, not both"
                )
            target_tokenizer, draft_tokenizer = tokenizers
        if (target_tokenizer is None) != (draft_tokenizer is None):
            raise ValueError("the tokenizer check needs both target_tokenizer and draft_tokenizer")
        self.tokenizer_size: int | None = None
        if target_tokenizer is not None:
            check_same_tokenizer(target_tokenizer, draft_tokenizer)
            self.tokenizer_size = tokenizer_size(target_tokenizer)
            unk = getattr(draft_tokenizer, "unk_token_id", None)
        else:
            unk = None
        self._substitute_id = int(unk) if unk is not None else 0

        self.draft = draft_model.eval()
        self.draft_vocab = _logits_rows(draft_model)
        if self.tokenizer_size is not None and self.draft_vocab < self.tokenizer_size:
            raise ValueError(
                f"the draft model's logits cover {self.draft_vocab} ids but the tokenizer has {self.tokenizer_size} "
                "tokens: this draft cannot score every token (wrong checkpoint or tokenizer?)"
            )
        self.target_vocab: int | None = None  # set by bind_target
        params = inspect.signature(draft_model.forward).parameters
        self._cache_arg = cache_kwarg(draft_model)
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._shapes: dict[int, TreeShape] = {}
        self._cache: DynamicCache | None = None
        self._pending: list[int] = []
        self._drafts: list[int] = []
        self._in_flight = False
        self._params = SamplingParams()
        self._generator: torch.Generator | None = None
        self._draft_seconds = 0.0
        self._step_start: float | None = None
        self._step_draft = 0.0
        self._step_verify: float | None = None

    # -- set-up ----------------------------------------------------------------------------------
    def bind_target(self, target: torch.nn.Module) -> None:
        """Check the draft against the target's logits size (called by the decoder)."""
        target_vocab = _logits_rows(target)
        if target_vocab != self.draft_vocab:
            if self.tokenizer_size is None:
                raise ValueError(
                    f"the draft model has {self.draft_vocab} logits but the target has {target_vocab}: "
                    "a draft must share the target's vocabulary. If the sizes differ only by padding of the "
                    "LM head, pass tokenizers=(target_tokenizer, draft_tokenizer) so that this can be checked"
                )
            if target_vocab < self.tokenizer_size:
                raise ValueError(
                    f"the target's logits cover {target_vocab} ids but the tokenizer has {self.tokenizer_size} tokens"
                )
        self.target_vocab = target_vocab

    def _chain(self, length: int) -> TreeShape:
        if length not in self._shapes:
            self._shapes[length] = TreeShape.chain(length)
        return self._shapes[length]

    @property
    def device(self) -> torch.device:
        return next(self.draft.parameters()).device

    def start(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, params: SamplingParams, generator) -> None:
        # Lazy prefill: the prompt is fed together with the first root (one forward, not two),
        # and not at all if the first steps fall back to plain decoding.
        self._cache = DynamicCache()
        self._pending = [int(t) for t in input_ids.reshape(-1).tolist()]
        self._drafts = []
        self._in_flight = False
        self._params = params
        self._generator = generator
        self._draft_seconds = 0.0
        self._step_start = None  # when the previous propose() began
        self._step_draft = 0.0  # draft forward seconds of the previous step
        self._step_verify = None  # its verify seconds (from observe)
        self.adaptive.reset_counts()

    # -- drafting ----------------------------------------------------------------------------------
    def _forward(self, tokens: list[int]) -> torch.Tensor:
        """Feed ``tokens`` after the draft cache; the logits [V_target] after the last one."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        if self.draft_vocab < (self.target_vocab or 0):
            # Padding ids the draft has no embedding for (only the target can emit them).
            ids = torch.where(ids < self.draft_vocab, ids, torch.full_like(ids, self._substitute_id))
        out = self.draft(input_ids=ids[None], use_cache=True, **{self._cache_arg: self._cache}, **self._keep_last)
        logits = out.logits[0, -1]
        if self.target_vocab is not None and self.target_vocab != self.draft_vocab:
            if self.draft_vocab > self.target_vocab:
                logits = logits[: self.target_vocab]
            else:
                pad = logits.new_full((self.target_vocab - self.draft_vocab,), float("-inf"))
                logits = torch.cat([logits, pad])
        return logits

    def _pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        if self._params.greedy:
            return int(logits.argmax()), None
        q = self._params.probs(logits).cpu()
        return sample(q, self._generator), q

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        if self._in_flight:
            raise RuntimeError("propose() called twice without accepted(): the decode loop is out of step")
        if self._cache is None:
            raise RuntimeError("call start() before propose()")
        now = time.perf_counter()
        if self._step_start is not None and self._step_verify is not None:
            # Wall time of the previous step minus its forwards: the loop's per-step overhead.
            self.adaptive.record_overhead(now - self._step_start - self._step_draft - self._step_verify)
        self._step_start, self._step_draft, self._step_verify = now, 0.0, None
        limit = min(max_depth, self.gamma if self.gamma is not None else self.adaptive.max_gamma)
        gamma = self.adaptive.choose(limit) if self.gamma is None else max(limit, 0)
        if self.gamma is not None:
            self.adaptive.histogram[gamma] = self.adaptive.histogram.get(gamma, 0) + 1
        self._in_flight = True
        if gamma == 0:
            # Plain decoding step: the draft sees the root later, with the next drafted step.
            self._pending.append(int(root))
            self._drafts = []
            return Tree(self._chain(0), torch.tensor([root], dtype=torch.long))

        feed = self._pending + [int(root)]
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        start = time.perf_counter()
        for _ in range(gamma):
            t0 = time.perf_counter()
            token, q = self._pick(self._forward(feed))
            if len(feed) <= 2:  # a catch-up forward over many pending tokens is not a draft step
                self.adaptive.record_draft_time(time.perf_counter() - t0)
            drafts.append(token)
            if q is not None:
                rows.append(q)
            feed = [token]
        self._step_draft = time.perf_counter() - start
        self._draft_seconds += self._step_draft
        # The cache now holds the old prefix + pending + root + drafts[:-1].
        self._pending = []
        self._drafts = drafts
        tokens = torch.tensor([root, *drafts], dtype=torch.long)
        draft_probs = None
        if rows:
            draft_probs = torch.cat([torch.zeros_like(rows[0])[None], torch.stack(rows)])
        return Tree(self._chain(gamma), tokens, draft_probs)

    def accepted(self, tokens: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        if not self._in_flight:
            raise RuntimeError("accepted() does not follow propose(): the decode loop is out of step")
        self._in_flight = False
        accepted = [int(t) for t in tokens.reshape(-1).tolist()[1:]]
        k, gamma = len(accepted), len(self._drafts)
        if accepted != self._drafts[:k]:
            raise RuntimeError("accepted tokens are not a prefix of the drafted chain: the decode loop is out of step")
        if gamma == 0:
            return
        # The cache holds root + drafts[:gamma-1]; keep root + drafts[:min(k, gamma-1)].
        seen = min(k, gamma - 1)
        remove = (gamma - 1) - seen
        if remove:
            self._cache.crop(-remove)  # negative = number of entries to drop (all transformers versions)
        if k == gamma:
            self._pending = [self._drafts[-1]]  # accepted but never fed to the draft

    def observe(self, num_drafted: int, accepted_drafts: int, verify_seconds: float) -> None:
        self._step_verify = verify_seconds
        self.adaptive.record_step(num_drafted, accepted_drafts, verify_seconds)

    def stats(self) -> dict:
        stats = {"proposer": "draft_model", "gamma_mode": "auto" if self.gamma is None else self.gamma}
        stats.update(self.adaptive.stats())
        stats["draft_seconds"] = self._draft_seconds
        return stats

    # -- introspection (tests, debugging) ---------------------------------------------------------
    @property
    def cache_length(self) -> int:
        """Tokens in the draft's cache (the committed length minus ``len(pending)``)."""
        return 0 if self._cache is None else int(self._cache.get_seq_length())

    @property
    def pending(self) -> list[int]:
        return list(self._pending)
