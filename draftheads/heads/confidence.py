"""How often the target accepts a draft candidate, by its depth in the tree, its rank among its
siblings and its draft probability: the table EAGLE-2's tree search ranks nodes by when a heads
folder keeps one (``confidence.json``).

EAGLE-2 grows the tree with the nodes of highest joint draft probability, which assumes that a
draft probability IS the chance of acceptance. Small heads trained briefly are far from that:
their distributions are flat while their top-1 is right most of the time (one EAGLE-3 head on a
small Nemotron-H accepted 56% of its rank-0 drafts given under 5% probability, and 10% of its
rank-1 drafts given 20-30%), so the joint probability ranks second choices above deeper first
choices that the target would have taken, and a tree of n tokens accepts less than a chain of n.
This table holds the measured chance instead, per depth and rank, as a non-decreasing curve of the
draft probability (`rescore`); a path's score is then the product of its steps' measured chances,
the expected-acceptance ranking EAGLE-2 meant (and which Medusa's static trees use per rank).
Depth is a dimension because the heads draft deeper levels from their own features, not the
target's, so the same rank and probability is accepted less often further down.

It is measured on the target's own greedy continuations (`methods.eagle.confidence`), where
"accepted" means what greedy verification accepts; it holds no device figure, so one table serves
every device and is kept beside the weights, not in the per-device ``tree.json``.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

CONFIDENCE_NAME = "confidence.json"
#: 2: one table per depth; 1 (the first release): one table for every depth, read as a single depth.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: Draft-probability bin edges: finer where flat heads put most of their candidates.
EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Pseudo-counts pulling a thin cell toward what is known around it (its rank's rate over all depths,
#: then, per depth, the same cell pooled over depths) before each curve is made monotone.
PRIOR_WEIGHT = 2.0
#: Chances are kept inside (0, 1): a log of 0 would make a node unrankable, one of 1 a tie with its parent.
FLOOR, CEILING = 1e-3, 0.999

Grid = tuple[tuple[tuple[float, ...], ...], ...]


@dataclass(frozen=True)
class ConfidenceCalibration:
    """``accept[d][r][j]``: the chance that a candidate at depth d (0: the root's children) and
    rank r whose draft probability falls in bin j (``EDGES``) is accepted, given its parent was;
    ``counts[d][r][j]``: the candidates measured there. Depths and ranks past the last use the last."""

    accept: Grid
    counts: tuple[tuple[tuple[int, ...], ...], ...]
    edges: tuple[float, ...] = EDGES
    measured_on: dict | None = None

    def __post_init__(self) -> None:
        bins = len(self.edges) + 1
        shape_ok = bool(self.accept) and len(self.counts) == len(self.accept) and all(
            len(a) == len(self.accept[0]) and len(a) == len(n) and len(a) > 0
            and all(len(row) == bins for row in (*a, *n)) for a, n in zip(self.accept, self.counts))
        if not shape_ok:
            raise ValueError(f"a confidence table needs, per depth, the same ranks, each one row of {bins} chances "
                             f"and of {bins} counts")
        if list(self.edges) != sorted(self.edges) or not all(0 < e < 1 for e in self.edges):
            raise ValueError(f"confidence bin edges must rise strictly inside (0, 1), got {list(self.edges)}")
        for d, ranks in enumerate(self.accept):
            for r, row in enumerate(ranks):
                if not all(FLOOR <= a <= CEILING for a in row):
                    raise ValueError(f"depth {d}, rank {r}: chances must lie in [{FLOOR}, {CEILING}], got {list(row)}")
                if any(b < a for a, b in zip(row, row[1:])):
                    raise ValueError(f"depth {d}, rank {r}: chances must not fall as the draft probability rises, "
                                     f"got {list(row)}")
        object.__setattr__(self, "_knots", {})  # device -> (knots, chances): `_on`

    @property
    def depths(self) -> int:
        return len(self.accept)

    @property
    def ranks(self) -> int:
        return len(self.accept[0])

    @classmethod
    def fit(cls, records: Iterable[tuple[int, int, float, bool]], ranks: int, depths: int = 1,
            edges: tuple[float, ...] = EDGES, measured_on: dict | None = None) -> "ConfidenceCalibration":
        """The table from (depth, rank, draft probability, accepted) records. Pooled over depths,
        each cell's rate is shrunk toward its rank's rate; per depth, each cell's toward that
        pooled cell (``PRIOR_WEIGHT`` pseudo-counts each time, so a deep level measured thinly
        leans on the shallower ones); every curve is then made non-decreasing along the
        probability (pool-adjacent-violators, weighted by counts) and clipped into [FLOOR, CEILING]."""
        bins = len(edges) + 1
        hits = [[[0] * bins for _ in range(ranks)] for _ in range(depths)]
        counts = [[[0] * bins for _ in range(ranks)] for _ in range(depths)]
        for depth, rank, prob, accepted in records:
            d, r, j = min(depth, depths - 1), min(rank, ranks - 1), sum(prob >= e for e in edges)
            counts[d][r][j] += 1
            hits[d][r][j] += bool(accepted)
        if not any(sum(map(sum, c)) for c in counts):
            raise ValueError("no drafted candidate was measured: the sequences are too short for the draft depth")
        pooled = []
        for r in range(ranks):
            h = [sum(hits[d][r][j] for d in range(depths)) for j in range(bins)]
            n = [sum(counts[d][r][j] for d in range(depths)) for j in range(bins)]
            prior = (sum(h) + 0.5) / (sum(n) + 1)
            pooled.append(_curve(h, n, [prior] * bins))
        accept = tuple(tuple(_curve(hits[d][r], counts[d][r], pooled[r]) for r in range(ranks)) for d in range(depths))
        return cls(accept, tuple(tuple(map(tuple, c)) for c in counts), tuple(edges), measured_on)

    def rescore(self, log_probs: torch.Tensor, depth: int = 0) -> torch.Tensor:
        """Log chances of acceptance for ranked draft log-probabilities [..., k] (the last dim in
        rank order, as ``topk`` gives them) at ``depth`` (0: the root's children): each rank's
        curve, linear between bin centres."""
        x, y = self._on(log_probs.device)
        k = log_probs.shape[-1]
        rows = y[min(depth, self.depths - 1)][torch.arange(k, device=y.device).clamp(max=self.ranks - 1)]  # [k, bins]
        lp = log_probs.float().clamp(min=float(x[0]), max=float(x[-1]))
        hi = torch.searchsorted(x, lp.contiguous()).clamp(1, x.numel() - 1)
        lo = hi - 1
        w = (lp - x[lo]) / (x[hi] - x[lo])
        rank = torch.arange(k, device=lp.device).expand_as(lp)
        y_lo, y_hi = rows[rank, lo], rows[rank, hi]
        return torch.log(y_lo + w * (y_hi - y_lo))

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The knots (log bin centres) and chances [depths, ranks, bins] on ``device``, made once per device."""
        if device not in self._knots:
            bounds = (0.0, *self.edges, 1.0)
            centres = [math.log((a + b) / 2) for a, b in zip(bounds, bounds[1:])]
            self._knots[device] = (torch.tensor(centres, device=device),
                                   torch.tensor(self.accept, dtype=torch.float32, device=device))
        return self._knots[device]

    def summary(self) -> list[str]:
        """One line per depth and rank: the chance by draft-probability bin (and how many were measured)."""
        lines = ["bin edges: " + " ".join(f"{e:g}" for e in self.edges)]
        for d, (ranks, counts) in enumerate(zip(self.accept, self.counts)):
            for r, (row, n) in enumerate(zip(ranks, counts)):
                lines.append(f"depth {d + 1}{'+' if d == self.depths - 1 else ''} rank {r}"
                             f"{'+' if r == self.ranks - 1 else ''}: " + " ".join(f"{a:.2f}" for a in row)
                             + f"  ({sum(n)} candidates)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "edges": list(self.edges),
                "accept": [[list(row) for row in ranks] for ranks in self.accept],
                "counts": [[list(row) for row in ranks] for ranks in self.counts], "measured_on": self.measured_on}

    @classmethod
    def from_json(cls, data: Any, where: str = CONFIDENCE_NAME) -> "ConfidenceCalibration":
        if not isinstance(data, dict):
            raise ValueError(f"{where} must hold a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"{where}: format_version must be one of {list(READABLE_VERSIONS)}, got {version!r}")
        unknown = sorted(set(data) - {"format_version", "edges", "accept", "counts", "measured_on"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}")
        try:
            accept, counts = data["accept"], data["counts"]
            if version == 1:  # one table for every depth
                accept, counts = [accept], [counts]
            return cls(tuple(tuple(tuple(float(a) for a in row) for row in ranks) for ranks in accept),
                       tuple(tuple(tuple(int(n) for n in row) for row in ranks) for ranks in counts),
                       tuple(float(e) for e in data["edges"]), data.get("measured_on"))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: not a confidence table ({e!r}): run draftheads calibrate again") from None
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

def read_confidence(folder: str | os.PathLike) -> ConfidenceCalibration | None:
    """A heads folder's ``confidence.json`` (None when it has none); a ValueError naming the file."""
    path = Path(folder) / CONFIDENCE_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return ConfidenceCalibration.from_json(data, str(path))


def write_confidence(folder: str | os.PathLike, table: ConfidenceCalibration) -> Path:
    """Write ``table`` as the heads folder's ``confidence.json`` (atomically); returns its path."""
    from ..atomic import write_json_atomically

    path = Path(folder) / CONFIDENCE_NAME
    write_json_atomically(path, table.to_json())
    return path


def _curve(hits: list[int], counts: list[int], prior: list[float]) -> tuple[float, ...]:
    """One rank's chances by bin: each bin's rate shrunk toward ``prior`` (that bin's), made
    non-decreasing, clipped into [FLOOR, CEILING]."""
    rates = [(h + PRIOR_WEIGHT * p) / (n + PRIOR_WEIGHT) for h, n, p in zip(hits, counts, prior)]
    return tuple(min(CEILING, max(FLOOR, a)) for a in _monotone(rates, [n + PRIOR_WEIGHT for n in counts]))


def _monotone(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [m for m, _, n in blocks for _ in range(int(n))]
