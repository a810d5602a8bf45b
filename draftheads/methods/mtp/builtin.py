"""``builtin-mtp``: the MTP layer a target ships, drafted with as it is (no training by draftheads).

``dh.load_heads("builtin-mtp", target=target)`` and ``draftheads generate --heads builtin-mtp`` go
through the method's ``builtin`` (`registry.Method.builtin`) to here."""
from __future__ import annotations

import warnings

import torch

from .heads import MtpHead
from .shipped import find_shipped


def builtin_heads(target: torch.nn.Module):
    """``builtin-mtp``: the heads ``target``'s checkpoint ships (its first MTP layer), untrained by
    draftheads; refused, saying why, for a target that ships none."""
    shipped = find_shipped(target)
    if not shipped.layers:
        name = getattr(target.config, "_name_or_path", "") or type(target).__name__
        raise ValueError(f"builtin-mtp: {name} ships no MTP layer: {shipped.reason}. Train MTP heads for it "
                         "(heads.head_type: mtp starts a fresh layer) and pass their folder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one thing for_target might say (more layers than one) is said here
        heads = MtpHead.for_target(target, num_heads=1)
    if shipped.layers > 1:
        warnings.warn(f"builtin-mtp: {target.config._name_or_path} ships {shipped.layers} MTP layers; drafting with the "
                      "first at every depth (as vLLM's MTP drafters do)", UserWarning, stacklevel=3)
    return heads
