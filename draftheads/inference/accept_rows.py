"""Greedy acceptance for a whole batch at once: one host read per step, however many rows.

`TreeVerifier.accept_greedy` does the same for one tree with one transfer; calling it per row
would make a batch of B rows stall the device B times a step. Here every row's candidate paths
are stacked into one table (rows padded with empty paths), the longest matching path of each row
is found on the device, and one ``tolist`` brings back, per row, the accepted count, the next
token, the path and its tokens.
"""
from __future__ import annotations

import torch

from .tree import Tree, TreeShape
from .verify import Acceptance, shape_on_device


def _path_table(shapes: list[TreeShape], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[rows, leaves, D+1] root-to-leaf node indices per row, -1 padded (a padded leaf is all -1
    and so matches nothing). One shape for every row (Medusa/Hydra trees) reuses its device copy."""
    first = shapes[0]
    if all(s is first for s in shapes):
        return shape_on_device(first, device, dtype).paths.expand(len(shapes), -1, -1)
    leaves = max(s.paths.shape[0] for s in shapes)
    width = max(s.paths.shape[1] for s in shapes)
    table = torch.full((len(shapes), leaves, width), -1, dtype=torch.long)
    for r, shape in enumerate(shapes):
        table[r, : shape.paths.shape[0], : shape.paths.shape[1]] = shape.paths
    return table.to(device, non_blocking=True)


def accept_greedy_rows(trees: list[Tree], tokens: torch.Tensor, logits: torch.Tensor) -> list[Acceptance]:
    """Per row, the longest root-to-node path whose tokens all equal the target's argmax at their
    parent (the first such path on ties, as `TreeVerifier.accept_greedy` picks), plus the target's
    next token after it.

    ``tokens`` [rows, n] are the trees' tokens as verified (padded, on the logits' device) and
    ``logits`` [rows, n, V] the verify forward's output."""
    device = logits.device
    paths = _path_table([t.shape for t in trees], device, logits.dtype)
    predicted = logits.argmax(dim=-1)  # [rows, n]
    child, parent = paths[:, :, 1:], paths[:, :, :-1]
    rows, leaves, steps = child.shape
    child_tokens = tokens.gather(1, child.clamp(min=0).reshape(rows, -1)).view(rows, leaves, steps)
    parent_argmax = predicted.gather(1, parent.clamp(min=0).reshape(rows, -1)).view(rows, leaves, steps)
    ok = (child >= 0) & (child_tokens == parent_argmax)
    lengths = ok.long().cumprod(dim=2).sum(dim=2)  # [rows, leaves]: drafts accepted along each path
    best = lengths.argmax(dim=1)
    index = torch.arange(rows, device=device)
    path = paths[index, best]  # [rows, D+1]
    accepted = lengths[index, best]
    last_node = path.gather(1, accepted[:, None])
    next_token = predicted.gather(1, last_node)
    path_tokens = tokens.gather(1, path.clamp(min=0))
    # The one transfer: per row [accepted, next token, path (D+1), its tokens (D+1)].
    packed = torch.cat([accepted[:, None], next_token, path, path_tokens], dim=1).tolist()
    width = path.shape[1]
    out = []
    for r, row in enumerate(packed):
        m = row[0] + 1
        nodes = row[2 : 2 + m]
        out.append(Acceptance(
            torch.tensor(nodes, dtype=torch.long), row[1], tokens=row[2 + width : 2 + width + m],
            device_path=path[r, :m], _nodes=nodes,
        ))
    return out
