"""How often the target accepts a draft candidate, by its rank among its siblings and its draft
probability: the table EAGLE-2's tree search ranks nodes by when a heads folder keeps one
(``confidence.json``).

EAGLE-2 grows the tree with the nodes of highest joint draft probability, which assumes that a
draft probability IS the chance of acceptance. Small heads trained briefly are far from that:
their distributions are flat while their top-1 is right most of the time (one EAGLE-3 head on a
small Nemotron-H accepted 56% of its rank-0 drafts given under 5% probability, and 10% of its
rank-1 drafts given 20-30%), so the joint probability ranks second choices above deeper first
choices that the target would have taken, and a tree of n tokens accepts less than a chain of n.
This table holds the measured chance instead, per rank, as a non-decreasing curve of the draft
probability (`rescore`); a path's score is then the product of its steps' measured chances, the
expected-acceptance ranking EAGLE-2 meant (and which Medusa's static trees use per rank).

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
FORMAT_VERSION = 1
#: Draft-probability bin edges: finer where flat heads put most of their candidates.
EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Pseudo-counts pulling a thin cell toward its rank's overall rate before the curve is made monotone.
PRIOR_WEIGHT = 2.0
#: Chances are kept inside (0, 1): a log of 0 would make a node unrankable, one of 1 a tie with its parent.
FLOOR, CEILING = 1e-3, 0.999


@dataclass(frozen=True)
class ConfidenceCalibration:
    """``accept[r][j]``: the chance that a rank-r candidate whose draft probability falls in bin
    j (``EDGES``) is accepted, given its parent was; ``counts[r][j]``: the candidates measured
    there. Ranks past the last row use the last row."""

    accept: tuple[tuple[float, ...], ...]
    counts: tuple[tuple[int, ...], ...]
    edges: tuple[float, ...] = EDGES
    measured_on: dict | None = None

    def __post_init__(self) -> None:
        bins = len(self.edges) + 1
        if not self.accept or any(len(row) != bins for row in self.accept) or len(self.counts) != len(self.accept) \
                or any(len(row) != bins for row in self.counts):
            raise ValueError(f"a confidence table needs one row of {bins} chances and of {bins} counts per rank")
        if list(self.edges) != sorted(self.edges) or not all(0 < e < 1 for e in self.edges):
            raise ValueError(f"confidence bin edges must rise strictly inside (0, 1), got {list(self.edges)}")
        for r, row in enumerate(self.accept):
            if not all(FLOOR <= a <= CEILING for a in row):
                raise ValueError(f"rank {r}: chances must lie in [{FLOOR}, {CEILING}], got {list(row)}")
            if any(b < a for a, b in zip(row, row[1:])):
                raise ValueError(f"rank {r}: chances must not fall as the draft probability rises, got {list(row)}")
        object.__setattr__(self, "_knots", {})  # device -> (knots, chances): `_on`

    @property
    def ranks(self) -> int:
        return len(self.accept)

    @classmethod
    def fit(cls, records: Iterable[tuple[int, float, bool]], ranks: int, edges: tuple[float, ...] = EDGES,
            measured_on: dict | None = None) -> "ConfidenceCalibration":
        """The table from (rank, draft probability, accepted) records: each cell's rate shrunk
        toward its rank's rate (``PRIOR_WEIGHT``), then made non-decreasing along the probability
        (pool-adjacent-violators, weighted by counts), clipped into [FLOOR, CEILING]."""
        bins = len(edges) + 1
        hits = [[0] * bins for _ in range(ranks)]
        counts = [[0] * bins for _ in range(ranks)]
        for rank, prob, accepted in records:
            r = min(rank, ranks - 1)
            j = sum(prob >= e for e in edges)
            counts[r][j] += 1
            hits[r][j] += bool(accepted)
        if not any(map(sum, counts)):
            raise ValueError("no drafted candidate was measured: the sequences are too short for the draft depth")
        accept = []
        for r in range(ranks):
            total = sum(counts[r])
            prior = (sum(hits[r]) + 0.5) / (total + 1)
            rates = [(h + PRIOR_WEIGHT * prior) / (n + PRIOR_WEIGHT) for h, n in zip(hits[r], counts[r])]
            accept.append(tuple(min(CEILING, max(FLOOR, a)) for a in _monotone(rates, [n + PRIOR_WEIGHT for n in counts[r]])))
        return cls(tuple(accept), tuple(map(tuple, counts)), tuple(edges), measured_on)

    def rescore(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Log chances of acceptance for ranked draft log-probabilities [..., k] (the last dim in
        rank order, as ``topk`` gives them): each rank's curve, linear between bin centres."""
        x, y = self._on(log_probs.device)
        k = log_probs.shape[-1]
        rows = y[torch.arange(k, device=y.device).clamp(max=self.ranks - 1)]  # [k, bins]
        lp = log_probs.float().clamp(min=float(x[0]), max=float(x[-1]))
        hi = torch.searchsorted(x, lp.contiguous()).clamp(1, x.numel() - 1)
        lo = hi - 1
        w = (lp - x[lo]) / (x[hi] - x[lo])
        rank = torch.arange(k, device=lp.device).expand_as(lp)
        y_lo, y_hi = rows[rank, lo], rows[rank, hi]
        return torch.log(y_lo + w * (y_hi - y_lo))

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The knots (log bin centres) and chances on ``device``, made once per device."""
        if device not in self._knots:
            bounds = (0.0, *self.edges, 1.0)
            centres = [math.log((a + b) / 2) for a, b in zip(bounds, bounds[1:])]
            self._knots[device] = (torch.tensor(centres, device=device),
                                   torch.tensor(self.accept, dtype=torch.float32, device=device))
        return self._knots[device]

    def summary(self) -> list[str]:
        """One line per rank: the chance by draft-probability bin (and how many were measured)."""
        lines = ["bin edges: " + " ".join(f"{e:g}" for e in self.edges)]
        for r, (row, n) in enumerate(zip(self.accept, self.counts)):
            lines.append(f"rank {r}{'+' if r == self.ranks - 1 else ''}: " + " ".join(f"{a:.2f}" for a in row)
                         + f"  ({sum(n)} candidates)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "edges": list(self.edges), "accept": [list(r) for r in self.accept],
                "counts": [list(r) for r in self.counts], "measured_on": self.measured_on}

    @classmethod
    def from_json(cls, data: Any, where: str = CONFIDENCE_NAME) -> "ConfidenceCalibration":
        if not isinstance(data, dict):
            raise ValueError(f"{where} must hold a JSON object, got {type(data).__name__}")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{where}: format_version must be {FORMAT_VERSION}, got {data.get('format_version')!r}")
        unknown = sorted(set(data) - {"format_version", "edges", "accept", "counts", "measured_on"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}")
        try:
            return cls(tuple(tuple(float(a) for a in row) for row in data["accept"]),
                       tuple(tuple(int(n) for n in row) for row in data["counts"]),
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


def confidence_json(table: ConfidenceCalibration) -> str:
    """The file's text (for writers that assemble a whole folder at once, and `write_confidence`)."""
    return json.dumps(table.to_json(), indent=2) + "\n"


def write_confidence(folder: str | os.PathLike, table: ConfidenceCalibration) -> Path:
    """Write ``table`` as the heads folder's ``confidence.json`` (atomically); returns its path."""
    from ..atomic import write_text_atomically

    path = Path(folder) / CONFIDENCE_NAME
    write_text_atomically(path, confidence_json(table))
    return path


def _monotone(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [m for m, _, n in blocks for _ in range(int(n))]
