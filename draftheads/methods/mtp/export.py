"""MTP heads -> the checkpoint layout vLLM's MTP drafters load (and transformers' `MtpModel` reads).

vLLM serves a target's MTP layer with ``speculative_config={"method": "mtp", "model": DIR}``: it
reads DIR's config.json (the target's own config, whose model type it maps to its MTP drafter:
``qwen3_5_text`` -> ``Qwen3_5MTP``, ``qwen3_next`` -> ``Qwen3NextMTP``, ``deepseek_v3`` ->
``DeepSeekMTPModel``; `families.FAMILIES`) and DIR's safetensors under the names a real checkpoint
gives the layer (`families.QWEN_LAYOUT`, `families.DEEPSEEK_LAYOUT`). Its loader is strict (every
parameter of the drafter must come from the file), and the drafter holds an embedding and an LM
head, which it shares with the target after loading: the target's are written beside the layer.

transformers reads the same tensors (``MtpModel.from_pretrained(main_model)`` opens the safetensors
of ``main_model.config.name_or_path`` and keeps the MTP names), so the folder is also what its
``generate(use_mtp=True)`` drafts with.

The block's tensors go back to the checkpoint's names through transformers' own
``revert_weight_conversion`` (what its ``save_pretrained`` does: experts fused at load are written
per expert again). Refused, by name: heads of a family vLLM has no MTP drafter for (a fresh layer
on a Llama, Mellum).
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from ...export.common import EngineFolder, ExportError, dtype_name, verifier_lm_head
from .families import DEEPSEEK_LAYOUT, QWEN_LAYOUT, MtpFamily, family_of, vllm_families

#: transformers' MtpLayer names -> the Qwen layout's (under ``mtp.``), for the parts outside the block.
QWEN_NAMES = {"eh_proj.weight": "fc.weight", "enorm.weight": "pre_fc_norm_embedding.weight",
              "hnorm.weight": "pre_fc_norm_hidden.weight", "post_norm.weight": "norm.weight"}
#: ... -> the DeepSeek layout's (under ``model.layers.{L}.``).
DEEPSEEK_NAMES = {"eh_proj.weight": "eh_proj.weight", "enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight",
                  "post_norm.weight": "shared_head.norm.weight"}


def exported_family(heads) -> MtpFamily:
    """The family the heads' layer belongs to, refused (named) when vLLM has no MTP drafter for it."""
    model_type = str(heads.config.extra["mtp_config"].get("model_type", ""))
    family = family_of(model_type)
    arch = heads.config.target.architecture if heads.config.target else model_type
    if family is None or family.vllm_method is None:
        raise ExportError(
            f"vLLM has no MTP drafter for {arch} (model type {model_type!r}): its MTP methods serve "
            f"{vllm_families()}. Serve these heads with draftheads, or train EAGLE-3 heads for this target")
    return family


def checkpoint_block(block: dict[str, torch.Tensor], target) -> dict[str, torch.Tensor]:
    """The decoder block's tensors (names inside a decoder layer) as the target's checkpoint names
    them: transformers' ``revert_weight_conversion`` with the model type's default conversions (as
    for a model built in memory: the ones a load recorded may hold only those its checkpoint matched)."""
    from transformers.core_model_loading import revert_weight_conversion

    prefix = "model.layers.0."
    missing = object()
    recorded = target.__dict__.pop("_weight_conversions", missing)
    try:
        reverted = revert_weight_conversion(target, {prefix + k: v for k, v in block.items()})
    finally:
        if recorded is not missing:
            target._weight_conversions = recorded
    out = {}
    for name, value in reverted.items():
        if not name.startswith(prefix):
            raise ExportError(f"transformers named a block tensor {name!r} when writing it back (expected {prefix}*)")
        out[name[len(prefix):]] = value.detach().cpu().contiguous()
    return out


