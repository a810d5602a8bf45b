"""P-EAGLE checkpoints (speculators ``peagle``) -> draftheads PEagleHead.

The EAGLE-3 layout (methods/eagle3/imports.py) plus ``mask_hidden``, a top-level ``mask_token_id``
and the draft's own trained ``embed_tokens`` (kept; without one, vLLM embeds with the target's
table, so that is what the imported heads get). ``norm_before_fc`` imports as for EAGLE-3: vLLM's
P-EAGLE mapping forwards it, and vLLM puts ``mask_hidden`` through the same norm before fc, as
draftheads' P-EAGLE head does (methods/peagle/heads.py, ``mask_input``); ``fc_norm`` and ``norm_output`` are
refused (vLLM's P-EAGLE mapping does not forward them; the speculators trainer's default
``norm_output`` included).
"""
from __future__ import annotations

from typing import Any

import torch

from .heads import PEagleHead
from ..eagle3.imports import Eagle3Reading


class PEagleReading(Eagle3Reading):
    heads = PEagleHead
    title = "P-EAGLE"
    norm_before_residual = False  # vLLM's P-EAGLE mapping defaults to false
    refused = ("fc_norm", "norm_output")

    def take(self, tensors: dict[str, torch.Tensor], cfg: dict, target: torch.nn.Module, where: str) -> dict[str, Any]:
        """Pop what P-EAGLE adds to EAGLE-3: its embedding, mask_hidden; read the mask id and depths."""
        mask_hidden = tensors.pop("mask_hidden", None)
        if mask_hidden is None:
            raise ValueError(f"{where}: a speculators peagle checkpoint needs mask_hidden (vLLM refuses one without it)")
        mask_id = cfg.get("mask_token_id", cfg.get("pard_token", cfg.get("ptd_token_id")))
        vocab = int(target.get_output_embeddings().weight.shape[0])
        if isinstance(mask_id, bool) or not isinstance(mask_id, int) or not 0 <= mask_id < vocab:
            raise ValueError(f"{where}: mask_token_id {mask_id!r} is missing or outside the target's vocabulary "
                             f"0..{vocab - 1}")
        methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
        depths = methods[0].get("speculative_tokens")
        if isinstance(depths, bool) or not isinstance(depths, int) or depths < 1:
            raise ValueError(f"{where}: speculators_config.proposal_methods[0].speculative_tokens {depths!r} is not a "
                             "positive integer (the draft positions the checkpoint was made for)")
        embedding = tensors.pop("embed_tokens.weight", None)
        if embedding is None:  # vLLM shares the target's embedding then: so do the imported heads
            embedding = target.get_input_embeddings().weight.detach().cpu()
        return {"tensors": {"embed_tokens.weight": embedding, "mask_hidden": mask_hidden.reshape(1, 1, -1)},
                "num_heads": int(depths), "extra": {"mask_token_id": int(mask_id), "cod_ratio": 0.7, "cod_min_ratio": 0.2}}
