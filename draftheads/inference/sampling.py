"""The target's processed next-token distribution, computed the way transformers' sampling does.

Lossless sampling means "exactly the distribution `generate(do_sample=True, ...)` draws from", so
we reuse transformers' own warpers (temperature, then top-k, then top-p, on fp32 logits) rather
than re-deriving their tie and threshold rules.
"""
from __future__ import annotations

import functools
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


class SamplingError(ValueError):
    """A sampling setting that `generate` would refuse too (negative or NaN temperature, ...)."""


def _checked_number(value: Any, name: str, *, integer: bool = False) -> Any:
    """``value`` if it is a finite real number (a whole one with ``integer``), else SamplingError.
    A NaN temperature compares False with everything, so unchecked it would decode greedily."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        want = "a whole number" if integer else "a finite number"
        raise SamplingError(f"{name} must be {want}, got {value!r}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """The target's processed distribution (temperature, top-k, top-p), and how drafts are drawn.

    ``sample_drafts`` (read only when sampling): proposers with a distribution of their own
    (every head type) DRAW each draft token from it, processed with these same settings, as a
    chain, and hand the law to the verifier (`Tree.draft_probs`), instead of drafting their
    top-k candidates as point masses. Both are exact; drawn drafts are accepted with
    probability 1 - TV(target, draft) rather than the target's probability of the draft's best
    guess, which is far more at high temperatures ("Acceptance rules" in `git show 19f3628:benchmarks/README.md`)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    sample_drafts: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def draws_drafts(self) -> bool:
        """Whether proposers that can should draw their drafts (`sample_drafts` while sampling)."""
        return self.sample_drafts and not self.greedy

    def warpers(self) -> LogitsProcessorList:
        """The same processors, in the same order, that `generate(do_sample=True)` builds."""
        procs = LogitsProcessorList()
        if self.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k:
            procs.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        return procs

    @functools.cached_property
    def _warper_calls(self) -> tuple:
        """`warpers` built once per settings, each called directly: `LogitsProcessorList.__call__`
        inspects every processor's signature on every call (a third of `probs`' time on the
        earlier 5M toy target, which decoding calls several times per step)."""
        return tuple(self.warpers())

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed probabilities for logits [..., V] (fp32)."""
        scores = logits.float()
        shape = scores.shape
        scores = scores.reshape(-1, shape[-1])
        for warper in self._warper_calls:
            scores = warper(None, scores)
        return torch.softmax(scores, dim=-1).reshape(shape)


#: transformers' global defaults for what a model's generation config leaves unset
#: (`GenerationConfig._get_default_generation_params`): greedy unless asked, and when sampling
#: temperature 1, top-k 50, top-p 1.
GENERATE_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}

#: Generation-config settings that make `generate` apply a logits processor we do not apply, with
#: their neutral values (None always neutral): decoding ignores them and says so.
_UNAPPLIED = {
    "repetition_penalty": (1.0,),
    "encoder_repetition_penalty": (1.0,),
    "no_repeat_ngram_size": (0,),
    "min_length": (0,),
    "min_new_tokens": (0,),
    "min_p": (),
    "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,),
    "eta_cutoff": (0.0,),
    "top_h": (),
    "bad_words_ids": (),
    "suppress_tokens": (),
    "begin_suppress_tokens": (),
    "sequence_bias": (),
    "exponential_decay_length_penalty": (),
}


def _setting(generation_config: Any, name: str) -> Any:
    value = getattr(generation_config, name, None)
    return GENERATE_DEFAULTS[name] if value is None else value


def resolve_sampling(
    generation_config: Any,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
) -> SamplingParams:
    """The sampling settings `target.generate(...)` would use for the same arguments: each one left
    ``None`` comes from the target's generation config, then from transformers' defaults.

    Greedy or sampling: an explicit ``temperature`` decides it (0 = greedy, > 0 = sampling, as
    this API always meant); otherwise ``do_sample``, otherwise the generation config's
    ``do_sample`` (unset = greedy, as in `generate`). A sampling temperature of 0 from the config
    is greedy too. When greedy, top-k/top-p do not matter and are ignored, as `generate` does.
    Values `generate` would refuse (a negative, NaN or non-numeric temperature, a negative top-k,
    a top-p outside (0, 1]) raise ``SamplingError`` whether or not they would be used."""
    if temperature is not None and _checked_number(temperature, "temperature") < 0:
        raise SamplingError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and _checked_number(top_k, "top_k", integer=True) < 0:
        raise SamplingError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if top_p is not None and not 0.0 < _checked_number(top_p, "top_p") <= 1.0:
        raise SamplingError(f"top_p must be in (0, 1], got {top_p}")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise SamplingError(f"do_sample must be True or False, got {do_sample!r}")
    if do_sample is not None and temperature is not None and do_sample != (temperature > 0):
        raise ValueError(
            f"do_sample={do_sample} contradicts temperature={temperature} (temperature 0 means greedy, > 0 "
            "means sampling): give one of them"
        )
    if temperature is not None:
        sampling = temperature > 0
    elif do_sample is not None:
        sampling = bool(do_sample)
    else:
        sampling = bool(_setting(generation_config, "do_sample"))
    if not sampling:
        return SamplingParams(0.0)
    return SamplingParams(
        temperature=float(_setting(generation_config, "temperature") if temperature is None else temperature),
        top_k=int(_setting(generation_config, "top_k") if top_k is None else top_k),
        top_p=float(_setting(generation_config, "top_p") if top_p is None else top_p),
    )


def resolve_generator(generator: torch.Generator | None, seed: int | None) -> torch.Generator | None:
    """The generator sampling draws from: ``generator``, or a fresh one seeded with ``seed``.
    Both at once is refused: one of them would be ignored, and a caller who passed the seed
    would think the run reproducible from it."""
    if generator is not None and seed is not None:
        raise SamplingError("give seed= or generator=, not both (the generator would ignore the seed)")
    if seed is not None:
        return torch.Generator().manual_seed(_checked_number(seed, "seed", integer=True))
    return generator


def warn_unapplied_settings(generation_config: Any) -> None:
    """Warn about generation-config settings whose logits processors `generate` would apply and we
    do not: with them, "the same tokens/distribution as `generate`" holds only without them."""
    found = {}
    for name, neutral in _UNAPPLIED.items():
        value = getattr(generation_config, name, None)
        if value is not None and value not in neutral and value != []:
            found[name] = value
    if found:
        settings = ", ".join(f"{k}={v!r}" for k, v in found.items())
        warnings.warn(
            f"the target's generation config sets {settings}: SpeculativeDecoder applies only temperature, "
            "top-k and top-p, so its output follows the target's distribution WITHOUT these settings "
            "(target.generate would apply them)",
            stacklevel=3,
        )


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a probability vector [V] (need not be normalised), by inverse CDF: one
    uniform, a float64 cumulative sum, the first token whose CDF exceeds it (a token without mass
    has no CDF step, so it is never drawn).

    On the host this is about 10x cheaper than `torch.multinomial` (one exponential per vocabulary
    entry: on a small target a tenth of a plain step); float rounding past the last step falls back
    to the last token with mass, read on the host. On an accelerator with its own generator:
    `torch.multinomial`; with a host generator (seeded runs): `sample_rows`, so the vocabulary row
    never leaves the device (only the token index does)."""
    on_host = probs.device.type == "cpu"
    if on_host and (generator is None or generator.device.type == "cpu"):
        u = torch.rand((), generator=generator, dtype=torch.float64)
        cdf = probs.cumsum(-1, dtype=torch.float64)
        index = int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True))
        return index if index < probs.shape[-1] else int(probs.nonzero()[-1])
    if not on_host and (generator is None or generator.device == probs.device):
        return int(torch.multinomial(probs, 1, generator=generator))
    return sample_inverse_cdf(probs, generator)


def sample_inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from [V] ``probs`` wherever they live (`sample_rows` for one row)."""
    return int(sample_rows(probs[None], generator)[0])


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` [R, V] (rows need not be normalised), as a tensor [R] where
    the rows are: one uniform per row from ``generator`` (a host generator serves device rows too)
    and the first index whose CDF exceeds it, so nothing is read back from the device. A
    zero-probability token is never drawn (its CDF equals its predecessor's)."""
    where = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=where)
    cdf = probs.double().cumsum(-1)
    index = torch.searchsorted(cdf, u.to(probs.device, non_blocking=True) * cdf[:, -1:], right=True)[:, 0]
    # Float rounding past the end: the last token with mass (no `nonzero`, itself a device sync).
    ids = torch.arange(probs.shape[-1], device=probs.device)
    return torch.minimum(index, torch.where(probs > 0, ids, -1).amax(-1))
