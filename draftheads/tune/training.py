"""The trees and draft vocabulary heads leave training with, so they decode fast with no extra step.

Written into the exported heads folder as ``tree.json`` (`draftheads.plans`): one entry for
greedy decoding and one per sampling temperature (``DEFAULT_TEMPERATURES``: greedy, 0.7, the
temperature most chat models ship, and 1.0, the target's own distribution),
``"chosen_by": "training"``, for the training device type (a decoder on another device type
ignores them and drafts its own default; `draftheads calibrate` replaces this device type's
entries with its measurements).

- Static trees (Medusa, Hydra): the acceptance table is the one the final evaluation measured
  (``eval/rank_accuracy``: how often head k's rank-r candidate is the token training targets, over
  the whole eval set). For each candidate draft vocabulary (the N most frequent training tokens),
  the share of those hits that survive the restriction is measured on a few held-out rows; the
  verify cost by tree size and the heads' drafting cost are timed on the training device; then
  calibrate's own search (``choose_tree``) picks the tree and vocabulary with the best expected
  tokens per second.
- DFlash, P-EAGLE: the final evaluation's per-depth, per-rank table and the verify cost by size,
  with one draft forward as the drafting cost of every tree (all of a step's candidates come from it).
  DFlash heads also try draft vocabularies as static trees do, because their LM head over the
  block's slots is a large share of the draft's cost. Each vocabulary is measured two ways: the
  share of hits it keeps on held-out rows, and the draft forward timed with it.
- Dynamic trees (EAGLE, EAGLE-3): acceptance depends on the draft's confidence at each step,
  which no table from training captures, so a small grid of settings (a subset of calibrate's)
  is timed by greedy decoding of a few held-out rows, plain decoding included.

At a sampling temperature the measurements that do not depend on it are reused (verify and
drafting times): static trees search again on a table of the target's tempered probability of
each candidate on the held-out rows (`calibrate.head_accuracy_table`); dynamic trees time only
plain decoding, the greedy choice, the shallowest grid setting and the chain of 5 (drawn drafts
are chains as deep as the tree; a tree that did not pay greedily does not pay under sampling,
which accepts less: then plain without timing); DFlash's
block tree is chosen for greedy decoding only (at a sampling temperature its greedy tree is the
candidate, timed as below).

What the trees are timed on: with ``prompts`` (training passes the ``train.plan_prompts`` set,
by default `data.plan_prompts`' ``user`` prompts, shaped like users' requests, or ``text`` for a
base model), the dynamic grid and the check against ``generate`` decode those prompts, rendered as
a user's request reaches the target; without, the first held-out rows, cut to prompts. The
target's own synthesized chats repeat little of their prompt, and a plan timed on them turned
prompt lookup off on a 2-core EPYC where lookup alone ran 1.7x on MT-Bench (issue 55). The verify
cost by width is measured once on this machine (`calibrate.measure_cost_curve`, kept in tree.json
as its ``cost_curves``) and sizes the dynamic grid (`calibrate.dynamic_grid`): on that EPYC 8
tokens verify cheaper than 3, so trees of 8 are timed rather than chains of 2.

Then every temperature's tree meets the decoder's real baseline: the cost models above compare a
tree with the decode loop's own one-token steps, not with the target's ``generate``, which is
what a plain entry runs and what a user would otherwise call. So, per temperature, speculative
decoding with the chosen tree (through `SpeculativeDecoder`, the tree in full) is timed against
``generate`` on a few held-out rows (`batch_plan.measure_batch_plan` at batch sizes
``VS_GENERATE_BATCH_SIZES``, 1, 4 and 8: interleaved, order alternated, same seed for both modes),
and each batch size's entry is PLAIN unless the median of its per-batch ratios exceeds
``PLAIN_MARGIN``. The same tree behind prompt lookup is timed in the same rounds (``try_lookup``,
``train.choose_prompt_lookup``): an entry speculates with whichever of the two has the higher
median, and records ``prompt_lookup`` when that is the lookup, which stays in front unless it
measured slower (`batch_plan`'s rule: its cost where nothing repeats is microseconds of search).
Each batch size times pairs until its verdict is settled to ``VS_GENERATE_RESOLUTION`` or its
time bound (``VS_GENERATE_MAX_SECONDS``) is spent, instead of stopping at a fixed four. The figures are kept in the entries' ``measured["batch"]`` (as `draftheads
calibrate --batch-sizes` keeps them) and, for batch size 1, in metrics.json (`describe`). Its cost
is bounded per temperature and batch size: at most prompts x rounds pairs of
short decodes, and no new pair once ``VS_GENERATE_MAX_SECONDS`` of decoding are spent (a loaded
machine stretches every decode; the verdict then rests on fewer prompts, and says how many).
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from ..registry import TreeKind, method_of
from ..device import device_name
from ..plans import CHOSEN_BY_TRAINING, PLAIN, SPECULATIVE, CostCurve, DynamicTree, PlanEntry, TreePlans, parse_temperatures, tree_spec
from ..plans import write_plans
from ..heads.confidence import write_confidence
from .batch_plan import PLAIN_MARGIN, BatchPlanResult, measure_batch_plan
from .calibrate import (
    calibrate_confidence,
    calibrate_dynamic_tree,
    choose_tree,
    describe_curve,
    dynamic_grid,
    head_accuracy_table,
    measure_draft_seconds,
    measure_verify_times,
    restricts_vocab,
    sampling_grid,
)
from ..inference.one_forward_tree import (
    one_forward_accuracy,
    one_forward_draft_seconds,
    one_forward_vocab_sizes,
)
from .tables import drafts_nothing, entries_for

VOCAB_SIZES = (4096, 2048, 1024, 512)  # draft vocabularies tried besides the whole one (static trees, DFlash)
BLOCK_VOCAB_ROW_TOKENS = 96  # tokens per held-out row measuring the hits a DFlash draft vocabulary keeps
VERIFY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SAMPLE_ROWS = 8  # held-out rows for the vocabulary ratio / dynamic-tree timing
DYNAMIC_NEW_TOKENS = 48
DYNAMIC_PROMPTS = 6  # chain or tree depends on the text (toy target, 19f3628:benchmarks/measurements/chains/): more rows, a choice tied less to a few
DEFAULT_TEMPERATURES = (0.0, 0.7, 1.0)  # greedy, what most chat models ship, and the target's own law
# The chosen tree against the target's generate (module docstring): prompts x rounds pairs of
# decodes per temperature, each of VS_GENERATE_NEW_TOKENS tokens after a VS_GENERATE_PROMPT_LEN
# prompt; speculation must beat generate by batch_plan.PLAIN_MARGIN (median of per-prompt
# ratios), as in calibrate --batch-sizes.
VS_GENERATE_PROMPTS = 12  # plan prompts (held-out rows: the first 4, as before there were plan prompts)
VS_GENERATE_ROWS = 4
VS_GENERATE_ROUNDS = 2
VS_GENERATE_NEW_TOKENS = 64
VS_GENERATE_PROMPT_LEN = 64  # held-out rows are cut to this; plan prompts keep their last PLAN_PROMPT_TOKENS
PLAN_PROMPT_TOKENS = 256
VS_GENERATE_MAX_SECONDS = 45.0  # per temperature at batch 1, warm-up excluded (at least batch_plan.MIN_PAIRS pairs)
VS_GENERATE_BATCH_SECONDS = 15.0  # per temperature at each larger batch size
VS_GENERATE_RESOLUTION = 0.01  # stop timing a size once its verdict is settled to 1% (batch_plan)
# Batch sizes timed against generate: a tree that pays for one sequence can lose at 8, where every
# drafted token is verified 8 times (toy target: Medusa's greedy tree 0.87x at batch 8, EAGLE's 0.98x), and
# a user who never runs calibrate decodes batches with training's plan.
VS_GENERATE_BATCH_SIZES = (1, 4, 8)


def _device_label(target: torch.nn.Module) -> str:
    device = target.device
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def _verify_context(target: torch.nn.Module) -> int:
    limit = getattr(target.config, "max_position_embeddings", None) or 4096
    return max(1, min(256, limit - max(VERIFY_SIZES) - 1))


def cost_curve(target: torch.nn.Module) -> CostCurve:
    """This machine's verify cost by width, measured once per training (module docstring)."""
    context = _verify_context(target)
    seconds = measure_verify_times(target, list(VERIFY_SIZES), context=context)
    return CostCurve(device_type=target.device.type, verify_seconds=seconds, device_name=device_name(target.device),
                     context=context, threads=torch.get_num_threads() if target.device.type == "cpu" else None,
                     chosen_by=CHOSEN_BY_TRAINING)


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
def choose_block_tree(target: torch.nn.Module, heads: torch.nn.Module, rank_accuracy: torch.Tensor,
                      rows: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """Tree for DFlash and P-EAGLE heads: the final evaluation's per-depth, per-rank acceptance
    table, the verify cost by tree size, and ONE draft forward as the drafting cost of every tree
    (a tree is read off the same forward's per-depth top-k, whatever its width).

    DFlash heads with training token counts also try each draft vocabulary of ``VOCAB_SIZES``, as
    `choose_static` does for Medusa: the table scaled per slot by the share of its hits that the
    restriction keeps on the held-out ``rows`` (each cut to ``BLOCK_VOCAB_ROW_TOKENS``), and the
    draft forward timed over that vocabulary; the best expected speedup wins."""
    verify = measure_verify_times(target, list(VERIFY_SIZES), context=_verify_context(target))
    sizes = one_forward_vocab_sizes(heads, VOCAB_SIZES) if rows else [None]
    ranks = rank_accuracy.shape[1]
    if len(sizes) > 1:
        rows = [r[:BLOCK_VOCAB_ROW_TOKENS] for r in rows]
        full = one_forward_accuracy(target, heads, rows, ranks)
    best = None
    for size in sizes:
        acc = rank_accuracy
        if size is not None:
            restricted = one_forward_accuracy(target, heads, rows, ranks, draft_vocab_size=size)
            kept = restricted.sum(1) / full.sum(1).clamp(min=1e-9)  # share of top-R hits left per slot
            acc = (rank_accuracy * kept.clamp(max=1.0)[:, None]).clamp(max=1.0)
        draft = one_forward_draft_seconds(heads, draft_vocab_size=size)
        result = choose_tree(acc, verify, draft, max_nodes=64, device=_device_label(target))
        result.draft_vocab_size = size
        if best is None or result.expected_speedup > best.expected_speedup:
            best = result
    return best.to_json()


def dynamic_prompts(target: torch.nn.Module, rows: list[torch.Tensor],
                    prompts: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """The [1, L] prompts EAGLE settings are timed (and their confidence measured) on: the plan
    prompts, else the beginnings of held-out rows, short enough for the target's positions."""
    limit = getattr(target.config, "max_position_embeddings", None) or 4096
    prompt_len = max(1, min(128, limit - DYNAMIC_NEW_TOKENS - 8))
    if prompts:
        return [p[-prompt_len:][None].to(target.device) for p in prompts[:DYNAMIC_PROMPTS]]
    return [row[:prompt_len][None] for row in rows[:DYNAMIC_PROMPTS]]


@torch.no_grad()
def choose_dynamic(target: torch.nn.Module, heads: torch.nn.Module, rows: list[torch.Tensor],
                   temperature: float = 0.0, greedy_choice: dict | None = None,
                   verify: dict[int, float] | None = None, prompts: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """EAGLE-2 settings for EAGLE/EAGLE-3 heads, timed end to end on ``prompts`` (the plan
    prompts; else held-out rows), at widths this machine's ``verify`` curve makes worth timing.
    At a sampling ``temperature``, with the greedy ``greedy_choice``: the short grid of the
    module docstring."""
    prompts = dynamic_prompts(target, rows, prompts)
    grid = dynamic_grid(target.device.type, restricts_vocab(heads), verify)
    if temperature > 0 and greedy_choice is not None:
        if greedy_choice.get("total_tokens") == 1:  # plain won greedily: sampling accepts less
            return {"tree": dict(greedy_choice), "calibration": {"skipped": "plain decoding won at temperature 0"},
                    "temperature": temperature}
        grid = sampling_grid(grid, greedy_choice)
    result = calibrate_dynamic_tree(target, heads, prompts, new_tokens=DYNAMIC_NEW_TOKENS, grid=grid, rounds=1,
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
    prompts: list[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The tree chosen at the end of training for ``temperature`` (0: greedy), measured on
    ``target``'s device: the tree, its draft vocabulary and the measurements behind them.

    ``rows``: a few held-out token rows (1-D); ``rank_accuracy``: the final evaluation's
    ``eval/rank_accuracy`` (static-tree heads), if there was an evaluation; ``greedy_choice``:
    the greedy tree (dynamic heads time a short grid around it); ``timings``: kept between
    temperatures (the verify curve, drafting times); ``prompts``: the plan prompts (1-D token
    rows) dynamic trees are timed on."""
    rows = [r.to(target.device) for r in rows if r.numel() >= 8][:SAMPLE_ROWS]
    if not rows:
        raise ValueError("no held-out rows of at least 8 tokens to choose a tree on")
    was_training, kind = heads.training, method_of(heads).tree
    try:
        if kind is TreeKind.DYNAMIC:
            verify = (timings or {}).get("verify")
            data = choose_dynamic(target, heads, rows, temperature, greedy_choice, verify=verify, prompts=prompts)
        elif kind is TreeKind.ONE_FORWARD:
            table = None if rank_accuracy is None else torch.tensor(rank_accuracy, dtype=torch.float32)
            if table is None or table.dim() != 2 or table.shape[0] != heads.config.num_heads:
                raise ValueError(f"{heads.head_type} heads choose their tree from the final evaluation's acceptance "
                                 "table; there was none")
            if temperature > 0:
                raise ValueError(f"{heads.head_type} heads choose their tree for greedy decoding only (their table "
                                 "holds greedy hit rates)")
            data = choose_block_tree(target, heads, table, rows)
        else:
            table = None if rank_accuracy is None else torch.tensor(rank_accuracy, dtype=torch.float32)
            if table is not None and (table.dim() != 2 or table.shape[0] != heads.config.num_heads or not math.isfinite(float(table.sum()))):
                table = None
            data = choose_static(target, heads, rows, table, temperature=temperature, timings=timings)
    finally:
        heads.train(was_training)
    data["chosen_by"] = CHOSEN_BY_TRAINING
    data["device_type"] = target.device.type
    data["device_name"] = device_name(target.device)
    data["temperature"] = float(temperature)
    return data


@contextmanager
def _in_eval(heads: torch.nn.Module) -> Iterator[None]:
    """Heads in eval mode while they are timed, then back in the mode they were in."""
    was_training = heads.training
    heads.eval()
    try:
        yield
    finally:
        heads.train(was_training)


def vs_generate_prompts(target: torch.nn.Module, rows: list[torch.Tensor],
                        prompts: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """What the check against ``generate`` decodes: the first ``VS_GENERATE_PROMPTS`` plan
    ``prompts`` (their last ``PLAN_PROMPT_TOKENS``), else the first ``VS_GENERATE_ROWS`` held-out
    rows cut to prompts (rows shorter than 8 tokens are left out, as in the tree choice); both
    leave room in the target's context for the new tokens."""
    limit = getattr(target.config, "max_position_embeddings", None) or 4096
    if prompts:
        length = max(1, min(PLAN_PROMPT_TOKENS, limit - VS_GENERATE_NEW_TOKENS - 8))
        return [p[-length:].to(target.device) for p in prompts[:VS_GENERATE_PROMPTS]]
    length = max(1, min(VS_GENERATE_PROMPT_LEN, limit - VS_GENERATE_NEW_TOKENS - 8))
    rows = [r.to(target.device) for r in rows if r.numel() >= 8]
    return [row[:length] for row in rows[:VS_GENERATE_ROWS]]


def time_against_generate(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    data: dict[str, Any],
    rows: list[torch.Tensor],
    measure: Callable[..., BatchPlanResult] = measure_batch_plan,
    try_lookup: bool = True,
    prompts: list[torch.Tensor] | None = None,
) -> BatchPlanResult | None:
    """``data``'s tree (a `choose_export_tree` result) against the target's ``generate`` at its
    temperature, at each of ``VS_GENERATE_BATCH_SIZES`` (module docstring), on the plan
    ``prompts`` (else held-out ``rows``); its plan says speculative or plain per batch size, and,
    with ``try_lookup``, where the tree behind prompt lookup runs. A tree that drafts nothing is
    plain decoding: None without ``try_lookup`` (nothing to time), else prompt lookup alone is its
    one candidate. ``measure``: `measure_batch_plan`, replaceable so a test can give the timings."""
    if drafts_nothing(data["tree"]) and not try_lookup:
        return None
    prompts = vs_generate_prompts(target, rows, prompts)
    if not prompts:
        raise ValueError("no held-out rows of at least 8 tokens to time the tree against generate on")
    started = time.perf_counter()
    vocab = data.get("draft_vocab_size") if method_of(heads).tree.rank_paths else None  # a dynamic tree carries its own
    bounds = {size: VS_GENERATE_BATCH_SECONDS for size in VS_GENERATE_BATCH_SIZES if size > 1}
    with _in_eval(heads):
        result = measure(target, heads, data["tree"], prompts, list(VS_GENERATE_BATCH_SIZES), new_tokens=VS_GENERATE_NEW_TOKENS,
                         rounds=VS_GENERATE_ROUNDS, temperature=data["temperature"], min_speedup=PLAIN_MARGIN,
                         max_seconds=VS_GENERATE_MAX_SECONDS, try_lookup=try_lookup, draft_vocab_size=vocab,
                         resolution=VS_GENERATE_RESOLUTION, max_seconds_by_size=bounds)
    result.measured[1]["seconds"] = time.perf_counter() - started  # warm-up included: what it cost the training
    return result


def check_against_generate(target: torch.nn.Module, heads: torch.nn.Module, data: dict[str, Any],
                           rows: list[torch.Tensor],
                           measure: Callable[..., BatchPlanResult] = measure_batch_plan,
                           try_lookup: bool = True, prompts: list[torch.Tensor] | None = None) -> BatchPlanResult | None:
    """`time_against_generate`, its verdict noted in ``data`` (``mode``, and ``batch``: the
    figures). A timing that fails keeps the chosen tree, as before this check existed, and says so:
    the heads and the other temperatures are worth more than this one check."""
    try:
        batch = time_against_generate(target, heads, data, rows, measure, try_lookup, prompts)
    except (RuntimeError, ValueError) as e:
        print(f"warning: timing the temperature-{data['temperature']:g} tree against generate failed ({e!r}); "
              "its entry stays speculative, unchecked (draftheads calibrate --batch-sizes 1 checks it)", flush=True)
        data["mode"] = SPECULATIVE
        data["vs_generate_error"] = repr(e)
        return None
    data["mode"] = PLAIN if batch is None else batch.plan[1]
    if batch is not None:
        data["batch"] = batch.measured[1]
        data["prompt_lookup"] = batch.lookup.get(1, False)
    return batch


def choose_export_plans(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    rows: list[torch.Tensor],
    rank_accuracy: list[list[float]] | None = None,
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES,
    measure: Callable[..., BatchPlanResult] = measure_batch_plan,
    try_lookup: bool = True,
    prompts: list[torch.Tensor] | None = None,
) -> tuple[TreePlans, list[dict[str, Any]]]:
    """The whole tree.json training writes: per temperature one entry per timed batch size, greedy first
    (which must succeed, and is chosen whether or not ``temperatures`` names 0), each timed
    against ``generate`` and plain where it loses (module docstring). A sampling temperature
    where no tree can be chosen (DFlash, P-EAGLE) times the greedy tree there instead.
    ``temperatures``: checked like calibrate's ``--temperatures`` (a negative, NaN or duplicate
    is a named error). ``try_lookup``: each tree is also timed behind prompt lookup, and an
    entry keeps it unless it is slower (`batch_plan`). ``prompts``: the plan prompts (1-D token
    rows) the trees are timed on (None: held-out ``rows``). Returns the table (with this machine's
    cost curve) and each temperature's `choose_export_tree` result, with ``mode``,
    ``prompt_lookup`` and the ``batch`` figures added."""
    temperatures = tuple(parse_temperatures(list(temperatures)))
    curve = cost_curve(target)
    print(describe_curve(curve), flush=True)
    timings: dict = {"verify": curve.verify_seconds}
    if method_of(heads).confidence is not None:  # the trees below rank their nodes by it
        with _in_eval(heads):
            heads.confidence = calibrate_confidence(target, heads, dynamic_prompts(target, rows, prompts),
                                                    new_tokens=DYNAMIC_NEW_TOKENS)
        print("confidence (chance of acceptance by rank and draft probability):\n  "
              + "\n  ".join(heads.confidence.summary()), flush=True)
    greedy = choose_export_tree(target, heads, rows, rank_accuracy, 0.0, timings=timings, prompts=prompts)
    chosen = [greedy]
    for temperature in (t for t in temperatures if t > 0):
        try:
            chosen.append(choose_export_tree(target, heads, rows, rank_accuracy, temperature,
                                             greedy_choice=greedy["tree"], timings=timings, prompts=prompts))
        except ValueError as e:
            print(f"tree: none chosen for temperature {temperature:g} ({e}); the greedy tree is timed there instead",
                  flush=True)
            chosen.append({**greedy, "temperature": temperature, "tree_from": f"temperature 0 ({e})"})
    entries: list[PlanEntry] = []
    for data in chosen:
        batch = check_against_generate(target, heads, data, rows, measure, try_lookup, prompts)
        entries += entries_for(data["tree"], data.get("draft_vocab_size"), data, data["device_type"],
                               data["temperature"], batch=batch, chosen_by=CHOSEN_BY_TRAINING,
                               device_name=data.get("device_name"))
    return TreePlans(tuple(entries), curves=(curve,)), chosen


def write_export_tree(
    accelerator,
    model: torch.nn.Module,
    heads_dir,
    rows: list[torch.Tensor],
    rank_accuracy: list[list[float]] | None,
    skip_reason: str | None = None,
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES,
    try_lookup: bool = True,
    prompts: list[torch.Tensor] | None = None,
) -> dict[str, Any] | None:
    """On the main process: choose the trees (one per temperature), time them against
    ``generate``, and write ``heads_dir/tree.json`` (atomically); every process meets at a barrier
    after. Returns a summary for metrics.json (main process), else None: the greedy tree's
    `describe`, every temperature's, which temperatures went plain, and the seconds spent.

    A failure here never costs the trained heads: they are already exported, and without a
    ``tree.json`` the decoder uses its device default; the reason is printed."""
    summary = None
    if accelerator.is_main_process:
        if skip_reason:
            print(f"tree: not chosen ({skip_reason}); the decoder will use its device default", flush=True)
        else:
            unwrapped = accelerator.unwrap_model(model)
            started = time.perf_counter()
            try:
                plans, chosen = choose_export_plans(unwrapped.target, unwrapped.heads, rows, rank_accuracy, temperatures,
                                                    try_lookup=try_lookup, prompts=prompts)
            except Exception as e:  # the heads are exported already; decoding falls back to a default
                print(f"warning: choosing a tree for the exported heads failed ({e!r}); "
                      "the decoder will use its device default (or run `draftheads calibrate`)", flush=True)
            else:
                path = write_plans(heads_dir, plans)
                if unwrapped.heads.confidence is not None:
                    write_confidence(heads_dir, unwrapped.heads.confidence)
                summary = summarize(chosen, time.perf_counter() - started)
                for data in chosen:
                    print(f"tree chosen for {data['device_type']} at temperature {data['temperature']:g}: "
                          f"{describe(data)['text']}", flush=True)
                print(f"-> {path} ({summary['seconds']:.1f} s, of which {summary['vs_generate_seconds']:.1f} s "
                      "timing against generate)", flush=True)
    accelerator.wait_for_everyone()
    return summary


def summarize(chosen: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """metrics.json's ``tree``: the greedy entry's `describe` at the top (as before plans per
    temperature), every temperature's, the temperatures that went plain and what timing against
    ``generate`` cost."""
    described = {f"{d['temperature']:g}": describe(d) for d in chosen}
    summary = describe(chosen[0])
    summary["seconds"] = seconds
    summary["temperatures"] = described
    summary["plain_temperatures"] = [float(d["temperature"]) for d in chosen if described[f"{d['temperature']:g}"]["mode"] == PLAIN]
    summary["vs_generate_seconds"] = sum(float(d.get("batch", {}).get("seconds", 0.0)) for d in chosen)
    return summary


def describe(data: dict[str, Any]) -> dict[str, Any]:
    """A short summary of one temperature's choice (for logs and metrics.json): the tree, and,
    where it was timed against ``generate``, the ratio and the verdict (``mode``)."""
    summary = _describe_tree(data)
    summary["mode"] = data.get("mode", PLAIN if drafts_nothing(data["tree"]) else SPECULATIVE)
    batch = data.get("batch")
    if batch:
        summary["vs_generate"] = {key: batch.get(f"speedup_{key}") for key in ("median", "min", "max")}
        summary["vs_generate"].update(prompts=batch.get("timed_batches"), needed=batch.get("min_speedup"),
                                      seconds=batch.get("seconds"), cut_by_time=batch.get("cut_by_time", False))
        cut = ", cut short by the time bound" if batch.get("cut_by_time") else ""
        timed = (f"{batch['speedup_median']:.2f}x target.generate (median of {batch['timed_batches']} prompt runs{cut}, "
                 f"{batch['speedup_min']:.2f}-{batch['speedup_max']:.2f})")
        needed = f"not above {batch['min_speedup']:.2f}x"
    if batch and batch.get("lookup_alone"):  # no tree of the heads paid: lookup alone was the one candidate
        summary["prompt_lookup"] = summary["mode"] == SPECULATIVE
        summary["text"] = (f"prompt lookup alone, the heads drafting nothing (no tree of theirs paid here); measured {timed}"
                           if summary["prompt_lookup"] else f"{summary['text']}; prompt lookup alone measured {timed}, {needed}")
    elif batch:
        behind = batch.get("prompt_lookup")
        if behind:
            summary["prompt_lookup"] = bool(data.get("prompt_lookup"))
            summary["vs_generate_behind_lookup"] = {key: behind.get(f"speedup_{key}") for key in ("median", "min", "max")}
            timed += (f"; behind prompt lookup {behind['speedup_median']:.2f}x "
                      f"({behind['speedup_min']:.2f}-{behind['speedup_max']:.2f})")
        if summary["mode"] == PLAIN:
            summary["text"] = f"plain decoding (target.generate): the {summary['text']} measured {timed}, {needed}"
        else:
            summary["text"] += f"{', behind prompt lookup' if data.get('prompt_lookup') else ''}; measured {timed}"
    elif data.get("vs_generate_error"):
        summary["text"] += f"; NOT timed against target.generate ({data['vs_generate_error']})"
    return summary


def _describe_tree(data: dict[str, Any]) -> dict[str, Any]:
    """The tree itself: its size, vocabulary and what the cost model expected of it."""
    tree = tree_spec(data["tree"])
    if tree.drafts_nothing:  # root-only: plain steps
        return {"text": "plain decoding (no tree paid for its drafting and verification on this device)",
                "nodes": 1, "draft_vocab_size": None}
    if isinstance(tree, DynamicTree):
        calibration = data.get("calibration", {})
        vocab = tree.draft_vocab_size
        speedup = calibration.get("tokens_per_second", 0) / max(calibration.get("plain_tokens_per_second", 0), 1e-9)
        text = (f"dynamic tree {tree.total_tokens} tokens, depth {tree.depth}, top-{tree.top_k}, "
                f"{'whole vocabulary' if not vocab else f'{vocab}-token draft vocabulary'}, "
                f"{speedup:.2f}x the decode loop's one-token steps measured")
        return {"text": text, "tree": tree.to_json(), "draft_vocab_size": vocab, "measured_speedup": speedup}
    vocab = data.get("draft_vocab_size")
    text = (f"static tree of {tree.nodes} nodes, {'whole vocabulary' if not vocab else f'{vocab}-token draft vocabulary'}, "
            f"expected {data['expected_tokens_per_step']:.2f} tokens/step, {data['expected_speedup']:.2f}x one-token steps")
    return {"text": text, "nodes": tree.nodes, "draft_vocab_size": vocab,
            "expected_tokens_per_step": data["expected_tokens_per_step"], "expected_speedup": data["expected_speedup"]}
