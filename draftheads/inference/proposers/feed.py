"""Rows that feed the target's features of committed positions to a draft model of their own
(EAGLE's draft layer, the parallel drafters): per row its tokens so far and the features it has
not fed yet, which a row's next drafting step takes (rows that do not draft keep theirs pending,
as they would drafted alone)."""
from __future__ import annotations

import torch

from .drafter import Drafter


class FeedRows(Drafter):
    """The bookkeeping; subclasses own the draft cache the features go into."""

    _ids: list[list[int]]
    _pending: list[list[torch.Tensor]]

    def start_feed(self, prompts: list[torch.Tensor], hidden: list[torch.Tensor]) -> None:
        self._ids = [p.tolist() for p in prompts]
        self._pending = [[h] for h in hidden]

    def accepted(self, tokens, hidden) -> None:
        for ids, pending, t, h in zip(self._ids, self._pending, tokens, hidden):
            ids.extend(t.tolist())
            pending.append(h)

    def keep_feed(self, rows: list[int]) -> None:
        self._ids = [self._ids[r] for r in rows]
        self._pending = [self._pending[r] for r in rows]

    def take_pending(self, drafting: list[bool], device: torch.device) -> tuple[torch.Tensor | None, list[int]]:
        """The drafting rows' pending features, padded with zeros to the longest [rows, m, F]
        (None when there are none), and each row's count; they are no longer pending."""
        fed = [torch.cat(p).to(device) if d and p else None for p, d in zip(self._pending, drafting)]
        counts = [0 if f is None else f.shape[0] for f in fed]
        m = max(counts)
        if m == 0:
            return None, counts
        if all(c == m for c in counts):  # always for one row: no padding
            feats = torch.stack(fed)
        else:
            some = next(f for f in fed if f is not None)
            feats = some.new_zeros(len(fed), m, some.shape[1])
            for r, f in enumerate(fed):
                if f is not None:
                    feats[r, : f.shape[0]] = f
        for r, f in enumerate(fed):
            if f is not None:
                self._pending[r] = []
        return feats, counts
