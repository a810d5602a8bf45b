"""What one step accepted for one row: the record every acceptance rule returns (`accept`,
`accept_typical`) and the KV stores and the loop read."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Acceptance:
    path: torch.Tensor  # node indices of the accepted path, root first: [m] (on the host)
    next_token: int  # the target's token after the path (bonus or residual sample): next step's root
    #: The tree's tokens along the path (root first), when acceptance already brought them to the host.
    tokens: list[int] | None = None
    _nodes: list[int] | None = field(default=None, repr=False)

    @property
    def nodes(self) -> list[int]:
        if self._nodes is None:
            self._nodes = self.path.tolist()
        return self._nodes

    @property
    def contiguous(self) -> bool:
        """The path is nodes 0..m-1 (always for chains): the cache and features need no gather."""
        return self.nodes == list(range(len(self.nodes)))

    def index(self, device: torch.device) -> slice | torch.Tensor:
        """What selects the path's rows from a tensor on ``device``: a slice (a view) when the path is
        contiguous, else the path copied there (host to device: no sync)."""
        if self.contiguous:
            return slice(0, len(self.nodes))
        return self.path.to(device, non_blocking=True)


#: The path of a step that accepted no draft: the root alone. One tensor shared by every such step
#: (nothing writes an `Acceptance`'s path), so a plain step builds none.
_ROOT_PATH = torch.zeros(1, dtype=torch.long)


def root_only(next_token: int, root: int) -> Acceptance:
    """A step that kept only its root (a plain step, or every draft rejected): on the host, with no
    tensor built; ``root`` is the root's token, ``next_token`` the target's token after it."""
    return Acceptance(_ROOT_PATH, next_token, tokens=[root], _nodes=[0])
