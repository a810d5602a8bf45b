"""How one draft distribution is scored against the target's at one position: `heads.loss`.

Every draft-layer loss (EAGLE's classification term, EAGLE-3's training-time-test steps, P-EAGLE's
depths, DFlash's block slots) scores a row the same way, through `row_losses`, so an option means
the same thing for every head type that takes it:

- ``soft_ce`` (the default): cross-entropy against the target's distribution p,
  ``-sum_x p(x) log q(x)`` (EAGLE-1's classification term, EAGLE-3, SpecForge).
- ``kl``: forward KL(p || q) = soft CE - H(p). H(p) does not depend on the draft, so the gradient
  with respect to the draft is EXACTLY soft CE's: ``kl`` is the same objective, trained to the same
  weights bit for bit (a test checks it); only the reported loss differs (0 where q = p). It is
  offered because speculators reports it (its default, ``kl_div``), not as another recipe.
- ``ce``: cross-entropy on the target's greedy token (hard labels, EAGLE-1's classification part as
  its paper describes it): what greedy verification accepts, blind to the rest of p.
- ``lk``: the negative log acceptance rate of the LK losses (arXiv 2602.23881):
  ``-log alpha`` with ``alpha = sum_x min(p(x), q(x))`` = 1 - TV(p, q), the probability that
  lossless speculative sampling accepts a token drafted from q. Optimising alpha directly is what
  sampling verification pays for; the log scales the total-variation gradient (which is tiny where
  alpha is small) by 1/alpha. The paper's other member, a KL + TV hybrid with an adaptive weight,
  is not built: the public sources read here do not pin down its schedule.

p is the target's distribution over the tokens the draft scores (EAGLE-3 and P-EAGLE: restricted to
the draft vocabulary and renormalised; rows whose target argmax lies outside it are left out by
the callers), and the greedy label is its argmax there.
"""
from __future__ import annotations

import torch

from ..schema import TARGET_LOSSES

DEFAULT_LOSS = "soft_ce"


def check_loss_name(name: str) -> str:
    """``name`` when it is a known loss, else an error naming the valid ones (for heads built or
    loaded outside the config, whose checking happens in pydantic)."""
    if name not in TARGET_LOSSES:
        raise ValueError(f"heads.loss: unknown loss {name!r}; valid: {', '.join(TARGET_LOSSES)}")
    return name


def loss_of(extra: dict) -> str:
    """The loss a heads config says to train with: its ``loss``; DFlash heads saved before the
    option was shared say ``block_loss`` (their ``kl`` was computed as soft CE: the same objective)."""
    if "loss" in extra:
        return check_loss_name(extra["loss"])
    return {"kl": "soft_ce", "ce": "ce"}.get(extra.get("block_loss", DEFAULT_LOSS), DEFAULT_LOSS)


def needs_distribution(kind: str) -> bool:
    """Whether the loss reads the target's whole distribution (``ce`` reads only its argmax)."""
    return kind != "ce"


def row_losses(kind: str, draft_logits: torch.Tensor, target_probs: torch.Tensor | None,
               target_top: torch.Tensor) -> torch.Tensor:
    """``[n]``: each row's loss. ``draft_logits`` [n, V] (fp32, with grad), ``target_probs`` [n, V]
    the target's distribution over the same V tokens (None for ``ce``), ``target_top`` [n] its
    argmax (an index into V)."""
    logq = draft_logits.log_softmax(-1)
    if kind == "ce":
        return -logq.gather(-1, target_top[:, None]).squeeze(-1)
    if target_probs is None:
        raise ValueError(f"heads.loss={kind!r} needs the target's distribution")
    if kind == "soft_ce":
        return -(target_probs * logq).sum(-1)
    if kind == "kl":  # soft CE minus the target's entropy (a constant for the draft)
        entropy = -torch.special.xlogy(target_probs, target_probs).sum(-1)
        return -(target_probs * logq).sum(-1) - entropy.detach()
    if kind == "lk":
        alpha = torch.minimum(target_probs, logq.exp()).sum(-1)
        return -alpha.clamp(min=torch.finfo(alpha.dtype).tiny).log()
    raise ValueError(f"heads.loss: unknown loss {kind!r}; valid: {', '.join(TARGET_LOSSES)}")


# A window's whole label table is kept when it is at most this large (fp32 probabilities over the
# draft's vocabulary for every position); past it, each chunk recomputes its rows' labels.
LABEL_TABLE_BYTES = 1 << 30


