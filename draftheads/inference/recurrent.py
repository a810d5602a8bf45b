"""The recurrent state of hybrid targets across a verify forward, and its commit to the accepted path.

An attention layer keeps one cache entry per token, so keeping a tree's accepted nodes is a choice of
entries (`kv.dynamic.commit`, `kv.ragged.commit_rows`). A linear-attention, state-space or convolution layer
(Gated DeltaNet in Qwen3.5 / Qwen3-Next / OLMo-hybrid / Kimi-Linear, Mamba-2 in Nemotron-H and
Falcon-H1, Mamba in Jamba, LFM2's short convolutions) keeps instead a fixed-size state per row: the
window of its last k convolution inputs and, for most, a recurrent matrix that every token advances.
transformers 5.25 keeps both in `LinearAttentionCacheLayerMixin` cache layers, and every such mixer
reads and writes them through the same few cache calls.

Here a verify forward (`verify.TreeVerifier`) RECORDS the state after every node without moving the
row's own state, and the KV stores' commits (`commit_states`) set each row's state to the one after its
last accepted node: rolling back is a slot choice, no replay. Two ways to record, one per tree kind:

- a chain in every row (prompt lookup, a draft model, chain heads; a plain step needs neither): one
  forward under transformers' own past recording (`activate_past_recording`), which makes each mixer
  run its one-token kernel token by token over the chain (the arithmetic of `generate`'s steps, not the
  chunked prefill kernel's) and keep every intermediate state; the projections stay batched.
- a tree: the mixers run level by level (`_LevelScan`): each level's nodes, of every row, go through
  the mixer's own one-token path at once as a batch, each node starting from its parent's state, so
  siblings never see each other and the arithmetic is again `generate`'s one-token step.

Only the mixers' forwards are re-entered (their module's own forward, swapped in for the forward and
restored after); no transformers modeling code is copied.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    DynamicLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionCacheLayerMixin,
)

from ..heads.config import target_decoder, text_config
from .masks import UnsupportedModelError, model_name


def _linear(layer) -> bool:
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def attention_layers(cache) -> list:
    """The cache layers that hold keys and values (hybrid targets also have state-only and empty ones)."""
    return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]


def keep_prefix(cache, length: int) -> None:
    """Drop every attention entry past ``length`` (what a verify forward that is not committed added:
    calibrate's and the benchmarks' timed forwards). A verify forward leaves recurrent state as it was."""
    for layer in attention_layers(cache):
        layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


def _mixer_of(decoder_layer: torch.nn.Module, index: int) -> torch.nn.Module | None:
    """The module of ``decoder_layer`` that advances cache layer ``index``'s state: the one that
    carries ``layer_idx == index`` and a depthwise convolution (every transformers mixer keeps a conv
    window), and whose forward takes the cache."""
    for module in decoder_layer.modules():
        if getattr(module, "layer_idx", None) != index or module is decoder_layer:
            continue
        if not any(isinstance(child, torch.nn.Conv1d) for child in module.modules()):
            continue
        if "cache" in inspect.signature(module.forward).parameters:
            return module
    return None


@dataclass(frozen=True)
class RecurrentLayout:
    """Which cache layers of a hybrid target keep a state, and which module advances each."""

    cache_kinds: tuple[type, ...]  # the class of every cache layer, as `DynamicCache(config=...)` builds them
    mixers: dict[int, torch.nn.Module]  # cache layer index -> its mixer
    layer_types: tuple[str, ...]  # the config's layer type of every layer

    @property
    def layers(self) -> list[int]:
        return sorted(self.mixers)

    @property
    def state_types(self) -> tuple[str, ...]:
        """The layer types that keep a state (what the verifier passes no attention mask for)."""
        return tuple(dict.fromkeys(self.layer_types[i] for i in self.layers))

    def no_masks(self) -> dict[str, None]:
        """The entries of a per-layer-type mask dict for the state layers: none (transformers' own
        forwards read "linear_attention" for Mamba layers whatever their type is called)."""
        return dict.fromkeys((*self.state_types, "linear_attention"))

    def new_cache(self) -> DynamicCache:
        """An empty cache for this target: state layers as transformers builds them, and every attention
        layer FULL length (the verifier's masks apply sliding windows and chunks; a truncating window layer
        would drop the entries a tree's rejected nodes leave, and commit moves entries by position)."""
        layers = []
        for kind in self.cache_kinds:
            if kind is DummyLayer:
                layers.append(DummyLayer())
            elif issubclass(kind, LinearAttentionCacheLayerMixin):
                hybrid = issubclass(kind, DynamicLayer)  # Falcon-H1: a state and an attention part in one layer
                layers.append(LinearAttentionAndFullAttentionLayer() if hybrid else kind())
            else:
                layers.append(DynamicLayer())
        cache = DynamicCache()
        Cache.__init__(cache, layers=layers)  # a DynamicCache (what the models expect) over these layers
        return cache


def cache_kinds(model_or_config) -> tuple[type, ...]:
    """The class of every cache layer transformers lays out for this model (empty where it cannot)."""
    cfg = text_config(model_or_config)
    if not getattr(cfg, "layer_types", None) or not hasattr(cfg, "get_text_config"):
        return ()
    try:
        return tuple(type(layer) for layer in DynamicCache(config=cfg).layers)
    except Exception:  # noqa: BLE001 - a config transformers cannot lay a cache out for: attention-only path
        return ()


def state_layer_types(model_or_config) -> tuple[str, ...]:
    """The layer types of a model (or config) that keep a recurrent state: linear attention, state-space
    or convolution layers (empty for attention-only models)."""
    types = getattr(text_config(model_or_config), "layer_types", None) or ()
    return tuple(dict.fromkeys(t for t, kind in zip(types, cache_kinds(model_or_config))
                               if issubclass(kind, LinearAttentionCacheLayerMixin)))


def recurrent_layout(target: torch.nn.Module) -> RecurrentLayout | None:
    """The target's recurrent layers, or None for an attention-only target. Refuses, by name, a state
    layer this version cannot record and roll back (no mixer found for it)."""
    kinds = cache_kinds(target)
    layer_types = getattr(text_config(target), "layer_types", None)
    state_layers = [i for i, kind in enumerate(kinds) if issubclass(kind, LinearAttentionCacheLayerMixin)]
    if not state_layers:
        return None
    decoder = target_decoder(target)
    blocks = getattr(decoder, "layers", None)
    mixers: dict[int, torch.nn.Module] = {}
    for index in state_layers:
        mixer = _mixer_of(blocks[index], index) if blocks is not None and index < len(blocks) else None
        if mixer is None:
            raise UnsupportedModelError(
                f"{model_name(target)} layer {index} (type {layer_types[index]!r}, cache layer "
                f"{kinds[index].__name__}) keeps a recurrent state, but draftheads found no module there that "
                "advances it through the cache (a module with layer_idx, a convolution and a `cache` argument): "
                "its state cannot be recorded per draft token and rolled back, so it cannot be verified"
            )
        mixers[index] = mixer
    return RecurrentLayout(kinds, mixers, tuple(layer_types))


# -- what one verify forward recorded -------------------------------------------------------------


@dataclass
class RecurrentStep:
    """The state after every node of one verify forward, per state layer: ``conv[i][s]`` and
    ``rec[i][s]`` are [rows, slots, ...] tensors where slot 0 is the row's state before the forward and
    slot j + 1 the state after node j (a chain's node j is its j-th token)."""

    conv: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    rec: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)


