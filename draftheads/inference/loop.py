"""THE decode loop: propose -> verify -> accept -> commit, for every active row of a batch.

Batch 1 is a batch of one row; a streamer sees that row's tokens as they are committed. The
loop knows neither the cache layout (a `kv.base.KVStore`: `SequenceKV` or `StaticKV` for one
unpadded row, `RaggedKV` for a batch) nor how a method drafts (a `proposers.drafter.Drafter`,
the one drafter interface). Each piece is a small
function; `decode` strings them together.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .accept import accept_rows
from .accepted import Acceptance
from .kv.base import Prefilled, Verified
from .output import SpeculativeOutput
from .sampling import SamplingParams, sample
from .timing import ForwardTimer
from .tree import Tree


@dataclass
class Settings:
    """What one decode call asked for, resolved by the decoder."""

    max_new_tokens: int
    params: SamplingParams
    device: torch.device  # the target's (the verify forward is timed there)
    eos: set[int]
    pad_token_id: int | None = None
    acceptance: str = "exact"
    generator: torch.Generator | None = None
    streamer: Any = None
    budget: Any = None  # an `inference.draft_budget.DraftBudget`: caps each step's draft depth (None: never)


@dataclass
class Rows:
    """Host bookkeeping of the batch: every row's tokens so far, and which rows are still active
    (their original index, in batch order; the store and the proposer hold only those)."""

    new_tokens: list[list[int]]
    accepts: list[list[int]] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    steps: int = 0
    verify_tokens: int = 0
    target_seconds: float = 0.0

    @property
    def roots(self) -> list[int]:
        """Each active row's next token: decided, not yet in the target's cache."""
        return [self.new_tokens[r][-1] for r in self.active]


def draft_depths(rows: Rows, settings: Settings) -> list[int]:
    """How deep each active row may draft this step: never past max_new_tokens (the target's own
    next token takes the last slot), nor deeper than the draft budget allows from earlier steps
    (0 = a plain step) when speculation does not pay."""
    limits = [settings.max_new_tokens - len(rows.new_tokens[r]) - 1 for r in rows.active]
    return limits if settings.budget is None else settings.budget.caps(limits)


def verify_widths(trees: list[Tree], proposer, settings: Settings) -> list[Tree]:
    """The drafted trees cut to the depth the draft budget verifies, where the drafter estimated
    each row's chance of acceptance by depth with its drafts (DSpark's confidence head:
    `Drafter.acceptance_estimates`) and the budget reads such estimates. Lossless: the cut
    depends on this step's drafts only, never on the target's output, and a truncated tree's
    accepted path is the truncated path."""
    budget = settings.budget
    if budget is None or not budget.uses_estimates:
        return trees
    estimates = proposer.acceptance_estimates()
    if estimates is None:
        return trees
    depths = budget.verify_depths(estimates, [t.shape.max_depth for t in trees])
    return [t if d >= t.shape.max_depth else t.truncated(d) for t, d in zip(trees, depths)]


def cut(emitted: list[int], eos: set[int], room: int) -> tuple[list[int], bool]:
    """``emitted`` up to its first EOS (included) and at most ``room`` tokens; whether the row is done."""
    for i, tok in enumerate(emitted):
        if tok in eos:
            return emitted[: min(i + 1, room)], True
    return emitted[:room], len(emitted) >= room


def first_tokens(last_logits: torch.Tensor, settings: Settings) -> list[int]:
    """Every row's first new token from its prompt's last logits [rows, V] (greedy: one host read;
    sampling: one `sampling.sample` per row, as a plain step draws its token)."""
    if settings.params.greedy:
        return last_logits.argmax(dim=-1).tolist()
    probs = settings.params.probs(last_logits)
    return [sample(probs[r], settings.generator) for r in range(probs.shape[0])]


def start(store, proposer, input_ids: torch.Tensor, settings: Settings) -> Rows:
    """Prefill the prompts, pick each row's first token, start the proposer."""
    if settings.streamer is not None:
        settings.streamer.put(input_ids[0].cpu())
    pre: Prefilled = store.prefill(input_ids)
    roots = first_tokens(pre.last_logits, settings)
    proposer.start(pre.prompts, pre.hidden, settings.params, settings.generator)
    del pre  # with output_hidden_states (fallback) the features hold every layer's states
    rows = Rows(new_tokens=[[root] for root in roots], accepts=[[] for _ in roots], active=list(range(len(roots))))
    if settings.streamer is not None:
        settings.streamer.put(torch.tensor(roots))
    finished = [root in settings.eos or settings.max_new_tokens == 1 for root in roots]
    drop_finished(store, proposer, rows, finished)
    return rows


def path_tokens(trees: list[Tree], accs: list[Acceptance]) -> list[list[int]]:
    """The accepted tokens on the host: greedy and sampling acceptance brought them back already."""
    return [acc.tokens if acc.tokens is not None else tree.tokens[acc.path].tolist() for tree, acc in zip(trees, accs)]


