"""Calibrated trees: the tree that maximises expected accepted tokens per SECOND on this device.

Two measurements feed it:
- an acceptance table ``acc[k, r]``: how often head k's rank-r candidate equals the token the
  target actually produces k+2 positions ahead, on sample text (Medusa's heads_accuracy);
- the verify-forward time for n tree tokens on this device (it grows quickly with n on a CPU and
  barely on a GPU, which is why the tree is measured where it decodes).
Under sampling at temperature T (exact acceptance, drafts are the heads' top-ranked tokens, so
each a point mass), a drafted token x is accepted with probability p_T(x), the target's tempered
probability of it, and siblings after a rejection with their share of what is left: so the table
at T holds the mean p_T of each candidate instead of its hit rate (the same thing at T = 0).
Trees are grown greedily, adding the node with the highest path probability (the product of
``acc`` along its path, assuming independence as Medusa's tree search does); the expected
tokens per step of a tree is 1 + the sum of its nodes' path probabilities (at most one child of
an accepted node can match the target, so accepted nodes form one path). The chosen size is the
one with the best expected tokens / (verify time + drafting time).

The verify cost is this machine's own curve, as measured (`measure_verify_times`): it is NOT
forced to rise with the width. CPU GEMM kernels switch at small row counts, so on one 2-core AMD
EPYC 8 tokens verify cheaper than 3 (1 / 1.67 / 2.03 / 1.52 / 1.42x one token for 1 / 2 / 3 / 4 /
8), while a Xeon's cost rises with every token (1.11 / 1.19 / 1.46 / 1.66 for 2 / 3 / 4 / 8): a
grid sized on one machine's curve misses the other's. So the widths EAGLE's dynamic trees are
timed at come from the curve too (`cheap_widths`: the widths no wider tree undercuts), and the
curve is kept in tree.json (`plans.CostCurve`) and printed by `draftheads calibrate`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from ..device import device_name
from ..heads.acceptance import expected_tokens_per_step, grow_tree  # noqa: F401 (re-exported)
from ..plans import CHOSEN_BY_CALIBRATION, CostCurve
from ..heads.base import token_context
from ..inference.decoder import SpeculativeDecoder
from ..registry import TreeKind, method_of
from ..inference.one_forward_tree import (
    one_forward_accuracy,
    one_forward_draft_seconds,
    one_forward_vocab_sizes,
)
from ..inference.recurrent import keep_prefix
from ..inference.sampling import SamplingParams
from ..inference.tree import Tree, TreeShape
from ..inference.verify import TreeVerifier


@torch.no_grad()
def head_accuracy_table(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    sequences: list[torch.Tensor],
    max_rank: int = 10,
    skip_prompt: list[int] | None = None,
    vocab_ids: torch.Tensor | None = None,
    temperature: float = 0.0,
) -> torch.Tensor:
    """acc[k, r] = P(head k's rank-r token == the token at t+2+k) over positions of ``sequences``
    (the target's own greedy continuations, so "correct" means "what verification accepts").
    With ``vocab_ids``, heads rank only those tokens (a restricted draft vocabulary). At
    ``temperature`` > 0: the mean probability the target, sampling at that temperature, gives
    the candidate there (the chance exact sampling accepts it; see the module docstring)."""
    num_heads = heads.config.num_heads
    hits = torch.zeros(num_heads, max_rank)
    totals = torch.zeros(num_heads)
    device = target.device
    for i, seq in enumerate(sequences):
        seq = seq.to(device)
        start = skip_prompt[i] - 1 if skip_prompt else 0
        out = target(seq[None], output_hidden_states=True)
        hidden = out.hidden_states[-1][0]
        if heads.reads_tokens:  # Hydra heads are told the (correct) tokens before theirs
            states = heads.head_states(hidden, token_context(seq[None], num_heads)[0])
        else:
            states = heads.head_states(hidden)
        for k, state in enumerate(states):
            shift = k + 2
            if seq.numel() - shift <= start:
                continue
            logits = heads.project(state[start:-shift], k)
            if vocab_ids is not None:
                top = vocab_ids.to(logits.device)[logits[:, vocab_ids].topk(max_rank, dim=-1).indices]
            else:
                top = logits.topk(max_rank, dim=-1).indices  # [positions, R]
            truth = seq[start + shift :]
            if temperature > 0:  # the target's tempered law for each truth position, from the position before
                probs = torch.softmax(out.logits[0, start + shift - 1 : -1].float() / temperature, dim=-1)
                hits[k] += probs.gather(1, top).sum(0).cpu()
            else:
                hits[k] += (top == truth[:, None]).float().sum(0).cpu()
            totals[k] += truth.numel()
    return hits / totals.clamp(min=1)[:, None]


@torch.no_grad()
def measure_verify_times(
    target: torch.nn.Module,
    sizes: list[int],
    context: int = 256,
    repeats: int = 15,
) -> dict[int, float]:
    """Median seconds of one tree forward with n nodes over a ``context``-token cache, as measured
    (sizes interleaved round by round; a wider tree may cost less: the module docstring)."""
    verifier = TreeVerifier(target)
    vocab = target.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(target.device)
    cache = verifier.new_cache()  # a hybrid target's state layers too
    target(input_ids=prompt, use_cache=True, **{verifier.cache_arg: cache})
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    # A bushy tree of each size (the shape hardly matters for the cost; the size does).
    trees = {
        n: Tree(TreeShape(tuple([-1] + [max(0, (i - 1) // 3) for i in range(1, n)])),
                torch.randint(0, vocab, (n,), generator=gen))
        for n in sizes
    }

    def timed(n: int) -> float:
        sync()
        t0 = time.perf_counter()
        verifier.forward(cache, trees[n], context)
        sync()
        seconds = time.perf_counter() - t0
        keep_prefix(cache, context)  # drop the tree again
        return seconds

    for n in sizes:  # warm-up: allocator, thread pool, kernels
        timed(n)
    # Sizes interleaved round by round, so drifts in clock speed or load hit every size alike.
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            samples[n].append(timed(n))
    return {n: statistics.median(samples[n]) for n in sorted(sizes)}


def measure_cost_curve(target: torch.nn.Module, sizes: list[int], context: int = 256, repeats: int = 15,
                       chosen_by: str = CHOSEN_BY_CALIBRATION) -> CostCurve:
    """This machine's verify cost by width (`measure_verify_times`), named by its device and
    machine, as tree.json keeps it."""
    seconds = measure_verify_times(target, sizes, context=context, repeats=repeats)
    device = target.device
    return CostCurve(device_type=device.type, verify_seconds=seconds, device_name=device_name(device), context=context,
                     threads=torch.get_num_threads() if device.type == "cpu" else None, chosen_by=chosen_by)


def cheap_widths(verify_seconds: dict[int, float], tolerance: float = 0.02) -> list[int]:
    """The widths worth drafting to on this machine: each width above 1 that no wider measured
    width verifies cheaper than (within ``tolerance``, so noise does not drop a width that ties).
    On a curve that rises with every token that is every width; on the EPYC's (8 tokens cheaper
    than 3) the widths 2-4 drop out and 8 stays."""
    widths = sorted(verify_seconds)
    return [n for i, n in enumerate(widths) if n > 1
            and all(verify_seconds[m] > verify_seconds[n] * (1 - tolerance) for m in widths[i + 1:])]


def describe_curve(curve: CostCurve) -> str:
    """One line: "verify cost on cpu (AMD EPYC, 2 threads, 256-token cache): 1: 57.0 ms, 2: 1.67x, ..."."""
    where = ", ".join(x for x in (curve.device_name, f"{curve.threads} threads" if curve.threads else None,
                                  f"{curve.context}-token cache" if curve.context else None) if x)
    relative = curve.relative()
    parts = [f"{n}: {s * 1000:.1f} ms" if n == 1 else f"{n}: {relative[n]:.2f}x"
             for n, s in sorted(curve.verify_seconds.items())]
    return f"verify cost on {curve.device_type} ({where}) by tree width: " + ", ".join(parts)


def interpolate(times: dict[int, float], n: int) -> float:
    sizes = sorted(times)
    if n <= sizes[0]:
        return times[sizes[0]]
    for lo, hi in zip(sizes, sizes[1:]):
        if lo <= n <= hi:
            return times[lo] + (times[hi] - times[lo]) * (n - lo) / (hi - lo)
    # Beyond the last measurement: extrapolate linearly from the last two points.
    lo, hi = sizes[-2], sizes[-1]
    return times[hi] + (times[hi] - times[lo]) * (n - hi) / (hi - lo)


@dataclass
class CalibratedTree:
    tree: list[list[int]]
    expected_tokens_per_step: float
    expected_speedup: float  # over one-token decoding steps, from the measurements below
    accuracy: list[list[float]]
    verify_seconds: dict[int, float]
    draft_seconds: dict[int, float]  # by tree depth (number of heads used)
    device: str
    draft_vocab_size: int | None = None  # None: heads rank the whole vocabulary
    candidates: list[dict] = field(default_factory=list)
    temperature: float = 0.0

    def to_json(self) -> dict:
        data = asdict(self)
        data["verify_seconds"] = {str(k): v for k, v in self.verify_seconds.items()}
        data["draft_seconds"] = {str(k): v for k, v in self.draft_seconds.items()}
        return data


def choose_tree(
    acc: torch.Tensor,
    verify_seconds: dict[int, float],
    draft_seconds: dict[int, float],
    max_nodes: int = 64,
    device: str = "",
) -> CalibratedTree:
    """The size (and greedy tree of that size) with the best expected tokens per second.

    A root-only tree (plain decoding) is a candidate too: if no tree pays for its drafting and
    verification on this device, calibration says so instead of picking a slower tree."""
    grown = grow_tree(acc, max_nodes)
    plain = interpolate(verify_seconds, 1)
    best = (1.0 / plain, 0, 1.0)
    candidates = [{"nodes": 1, "expected_tokens": 1.0, "seconds": plain}]
    expected, depth = 1.0, 0
    for n_drafts, (path, value) in enumerate(grown, start=1):
        expected += value
        depth = max(depth, len(path))
        seconds = interpolate(verify_seconds, n_drafts + 1) + draft_seconds[depth]
        rate = expected / seconds
        candidates.append({"nodes": n_drafts + 1, "expected_tokens": expected, "seconds": seconds})
        if rate > best[0]:
            best = (rate, n_drafts, expected)
    rate, n_drafts, expected = best
    tree = [list(path) for path, _ in grown[:n_drafts]]
    return CalibratedTree(
        tree=tree,
        expected_tokens_per_step=expected,
        expected_speedup=rate * plain,
        accuracy=acc.tolist(),
        verify_seconds=verify_seconds,
        draft_seconds=draft_seconds,
        device=device,
        candidates=candidates,
    )


@torch.no_grad()
def measure_draft_seconds(
    heads: torch.nn.Module, repeats: int = 20, draft_vocab_size: int | None = None
) -> dict[int, float]:
    """Median seconds for the heads to draft from one hidden state, by the number of heads used
    (a tree d deep uses the first d heads; each costs a vocab-sized projection, which on a small
    target with a large vocabulary is as much as the target's own LM head)."""
    times = {0: 0.0}
    for depth in range(1, heads.config.num_heads + 1):
        drafter = heads.proposer(tree=[[0] * d for d in range(1, depth + 1)], draft_vocab_size=draft_vocab_size)
        param = next(heads.parameters())
        hidden = torch.randn(1, heads.config.hidden_size, device=param.device, dtype=param.dtype)
        # One row, through the drafter interface the decode loop drafts through.
        drafter.start([torch.zeros(1, dtype=torch.long)], [hidden], SamplingParams(), None)  # drafts from this state
        samples = []
        for rep in range(repeats + 1):
            t0 = time.perf_counter()
            drafter.propose([0], [depth])
            if param.device.type == "cuda":
                torch.cuda.synchronize()
            if rep:
                samples.append(time.perf_counter() - t0)
        times[depth] = statistics.median(samples)
    return times


def calibrate(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    prompts: list[torch.Tensor],
    new_tokens: int = 64,
    max_rank: int = 8,
    max_nodes: int = 64,
    sizes: list[int] | None = None,
    temperature: float = 0.0,
    verify: dict[int, float] | None = None,
) -> CalibratedTree:
    """Measure acceptance on ``prompts`` (continuations by the target itself: greedy, or sampled
    at ``temperature``) and verify times on this device (``verify``: already measured ones), and
    return the tree with the best expected tokens per second at that temperature."""
    decoder = SpeculativeDecoder(target, heads, batch_plan=None)  # the continuation is the target's, only faster
    sequences = [decoder.generate(p, max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[],
                                  seed=i).sequences[0] for i, p in enumerate(prompts)]
    skip = [p.shape[-1] for p in prompts]
    sizes = sizes or [n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n <= max_nodes + 1]
    context = min(256, max(int(s.numel()) for s in sequences))
    verify = verify or measure_verify_times(target, sizes, context=context)
    device = str(target.device) + (f" ({torch.cuda.get_device_name()})" if target.device.type == "cuda" else "")
    # Draft vocabularies to try: the whole one, and the most frequent training tokens (cheaper
    # projections, fewer tokens that can be drafted). The measurements decide.
    if method_of(heads).tree is TreeKind.ONE_FORWARD:  # one draft forward drafts any tree
        if temperature > 0:
            raise ValueError(f"{heads.head_type} heads: trees are measured for greedy decoding only (their table "
                             f"holds greedy hit rates, not the chance of acceptance at temperature {temperature:g})")
        candidates = (  # DFlash: draft vocabularies as Medusa's below; greedy hit rates
            (size, one_forward_accuracy(target, heads, sequences, max_rank, skip_prompt=skip, draft_vocab_size=size),
             one_forward_draft_seconds(heads, draft_vocab_size=size))
            for size in one_forward_vocab_sizes(heads, (4096, 2048, 1024, 512)))
        return _best_tree(candidates, verify, max_nodes, device, temperature)
    vocab_sizes: list[int | None] = [None]
    if int(getattr(heads, "token_counts", torch.zeros(1)).sum()) > 0:
        vocab_sizes += [n for n in (4096, 2048, 1024, 512) if n < heads.config.vocab_size // 2]
    candidates = (
        (size, head_accuracy_table(target, heads, sequences, max_rank, skip_prompt=skip,
                                   vocab_ids=heads.draft_vocab(size), temperature=temperature),
         measure_draft_seconds(heads, draft_vocab_size=size))
        for size in vocab_sizes)
    return _best_tree(candidates, verify, max_nodes, device, temperature)


def _best_tree(candidates, verify: dict[int, float], max_nodes: int, device: str,
               temperature: float) -> CalibratedTree:
    """The tree with the best expected speedup over ``candidates``: (draft vocabulary size, its
    accuracy table, its draft seconds) each."""
    best = None
    for vocab_size, acc, draft in candidates:
        result = choose_tree(acc, verify, draft, max_nodes=max_nodes, device=device)
        result.draft_vocab_size = vocab_size
        result.temperature = temperature
        if best is None or result.expected_speedup > best.expected_speedup:
            best = result
    return best


# -- dynamic (EAGLE-2) trees: measured end to end -----------------------------------------------------
def chain(depth: int) -> dict:
    """EAGLE-2 settings that draft a chain of ``depth`` tokens (top-1 at every step: one path)."""
    return {"total_tokens": depth + 1, "depth": depth, "top_k": 1}


CHAINS = [chain(d) for d in (5, 7)]
SHORT_CHAINS = [chain(d) for d in (1, 2)]  # CPU only: verify cost climbs fast
# EAGLE (scored by the target's LM head, not a small one of its own as EAGLE-3's) also tries
# ranking only the most frequent training tokens.
DRAFT_VOCAB_SIZE = 1024


#: A dynamic tree of this many tokens or more is also timed as a top-3 tree, not only as a chain.
MIN_TREE_TOKENS = 6
#: The CPU grid times at most this many widths, each verifying at most MAX_WIDTH_COST one-token steps
#: (a wider verify would need more accepted tokens than the heads here commit): a grid of every cheap
#: width timed for minutes on a noisy curve.
MAX_GRID_WIDTHS = 4
MAX_WIDTH_COST = 2.5
#: The widest chain timed on a CPU (each of its drafts is one draft-layer forward).
MAX_CHAIN_DEPTH = 7


def dynamic_grid(device_type: str, restrict_vocab: bool, verify_seconds: dict[int, float] | None = None) -> list[dict]:
    """A few EAGLE-2 settings sized for the device (small trees on CPU, large on CUDA): what
    training's tree choice and `draftheads calibrate` both time. With this machine's
    ``verify_seconds`` (a CPU's cost curve), the widths come from the curve (`cheap_widths`): a
    chain and, from ``MIN_TREE_TOKENS`` on, top-3 trees of each width that no wider one undercuts."""
    if device_type == "cuda":
        base = [{"total_tokens": t, "depth": d, "top_k": 8} for t in (32, 64) for d in (5, 7)]
    elif verify_seconds:
        base = []
        one = verify_seconds.get(1) or min(verify_seconds.values())
        widths = [w for w in cheap_widths(verify_seconds) if w <= 16 and verify_seconds[w] <= MAX_WIDTH_COST * one]
        for width in widths[:MAX_GRID_WIDTHS]:
            if width - 1 <= MAX_CHAIN_DEPTH:
                base.append(chain(width - 1))
            if width >= MIN_TREE_TOKENS:
                base += [{"total_tokens": width, "depth": d, "top_k": 3} for d in (3, 5) if d < width]
        base = base or list(SHORT_CHAINS)
    else:
        # Chains too: on a CPU every verified token costs, and a confident draft's chain goes
        # deeper for fewer tokens than a tree. Short chains for heads that are seldom right twice
        # in a row: on SmolLM2 a chain of 1 is the one setting that beats plain decoding
        # (docs/results.md).
        base = ([{"total_tokens": t, "depth": d, "top_k": 3} for t in (8, 16) for d in (3, 5)]
                + SHORT_CHAINS + CHAINS)
    vocabs = (None, DRAFT_VOCAB_SIZE) if restrict_vocab else (None,)
    return [{**g, "draft_vocab_size": v} for g in base for v in vocabs]


def restricts_vocab(heads: torch.nn.Module) -> bool:
    """Whether ranking only the most frequent training tokens is worth timing for ``heads``: they
    rank the target's whole vocabulary and counted their training tokens."""
    return (heads.vocab_ids() is None and int(heads.token_counts.sum()) > 0
            and DRAFT_VOCAB_SIZE < heads.config.vocab_size // 2)


def sampling_grid(grid: list[dict], greedy_choice: dict) -> list[dict]:
    """At a sampling temperature, after the greedy choice: drawn drafts are chains as deep as the
    tree (EAGLE's: trees shaped by sibling acceptance, `drawn_trees`, within the same settings), so
    only the greedy choice, the shallowest setting and the chain of 5 are timed (each with the
    greedy choice's vocabulary); plain decoding is always timed beside them."""
    vocab = {"draft_vocab_size": greedy_choice.get("draft_vocab_size")}
    shallowest = {**min(grid, key=lambda g: (g["depth"], g["total_tokens"])), **vocab}
    candidates = [dict(greedy_choice), shallowest, {**CHAINS[0], **vocab}]
    candidates = [g for g in candidates if g.get("total_tokens", 1) > 1]
    return [g for i, g in enumerate(candidates) if g not in candidates[:i]]


@torch.no_grad()
def calibrate_confidence(target: torch.nn.Module, heads: torch.nn.Module, prompts: list[torch.Tensor],
                         new_tokens: int = 64):
    """EAGLE heads' confidence table (`heads.confidence`) measured on the target's greedy
    continuations of ``prompts``: what their trees rank nodes by once it is set. Measured with the
    heads' whole draft vocabulary, the table also serves a restricted one (whose probabilities
    run slightly higher, so it errs toward trusting them)."""
    measure = method_of(heads).confidence
    if measure is None:
        raise ValueError(f"{heads.head_type} heads rank no tree by a confidence table")
    decoder = SpeculativeDecoder(target, heads, batch_plan=None)  # the continuation is the target's, only faster
    sequences = [decoder.generate(p, max_new_tokens=new_tokens, eos_token_id=[], temperature=0.0).sequences[0]
                 for p in prompts]
    return measure(target, heads, sequences, [p.shape[-1] for p in prompts])


@dataclass
class CalibratedDynamicTree:
    tree: dict  # total_tokens, depth, top_k
    tokens_per_second: float
    plain_tokens_per_second: float
    mean_accept_length: float
    device: str
    candidates: list[dict] = field(default_factory=list)
    temperature: float = 0.0

    @property
    def expected_speedup(self) -> float:
        return self.tokens_per_second / self.plain_tokens_per_second

    def to_json(self) -> dict:
        return asdict(self)


@torch.no_grad()
def calibrate_dynamic_tree(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    prompts: list[torch.Tensor],
    new_tokens: int = 64,
    grid: list[dict] | None = None,
    rounds: int = 2,
    temperature: float = 0.0,
) -> CalibratedDynamicTree:
    """The EAGLE tree settings (token budget, depth, top-k) that decode fastest on ``prompts``.

    A dynamic tree's acceptance depends on the draft's confidence at every step, which no
    per-rank table captures, so each setting is simply timed: greedy decoding of every prompt,
    settings interleaved over ``rounds`` rounds so that machine drift hits them all alike, the
    best total tokens / decode seconds wins. Plain decoding (a root-only tree) is measured the
    same way, so the reported speedup is against our own one-token steps. At ``temperature`` > 0
    every setting samples, with the same seed per prompt and round."""
    if grid is None:
        grid = dynamic_grid(target.device.type, restricts_vocab(heads))
    # First: plain decoding through the same loop (total_tokens=1 drafts nothing at all).
    settings = [{"total_tokens": 1, "depth": 1, "top_k": 1}] + list(grid)
    # batch_plan=None: a plan saved by an earlier calibration must not turn these timings into plain
    # decoding; draft_budget=None: each setting is timed in full (the online budget, learning from a
    # fresh start on a few short decodes, sent whole candidates plain: an EAGLE 3-deep drawn chain
    # measured 1.04 accepted tokens per step at T = 0.7, 2.39 at T = 1.0).
    decoders = [SpeculativeDecoder(target, heads, tree=s, check_model=(i == 0), batch_plan=None, draft_budget=None)
                for i, s in enumerate(settings)]
    for p in prompts[:1]:  # warm-up
        for d in decoders:
            d.generate(p, max_new_tokens=8, temperature=temperature, eos_token_id=[], seed=0)
    seconds = [0.0] * len(settings)
    tokens = [0] * len(settings)
    steps = [0] * len(settings)
    for r in range(rounds):
        for j, p in enumerate(prompts):
            for i, d in enumerate(decoders):
                out = d.generate(p, max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[],
                                 seed=r * len(prompts) + j)
                seconds[i] += out.decode_seconds
                tokens[i] += out.num_new_tokens - 1  # the first token comes from the prefill
                steps[i] += len(out.accept_lengths)
    rates = [t / s for t, s in zip(tokens, seconds)]
    # Plain decoding is a candidate too: if no tree pays for its drafting here, say so.
    best = max(range(len(settings)), key=lambda i: rates[i])
    device = str(target.device) + (f" ({torch.cuda.get_device_name()})" if target.device.type == "cuda" else "")
    candidates = [
        {**s, "tokens_per_second": r, "mean_accept_length": t / max(n, 1)}
        for s, r, t, n in zip(settings, rates, tokens, steps)
    ]
    return CalibratedDynamicTree(
        tree=settings[best],
        tokens_per_second=rates[best],
        plain_tokens_per_second=rates[0],
        mean_accept_length=tokens[best] / max(steps[best], 1),
        device=device,
        candidates=candidates,
        temperature=temperature,
    )
