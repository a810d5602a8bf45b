"""The trees and draft vocabulary heads leave training with, so they decode fast with no extra step.

Written into the exported heads folder as ``tree.json`` (`draftheads.plans`): one entry for
greedy decoding and one per sampling temperature (``DEFAULT_TEMPERATURES``: greedy and 0.7, the
temperature most chat models ship), ``"chosen_by": "training"``, for the training device type (a
decoder on another device type ignores them and drafts its own default; `draftheads calibrate`
replaces this device type's entries with its measurements).

- Static trees (Medusa, Hydra): the acceptance table is the one the final evaluation measured
  (``eval/rank_accuracy``: how often head k's rank-r candidate is the token training targets, over
  the whole eval set). For each candidate draft vocabulary (the N most frequent training tokens),
  the share of those hits that survive the restriction is measured on a few held-out rows; the
  verify cost by tree size and the heads' drafting cost are timed on the training device; then
  calibrate's own search (``choose_tree``) picks the tree and vocabulary with the best expected
  tokens per second.
- DFlash, P-EAGLE: the final evaluation's per-depth, per-rank table and the verify cost by size,
  with one draft forward as the drafting cost of every tree (all of a step's candidates come from it).
- Dynamic trees (EAGLE, EAGLE-3): acceptance depends on the draft's confidence at each step,
  which no table from training captures, so a small grid of settings (a subset of calibrate's)
  is timed by greedy decoding of a few held-out rows, plain decoding included.

At a sampling temperature the measurements that do not depend on it are reused (verify and
drafting times): static trees search again on a table of the target's tempered probability of
each candidate on the held-out rows (`calibrate.head_accuracy_table`); dynamic trees time only
plain decoding, the greedy choice and the smallest grid setting (a tree that did not pay
greedily does not pay under sampling, which accepts less: then plain without timing); DFlash's
block tree is chosen for greedy decoding only.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..plans import CHOSEN_BY_TRAINING, PlanEntry, TreePlans, write_plans
from .calibrate import (
    calibrate_dynamic_tree,
    choose_tree,
    head_accuracy_table,
    measure_draft_seconds,
    measure_verify_times,
)
from ..inference.one_forward_tree import drafts_in_one_forward, one_forward_draft_seconds
from .tables import entries_for

VOCAB_SIZES = (4096, 2048, 1024, 512)  # draft vocabularies tried besides the whole one (static trees)
VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SAMPLE_ROWS = 8  # held-out rows for the vocabulary ratio / dynamic-tree timing
DYNAMIC_PROMPTS = 3
DYNAMIC_VOCAB_SIZE = 1024  # EAGLE (scored by the target's LM head) also tries ranking only these tokens
DEFAULT_TEMPERATURES = (0.0, 0.7)  # greedy, and the sampling temperature most chat models ship


def dynamic_grid(device_type: str, restrict_vocab: bool) -> list[dict]:
    """A few EAGLE-2 settings sized for the device (small trees on CPU, large on CUDA)."""
    if device_type == "cuda":
        base = [{"total_tokens": t, "depth": d, "top_k": 8} for t in (32, 64) for d in (5, 7)]
    else:
        base = [{"total_tokens": t, "depth": d, "top_k": 3} for t in (8, 16) for d in (3, 5)]
    vocabs = (None, DYNAMIC_VOCAB_SIZE) if restrict_vocab else (None,)
    return [{**g, "draft_vocab_size": v} for g in base for v in vocabs]


def _device_label(target: torch.nn.Module) -> str:
    device = target.device
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def _verify_context(target: torch.nn.Module) -> int:
    limit = getattr(target.config, "max_position_embeddings", None) or 4096
    return max(1, min(256, limit - max(VERIFY_SIZES) - 1))


@torch.no_grad()
def choose_static(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    rows: list[torch.Tensor],
    rank_accuracy: torch.Tensor | None,
    max_nodes: int = 64,
    temperature: float = 0.0,
    timings: dict | None = None,
) -> dict[str, Any]:
    """Tree + draft vocabulary for Medusa/Hydra heads (see the module docstring). ``timings``:
    a dict that keeps the verify and drafting times between calls (temperatures)."""
    timings = {} if timings is None else timings
    ranks = rank_accuracy.shape[1] if rank_accuracy is not None else 10
    full = head_accuracy_table(target, heads, rows, ranks, temperature=temperature)
    table = rank_accuracy if rank_accuracy is not None and temperature == 0 else full
    if "verify" not in timings:
        timings["verify"] = measure_verify_times(target, list(VERIFY_SIZES), context=_verify_context(target))
    verify = timings["verify"]
    sizes: list[int | None] = [None]
    if int(heads.token_counts.sum()) > 0:
        sizes += [n for n in VOCAB_SIZES if n < heads.config.vocab_size // 2]
    best = None
    for size in sizes:
        acc = table
        if size is not None:
            restricted = head_accuracy_table(target, heads, rows, ranks, vocab_ids=heads.draft_vocab(size),
                                             temperature=temperature)
            kept = restricted.sum(1) / full.sum(1).clamp(min=1e-9)  # share of top-R hits left per head
            acc = (table * kept.clamp(max=1.0)[:, None]).clamp(max=1.0)
        if ("draft", size) not in timings:
            timings[("draft", size)] = measure_draft_seconds(heads, draft_vocab_size=size)
        draft = timings[("draft", size)]
        result = choose_tree(acc, verify, draft, max_nodes=max_nodes, device=_device_label(target))
        result.draft_vocab_size = size
        result.temperature = temperature
        if best is None or result.expected_speedup > best.expected_speedup:
            best = result
    return best.to_json()


@torch.no_grad()
def choose_block_tree(target: torch.nn.Module, heads: torch.nn.Module, rank_accuracy: torch.Tensor) -> dict[str, Any]:
    """Tree for DFlash and P-EAGLE heads: the final evaluation's per-depth, per-rank acceptance
    table, the verify cost by tree size, and ONE draft forward as the drafting cost of every tree
    (a tree is read off the same forward's per-depth top-k, whatever its width)."""
    verify = measure_verify_times(target, list(VERIFY_SIZES), context=_verify_context(target))
    draft = one_forward_draft_seconds(heads)
    return choose_tree(rank_accuracy, verify, draft, max_nodes=64, device=_device_label(target)).to_json()


@torch.no_grad()
def choose_dynamic(target: torch.nn.Module, heads: torch.nn.Module, rows: list[torch.Tensor],
                   temperature: float = 0.0, greedy_choice: dict | None = None) -> dict[str, Any]:
    """EAGLE-2 settings for EAGLE/EAGLE-3 heads, timed end to end on held-out rows. At a
    sampling ``temperature``, with the greedy ``greedy_choice``: the short grid of the module
    docstring."""
    limit = getattr(target.config, "max_position_embeddings", None) or 4096
    new_tokens = 48
    prompt_len = max(1, min(128, limit - new_tokens - 8))
    prompts = [row[:prompt_len][None] for row in rows[:DYNAMIC_PROMPTS]]
    restrict = (heads.vocab_ids() is None and int(heads.token_counts.sum()) > 0
                and DYNAMIC_VOCAB_SIZE < heads.config.vocab_size // 2)
    grid = dynamic_grid(target.device.type, restrict)
    if temperature > 0 and greedy_choice is not None:
        if greedy_choice.get("total_tokens") == 1:  # plain won greedily: sampling accepts less
            return {"tree": dict(greedy_choice), "calibration": {"skipped": "plain decoding won at temperature 0"},
                    "temperature": temperature}
        smallest = min(grid, key=lambda g: (g["total_tokens"], g["depth"]))
        smallest = {**smallest, "draft_vocab_size": greedy_choice.get("draft_vocab_size")}
        grid = [dict(greedy_choice)] + ([smallest] if smallest != greedy_choice else [])
    result = calibrate_dynamic_tree(target, heads, prompts, new_tokens=new_tokens, grid=grid, rounds=1,
                                    temperature=temperature)
    return {"tree": result.tree, "calibration": result.to_json(), "temperature": temperature}


def choose_export_tree(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    rows: list[torch.Tensor],
    rank_accuracy: list[list[float]] | None = None,
    temperature: float = 0.0,
    greedy_choice: Any = None,
    timings: dict | None = None,
) -> dict[str, Any]:
    """The tree chosen at the end of training for ``temperature`` (0: greedy), measured on
    ``target``'s device: the tree, its draft vocabulary and the measurements behind them.

    ``rows``: a few held-out token rows (1-D); ``rank_accuracy``: the final evaluation's
    ``eval/rank_accuracy`` (static-tree heads), if there was an evaluation; ``greedy_choice``:
    the greedy tree (dynamic heads time a short grid around it); ``timings``: kept between
    temperatures (static heads)."""
    rows = [r.to(target.device) for r in rows if r.numel() >= 8][:SAMPLE_ROWS]
    if not rows:
        raise ValueError("no held-out rows of at least 8 tokens to choose a tree on")
    was_training = heads.training
    try:
        if getattr(heads, "dynamic_tree", False):
            data = choose_dynamic(target, heads, rows, temperature, greedy_choice)
        elif drafts_in_one_forward(heads):
            table = None if rank_accuracy is None else torch.tensor(rank_accuracy, dtype=torch.float32)
            if table is None or table.dim() != 2 or table.shape[0] != heads.config.num_heads:
                raise ValueError(f"{heads.head_type} heads choose their tree from the final evaluation's acceptance "
                                 "table; there was none")
            if temperature > 0:
                raise ValueError(f"{heads.head_type} heads choose their tree for greedy decoding only (their table "
                                 "holds greedy hit rates)")
            data = choose_block_tree(target, heads, table)
        else:
            table = None if rank_accuracy is None else torch.tensor(rank_accuracy, dtype=torch.float32)
            if table is not None and (table.dim() != 2 or table.shape[0] != heads.config.num_heads or not math.isfinite(float(table.sum()))):
                table = None
            data = choose_static(target, heads, rows, table, temperature=temperature, timings=timings)
    finally:
        heads.train(was_training)
    data["chosen_by"] = CHOSEN_BY_TRAINING
    data["device_type"] = target.device.type
    data["temperature"] = float(temperature)
    return data


def choose_export_plans(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    rows: list[torch.Tensor],
    rank_accuracy: list[list[float]] | None = None,
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES,
) -> tuple[TreePlans, list[dict[str, Any]]]:
    """The whole tree.json training writes: one batch-1 entry per temperature, greedy first
    (which must succeed; a sampling temperature that cannot be measured is left out, printed).
    Returns the table and each temperature's `choose_export_tree` result."""
    timings: dict = {}
    greedy = choose_export_tree(target, heads, rows, rank_accuracy, 0.0, timings=timings)
    chosen = [greedy]
    for temperature in sorted(t for t in temperatures if t > 0):
        try:
            chosen.append(choose_export_tree(target, heads, rows, rank_accuracy, temperature,
                                             greedy_choice=greedy["tree"], timings=timings))
        except ValueError as e:
            print(f"tree: none chosen for temperature {temperature:g} ({e}); requests there use the nearest plan",
                  flush=True)
    entries: list[PlanEntry] = []
    for data in chosen:
        entries += entries_for(data["tree"], data.get("draft_vocab_size"), data, data["device_type"],
                               data["temperature"], chosen_by=CHOSEN_BY_TRAINING)
    return TreePlans(tuple(entries)), chosen


def write_export_tree(
    accelerator,
    model: torch.nn.Module,
    heads_dir,
    rows: list[torch.Tensor],
    rank_accuracy: list[list[float]] | None,
    skip_reason: str | None = None,
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES,
) -> dict[str, Any] | None:
    """On the main process: choose the trees (one per temperature) and write
    ``heads_dir/tree.json`` (atomically); every process meets at a barrier after. Returns a
    summary for metrics.json (main process), else None.

    A failure here never costs the trained heads: they are already exported, and without a
    ``tree.json`` the decoder uses its device default; the reason is printed."""
    import time

    summary = None
    if accelerator.is_main_process:
        if skip_reason:
            print(f"tree: not chosen ({skip_reason}); the decoder will use its device default", flush=True)
        else:
            unwrapped = accelerator.unwrap_model(model)
            started = time.perf_counter()
            try:
                plans, chosen = choose_export_plans(unwrapped.target, unwrapped.heads, rows, rank_accuracy, temperatures)
            except Exception as e:  # the heads are exported already; decoding falls back to a default
                print(f"warning: choosing a tree for the exported heads failed ({e!r}); "
                      "the decoder will use its device default (or run `draftheads calibrate`)", flush=True)
            else:
                path = write_plans(heads_dir, plans)
                summary = describe(chosen[0])
                summary["seconds"] = time.perf_counter() - started
                summary["temperatures"] = {f"{d['temperature']:g}": describe(d) for d in chosen}
                for data in chosen:
                    print(f"tree chosen for {data['device_type']} at temperature {data['temperature']:g}: "
                          f"{describe(data)['text']}", flush=True)
                print(f"-> {path} ({summary['seconds']:.1f} s)", flush=True)
    accelerator.wait_for_everyone()
    return summary


def describe(data: dict[str, Any]) -> dict[str, Any]:
    """A short summary of a ``tree.json`` written by training (for logs and metrics.json)."""
    tree = data["tree"]
    if tree == [] or (isinstance(tree, dict) and tree.get("total_tokens") == 1):  # root-only: plain steps
        return {"text": "plain decoding (no tree paid for its drafting and verification on this device)",
                "nodes": 1, "draft_vocab_size": None}
    if isinstance(tree, dict):
        calibration = data.get("calibration", {})
        vocab = tree.get("draft_vocab_size")
        speedup = calibration.get("tokens_per_second", 0) / max(calibration.get("plain_tokens_per_second", 0), 1e-9)
        text = (f"dynamic tree {tree['total_tokens']} tokens, depth {tree['depth']}, top-{tree['top_k']}, "
                f"{'whole vocabulary' if not vocab else f'{vocab}-token draft vocabulary'}, "
                f"{speedup:.2f}x plain steps measured")
        return {"text": text, "tree": tree, "draft_vocab_size": vocab, "measured_speedup": speedup}
    vocab = data.get("draft_vocab_size")
    text = (f"static tree of {len(tree) + 1} nodes, {'whole vocabulary' if not vocab else f'{vocab}-token draft vocabulary'}, "
            f"expected {data['expected_tokens_per_step']:.2f} tokens/step, {data['expected_speedup']:.2f}x one-token steps")
    return {"text": text, "nodes": len(tree) + 1, "draft_vocab_size": vocab,
            "expected_tokens_per_step": data["expected_tokens_per_step"], "expected_speedup": data["expected_speedup"]}
