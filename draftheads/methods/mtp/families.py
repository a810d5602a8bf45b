"""The model families that ship multi-token-prediction (MTP) layers, and what differs between them.

An MTP layer is the same thing in every family (transformers' `modeling_layers.MtpLayer`: fc over
[enorm(embedding of the next token), hnorm(hidden state)], one decoder layer of the model's own
kind, a final norm, the model's LM head). What differs is only bookkeeping, kept here in one table:

- which config field counts the layers (Qwen3.5: ``mtp_num_hidden_layers``; DeepSeek-V3, GLM-4.5,
  Qwen3-Next: ``num_nextn_predict_layers``, which transformers reads as ``num_mtp_layers``), and
  whether checkpoints carry them while their config never counts them (Qwen3-Next: vLLM assumes one);
- how a checkpoint names the tensors (`QWEN_LAYOUT`: ``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
  ``mtp.pre_fc_norm_hidden``, ``mtp.layers.{i}.*``, ``mtp.norm``, as vLLM loads them in
  vllm/model_executor/models/qwen3_5_mtp.py and vllm/model_executor/models/qwen3_next_mtp.py;
  `DEEPSEEK_LAYOUT`: ``model.layers.{L+i}.{enorm, hnorm, eh_proj, shared_head.norm, <decoder
  layer>}``, as vllm/model_executor/models/deepseek_mtp.py loads them);
- which vLLM speculative method serves them (`vllm.config.speculative.MTPModelTypes`), if any.
"""
from __future__ import annotations

from dataclasses import dataclass

QWEN_LAYOUT = "qwen"
DEEPSEEK_LAYOUT = "deepseek"


@dataclass(frozen=True)
class MtpFamily:
    """One family's facts (module docstring). ``model_types``: the text config's ``model_type``
    values; ``count_keys``: config fields that say how many MTP layers the checkpoint has;
    ``implicit``: checkpoints hold one MTP layer their config does not count (found by their
    tensors); ``vllm_method``: vLLM's speculative method for it (None: vLLM has none);
    ``vllm_architecture``: the draft architecture vLLM builds for it (its MTP model class)."""

    name: str
    model_types: tuple[str, ...]
    count_keys: tuple[str, ...]
    layout: str
    vllm_method: str | None = None
    vllm_architecture: str | None = None
    implicit: bool = False
    #: Mixture-of-experts MTP blocks: transformers fuses their experts at load, which an export
    #: would have to split again per expert (not written yet).
    moe: bool = False


FAMILIES: tuple[MtpFamily, ...] = (
    MtpFamily("qwen3_5", ("qwen3_5_text", "qwen3_5"), ("mtp_num_hidden_layers",), QWEN_LAYOUT,
              "qwen3_5_mtp", "Qwen3_5MTP"),
    MtpFamily("qwen3_5_moe", ("qwen3_5_moe_text", "qwen3_5_moe"), ("mtp_num_hidden_layers",), QWEN_LAYOUT,
              "qwen3_5_mtp", "Qwen3_5MoeMTP", moe=True),
    MtpFamily("qwen3_next", ("qwen3_next",), ("num_nextn_predict_layers",), QWEN_LAYOUT,
              "qwen3_next_mtp", "Qwen3NextMTP", implicit=True, moe=True),
    MtpFamily("mellum", ("mellum",), ("num_mtp_layers", "num_nextn_predict_layers"), QWEN_LAYOUT),
    MtpFamily("deepseek_v3", ("deepseek_v3",), ("num_nextn_predict_layers", "num_mtp_layers"), DEEPSEEK_LAYOUT,
              "deepseek_mtp", "DeepSeekMTPModel", moe=True),
    MtpFamily("glm4_moe", ("glm4_moe",), ("num_nextn_predict_layers", "num_mtp_layers"), DEEPSEEK_LAYOUT,
              "glm4_moe_mtp", "Glm4MoeMTPModel", moe=True),
)


def family_of(model_type: str) -> MtpFamily | None:
    """The family of a text config's ``model_type``, or None when no known family ships MTP layers."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def declared_layers(family: MtpFamily | None, text_config) -> int:
    """How many MTP layers ``text_config`` says its checkpoint holds (0: none declared). A family
    whose configs never count them (``implicit``) may still hold one: see `shipped.find_shipped`."""
    if family is None:
        return 0
    for key in family.count_keys:
        value = getattr(text_config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def vllm_families() -> str:
    """The families vLLM serves with an MTP method, for error messages."""
    return ", ".join(f"{f.name} ({f.vllm_method})" for f in FAMILIES if f.vllm_method)
