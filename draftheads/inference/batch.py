"""Speculative decoding of a left-padded batch: each row exactly what `generate` gives that row.

One target forward per step verifies every active row's tree at once. Rows accept different
numbers of tokens, so the batch shares one KV cache with per-row holes (`ragged`): per-row 4D
masks and position ids make each row see only its own tokens. Rows that reach EOS or
max_new_tokens leave the batch at once (their cache rows are dropped), so they stop costing
verify tokens; their output is padded after EOS with the pad id, as `generate` pads.

``compaction`` decides when holes are removed (one gather of the cache):
- "never": holes stay masked (attention runs over them);
- "always": after every step (no holes, a full-cache copy per step);
- "auto" (default): when a finished row is dropped (that copy happens anyway) or when holes
  exceed a quarter of the cache.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from transformers import DynamicCache

from .accept_rows import accept_greedy_rows
from .timing import ForwardTimer
from .proposers.rows import row_proposer
from .ragged import RaggedState, commit_rows, compact, keep_rows, pad_trees, prefill_state, ragged_mask
from .sampling import SamplingParams, sample
from .output import SpeculativeOutput, last_logits_only

COMPACTION = ("auto", "never", "always")
HOLE_FRACTION = 0.25


def token_matrix(input_ids: Any) -> torch.Tensor:
    """``input_ids`` as a [batch, seq] tensor (one sequence [seq] becomes one row)."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(ids.shape)}")
    return ids


def left_pad(prompts: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One [B, T] batch and its attention mask from 1-D (or [1, T]) prompts, padded on the left as
    decoder-only `generate` needs."""
    rows = [p.reshape(-1) for p in prompts]
    width = max(r.numel() for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - row.numel():] = row
        mask[i, width - row.numel():] = 1
    return ids, mask


def wants_batch_path(input_ids: torch.Tensor, attention_mask: Any) -> bool:
    """Whether a call needs the batched loop: several rows, or one row with padding
    (``input_ids`` as `token_matrix` returns it)."""
    if input_ids.shape[0] != 1:
        return True
    if attention_mask is None:
        return False
    mask = torch.as_tensor(attention_mask)
    return mask.shape != input_ids.shape or not bool((mask == 1).all())


def check_batch(
    input_ids: Any, attention_mask: Any, pad_token_id: int | None, eos: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated ``(input_ids [B, T], attention_mask [B, T])``; a missing mask is inferred from the
    pad token the way `generate` infers it (pad positions masked when the pad id is not an EOS)."""
    ids = token_matrix(input_ids)
    if ids.shape[0] == 0:
        raise ValueError("input_ids has no rows (batch size 0)")
    if ids.shape[1] == 0:
        raise ValueError("the prompts are empty: give at least one token per row (e.g. the BOS token)")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    if attention_mask is None:
        if pad_token_id is not None and pad_token_id not in eos and bool((ids == pad_token_id).any()):
            mask = (ids != pad_token_id).long()
        else:
            mask = torch.ones_like(ids)
    else:
        mask = torch.as_tensor(attention_mask)
        if mask.dim() == 1 and ids.shape[0] == 1:
            mask = mask[None]
        if mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(mask.shape)} but input_ids has shape {tuple(ids.shape)}: "
                "give one 0/1 mask entry per token (the tokenizer's attention_mask for the same batch)"
            )
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
        mask = mask.long()
    empty = (mask.sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"row(s) {empty} of the batch have no tokens (attention mask all zeros): give every row at least "
            "one token (e.g. the BOS token) or leave the row out"
        )
    bad = ((mask == 0) & (mask.cumsum(dim=1) > 0)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"row(s) {bad} of the batch are padded on the right (a 0 in attention_mask after a token): decoder-only "
            "models continue from the last position, so pad on the left, as `generate` needs "
            "(tokenizer.padding_side = 'left')"
        )
    return ids, mask


def _gather_rows(values: list[Any], rows: list[int]) -> list[Any]:
    return [values[r] for r in rows]


