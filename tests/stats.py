"""Statistics shared by the distribution tests: one chi-square test and one biased verifier.

Every sampling test compares an empirical law with an exact one by ``chi_square_pvalue`` and
shows that it has teeth with ``biased_accept_sampling``, a verifier with a classic mistake that
the same test must reject.
"""
from __future__ import annotations

from collections import Counter

import torch

from draftheads.inference.accepted import Acceptance


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square goodness of fit of ``counts`` to ``probs`` (same shape); cells with
    expectation below ``min_expected`` are pooled into one. An outcome of probability zero that
    occurs fails outright (p-value 0). The p-value is exact (regularised upper gamma)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if bool((counts[probs <= 0] > 0).any()):
        return 0.0
    expected = probs * counts.sum()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))


def law_pvalue(counts: Counter, law: dict) -> float:
    """``chi_square_pvalue`` for outcomes keyed by token tuples (a Counter against an exact law)."""
    keys = sorted(set(law) | set(counts))
    return chi_square_pvalue(
        torch.tensor([float(counts.get(k, 0)) for k in keys]), torch.tensor([float(law.get(k, 0.0)) for k in keys])
    )


def biased_accept_sampling(bug: str):
    """A tree verifier with a classic mistake, for deterministic (point-mass) and sampled drafts:

    - ``"resample_from_p"``: a rejected draft is not removed from the distribution (the next
      sibling and the final token are drawn from p instead of the residual);
    - ``"q_over_p"``: the acceptance ratio is inverted (q(x)/p(x) instead of p(x)/q(x)).
    """
    if bug not in ("resample_from_p", "q_over_p"):
        raise ValueError(f"unknown bug {bug!r}")

    def accept(tree, logits, params, generator):
        tokens, node, path = tree.tokens.tolist(), 0, [0]
        while True:
            residual = params.probs(logits[node]).cpu().double()
            for child in tree.shape.children[node]:
                x = tokens[child]
                if tree.draft_probs is None:
                    q = torch.zeros_like(residual)
                    q[x] = 1.0
                else:
                    q = tree.draft_probs[child].cpu().double()
                r = residual / residual.sum()
                ratio = q[x] / r[x].clamp(min=1e-30) if bug == "q_over_p" else r[x] / q[x]
                if float(torch.rand((), generator=generator)) < min(1.0, float(ratio)):
                    node = child
                    path.append(child)
                    break
                if bug != "resample_from_p":
                    residual = torch.clamp(r - q, min=0.0)
            else:
                token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
                return Acceptance(torch.tensor(path), token)

    return accept
