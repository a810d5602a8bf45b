"""What the tests of the block drafters built on DFlash's backbone (DSpark, DFlash2) share: heads
trained for a few seconds with the real loss on a tiny target's greedy continuations, so that
exactness runs with drafts that are accepted often."""
from __future__ import annotations

import torch

from draftheads.train.model import TargetWithHeads

from inference_utils import greedy_reference

MASK_ID = 63  # the tiny targets' last id (their pad id 0 has a zero embedding row)
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def trained_block_heads(cls, target, steps: int = 60, seed: int = 0, prompts: torch.Tensor | None = None, **options):
    """Heads of ``cls`` trained with `TargetWithHeads`' loss; returns (heads, prompts, first, last)
    with first/last = (loss, depth-1 top-1 accuracy) averaged over the first and the last 5 steps."""
    vocab = target.config.vocab_size
    if prompts is None:
        prompts = torch.randint(3, vocab, (32, 6), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        seqs = greedy_reference(target, prompts, 40)
    torch.manual_seed(seed)
    settings = {"num_layers": 1, "mask_token_id": MASK_ID, "num_anchors": 16}
    heads = cls.for_target(target, **{**settings, **options})
    model = TargetWithHeads(target, heads)
    opt = torch.optim.Adam(heads.parameters(), lr=3e-3)
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompts.shape[1] :] = 1
    history = []
    model.train()
    for step in range(steps):
        model.reseed_noise(step, seqs.device)
        out = model(seqs, loss_mask=loss_mask)
        stats = out["stats"]
        history.append((float(out["loss"].detach()), float(stats[2, 0] / stats[1, 0])))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()

    def mean(rows):
        return tuple(sum(r[i] for r in rows) / len(rows) for i in range(2))

    return heads.eval(), prompts, mean(history[:5]), mean(history[-5:])


def tree_tokens_follow_their_parents(drafter, tree, root: int) -> None:
    """Every node of ``tree`` (drafted by a chained drafter for one row, ``root`` its root) is its
    parent's rank-r candidate of its depth GIVEN the parent's token: the Markov / selector stage
    conditions each depth on the token before it."""
    shape = tree.shape
    depth = shape.depth.tolist()
    tokens = tree.tokens.cpu()
    slots = drafter.scores([root], [shape.max_depth])
    for node in range(1, shape.size):
        parent = shape.parents[node]
        previous = torch.tensor([int(tokens[parent])], device=drafter.device)
        step = drafter.step_scores(slots, torch.zeros(1, dtype=torch.long, device=drafter.device), depth[node], previous)[0]
        ranked = step.topk(shape.ranks[node] + 1).indices
        want = ranked[-1] if drafter.vocab_ids is None else drafter.vocab_ids[ranked[-1]]
        assert int(tokens[node]) == int(want), f"node {node} (depth {depth[node]}, rank {shape.ranks[node]}) is not its parent's candidate"
