"""`SpeculativeDecoder`: argument checks and the choice of mode; the decoding itself is `loop.py`.

``generate`` checks a call once (``_check_request``: every error a call can meet before it
decodes, in a fixed order), which leaves a `Request`; then it decodes that request. A request is
decoded plainly (the target's `generate`, for batch sizes the batch plan marks plain) or
speculatively: one unpadded row in a dynamic or static cache (`kv.SequenceKV`, `kv.StaticKV`),
anything else in a ragged batch cache (`kv.RaggedKV`); all through the same loop.
"""
from __future__ import annotations

import dataclasses
import operator
import os
from typing import Any, Mapping

import torch

from ..plans import PLAIN, SPECULATIVE, BatchPlan, TreePlans, TreeSpec
from ..heads.config import text_config
from .accept import ACCEPTANCE
from .compaction import check_compaction
from .inputs import check_batch, eos_ids, pad_id, token_matrix, wants_batch_path
from .masks import model_name
from .kv import CACHE_KINDS, RaggedKV, SequenceKV, StaticKV, StaticTreeVerifier, tree_headroom
from .loop import Settings, decode
from .output import SpeculativeOutput
from .draft_budget import DraftBudget, PerSourceBudget, resolve_budget
from .plain import generate_plain
from .planned import PlannedDrafts, PlannedRun, resolve_plans
from .probe import check_tree_attention
from .proposers.drafter import Drafter
from .proposers.prompt_lookup import PromptLookupProposer
from .proposers.sequence import Proposer, as_drafter
from .sampling import SamplingParams, resolve_generator, resolve_sampling, warn_unapplied_settings
from .tree import TreeShape
from .verify import TreeVerifier


def _whole_number(value: Any, name: str) -> int:
    """``value`` as an int if it is one (numpy and 0-d tensor ints too), else a named error: a
    float like 2.5 must not be truncated or break the loop's bookkeeping halfway."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a whole number, got {type(value).__name__} {value!r}") from None


_ONE_ROW_STREAMING = "streaming supports one sequence at a time (as transformers' streamers do): pass one row"


@dataclasses.dataclass(frozen=True)
class Request:
    """One ``generate`` call as `SpeculativeDecoder._check_request` leaves it: every argument
    checked and resolved, so decoding reads it and checks nothing again."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor | None  # [B, T] where ``batched``; None for one unpadded row
    batched: bool  # several rows or padding (the ragged cache), or plain decoding: it reads the mask
    max_new_tokens: int
    params: SamplingParams
    eos: list[int]
    pad: int | None
    acceptance: str
    generator: torch.Generator | None
    streamer: Any
    run: PlannedRun  # the plan's entry for the batch size and temperature: mode and proposer