def _mask_for(verifier, state: RaggedState, depth: torch.Tensor, ancestors: torch.Tensor, dtype, device):
    """The 4D mask (or one per layer type, as `TreeVerifier.attention_mask`) for this step, built on
    the device from the host's slot table: [rows, slots] positions travel, not [rows, n, slots] floats."""
    state = RaggedState(state.slot_pos.to(device, non_blocking=True), state.next_pos.to(device, non_blocking=True))
    depth, ancestors = depth.to(device, non_blocking=True), ancestors.to(device, non_blocking=True)
    masks = {name: ragged_mask(state, depth, ancestors, span, dtype) for name, span in verifier.spans.items()}
    if len(masks) == 1:
        return next(iter(masks.values()))
    return masks


def generate_batch(
    decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    params: SamplingParams,
    eos: set[int],
    pad_token_id: int | None,
    generator: torch.Generator | None,
    acceptance: str = "exact",
    compaction: str = "auto",
):
    """The batched decode loop behind `SpeculativeDecoder.generate` (see the module docstring)."""
    if compaction not in COMPACTION:
        raise ValueError(f"compaction must be one of {COMPACTION}, got {compaction!r}")
    target, verifier = decoder.target, decoder.verifier
    device, dtype = target.device, target.dtype
    proposer = row_proposer(decoder.proposer)
    tap = verifier.tap  # captures only the hidden states the proposer reads
    batch, width = input_ids.shape

    # Prefill: the padded prompts, positions counted over real tokens as `generate` counts them.
    t0 = time.perf_counter()
    state, position_ids = prefill_state(attention_mask)
    cache = DynamicCache()
    with tap.capture() as captured:
        out = target(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), position_ids=position_ids.to(device),
            use_cache=True, **tap.forward_kwargs(), **{verifier.cache_arg: cache}, **last_logits_only(target),
        )
    last = out.logits[:, -1]
    if params.greedy:
        roots = last.argmax(dim=-1).tolist()
    else:
        probs = params.probs(last).cpu()
        roots = [sample(probs[r], generator) for r in range(batch)]
    lengths = attention_mask.sum(dim=1).tolist()
    feats = tap.features(captured, out)
    prompts = [input_ids[r, width - lengths[r]:].to(device) for r in range(batch)]
    hidden = [None if feats is None else feats[r, width - lengths[r]:] for r in range(batch)]
    proposer.start(prompts, hidden, params, generator)
    del out, feats
    new_tokens: list[list[int]] = [[root] for root in roots]
    row_accepts: list[list[int]] = [[] for _ in range(batch)]
    active = list(range(batch))  # original row of each position in the batch
    t1 = time.perf_counter()

    steps = verify_tokens = compactions = max_holes = 0
    target_seconds = 0.0
    finished = [root in eos or max_new_tokens == 1 for root in roots]
    active, state, compacted = _drop_finished(cache, state, proposer, active, finished, compaction)
    compactions += compacted
    roots = [new_tokens[r][-1] for r in active]
    budget = decoder._budget()
    while active:
        step_start = time.perf_counter()
        trees = proposer.propose(roots, budget.caps([max_new_tokens - len(new_tokens[r]) - 1 for r in active]))
        tokens, depth, ancestors = pad_trees(trees)
        timer = ForwardTimer(torch.device(device))
        device_tokens = tokens.to(device)
        with tap.capture() as captured:
            out = target(
                input_ids=device_tokens, position_ids=(state.next_pos[:, None] + depth).to(device),
                attention_mask=_mask_for(verifier, state, depth, ancestors, dtype, device),
                use_cache=True, **tap.forward_kwargs(), **{verifier.cache_arg: cache},
            )
        timer.stop()
        logits = out.logits
        steps += 1
        verify_tokens += tokens.numel()
        feats = tap.features(captured, out)
        del out
        if params.greedy:  # every row at once: one host read per step
            accs = accept_greedy_rows(trees, device_tokens, logits)
        elif acceptance == "typical":
            accs = [verifier.accept_typical(t, logits[pos, : t.shape.size], params, generator)
                    for pos, t in enumerate(trees)]
        else:
            accs = [verifier.accept_sampling(t, logits[pos, : t.shape.size], params, generator)
                    for pos, t in enumerate(trees)]
        paths = [acc.path.cpu() for acc in accs]
        verify_seconds = timer.seconds()  # after acceptance's transfer: no extra device sync
        target_seconds += verify_seconds
        state = commit_rows(cache, state, [acc.nodes for acc in accs], state.next_pos)
        # The accepted tokens on the host: greedy and sampling acceptance brought them back already.
        path_tokens = [acc.tokens if acc.tokens is not None else tree.tokens[p].tolist()
                       for tree, acc, p in zip(trees, accs, paths)]
        proposer.accepted(
            [torch.tensor(tokens) for tokens in path_tokens],
            [None if feats is None else feats[pos, p.to(feats.device)] for pos, p in enumerate(paths)],
        )
        proposer.observe([t.shape.size - 1 for t in trees], [p.numel() - 1 for p in paths], verify_seconds)
        finished = []
        for row, acc, tokens in zip(active, accs, path_tokens):
            emitted = tokens[1:] + [acc.next_token]
            row_accepts[row].append(len(emitted))
            done = False
            for i, tok in enumerate(emitted):
                if tok in eos:
                    emitted, done = emitted[: i + 1], True
                    break
            emitted = emitted[: max_new_tokens - len(new_tokens[row])]
            new_tokens[row].extend(emitted)
            finished.append(done or len(new_tokens[row]) >= max_new_tokens)
        max_holes = max(max_holes, state.holes)
        active, state, compacted = _drop_finished(cache, state, proposer, active, finished, compaction)
        if active and not compacted and (
            compaction == "always" or (compaction == "auto" and state.holes > HOLE_FRACTION * state.slot_pos.numel())
        ):
            state = compact(cache, state)
            compacted = True
        compactions += compacted
        roots = [acc.next_token for acc, done in zip(accs, finished) if not done]
        budget.record(max(t.shape.max_depth for t in trees), [p.numel() - 1 for p in paths],
                      time.perf_counter() - step_start)
    t2 = time.perf_counter()

    sequences = _assemble(input_ids, new_tokens, pad_token_id)
    flat_accepts = [n for row in row_accepts for n in row]
    return SpeculativeOutput(
        sequences=sequences,
        accept_lengths=flat_accepts,
        prefill_seconds=t1 - t0,
        decode_seconds=t2 - t1,
        target_seconds=target_seconds,
        stats={
            "new_tokens": sum(len(t) for t in new_tokens),
            "steps": steps,
            "batch_size": batch,
            "row_new_tokens": [len(t) for t in new_tokens],
            "row_accept_lengths": row_accepts,
            "verify_tokens": verify_tokens,
            "compaction": compaction,
            "compactions": compactions,
            "max_holes": max_holes,
            **proposer.stats(),
            **budget.stats(),
        },
    )