def _select(slots: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
    """Row r's slot ``picks[r]`` of [rows, slots, ...]."""
    if slots.shape[0] == 1:
        return slots[0, int(picks[0])][None].clone()
    return slots[torch.arange(slots.shape[0], device=slots.device), picks.to(slots.device)]


def commit_states(cache, step: RecurrentStep, last_nodes: Sequence[int], kept: int) -> None:
    """Every row's state := the state after its last accepted node (``last_nodes[r]``, node index in
    the row's tree; 0 = the root only). ``kept``: the most tokens a row kept, what the layers' token
    count (one per batch) moves by."""
    picks = torch.tensor([n + 1 for n in last_nodes], dtype=torch.long)
    for index, per_state in step.conv.items():
        layer = cache.layers[index]
        for s, slots in per_state.items():
            layer.conv_states[s] = _select(slots, picks)
    for index, per_state in step.rec.items():
        layer = cache.layers[index]
        for s, slots in per_state.items():
            layer.recurrent_states[s] = _select(slots, picks)
    for index in set(step.conv) | set(step.rec):
        cache.layers[index].cumulative_length_linear.add_(kept)


def keep_state_rows(cache, rows: torch.Tensor) -> None:
    """Only ``rows`` of every state layer go on (finished rows leave the batch)."""
    for layer in cache.layers:
        if not _linear(layer):
            continue
        for s in range(layer.number_of_states):
            if layer.is_conv_states_initialized[s]:
                layer.conv_states[s] = layer.conv_states[s].index_select(0, rows.to(layer.conv_states[s].device))
            if layer.is_recurrent_states_initialized[s]:
                layer.recurrent_states[s] = layer.recurrent_states[s].index_select(
                    0, rows.to(layer.recurrent_states[s].device))


# -- recording a chain: transformers' past recording, then the row's state restored ---------------

# A mixer under past recording splits its input into a chunked head and a recorded tail, and calls its
# chunked kernel on the head even when a verify chain is all tail: on ZERO tokens. Such a call's answer
# is known without running it (an empty output, the initial state in float32, as the torch kernels
# return it), and running it costs about a one-token kernel call per layer on a CPU (padding, reshapes
# and masks over an empty sequence), most of what recording a short chain cost (docs/results.md, "Small
# hybrid targets"). So while a chain is recorded (`_empty_chunks_skipped`) these kernels answer zero-token
# calls themselves. (With an accelerator kernel installed, its answer on zero tokens is the same state,
# here in float32 as the torch kernels return it.)

def _empty_gated_delta(query, key, value, *args, initial_state=None, output_final_state=False, **kwargs):
    """A gated delta rule (Gated DeltaNet: Qwen3.5/3.6, Qwen3-Next, OLMo-hybrid) over no tokens: the output
    [B, 0, Hv, Dv] in the query's dtype and the initial state, as the torch kernel returns them."""
    out = query.new_empty((value.shape[0], 0, *value.shape[2:]))
    return out, initial_state.to(torch.float32) if output_final_state else None


def _empty_mamba2_scan(hidden_states, *args, initial_states=None, return_final_states=False, **kwargs):
    """A Mamba-2 chunked scan (Nemotron-H, Falcon-H1, Bamba, Granite hybrids) over no tokens: a float32
    output [B, 0, H, P] and a copy of the initial state (the mixer then advances it in place)."""
    out = hidden_states.new_empty(hidden_states.shape, dtype=torch.float32)
    return (out, initial_states.to(torch.float32, copy=True)) if return_final_states else out


#: module-level kernel name -> its zero-token answer, and the keyword that carries its initial state
_EMPTY_CHUNK_ANSWERS = {
    "torch_chunk_gated_delta_rule": (_empty_gated_delta, "initial_state"),
    "mamba2_chunk_scan": (_empty_mamba2_scan, "initial_states"),
}


def _answering_empty_calls(kernel, answer, state_keyword: str):
    """``kernel``, except that a call on zero tokens (its first argument's dim 1) that starts from a state
    is answered by ``answer``."""

    def chunked(first, *args, **kwargs):
        if first.shape[1] or kwargs.get(state_keyword) is None:
            return kernel(first, *args, **kwargs)
        return answer(first, *args, **kwargs)

    chunked.answers_empty_calls = True
    return chunked


@contextlib.contextmanager
def _empty_chunks_skipped(layout: RecurrentLayout) -> Iterator[None]:
    """While a chain is recorded, the mixers' modules' zero-token chunked kernel calls answered directly
    (`_EMPTY_CHUNK_ANSWERS`); the modules' own kernels are back when it ends. The swap is of a module
    global, the name the mixer's forward calls, so it holds for every model of that module for the
    forward's length (the answer is the kernel's own, so another model's forward is not changed)."""
    swapped = []
    for module_name in {type(mixer).__module__ for mixer in layout.mixers.values()}:
        module = sys.modules.get(module_name)
        for name, (answer, state_keyword) in _EMPTY_CHUNK_ANSWERS.items():
            kernel = getattr(module, name, None)
            if kernel is None or getattr(kernel, "answers_empty_calls", False):  # absent, or swapped already
                continue
            setattr(module, name, _answering_empty_calls(kernel, answer, state_keyword))
            swapped.append((module, name, kernel))
    try:
        yield
    finally:
        for module, name, kernel in swapped:
            setattr(module, name, kernel)


def _record_chain(cache, layout: RecurrentLayout, n: int) -> dict[int, dict[int, torch.Tensor]]:
    """Past recording on for an n-token chain; returns every row's recurrent state before it (copies: some
    mixers advance the cache's own state tensor in place, Jamba's Mamba among them)."""
    before = {}
    for index in layout.layers:
        layer = cache.layers[index]
        layer.activate_past_recording(recurrent_states_to_keep=n)
        # one history list per state (`activate_past_recording` shares one list between them)
        layer.recurrent_states_history = {s: [] for s in range(layer.number_of_states)}
        before[index] = {s: layer.recurrent_states[s].clone() for s in range(layer.number_of_states)
                         if layer.is_recurrent_states_initialized[s]}
    return before


def _collect_chain(cache, layout: RecurrentLayout, n: int, before: dict[int, dict[int, torch.Tensor]],
                   recorded: bool = True) -> RecurrentStep:
    """The recorded states as slots (``recorded``: the forward ran to its end), and every layer back to its
    state before the forward."""
    step = RecurrentStep()
    for index in layout.layers:
        layer = cache.layers[index]
        conv, rec = {}, {}
        for s in range(layer.number_of_states):
            if layer.is_conv_states_initialized[s]:
                full = layer.conv_states[s]  # [rows, C, k + n]: the window before, then the chain's inputs
                k = layer.conv_kernel_size[s]
                conv[s] = full.unfold(-1, k, 1).transpose(1, 2)  # [rows, n + 1, C, k]: windows ending at each slot
                layer.conv_states[s] = full[..., :k].contiguous()
            if s in before[index] and not recorded:
                layer.recurrent_states[s] = before[index][s]
            elif s in before[index]:
                # the history holds (a copy of) the state as the mixer left it before its update, then the
                # states after 1 .. n-1 tokens; the state after n is the layer's own
                history = layer.recurrent_states_history[s]
                if len(history) != n:
                    raise UnsupportedModelError(
                        f"layer {index}'s mixer ({type(layout.mixers[index]).__name__}) recorded {len(history)} states "
                        f"over a {n}-token chain instead of one per token: its state cannot be rolled back per token"
                    )
                rec[s] = torch.stack([before[index][s], *history[1:], layer.recurrent_states[s]], dim=1)
                layer.recurrent_states[s] = before[index][s]
        layer.record_past = False
        layer.recurrent_states_history = {s: [] for s in range(layer.number_of_states)}
        if recorded:
            layer.cumulative_length_linear.sub_(n)
        step.conv[index], step.rec[index] = conv, rec
    return step


# -- recording a tree: the mixers run level by level ----------------------------------------------


class _LevelStates:
    """The cache a mixer sees for one tree level: its nodes' parents' states as a batch, and the
    one-token path's calls answered from them (the mixer's conv update writes the window in place)."""

    def __init__(self, index: int, conv: dict[int, torch.Tensor], rec: dict[int, torch.Tensor]) -> None:
        self.index, self.conv, self.rec = index, conv, rec

    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        return self.conv.get(state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self.rec.get(state_idx)

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs):
        self.rec[state_idx] = recurrent_states
        return recurrent_states

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        return 0

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        pass

    def update_conv_state(self, *args, **kwargs):
        raise RuntimeError(
            f"the mixer of layer {self.index} asked to grow its convolution state in a one-token step: a tree "
            "level must go through the one-token path (is the prompt's state missing?)"
        )


@dataclass
class _LevelScan:
    """One forward's tree topology, as levels: ``levels[d]`` = (rows, nodes, parent slots) of every node
    at depth d over all rows (a node's parent slot: 0 for a root or padding node, parent + 1 otherwise)."""

    levels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    rows: int
    n: int

    @classmethod
    def of(cls, parents: torch.Tensor) -> "_LevelScan":
        """``parents`` [rows, n]: each node's parent node (-1: root, or a padding node)."""
        rows, n = parents.shape
        depth = torch.zeros(rows, n, dtype=torch.long)
        for j in range(n):  # parents come before their children
            p = parents[:, j]
            depth[:, j] = torch.where(p >= 0, depth.gather(1, p.clamp(min=0)[:, None])[:, 0] + 1, 0)
        levels = []
        for d in range(int(depth.max()) + 1):
            r, j = (depth == d).nonzero(as_tuple=True)
            levels.append((r, j, parents[r, j] + 1))
        return cls(levels, rows, n)


def _scan_forward(mixer: torch.nn.Module, original, scan: _LevelScan, cache, step: RecurrentStep):
    """A mixer's forward over [rows, n, H] tree tokens: level by level through its own one-token path."""
    index = mixer.layer_idx
    layer = cache.layers[index]

    def forward(hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs) -> torch.Tensor:
        out = None
        conv, rec = {}, {}
        for s in range(layer.number_of_states):
            if layer.is_conv_states_initialized[s]:
                before = layer.conv_states[s]
                conv[s] = before.new_zeros((scan.rows, scan.n + 1, *before.shape[1:]))
                conv[s][:, 0] = before
            if layer.is_recurrent_states_initialized[s]:
                before = layer.recurrent_states[s]
                rec[s] = before.new_zeros((scan.rows, scan.n + 1, *before.shape[1:]))
                rec[s][:, 0] = before
        for rows, nodes, parent_slots in scan.levels:
            device = hidden_states.device
            r, j, p = rows.to(device), nodes.to(device), parent_slots.to(device)
            level = _LevelStates(index, {s: t[r, p] for s, t in conv.items()}, {s: t[r, p] for s, t in rec.items()})
            y = original(hidden_states[r, j][:, None], cache=level, attention_mask=None, **kwargs)
            if out is None:
                out = y.new_zeros((scan.rows, scan.n, *y.shape[2:]))
            out[r, j] = y[:, 0]
            for s in conv:
                conv[s][r, j + 1] = level.conv[s]
            for s in rec:
                rec[s][r, j + 1] = level.rec[s]
        step.conv[index], step.rec[index] = conv, rec
        return out

    return forward


def _chains(parents: torch.Tensor) -> bool:
    """Whether every row is a chain, possibly followed by padding nodes (parent -1 after node 0, see
    `ragged.pad_trees`): a chain's recurrence then runs through the padding after the row's last real
    token, which no acceptance ever keeps."""
    n = parents.shape[1]
    chained = parents == torch.arange(-1, n - 1)
    padding = (parents == -1) & (torch.arange(n) > 0)
    # from its first padding node on, a row is padding only
    after_padding = padding.long().cummax(dim=1).values.bool()
    return bool(torch.where(after_padding, padding, chained).all())


@contextlib.contextmanager
def recording(cache, layout: RecurrentLayout | None, parents: torch.Tensor | None) -> Iterator[RecurrentStep | None]:
    """Around one verify forward over [rows, n] tree tokens (``parents`` [rows, n] on the host, None for
    a one-token step): yields the `RecurrentStep` the forward fills, or None where nothing is recorded
    (attention-only targets, one-token steps, whose mixers advance the state in place as `generate`
    does). Every row's own state is as before the forward when it ends."""
    if layout is None or parents is None or parents.shape[1] == 1:
        yield None
        return
    if _chains(parents):
        n = parents.shape[1]
        before = _record_chain(cache, layout, n)
        holder = RecurrentStep()
        try:
            with _empty_chunks_skipped(layout):
                yield holder
        except BaseException:  # the rows keep their state and stop recording; the error is the forward's
            _collect_chain(cache, layout, n, before, recorded=False)
            raise
        collected = _collect_chain(cache, layout, n, before)
        holder.conv, holder.rec = collected.conv, collected.rec
        return
    scan = _LevelScan.of(parents)
    step = RecurrentStep()
    swapped = []  # (mixer, its own instance-level forward if it had one)
    try:
        for mixer in layout.mixers.values():
            swapped.append((mixer, mixer.__dict__.get("forward")))
            mixer.forward = _scan_forward(mixer, mixer.forward, scan, cache, step)
        yield step
    finally:
        for mixer, own in swapped:
            if own is None:
                del mixer.forward  # the class's forward shows again
            else:
                mixer.forward = own
