"""The tree-attention probe: does this target honour our 4D masks? Checked once per decoder,
before any decode, so an unsupported model raises instead of decoding garbage."""
from __future__ import annotations

import torch
from ..heads.config import text_config
from .masks import UnsupportedModelError, model_name
from .output import logits_to_keep
from .tree import Tree, TreeShape
from .verify import TreeVerifier

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
                cache = verifier.new_cache()
                target(input_ids=prompt, use_cache=True, **{verifier.cache_arg: cache}, **logits_to_keep(target, 1))
                tree_logits, _ = verifier.forward(cache, tree, prefix_len)
            except Exception as e:  # noqa: BLE001 - any failure here means the same thing to the user
                raise UnsupportedModelError(
                    f"{model_name(target)} failed on a prefill and a forward with a custom 4D attention mask "
                    f"({type(e).__name__}: {e}); tree verification needs a model whose forward takes a "
                    f"`{verifier.cache_arg}` cache and an `attention_mask` of shape [batch, 1, q_len, kv_len]"
                ) from e
            first = torch.cat([prompt, tokens[[0, 1]].to(device)[None]], dim=1)
            second = torch.cat([prompt, tokens[[0, 2]].to(device)[None]], dim=1)
            ref_01 = target(input_ids=first, **logits_to_keep(target, 2)).logits[0, -2:]
            ref_2 = target(input_ids=second, **logits_to_keep(target, 1)).logits[0, -1:]
        reference = torch.cat([ref_01, ref_2]).float()
        err = float((tree_logits.float() - reference).abs().max())
        scale = float(reference.abs().max()) + 1e-6
        if err > tol * scale:
            where = (
                "" if prefix_len == lengths[0] else
                f" after a {prefix_len}-token prefix (correct after {lengths[0]} tokens: the model limits attention "
                "far into a sequence, e.g. a sliding window or chunks, in a way draftheads does not reproduce)"
            )
            states = "" if verifier.recurrent is None else (
                f" (or its {', '.join(verifier.recurrent.state_types)} layers' state does not follow the tree scan of "
                "draftheads.inference.recurrent)")
            raise UnsupportedModelError(
                f"{model_name(target)} does not honour a custom 4D attention mask{where}{states}: a tree node's logits "
                f"differ from a plain forward over its path by {err:.3g}, so tree verification would be wrong. "
                "Try attn_implementation='eager' or 'sdpa', or a model whose forward accepts a 4D mask."
            )
