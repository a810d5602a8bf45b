"""Block verification of a drafted CHAIN (Sun et al., "Block verification accelerates speculative
decoding", ICLR 2025): lossless, and never fewer accepted tokens in expectation than judging the
drafts one at a time.

Token-by-token verification stops at the first draft x_i with u_i > p_i(x_i) / q_i(x_i). Block
verification judges the chain as a whole: a draft that the target finds too likely (p > q) leaves
credit that later drafts may use. With drafts x_1..x_g drawn from q_1..q_g and the target's
processed laws p_0..p_g at the chain's nodes (p_{i-1} is the target's law for x_i):

    P_0 = 1,  P_i = min(1, P_{i-1} * p_{i-1}(x_i) / q_i(x_i))       (the prefix's joint credit)
    R_i = sum_x max(P_i * p_i(x) - q_{i+1}(x), 0)                    (what a stop after x_i leaves)
    h_i = R_i / (R_i + 1 - P_i)   for i < g,      h_g = P_g

Draw u_1..u_g ~ U(0, 1) independently; the chain is accepted up to tau = the LARGEST i with
u_i < h_i (0 if none). The next token is drawn from p_g (the bonus) when tau = g, else from the
residual norm(max(P_tau * p_tau - q_{tau+1}, 0)).

For deterministic drafts (point masses, q_i = 1 at x_i) the rule accepts exactly as many tokens,
in law, as the token-by-token rule: both accept x_1..x_k with the target's own probability
prod p_{i-1}(x_i), the most any lossless rule can. It helps only drafts SAMPLED from a q.

Only scalars (the g thresholds and credits, in one transfer) come to the host; the vocabulary
rows stay where the logits are.
"""
from __future__ import annotations

import torch

from .sampling import SamplingParams, sample
from .tree import Tree, TreeShape


def is_chain(shape: TreeShape) -> bool:
    """Every node has at most one child (node i's parent is i - 1): what block verification judges."""
    return all(p == i - 1 for i, p in enumerate(shape.parents[1:], start=1))


def draft_laws(tree: Tree, vocab: int, device: torch.device) -> torch.Tensor:
    """[g, V]: row i-1 is the law draft x_i was drawn from (a one-hot row for a point mass)."""
    if tree.draft_probs is not None:
        return tree.draft_probs[1:].to(device, torch.float32, non_blocking=True)
    drafts = tree.tokens[1:].to(device, non_blocking=True)
    return torch.nn.functional.one_hot(drafts, vocab).float()


def prefix_credits(probs: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """[g + 1]: P_0 = 1 and P_i = min(1, P_{i-1} p_{i-1}(x_i) / q_i(x_i)) (``probs`` [g + 1, V])."""
    g = q.shape[0]
    rows = torch.arange(g, device=probs.device)
    ratio = probs[rows, drafts] / q[rows, drafts].clamp(min=1e-30)
    credits = [torch.ones((), device=probs.device)]
    for i in range(g):  # a clamped running product: g tiny device ops, no host read
        credits.append(torch.clamp(credits[-1] * ratio[i], max=1.0))
    return torch.stack(credits)


def residual(credit: torch.Tensor | float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The law the next token comes from when the block stops where its credit is ``credit``:
    max(credit * p - q, 0), unnormalised (``sample`` normalises)."""
    return torch.clamp(credit * p - q, min=0.0)


def thresholds(probs: torch.Tensor, q: torch.Tensor, credits: torch.Tensor) -> torch.Tensor:
    """[g]: h_1..h_g, each the probability that the block may end after x_i given the draws after it."""
    g = q.shape[0]
    mass = residual(credits[1:g, None], probs[1:g], q[1:g]).sum(-1)  # R_1..R_{g-1}
    denom = mass + 1.0 - credits[1:g]
    inner = torch.where(denom > 0, mass / denom.clamp(min=1e-30), torch.ones_like(mass))
    return torch.cat([inner, credits[g:]])


def block_verification(
    tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """The accepted chain's node indices (root first) and the target's next token, for a chain
    ``tree`` and its verify logits [g + 1, V]. Lossless for drafts sampled from ``tree.draft_probs``
    and for point masses alike."""
    if not is_chain(tree.shape):
        raise ValueError("block verification judges a chain of drafts; this tree branches (use recursive rejection)")
    g = tree.shape.size - 1
    probs = params.probs(logits[: g + 1])  # [g + 1, V]
    if g == 0:
        return [0], sample(probs[0], generator)
    device = probs.device
    q = draft_laws(tree, probs.shape[-1], device)
    drafts = tree.tokens[1:].to(device, non_blocking=True)
    credits = prefix_credits(probs, q, drafts)
    h = thresholds(probs, q, credits)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(g, generator=generator, device=gen_device).tolist()
    h_host = h.tolist()  # the one read of the step's scalars
    tau = max((i + 1 for i in range(g) if u[i] < h_host[i]), default=0)
    if tau == g:
        return list(range(g + 1)), sample(probs[g], generator)
    rest = residual(credits[tau], probs[tau], q[tau])
    if float(rest.sum()) <= 0.0:
        # Only reachable through float rounding: an empty residual has probability-zero stops.
        rest = probs[tau]
    return list(range(tau + 1)), sample(rest, generator)
