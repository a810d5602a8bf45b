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

How long a chain to draft is the decoder's draft budget's decision (`inference.draft_budget`),
the one rule every proposer has: the proposer drafts up to its ``gamma`` (``"auto"``:
``max_gamma``) and the budget caps each step, down to a plain step, from what earlier steps
accepted and cost. A capped chain is the full chain's prefix, which is all the budget needs.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from transformers import DynamicCache

from ..output import logits_to_keep
from ..sampling import SamplingParams, sample
from ..tokenizer_check import check_same_tokenizer, tokenizer_size
from ..tree import Tree, chain_shape
from ..recurrent import recurrent_layout
from ..verify import cache_kwarg
from .sequence import Proposer


def _logits_rows(model: torch.nn.Module) -> int:
    """Size of the model's logits (rows of the LM head; may exceed the tokenizer: padded vocabs)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


# -- the proposer -----------------------------------------------------------------------------------
class DraftModelProposer(Proposer):
    """Drafts with ``draft_model`` (any HF causal LM sharing the target's tokenizer).

    ``gamma``: the longest chain a step drafts, an int (0 = plain decoding) or ``"auto"``
    (``max_gamma``); the decoder's draft budget (default "auto") caps it step by step, down to plain
    steps where drafting does not pay. ``SpeculativeDecoder(..., draft_budget=None)`` drafts exactly
    ``gamma`` every step. Pass ``tokenizers=(target_tok, draft_tok)`` (or ``target_tokenizer=`` and
    ``draft_tokenizer=``) to check that both tokenizers map every token to the same id.

    Vocabulary sizes: the draft's logits must have as many rows as the target's. Models that pad
    their LM head (e.g. to a multiple of 64) may differ in padding only; this is accepted when the
    tokenizers are given and both logit sizes cover ``len(tokenizer)``. The draft's logits are then
    cut or padded (with -inf) to the target's size, so q is a distribution over the target's ids
    and the draft never proposes an id the target does not have. Still lossless: q is exactly what
    the drafts are sampled from. Without tokenizers, differing sizes are refused.
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
    ) -> None:
        if isinstance(max_gamma, bool) or not isinstance(max_gamma, int) or max_gamma < 1:
            raise ValueError(f"max_gamma must be an int >= 1, got {max_gamma!r}")
        if isinstance(gamma, str):
            if gamma != "auto":
                raise ValueError(f"gamma must be an int >= 0 or 'auto', got {gamma!r}")
            self.gamma = max_gamma
        else:
            if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 0:
                raise ValueError(f"gamma must be an int >= 0 or 'auto', got {gamma!r}")
            self.gamma = int(gamma)
        self.gamma_mode: int | str = gamma if isinstance(gamma, str) else self.gamma
        self.histogram: dict[int, int] = {}  # drafted chain length -> steps, this generation
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
        # A hybrid draft (e.g. a small Qwen3.5 for a large one): its recurrent layers record their states
        # while it drafts, so that rejected drafts can be cropped from them as from its KV entries.
        self._draft_layout = recurrent_layout(draft_model)
        self.draft_vocab = _logits_rows(draft_model)
        if self.tokenizer_size is not None and self.draft_vocab < self.tokenizer_size:
            raise ValueError(
                f"the draft model's logits cover {self.draft_vocab} ids but the tokenizer has {self.tokenizer_size} "
                "tokens: this draft cannot score every token (wrong checkpoint or tokenizer?)"
            )
        self.target_vocab: int | None = None  # set by bind_target
        self._cache_arg = cache_kwarg(draft_model)
        self._keep_last = logits_to_keep(draft_model, 1)
        self._cache: DynamicCache | None = None
        self._pending: list[int] = []
        self._drafts: list[int] = []
        self._in_flight = False
        self._params = SamplingParams()
        self._generator: torch.Generator | None = None
        self._draft_seconds = 0.0

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

    @property
    def device(self) -> torch.device:
        return next(self.draft.parameters()).device

    def start(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, params: SamplingParams, generator) -> None:
        # Lazy prefill: the prompt is fed together with the first root (one forward, not two),
        # and not at all if the first steps fall back to plain decoding.
        self._cache = DynamicCache() if self._draft_layout is None else self._draft_layout.new_cache()
        self._pending = [int(t) for t in input_ids.reshape(-1).tolist()]
        self._drafts = []
        self._in_flight = False
        self._params = params
        self._generator = generator
        self._draft_seconds = 0.0
        self.histogram = {}

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
        gamma = max(min(max_depth, self.gamma), 0)
        self.histogram[gamma] = self.histogram.get(gamma, 0) + 1
        self._in_flight = True
        if gamma == 0:
            # Plain decoding step: the draft sees the root later, with the next drafted step.
            self._pending.append(int(root))
            self._drafts = []
            return Tree(chain_shape(0), torch.tensor([root], dtype=torch.long))

        feed = self._pending + [int(root)]
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        start = time.perf_counter()
        if self._draft_layout is not None:  # every state this burst passes through, for `accepted`'s crop
            self._cache.activate_past_recording(recurrent_states_to_keep=len(feed) + gamma)
        for _ in range(gamma):
            token, q = self._pick(self._forward(feed))
            drafts.append(token)
            if q is not None:
                rows.append(q)
            feed = [token]
        self._draft_seconds += time.perf_counter() - start
        # The cache now holds the old prefix + pending + root + drafts[:-1].
        self._pending = []
        self._drafts = drafts
        tokens = torch.tensor([root, *drafts], dtype=torch.long)
        draft_probs = None
        if rows:
            draft_probs = torch.cat([torch.zeros_like(rows[0])[None], torch.stack(rows)])
        return Tree(chain_shape(gamma), tokens, draft_probs)

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
        if remove or self._draft_layout is not None:
            # negative = number of entries to drop (all transformers versions); a hybrid draft's state
            # layers also go back to their one-token size, and stop recording, even when nothing is dropped
            self._cache.crop(-remove)
        if k == gamma:
            self._pending = [self._drafts[-1]]  # accepted but never fed to the draft

    def stats(self) -> dict:
        steps = sum(self.histogram.values())
        return {
            "proposer": "draft_model",
            "gamma_mode": self.gamma_mode,
            "gamma_mean": sum(g * c for g, c in self.histogram.items()) / max(steps, 1),
            "gamma_histogram": dict(sorted(self.histogram.items())),  # chain length drafted -> steps
            "draft_seconds": self._draft_seconds,
        }

    # -- introspection (tests, debugging) ---------------------------------------------------------
    @property
    def cache_length(self) -> int:
        """Tokens in the draft's cache (the committed length minus ``len(pending)``)."""
        return 0 if self._cache is None else int(self._cache.get_seq_length())

    @property
    def pending(self) -> list[int]:
        return list(self._pending)