def layer_tensors(heads, family: MtpFamily, target) -> dict[str, torch.Tensor]:
    """The MTP layer's tensors under the family's checkpoint names."""
    state = {k[len("layers.0."):]: v.detach().cpu().contiguous() for k, v in heads.state_dict().items()
             if k.startswith("layers.0.")}
    block = checkpoint_block({k[len("mtp_block."):]: v for k, v in state.items() if k.startswith("mtp_block.")}, target)
    state = {k: v for k, v in state.items() if not k.startswith("mtp_block.")}
    state.update({"mtp_block." + k: v for k, v in block.items()})
    if family.layout == QWEN_LAYOUT:
        prefix, block, outside = "mtp.", "mtp.layers.0.", QWEN_NAMES
    elif family.layout == DEEPSEEK_LAYOUT:
        prefix = block = f"model.layers.{heads.config.target.num_hidden_layers}."
        outside = DEEPSEEK_NAMES
    else:  # a family added to the table without its layout here
        raise ExportError(f"MTP layout {family.layout!r} has no writer")
    out = {}
    for name, value in state.items():
        if name.startswith("mtp_block."):
            out[block + name[len("mtp_block."):]] = value
        else:
            out[prefix + outside[name]] = value
    return out


def shared_tensors(heads, family: MtpFamily, verifier: str | None, verifier_cfg: dict) -> dict[str, torch.Tensor]:
    """The target's embedding and LM head, which vLLM's drafter loads (then shares with the target),
    read from the verifier folder's safetensors (the LM head checked against the heads' fingerprint)."""
    head = verifier_lm_head(verifier, heads.config).contiguous()
    emb = verifier_tensor(Path(verifier), "embed_tokens.weight").contiguous()
    if family.layout == DEEPSEEK_LAYOUT:  # each DeepSeek MTP layer names its own copies
        layer = f"model.layers.{heads.config.target.num_hidden_layers}."
        return {layer + "embed_tokens.weight": emb, layer + "shared_head.head.weight": head}
    out = {"model.embed_tokens.weight": emb}
    if not _tied(verifier_cfg):
        out["lm_head.weight"] = head
    return out


def verifier_tensor(folder: Path, suffix: str) -> torch.Tensor:
    """The one tensor of the verifier's safetensors whose name ends with ``suffix`` (outside any MTP layer)."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.endswith(suffix) and not name.startswith("mtp.") and ".layers." not in name:
                    return f.get_tensor(name)
    raise ExportError(f"no *{suffix} in {folder}'s safetensors files")


def structural_target(verifier: str):
    """The target's model built on the meta device (no weights): what transformers' weight
    conversions are looked up from."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(verifier))


def _tied(cfg: dict) -> bool:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    return bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def draft_config(heads, family: MtpFamily, verifier_cfg: dict) -> dict:
    """The target's own config with the MTP layer counted as vLLM and transformers count it."""
    config = copy.deepcopy(verifier_cfg) if verifier_cfg else {}
    if not config:
        config = {k: v for k, v in heads.config.extra["mtp_config"].items()}
        config["num_hidden_layers"] = heads.config.target.num_hidden_layers
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    for key in family.count_keys:
        text[key] = 1
    if family.name in ("qwen3_5", "qwen3_5_moe"):
        config["mtp_num_hidden_layers"] = 1  # vLLM reads it from the top level too
    return config


def checkpoint_tensors(heads, family: MtpFamily, verifier: str | None, verifier_cfg: dict) -> dict[str, torch.Tensor]:
    """The MTP layer under its family's checkpoint names, with the target's embedding and LM head."""
    if not verifier or not Path(verifier).is_dir():
        raise ExportError("the MTP export writes the target's embedding and LM head beside the layer (vLLM's drafter "
                          f"loads them): pass the target folder with --verifier (got {verifier!r}, not a local folder)")
    return {**layer_tensors(heads, family, structural_target(verifier)),
            **shared_tensors(heads, family, verifier, verifier_cfg)}


def export_vllm(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
    family = exported_family(heads)
    tensors = checkpoint_tensors(heads, family, verifier, verifier_cfg)
    config = draft_config(heads, family, verifier_cfg)
    config["torch_dtype"] = dtype_name(tensors)
    k = num_speculative_tokens or 1
    notes = [f"load with speculative_config={{'method': 'mtp', 'model': DIR, 'num_speculative_tokens': {k}}} "
             f"(vLLM's {family.vllm_method}: {family.vllm_architecture}); it drafts every depth with this one layer",
             "the same folder is what transformers' MtpModel.from_pretrained reads, for a main model whose "
             "config.name_or_path is DIR"]
    return EngineFolder(config, tensors, notes)