def _device_of(model: torch.nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def _headroom(proposers: list) -> int | None:
    """Cache slots beyond prompt + new tokens the largest tree of the plan may take (static cache)."""
    sizes = [tree_headroom(p) for p in proposers]
    return None if any(s is None for s in sizes) else max(sizes)


class SpeculativeDecoder:
    """Lossless speculative decoding of ``target`` with heads (drafting through the drafter their
    method declares), any `Drafter`, or a per-sequence `Proposer` (prompt lookup, a draft model:
    wrapped once, `proposers.sequence.ForkedRows`).

    ``check_model`` probes once that the target honours a 4D tree mask and raises
    ``UnsupportedModelError`` otherwise, instead of decoding garbage.

    ``cache="static"`` (opt-in; one sequence at a time) decodes in a preallocated KV cache of fixed
    length (`inference.kv.static`), so every verify forward of a given tree size has the same
    shapes; ``compile=True`` (or a backend name such as "aot_eager") then runs that forward through
    ``torch.compile(dynamic=False)``: one compilation per padded tree size (Medusa/Hydra: one; chains:
    a power of two each), paid on first use (seconds to minutes on a CPU).
    ``max_cache_len`` fixes the static cache's length (calls needing more are refused); by default
    it is sized per call (prompt + max_new_tokens + tree, rounded up to 64) and reused. Same output
    as the default dynamic cache; whether it is faster depends on the device: measure it
    (benchmarks/gpu.sh, its static_cache section).

    ``tree`` (heads only) drafts one tree for every request: a `StaticTree` or rank paths such
    as ``[[0], [1], [0, 0]]`` (Medusa, Hydra, P-EAGLE, DFlash), a `DynamicTree` or its settings
    such as ``{"total_tokens": 12, "depth": 5, "top_k": 4}`` (EAGLE, EAGLE-3) (`plans.trees`),
    also where the table says plain, and without the table's prompt lookup (what the caller asks
    for wins; the table fills in only what is left open: `inference.planned`).
    Heads without a ``tree`` follow a table (tree.json, `draftheads.plans`): ``plans`` (a
    `TreePlans`, or a heads folder or tree.json path), else the one they were loaded with
    (``heads.plans``); what to run per device type x batch size x temperature, a tree or plain decoding (the
    target's own `generate`). Each request runs the entry for this decoder's device type, the
    nearest measured temperature (greedy = 0) and the largest measured batch size at or below its
    own (`inference.planned`); entries measured on ANOTHER device type are ignored, with a
    warning, and the device default tree is drafted. ``out.stats["plan"]`` says which entry ran.

    ``batch_plan`` says whether that table also decides plain decoding: ``"heads"`` (default)
    follows it; ``None`` always speculates (trees still follow the table); a dict such as
    ``{1: "speculative", 4: "plain"}`` forces the mode per batch size (sizes between keys follow
    the nearest key at or below, see `plans.batch_sizes`). Proposers (prompt lookup, a draft
    model) have no heads folder, so a dict is their only plan.

    ``compaction`` says when a batch's caches (the target's, and EAGLE's draft cache) remove the
    holes rows leave when they accept different numbers of tokens: "auto", "never" or "always"
    (`inference.compaction`); the output is the same either way.

    ``draft_budget`` decides, step by step within a generation, how deep to draft: "auto"
    (default, `inference.draft_budget.OnlineDraftBudget`) measures what speculation earns
    (accepted tokens per step) against what a step costs, and caps the draft to a shallower
    sub-tree, or to a plain root-only step, when that is faster, probing the full draft again now
    and then; ``None`` always drafts in full (seed-reproducible sampling); or a `DraftBudget`.
    Lossless either way: a step's cap depends only on earlier steps. With "auto" the decoder keeps
    one budget per proposer and sampling settings, and what it learned (step costs, accepted
    tokens per depth) carries from one generation to the next. Behind prompt lookup only the
    copies have a budget (`draft_budget.PerSourceBudget`: judged by what copies earn), and the heads
    draft as the plan chose. ``out.stats["draft_budget"]`` counts the steps taken full, capped and
    plain.

    ``draw_drafts`` (default True): when a request SAMPLES, heads draw each draft token from their
    own distribution (processed with the request's temperature/top-k/top-p) as a chain as deep as
    their tree, and the verifier accepts it with probability 1 - TV(target, draft)
    (`proposers.sampled`); heads that draft dynamic trees (EAGLE, EAGLE-3, MTP, top_k > 1) draw a
    tree of siblings without replacement, shaped by how often each sibling was accepted
    (`proposers.drawn_trees`). False keeps their top-k tree (point masses, accepted with the
    target's probability of each candidate). All are exact; drawn chains accept more tokens per
    step than top-k trees at T = 0.7-1.0, drawn trees more than drawn chains of the same verify
    tokens (docs/results.md). Greedy decoding is not affected; prompt lookup has no distribution
    to draw from and a draft model always samples.

    ``prompt_lookup`` (heads only): prompt lookup in front of the heads. Each step a row whose text
    matches an earlier n-gram (by default n from 3 down to 2) drafts the copy, and the heads draft
    the other rows (`proposers.hybrid.LookupThenHeads`). None (the default) does so where the
    heads' plan says it measured faster (tree.json's ``prompt_lookup``); True (or a configured
    `PromptLookupProposer`) for every request, also those the plan marks plain; False never (an
    entry that speculated only by lookup then decodes plainly). ``out.stats["plan"]["from"]`` says
    what decided the mode, the tree and the lookup: the arguments or tree.json."""

    def __init__(
        self,
        target: torch.nn.Module,
        proposer: Drafter | Proposer | torch.nn.Module,
        tree: TreeSpec | list[list[int]] | dict | TreeShape | None = None,
        check_model: bool = True,
        cache: str = "dynamic",
        compile: bool | str = False,
        max_cache_len: int | None = None,
        batch_plan: str | Mapping[int | str, str] | None = "heads",
        compaction: str = "auto",
        draft_budget: str | DraftBudget | None = "auto",
        draw_drafts: bool = True,
        prompt_lookup: bool | PromptLookupProposer | None = None,
        plans: TreePlans | str | os.PathLike | None = None,
    ) -> None:
        self.compaction = check_compaction(compaction)
        if prompt_lookup is not None and not isinstance(prompt_lookup, (bool, PromptLookupProposer)):
            raise ValueError(f"prompt_lookup must be None (the heads' plan decides), True, False or a "
                             f"PromptLookupProposer, got {prompt_lookup!r}")
        if not isinstance(draw_drafts, bool):
            raise ValueError(f"draw_drafts must be True or False, got {draw_drafts!r}")
        self.draw_drafts = draw_drafts
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {CACHE_KINDS}, got {cache!r}")
        if max_cache_len is not None and _whole_number(max_cache_len, "max_cache_len") < 1:
            raise ValueError(f"max_cache_len must be >= 1 (or None to size the cache per call), got {max_cache_len}")
        if not isinstance(compile, (bool, str)):
            raise ValueError(f"compile must be True/False or a torch.compile backend name, got {compile!r}")
        if cache != "static" and (compile or max_cache_len is not None):
            raise ValueError(
                "compile and max_cache_len need cache='static': with the dynamic cache every verify forward "
                "has new shapes, so a compiled forward would recompile every step"
            )
        self._draft_budget_arg = draft_budget
        self.draft_budget = resolve_budget(draft_budget)  # the first request's (see `_budget`)
        self._budget_given = isinstance(draft_budget, DraftBudget)
        self._budgets: dict[tuple, DraftBudget] = {}
        drafter = as_drafter(proposer)  # None: heads
        if drafter is None:
            bind = getattr(proposer, "bind_target", None)
            if bind is None:
                raise TypeError(f"expected heads, a Drafter or a Proposer, got {type(proposer).__name__}")
            bind(target)  # refuses heads trained for another target
            # The saved plans' trees (or this device type's default): each head type drafts its own way.
            self.drafts = PlannedDrafts(proposer, _device_of(target), tree, batch_plan=batch_plan,
                                        prompt_lookup=prompt_lookup, plans=resolve_plans(proposer, plans))
        elif prompt_lookup:
            raise ValueError("prompt_lookup=... goes with heads (lookup first, the heads where it finds no match); "
                             "to draft by lookup alone pass a PromptLookupProposer as the proposer")
        elif tree is not None or plans is not None:
            raise ValueError("`tree` and `plans` apply to heads; a drafter brings its own tree")
        else:
            drafter.bind_target(target)
            self.drafts = PlannedDrafts(drafter, _device_of(target), is_heads=False, batch_plan=batch_plan)
        for each in self.drafts.proposers:
            each.use_compaction(self.compaction)
        proposer = self.drafts.proposers[0]  # what one greedy sequence runs
        self.batch_plan: BatchPlan | None = self.drafts.batch_plan()
        self.target = target.eval()
        self.proposer = proposer
        # Only the hidden states the proposer reads are captured (none for prompt lookup).
        dynamic_verifier = TreeVerifier(target, feature_layers=proposer.feature_layers)
        self.verifier = dynamic_verifier
        self.cache = cache
        if cache == "static" and dynamic_verifier.recurrent is not None:
            raise ValueError(
                f"cache='static' preallocates attention keys and values only, but {model_name(target)} has layers "
                f"that keep a recurrent state ({', '.join(dynamic_verifier.recurrent.state_types)}): decode it with "
                "the default cache='dynamic', whose stores record and roll back that state"
            )
        if cache == "static":
            self.verifier = StaticTreeVerifier(
                target, proposer.feature_layers, compile=compile, max_cache_len=max_cache_len, headroom=_headroom(self.drafts.proposers)
            )
        if check_model:  # the 4D-mask property the static path relies on too
            check_tree_attention(target, dynamic_verifier)
        self.max_positions = getattr(text_config(target), "max_position_embeddings", None)
        warn_unapplied_settings(getattr(target, "generation_config", None))

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int = 128,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        eos_token_id: int | list[int] | None = None,
        streamer: Any = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        acceptance: str = "exact",
        do_sample: bool | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> SpeculativeOutput:
        """Like ``target.generate`` for one sequence. Every setting left ``None`` comes from the
        target's generation config, as in `generate`: ``eos_token_id`` (pass ``[]`` to never stop
        early), greedy or sampling (``do_sample``; unset = greedy), and when sampling its
        ``temperature``, ``top_k``, ``top_p`` (transformers' defaults 1.0, 50, 1.0 where it has none).
        ``temperature=0`` is always greedy, an explicit ``temperature > 0`` always samples.

        ``acceptance="typical"`` switches sampling to Medusa's typical acceptance: more tokens per
        step, but LOSSY (not the target's distribution). The default, "exact", is lossless (recursive
        rejection); "block" is block verification of chains, lossless too (trees keep "exact").

        A batch ``input_ids`` [B, T] (left-padded, with its ``attention_mask``, as for `generate`)
        decodes all rows together, each exactly as `generate` decodes it (see `inference.kv.ragged`).

        A request the decoder's plan marks plain is decoded by ``target.generate`` itself;
        ``out.stats["mode"]`` says which mode ran ("speculative" or "plain") and
        ``out.stats["plan"]`` which tree.json entry chose it (``entry``: device type, batch size,
        temperature, mode, chosen_by; ``tree``: "calibration", "training", "device default" or
        "given")."""
        request = self._check_request(input_ids, max_new_tokens, temperature, top_p, top_k, eos_token_id, streamer,
                                      generator, seed, acceptance, do_sample, attention_mask)
        if request.run.mode == PLAIN:  # the target's own `generate`, on the same checked inputs
            out = generate_plain(self.target, request.input_ids, request.attention_mask, request.max_new_tokens,
                                 request.params, request.eos, request.pad, request.generator, request.streamer)
            out.stats = {**out.stats, "plan": request.run.stats}
            return out
        if request.batched:
            store = RaggedKV(self.verifier, request.attention_mask, self.compaction)
        else:
            store = (StaticKV if self.cache == "static" else SequenceKV)(self.verifier, request.max_new_tokens)
        settings = Settings(request.max_new_tokens, request.params, self.target.device, set(request.eos), request.pad,
                            request.acceptance, request.generator, request.streamer,
                            self._budget(request.run.proposer, request.params))
        out = decode(store, request.run.proposer, request.input_ids, settings)
        out.stats = {"mode": SPECULATIVE, "plan": request.run.stats, **out.stats}
        return out

    def _check_request(self, input_ids, max_new_tokens, temperature, top_p, top_k, eos_token_id, streamer,
                       generator, seed, acceptance, do_sample, attention_mask) -> Request:
        """``generate``'s arguments checked, in one place and in this order: the settings
        (acceptance, sampling, the generator, ``max_new_tokens``), the plan's run for the batch
        size and temperature (its mode decides which path the inputs take), what that path cannot
        decode with, then the inputs as `generate` reads them (left padding, EOS and pad ids) and
        the context they fit in. Decoding checks nothing of the call after this."""
        if acceptance not in ACCEPTANCE:
            raise ValueError(f"acceptance must be {' or '.join(map(repr, ACCEPTANCE))}, got {acceptance!r}")
        params = resolve_sampling(getattr(self.target, "generation_config", None), do_sample, temperature, top_k, top_p)
        params = dataclasses.replace(params, sample_drafts=self.draw_drafts and not params.greedy)
        generator = resolve_generator(generator, seed)  # the one place a seed becomes a generator
        if acceptance == "typical" and params.greedy:
            raise ValueError("typical acceptance needs temperature > 0 (at temperature 0 decoding is greedy and exact)")
        max_new_tokens = _whole_number(max_new_tokens, "max_new_tokens")
        input_ids = token_matrix(input_ids)
        run = self.drafts.run_for(input_ids.shape[0], 0.0 if params.greedy else params.temperature)
        plain = run.mode == PLAIN
        batched = plain or wants_batch_path(input_ids, attention_mask)  # plain decoding reads a batch and its mask
        if plain:
            if streamer is not None and input_ids.shape[0] > 1:
                raise ValueError(_ONE_ROW_STREAMING)
        elif batched:  # a batch, or a padded row: the ragged cache
            if self.cache == "static":
                raise ValueError(
                    f"cache='static' decodes one sequence at a time (got input_ids of shape {list(input_ids.shape)}"
                    f"{' with an attention_mask' if attention_mask is not None else ''}); for batches use the default "
                    "cache='dynamic', whose batched loop keeps a ragged cache"
                )
            if streamer is not None:
                raise ValueError(_ONE_ROW_STREAMING)
        eos = eos_ids(self.target, eos_token_id)
        pad = pad_id(self.target, eos)
        if batched:
            input_ids, attention_mask = check_batch(input_ids, attention_mask, pad, eos)
            prompt = f"{input_ids.shape[1]} tokens, padding included"
        else:  # one unpadded row: its mask says nothing
            if input_ids.shape[1] == 0:
                raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
            attention_mask, prompt = None, f"{input_ids.shape[1]} tokens"
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        total = input_ids.shape[1] + max_new_tokens
        if self.max_positions is not None and total > self.max_positions:
            raise ValueError(
                f"prompt ({prompt}) + max_new_tokens ({max_new_tokens}) = {total} exceeds "
                f"the model's context of {self.max_positions} positions"
            )
        sources = getattr(run.proposer, "budget_sources", ())
        if not plain and isinstance(self.draft_budget, PerSourceBudget) and not sources:  # given so, explicitly
            raise ValueError(f"a PerSourceBudget caps the sources of a drafter that routes rows between them "
                             f"(heads behind prompt lookup); {getattr(run.proposer, 'name', type(run.proposer).__name__)} "
                             "drafts one way: pass 'auto', None or a DraftBudget")
        return Request(input_ids, attention_mask, batched, max_new_tokens, params, eos, pad, acceptance, generator,
                       streamer, run)

    def _budget(self, proposer: Any, params: SamplingParams) -> DraftBudget:
        """This call's draft budget, started for a new generation: one per proposer (the plan's tree
        for the request) and sampling settings, since both what a step costs (a 16-node tree or a
        drawn chain of the same depth) and what it earns (the temperature) depend on them; a budget
        given explicitly serves every request."""
        budget = self.draft_budget
        sources = getattr(proposer, "budget_sources", ())
        if not self._budget_given:
            key = (id(proposer), params.temperature, params.top_k, params.top_p, params.draws_drafts)
            if key not in self._budgets:
                if sources and type(budget) is not DraftBudget:  # a budget per source (`PerSourceBudget`)
                    self._budgets[key] = PerSourceBudget({s: resolve_budget(self._draft_budget_arg) for s in sources})
                else:
                    self._budgets[key] = budget if not self._budgets else resolve_budget(self._draft_budget_arg)
            budget = self._budgets[key]
        if sources:
            proposer.use_budget(budget if isinstance(budget, PerSourceBudget) else None)
        budget.start()
        return budget

    def mode_for(self, batch_size: int, temperature: float = 0.0) -> str:
        """"speculative" or "plain": how a batch of ``batch_size`` rows at ``temperature`` (0:
        greedy) is decoded under this decoder's plan."""
        return self.drafts.run_for(batch_size, temperature).mode