class TargetRows:
    """The target's side of a loss at window positions: its argmax (an index into the tokens the
    draft scores), whether that argmax lies among them, its distribution over them (None for
    ``ce``), and the final hidden state itself (EAGLE-1's regression label); plus its greedy token
    as a target id (`greedy_ids`, for ``heads.greedy_path``) from the same LM-head pass.

    Several draft rows score the same position: EAGLE's unrolled step k+1 scores the positions of
    step k shifted by one, P-EAGLE's depths and DFlash's overlapping blocks likewise. The target's
    LM head (vocabulary x hidden per row: at real sizes the largest matmul of a draft step) then
    runs once per window position instead of once per scoring row. The table is computed in chunks
    of ``chunk_size`` positions and kept while it fits in ``LABEL_TABLE_BYTES``; a larger window
    (a full vocabulary of 128k over thousands of positions) falls back to computing each chunk's
    rows on the fly, as the losses did before. Either way ``rows`` returns the same values.

    ``vocab_ids``: the target ids the draft scores (EAGLE-3 / P-EAGLE's draft vocabulary, their
    probabilities renormalised over it) or None for the whole vocabulary; ``target_to_draft``
    maps a target id to its index there (-1 outside)."""

    def __init__(self, lm_head: torch.nn.Module, last_hidden: torch.Tensor, kind: str,
                 vocab_ids: torch.Tensor | None = None, target_to_draft: torch.Tensor | None = None,
                 chunk_size: int = 1024) -> None:
        self.lm_head, self.kind, self.chunk_size = lm_head, kind, chunk_size
        self.vocab_ids, self.target_to_draft = vocab_ids, target_to_draft
        self.hidden = last_hidden.reshape(-1, last_hidden.shape[-1])
        width = lm_head.weight.shape[0] if vocab_ids is None else vocab_ids.numel()
        table_bytes = self.hidden.shape[0] * width * 4 if needs_distribution(kind) else 0
        self.table = None
        if table_bytes <= LABEL_TABLE_BYTES:
            parts = [self._compute(self.hidden[i : i + chunk_size]) for i in range(0, self.hidden.shape[0], chunk_size)]
            self.table = tuple(torch.cat(col) if col[0] is not None else None for col in zip(*parts)) if parts else None

    @torch.no_grad()
    def _compute(self, hidden: torch.Tensor):
        logits = self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
        greedy = logits.argmax(-1)  # a target id
        if self.vocab_ids is None:
            top, inside = greedy, torch.ones_like(greedy, dtype=torch.bool)
        else:
            inside = self.target_to_draft[greedy] >= 0
            logits = logits[:, self.vocab_ids]
            top = self.target_to_draft[greedy].clamp(min=0)
        p = logits.softmax(-1) if needs_distribution(self.kind) else None
        return top, inside, p, greedy

    @torch.no_grad()
    def greedy_ids(self) -> torch.Tensor:
        """[batch x seq]: the target's greedy token (a target id) after every window position, from
        the table when it is kept (no second pass of the LM head), else argmax in chunks."""
        if self.table is not None:
            return self.table[3]
        head = self.lm_head
        parts = [head(self.hidden[i : i + self.chunk_size].to(head.weight.dtype)).argmax(-1)
                 for i in range(0, self.hidden.shape[0], self.chunk_size)]
        return torch.cat(parts) if parts else self.hidden.new_zeros(0, dtype=torch.long)

    def rows(self, positions: torch.Tensor):
        """(top [m], inside [m], p [m, V] or None, hidden [m, H]) at flat window positions [m]
        (row-major over [batch, seq])."""
        hidden = self.hidden[positions]
        if self.table is None:
            return (*self._compute(hidden)[:3], hidden)
        top, inside, p, _ = self.table
        return top[positions], inside[positions], None if p is None else p[positions], hidden


@torch.no_grad()
def greedy_follows(labels: TargetRows, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: token p of the data is the target's greedy token after p-1 (position 0: False).
    The greedy tokens come from ``labels`` (the same LM-head pass that scores the losses)."""
    bsz, seq = input_ids.shape
    greedy = labels.greedy_ids().view(bsz, seq)
    follows = torch.zeros(bsz, seq, dtype=torch.bool, device=input_ids.device)
    follows[:, 1:] = greedy[:, :-1] == input_ids[:, 1:]
    return follows