def inform(proposer, accs: list[Acceptance], tokens: list[list[int]], verified: Verified) -> None:
    """Tell the proposer what was accepted: the tokens and the target's features there."""
    feats = verified.features
    proposer.accepted(
        [torch.tensor(t, dtype=torch.long) for t in tokens],
        [None if feats is None else feats[r, acc.index(feats.device)] for r, acc in enumerate(accs)],
    )


def emit(rows: Rows, accs: list[Acceptance], tokens: list[list[int]], settings: Settings) -> list[bool]:
    """Append every active row's accepted drafts and next token, cut at EOS and max_new_tokens;
    per active row, whether it is done."""
    finished = []
    for row, acc, path in zip(rows.active, accs, tokens):
        emitted = path[1:] + [acc.next_token]
        rows.accepts[row].append(len(emitted))
        emitted, done = cut(emitted, settings.eos, settings.max_new_tokens - len(rows.new_tokens[row]))
        rows.new_tokens[row].extend(emitted)
        if settings.streamer is not None:
            settings.streamer.put(torch.tensor(emitted))
        finished.append(done)
    return finished


def drop_finished(store, proposer, rows: Rows, finished: list[bool]) -> None:
    """Rows that are done leave the store and the proposer at once (they stop costing verify tokens)."""
    if not any(finished):
        return
    keep = [pos for pos, done in enumerate(finished) if not done]
    rows.active = [rows.active[pos] for pos in keep]
    if keep:
        store.keep(keep)
        proposer.keep(keep)


def step(store, proposer, rows: Rows, settings: Settings) -> None:
    """One speculative step for every active row: propose, one verify forward, accept, commit."""
    step_start = time.perf_counter()
    trees = verify_widths(proposer.propose(rows.roots, draft_depths(rows, settings)), proposer, settings)
    timer = ForwardTimer(settings.device)
    verified = store.verify(trees)
    timer.stop()
    accs = accept_rows(trees, verified.tokens, verified.logits, settings.params, settings.acceptance, settings.generator)
    tokens = path_tokens(trees, accs)
    verify_seconds = timer.seconds()  # after acceptance's transfer: no extra device sync
    rows.steps += 1
    rows.verify_tokens += verified.tokens.numel()
    rows.target_seconds += verify_seconds
    store.commit(accs)
    inform(proposer, accs, tokens, verified)
    drop_finished(store, proposer, rows, emit(rows, accs, tokens, settings))
    if rows.active:
        store.tidy()
    if settings.budget is not None:
        settings.budget.record(max(t.shape.max_depth for t in trees), [len(t) - 1 for t in tokens],
                               time.perf_counter() - step_start)


def assemble(input_ids: torch.Tensor, new_tokens: list[list[int]], pad_token_id: int | None) -> torch.Tensor:
    """Prompt + new tokens per row, rows that stopped early padded like `generate` pads them."""
    longest = max(len(t) for t in new_tokens)
    if pad_token_id is None and any(len(t) < longest for t in new_tokens):
        raise ValueError("rows stopped at different steps but there is no pad_token_id to fill them with")
    pad = 0 if pad_token_id is None else pad_token_id
    tail = torch.full((len(new_tokens), longest), pad, dtype=input_ids.dtype)
    for r, toks in enumerate(new_tokens):
        tail[r, : len(toks)] = torch.tensor(toks, dtype=input_ids.dtype)
    return torch.cat([input_ids.cpu(), tail], dim=1)


def decode(store, proposer, input_ids: torch.Tensor, settings: Settings) -> SpeculativeOutput:
    """Decode ``input_ids`` [rows, T] (the store holds their cache) until every row is done."""
    t0 = time.perf_counter()
    rows = start(store, proposer, input_ids, settings)
    t1 = time.perf_counter()
    while rows.active:
        step(store, proposer, rows, settings)
    t2 = time.perf_counter()
    if settings.streamer is not None:
        settings.streamer.end()
    return SpeculativeOutput(
        sequences=assemble(input_ids, rows.new_tokens, settings.pad_token_id),
        accept_lengths=[n for row in rows.accepts for n in row],
        prefill_seconds=t1 - t0,
        decode_seconds=t2 - t1,
        target_seconds=rows.target_seconds,
        stats={
            "new_tokens": sum(len(t) for t in rows.new_tokens),
            "steps": rows.steps,
            "batch_size": len(rows.new_tokens),
            "row_new_tokens": [len(t) for t in rows.new_tokens],
            "row_accept_lengths": rows.accepts,
            "verify_tokens": rows.verify_tokens,
            **store.stats(),
            **proposer.stats(),
            **({} if settings.budget is None else settings.budget.stats()),
        },
    )
