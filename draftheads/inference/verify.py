"""The verifier: ONE target forward over prefix-cache + tree, then pick the accepted path.

Tree attention uses only the model's public arguments: an additive float 4D mask
[1, 1, n, prefix + n] (0 = attend, dtype-min = masked) where each node sees the prefix, its
ancestors and itself, position ids = prefix length + depth, and the target's own cache. Greedy
acceptance keeps the longest path whose every token is the target's argmax at its parent;
sampling uses lossless (multi-candidate) rejection sampling, so the output distribution is
exactly the target's.
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ..heads.config import text_config
from .features import FINAL, FeatureTap
from .sampling import SamplingParams, sample
from .tree import Tree, TreeShape


class UnsupportedModelError(ValueError):
    """The model's forward does not honour a custom 4D attention mask, so trees cannot be verified."""


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


#: Layer types whose attention a tree mask can express; anything else (linear attention, state-space
#: or convolution layers) keeps a recurrent state that cannot branch over a tree.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class AttentionSpan:
    """What one attention layer lets a query at position q see besides causality: the last
    ``window`` positions (sliding window: k > q - window), or only its own chunk of ``chunk``
    positions (chunked attention, Llama 4: k // chunk == q // chunk). Neither = full attention."""

    window: int | None = None
    chunk: int | None = None

    @property
    def size(self) -> int | None:
        return self.window or self.chunk

    def limits(self, end: int) -> bool:
        """Whether the span hides anything from queries at positions below ``end``."""
        return self.size is not None and end > self.size


def _model_name(model: torch.nn.Module) -> str:
    model_type = getattr(text_config(model), "model_type", None)
    return f"{type(model).__name__} (model_type {model_type!r})" if model_type else type(model).__name__