def _drop_finished(cache, state: RaggedState, proposer, active: list[int], finished: list[bool],
                   compaction: str) -> tuple[list[int], RaggedState, bool]:
    """Remove finished rows from the cache, the slot table and the proposer; with compaction on,
    the same copy removes the holes. Returns the rows left, their state, whether it compacted."""
    if not any(finished):
        return active, state, False
    keep = [pos for pos, done in enumerate(finished) if not done]
    if not keep:
        return [], state, False
    state = keep_rows(cache, state, keep, compact_too=compaction != "never")
    proposer.keep(keep)
    return _gather_rows(active, keep), state, compaction != "never"


def _assemble(input_ids: torch.Tensor, new_tokens: list[list[int]], pad_token_id: int | None) -> torch.Tensor:
    """Prompt + new tokens per row, rows that stopped early padded like `generate` pads them."""
    longest = max(len(t) for t in new_tokens)
    if pad_token_id is None and any(len(t) < longest for t in new_tokens):
        raise ValueError("rows stopped at different steps but there is no pad_token_id to fill them with")
    pad = 0 if pad_token_id is None else pad_token_id
    tail = torch.full((len(new_tokens), longest), pad, dtype=input_ids.dtype)
    for r, toks in enumerate(new_tokens):
        tail[r, : len(toks)] = torch.tensor(toks, dtype=input_ids.dtype)
    return torch.cat([input_ids.cpu(), tail], dim=1)