def layer_spans(model: torch.nn.Module) -> dict[str, AttentionSpan]:
    """The attention span of each layer type of ``model`` (read from its config), keyed by the
    name its forward uses for a per-layer-type mask dict (``""`` for models without layer types).

    Refuses models with non-attention layers: a tree forward would feed every node through their
    recurrent state in sequence (siblings would see each other) and there is no cheap way to roll
    that state back to the accepted path."""
    cfg = text_config(model)
    window = getattr(cfg, "sliding_window", None)
    chunk = getattr(cfg, "attention_chunk_size", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        other = sorted(set(layer_types) - set(ATTENTION_LAYER_TYPES))
        if other:
            raise UnsupportedModelError(
                f"{_model_name(model)} has layers of type {other} (linear attention, state-space, convolution "
                "or hybrid layers): they carry a recurrent state that one forward over a tree of candidates would "
                "run through every node in order (siblings would see each other), and that cannot be rolled back "
                "to the accepted path. Speculative decoding with draftheads needs a model whose layers are all "
                f"attention ({', '.join(ATTENTION_LAYER_TYPES)})"
            )
        spans = {"full_attention": AttentionSpan(), "sliding_attention": AttentionSpan(window=window),
                 "chunked_attention": AttentionSpan(chunk=chunk)}
        return {t: spans[t] for t in dict.fromkeys(layer_types)}
    if chunk:
        return {"": AttentionSpan(chunk=chunk)}
    if window and getattr(cfg, "use_sliding_window", True):
        return {"": AttentionSpan(window=window)}
    return {"": AttentionSpan()}


def tree_attention_mask(
    shape: TreeShape,
    prefix_len: int,
    dtype: torch.dtype,
    device: torch.device,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Additive mask [1, 1, n, prefix_len + n] for one tree forward; ``window``/``chunk`` as in
    `AttentionSpan`, applied to the nodes' positions (prefix length + depth)."""
    n = shape.size
    visible = torch.ones(n, prefix_len + n, dtype=torch.bool)
    visible[:, prefix_len:] = shape.ancestor_mask
    if window is not None or chunk is not None:
        q_pos = prefix_len + shape.depth
        k_pos = torch.cat([torch.arange(prefix_len), prefix_len + shape.depth])
        if window is not None:
            visible &= (q_pos[:, None] - k_pos[None, :]) < window
        if chunk is not None:
            visible &= (q_pos[:, None] // chunk) == (k_pos[None, :] // chunk)
    mask = torch.zeros(n, prefix_len + n, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask.to(device)[None, None]


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the forward's cache argument: ``cache`` in recent transformers (where
    ``past_key_values`` is deprecated), ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass
class _ShapeOnDevice:
    """A tree shape's topology on the target's device, built once per shape (static trees: once)."""

    depth: torch.Tensor  # [n]
    paths: torch.Tensor  # [leaves, D+1], -1 padded
    block: torch.Tensor  # [n, n] additive mask among the tree's nodes


def shape_on_device(shape: TreeShape, device: torch.device, dtype: torch.dtype) -> _ShapeOnDevice:
    """Cached on the shape itself, so dynamic trees (one shape per step) do not pile up."""
    per_device = shape.on_device
    key = (device, dtype)
    if key not in per_device:
        block = torch.zeros(shape.size, shape.size, dtype=dtype)
        block.masked_fill_(~shape.ancestor_mask, torch.finfo(dtype).min)
        per_device[key] = _ShapeOnDevice(
            depth=shape.depth.to(device, non_blocking=True),
            paths=shape.paths.to(device, non_blocking=True),
            block=block.to(device, non_blocking=True),
        )
    return per_device[key]


def select_features(hidden_states: tuple[torch.Tensor, ...], layers: list[int] | None) -> torch.Tensor:
    """What a proposer reads from the target: the last hidden state after the final norm (``None``),
    or the hidden states entering the given layers, concatenated (EAGLE-3's fused features;
    ``hidden_states[i]`` is the input of decoder layer i)."""
    if layers is None:
        return hidden_states[-1]
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


class TreeVerifier:
    """Scores a tree with the target and decides which path is accepted.

    ``feature_layers``: which hidden states `forward` returns, in ``output_hidden_states``
    numbering (a proposer's `feature_layers`; ``None`` = the last hidden state, ``()`` = none).
    Only those are captured (`FeatureTap`), never all L+1."""

    def __init__(self, target: torch.nn.Module, feature_layers: Sequence[int] | None = None) -> None:
        self.target = target
        self.tap = FeatureTap(target, (FINAL,) if feature_layers is None else feature_layers)
        self.feature_layers = self.tap.layers
        self.spans = layer_spans(target)  # refuses models with non-attention layers
        self.cache_arg = cache_kwarg(target)
        # Tree masks over prefix + tree, one buffer per tree size, extended in place: the prefix
        # columns stay 0 (visible), only the tree block moves along (see `_extended_mask`).
        self._masks: dict[tuple[int, torch.device, torch.dtype], list] = {}

    def _extended_mask(self, shape: TreeShape, prefix_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[1, 1, n, prefix_len + n] view of a buffer on the device: two small device copies per step
        (clear the last block, place this one) instead of building n x (prefix + n) on the host."""
        n, need = shape.size, prefix_len + shape.size
        key = (n, device, dtype)
        entry = self._masks.get(key)
        if entry is None or entry[0].shape[1] < need:
            entry = self._masks[key] = [torch.zeros(n, max(2 * need, 512), dtype=dtype, device=device), None]
        buffer, placed = entry
        if placed is not None and placed != prefix_len:
            buffer[:, placed : placed + n].zero_()
        buffer[:, prefix_len:need] = shape_on_device(shape, device, dtype).block
        entry[1] = prefix_len
        return buffer[None, None, :, :need]

    # -- the cache (a static cache overrides these: `static_cache.StaticTreeVerifier`) ----------------
    def own_cache(self, prefill: DynamicCache, prefix_len: int, end: int) -> DynamicCache:
        """The cache the loop decodes in after a prefill into ``prefill``, for a call that ends at
        ``end`` tokens: the same one here."""
        return prefill

    def commit(self, cache: DynamicCache, prefix_len: int, acc: Acceptance) -> None:
        commit(cache, prefix_len, acc)

    # -- the forward ------------------------------------------------------------------------------
    def attention_mask(self, shape: TreeShape, prefix_len: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        dtype = self.target.dtype
        device = self.target.device
        total = prefix_len + shape.max_depth + 1
        limiting = {name: span for name, span in self.spans.items() if span.limits(total)}
        if not limiting:
            if all(p == i - 1 for i, p in enumerate(shape.parents)):
                # A chain (draft-model and prompt-lookup drafts; a root-only tree is a plain decoding
                # step) needs no tree mask: its tree mask IS the causal mask. Passing none, as
                # `generate` does, lets the model build its own causal mask and take its fast paths
                # (building and applying our 4D mask cost ~3% of a one-token step on the demo target).
                return None
            return self._extended_mask(shape, prefix_len, dtype, device)
        if len(self.spans) == 1:
            (span,) = self.spans.values()
            return tree_attention_mask(shape, prefix_len, dtype, device, window=span.window, chunk=span.chunk)
        # Models mixing layer types (Gemma 2/3, Qwen2 with windows: sliding + full; Llama 4: chunked +
        # full) take one mask per layer type.
        none = AttentionSpan()
        return {
            name: tree_attention_mask(
                shape, prefix_len, dtype, device, window=limiting.get(name, none).window, chunk=limiting.get(name, none).chunk
            )
            for name in self.spans
        }

    def forward(self, cache: DynamicCache, tree: Tree, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [n, V] and features [n, F] of every tree node (by default the last hidden states
        after the final norm, F = H).

        The cache grows by n entries; `commit` then keeps only the accepted ones."""
        device = self.target.device
        on_device = shape_on_device(tree.shape, device, self.target.dtype)
        with self.tap.capture() as captured:
            out = self.target(
                input_ids=tree.tokens.to(device, non_blocking=True)[None],
                position_ids=(on_device.depth + prefix_len)[None],
                attention_mask=self.attention_mask(tree.shape, prefix_len),
                use_cache=True,
                **self.tap.forward_kwargs(),
                **{self.cache_arg: cache},
            )
        features = self.tap.features(captured, out)
        return out.logits[0], None if features is None else features[0]

    # -- acceptance -------------------------------------------------------------------------------
    @staticmethod
    def accept_greedy(tree: Tree, logits: torch.Tensor) -> Acceptance:
        """Longest root-to-node path whose tokens all equal the target's argmax at their parent.

        ONE transfer brings the argmax of every node and the tree's tokens to the host (on a GPU
        every host read is a stall of the device); the walk down the tree's few paths is then
        plain Python, cheaper than a dozen small tensor ops."""
        n = tree.shape.size
        values = torch.cat([logits.argmax(dim=-1), tree.tokens.to(logits.device, non_blocking=True)]).tolist()
        return greedy_acceptance(tree.shape, values[:n], values[n:])

    @staticmethod
    def accept_sampling(
        tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
    ) -> Acceptance:
        """Lossless rejection sampling down the tree.

        At an accepted node with target distribution p (processed like `generate` does), its
        children are tried in order. A deterministic draft x (a point mass) is accepted with
        probability r(x) where r is the current residual; on rejection r(x) is zeroed and r
        renormalised. A sampled draft x ~ q (``tree.draft_probs``) is accepted with probability
        min(1, r(x)/q(x)); on rejection r <- norm(max(r - q, 0)) (SpecInfer's rule, exact for
        siblings drawn independently from q). If every child is rejected, the next token is drawn
        from the residual; at a leaf it is drawn from p itself (the bonus token).
        """
        children = tree.shape.children
        tokens = tree.tokens.tolist()
        node, path = 0, [0]
        device = logits.device
        while True:
            # Vocabulary rows stay where the logits are: only scalars come to the host.
            residual = params.probs(logits[node])
            for child in children[node]:
                x = tokens[child]
                total = residual.sum()
                if tree.draft_probs is None:
                    accept_prob = residual[x] / total
                else:
                    q = tree.draft_probs[child].to(device, torch.float32, non_blocking=True)
                    accept_prob = torch.clamp(residual[x] / total / q[x].clamp(min=1e-30), max=1.0)
                if float(torch.rand((), generator=generator)) < float(accept_prob):
                    node = child
                    path.append(child)
                    break
                if tree.draft_probs is None:
                    residual[x] = 0.0
                else:
                    residual = torch.clamp(residual / total - q, min=0.0)
                if float(residual.sum()) <= 0.0:
                    # Only reachable through float rounding: the residual is empty when the draft
                    # covers p exactly, in which case acceptance had probability 1.
                    residual = params.probs(logits[node])
            else:
                return Acceptance(torch.tensor(path, dtype=torch.long), sample(residual, generator),
                                  tokens=[tokens[i] for i in path], _nodes=path)

    @staticmethod
    def accept_typical(
        tree: Tree,
        logits: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        epsilon: float = 0.09,
        delta: float = 0.3,
    ) -> Acceptance:
        """Medusa's "typical acceptance". LOSSY: the output no longer follows the target's
        distribution. A draft x is accepted when p(x) > min(epsilon, delta * exp(-H(p))) under
        the target's processed distribution p at its parent; the longest such path wins and the
        next token is sampled from p at its end. Opt-in only (`acceptance="typical"`)."""
        probs = params.probs(logits)  # stays on the device; only the path comes to the host
        entropy = -(probs * probs.clamp(min=1e-30).log()).sum(-1)
        threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
        tokens = tree.tokens.to(probs.device, non_blocking=True)
        paths = shape_on_device(tree.shape, probs.device, logits.dtype).paths
        if paths.shape[1] == 1:
            return Acceptance(torch.zeros(1, dtype=torch.long), sample(probs[0], generator))
        child, parent = paths[:, 1:].clamp(min=0), paths[:, :-1].clamp(min=0)
        p_child = probs[parent, tokens[child]]
        ok = (paths[:, 1:] >= 0) & (p_child > threshold[parent])
        lengths = ok.long().cumprod(dim=1).sum(dim=1)
        best = int(lengths.argmax())
        path = paths[best, : int(lengths[best]) + 1]
        return Acceptance(path.cpu(), sample(probs[path[-1]], generator))


def greedy_acceptance(shape: TreeShape, predicted: list[int], tokens: list[int]) -> Acceptance:
    """The first longest root-first path of ``shape`` whose every drafted token equals the target's
    argmax (``predicted``) at its parent, and the target's next token after it (host lists, as one
    transfer brought them back)."""
    best: tuple[int, ...] = (0,)
    for path in shape.leaf_paths:
        m = 1
        while m < len(path) and tokens[path[m]] == predicted[path[m - 1]]:
            m += 1
        if m > len(best):
            best = path[:m]
    nodes = list(best)
    return Acceptance(torch.tensor(nodes, dtype=torch.long), predicted[nodes[-1]],
                      tokens=[tokens[i] for i in nodes], _nodes=nodes)


def commit(cache: DynamicCache, prefix_len: int, path: torch.Tensor | Acceptance) -> None:
    """Keep the prefix and the accepted tree nodes (``path``, relative to the tree, or an
    `Acceptance`) in the cache.

    Entries are moved in place and the layers become views of their first prefix+m slots: no
    full-cache copy (the next forward's concatenation makes the only copy). No host sync: the
    contiguity test reads the host copy of the path, the gather uses the device copy."""
    acc = path if isinstance(path, Acceptance) else Acceptance(path, -1)
    m = len(acc.nodes)
    contiguous = acc.contiguous
    sources: dict[torch.device, torch.Tensor] = {}
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if not contiguous:
            if keys.device not in sources:
                sources[keys.device] = prefix_len + acc.index(keys.device)
            src = sources[keys.device]
            keys[..., prefix_len : prefix_len + m, :] = keys.index_select(-2, src)
            values[..., prefix_len : prefix_len + m, :] = values.index_select(-2, src)
        layer.keys = keys[..., : prefix_len + m, :]
        layer.values = values[..., : prefix_len + m, :]


#: The probe always looks this far into a sequence, besides every declared window and chunk size:
#: a model whose mask goes wrong only past some undeclared position is caught if that is below it.
PROBE_PREFIX = 256


def probe_prefix_lengths(target: torch.nn.Module) -> list[int]:
    """Prefix lengths at which `check_tree_attention` scores its tree: a short one, `PROBE_PREFIX`,
    and around every window/chunk size s the config declares (read from the config itself, not
    from the verifier being checked): prefix s-1 puts the root on the last position of the first
    window/chunk and its children on the first outside, prefix s+2 puts the whole tree past it."""
    cfg = text_config(target)
    layer_types = getattr(cfg, "layer_types", None) or ()
    sizes = []
    # Only spans the config switches on: Qwen2 declares a sliding_window of 32k-128k that it does
    # not use (use_sliding_window false), and probing there would cost a 32k-token prefill.
    window = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is not False and (not layer_types or "sliding_attention" in layer_types):
        sizes.append(window)
    chunk = getattr(cfg, "attention_chunk_size", None)
    if not layer_types or "chunked_attention" in layer_types:
        sizes.append(chunk)
    lengths = {4, PROBE_PREFIX}
    for size in sizes:
        if isinstance(size, int) and size > 0:
            lengths |= {size - 1, size + 2}
    max_positions = getattr(cfg, "max_position_embeddings", None)
    if max_positions is not None:  # the tree adds two positions after the prefix
        lengths = {min(n, max_positions - 2) for n in lengths}
    return sorted(n for n in lengths if n >= 1)


def _keep_last(model: torch.nn.Module, n: int) -> dict[str, int]:
    """Ask only for the last ``n`` positions' logits where the forward allows it (a long probe
    prefix times a large vocabulary would otherwise allocate gigabytes of fp32 logits)."""
    return {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def check_tree_attention(target: torch.nn.Module, verifier: TreeVerifier | None = None) -> None:
    """Probe once that ``target`` honours our tree masks: score a 3-node tree (root with two
    sibling children) after prefixes of several lengths (`probe_prefix_lengths`) and compare every
    node's logits with a plain forward over its path.

    A model that ignores or rebuilds the mask lets the second child see its sibling and fails; a
    mask that is wrong only far into a sequence (a window or chunk we do not apply) fails at the
    longer prefixes."""
    verifier = verifier or TreeVerifier(target)
    device = target.device
    vocab = target.get_output_embeddings().weight.shape[0]
    lengths = probe_prefix_lengths(target)
    gen = torch.Generator().manual_seed(1234)
    sequence = torch.randint(0, vocab, (1, lengths[-1]), generator=gen).to(device)
    tokens = torch.randint(0, vocab, (3,), generator=gen)
    tree = Tree(TreeShape((-1, 0, 0)), tokens)
    tol = 1e-3 if target.dtype == torch.float32 else 5e-2
    for prefix_len in lengths:
        prompt = sequence[:, :prefix_len]
        with torch.no_grad():
            try:
                cache = DynamicCache()
                target(input_ids=prompt, use_cache=True, **{verifier.cache_arg: cache}, **_keep_last(target, 1))
                tree_logits, _ = verifier.forward(cache, tree, prefix_len)
            except Exception as e:  # noqa: BLE001 - any failure here means the same thing to the user
                raise UnsupportedModelError(
                    f"{_model_name(target)} failed on a prefill and a forward with a custom 4D attention mask "
                    f"({type(e).__name__}: {e}); tree verification needs a model whose forward takes a "
                    f"`{verifier.cache_arg}` cache and an `attention_mask` of shape [batch, 1, q_len, kv_len]"
                ) from e
            first = torch.cat([prompt, tokens[[0, 1]].to(device)[None]], dim=1)
            second = torch.cat([prompt, tokens[[0, 2]].to(device)[None]], dim=1)
            ref_01 = target(input_ids=first, **_keep_last(target, 2)).logits[0, -2:]
            ref_2 = target(input_ids=second, **_keep_last(target, 1)).logits[0, -1:]
        reference = torch.cat([ref_01, ref_2]).float()
        err = float((tree_logits.float() - reference).abs().max())
        scale = float(reference.abs().max()) + 1e-6
        if err > tol * scale:
            where = (
                "" if prefix_len == lengths[0] else
                f" after a {prefix_len}-token prefix (correct after {lengths[0]} tokens: the model limits attention "
                "far into a sequence, e.g. a sliding window or chunks, in a way draftheads does not reproduce)"
            )
            raise UnsupportedModelError(
                f"{_model_name(target)} does not honour a custom 4D attention mask{where}: a tree node's logits "
                f"differ from a plain forward over its path by {err:.3g}, so tree verification would be wrong. "
                "Try attn_implementation='eager' or 'sdpa', or a model whose forward accepts a 4D mask."
            )
