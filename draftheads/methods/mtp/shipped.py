"""The MTP layers a target checkpoint ships: whether it has any, and reading them.

transformers builds the target without them (Qwen3.5 and Qwen3-Next drop ``mtp.*`` at load:
``_keys_to_ignore_on_load_unexpected``; DeepSeek-V3 drops ``model.layers.61.*``) and reads them
only into its own `modeling_layers.MtpModel`, whose ``from_pretrained(main_model)`` finds them in
the target's own safetensors with the main model's weight conversions (experts fused, checkpoint
renames). That is how the heads read them too, so that the shipped layer is exactly the one
``generate(use_mtp=True)`` drafts with. ``MtpModel`` counts the layers in the text config's
``num_mtp_layers``; families that count them elsewhere (Qwen3.5's ``mtp_num_hidden_layers``) or
not at all (Qwen3-Next) have it declared for the duration of the read (`declared`).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ...heads.config import text_config
from .families import DEEPSEEK_LAYOUT, FAMILIES, MtpFamily, declared_layers, family_of

INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass(frozen=True)
class Shipped:
    """What a target checkpoint holds: its family (None: no known family ships MTP layers), how
    many MTP layers it has (0: none) and, when none, why (said to the user)."""

    family: MtpFamily | None
    layers: int
    reason: str = ""


def checkpoint_keys(name_or_path: str) -> set[str] | None:
    """The tensor names of a checkpoint (a folder or a Hub id in the local cache), or None when
    they cannot be listed (a model built in memory, a GGUF, nothing cached)."""
    if not name_or_path:
        return None
    folder = Path(name_or_path)
    if folder.is_dir():
        index, single = folder / INDEX_NAME, folder / WEIGHTS_NAME
        files = [single] if single.is_file() else sorted(folder.glob("*.safetensors"))
    else:
        try:
            from transformers.utils import cached_file

            found = cached_file(name_or_path, INDEX_NAME, _raise_exceptions_for_missing_entries=False)
            index = Path(found) if found else None
            found = None if index else cached_file(name_or_path, WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False)
            files = [Path(found)] if found else []
        except Exception:  # noqa: BLE001 - offline, unknown id: nothing to list
            return None
    if index is not None and index.is_file():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    if not files:
        return None
    from safetensors import safe_open

    keys: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            keys.update(f.keys())
    return keys


def mtp_prefix(family: MtpFamily, num_hidden_layers: int) -> str:
    """Where a family's checkpoints keep the first MTP layer's tensors."""
    return f"model.layers.{num_hidden_layers}." if family.layout == DEEPSEEK_LAYOUT else "mtp."


def find_shipped(target: torch.nn.Module) -> Shipped:
    """How many MTP layers ``target``'s checkpoint ships, read from its config and its tensor names."""
    cfg = text_config(target)
    model_type = str(getattr(cfg, "model_type", ""))
    family = family_of(model_type)
    if family is None:
        known = ", ".join(t for f in FAMILIES for t in f.model_types)
        return Shipped(None, 0, f"its model type {model_type!r} ships no MTP layers in any family draftheads knows ({known})")
    name = str(getattr(target.config, "_name_or_path", "") or "")
    keys = checkpoint_keys(name)
    prefix = mtp_prefix(family, int(cfg.num_hidden_layers))
    has = None if keys is None else any(k.startswith(prefix) or f".{prefix}" in k for k in keys)
    count = declared_layers(family, cfg)
    if count == 0 and family.implicit and has:
        count = 1  # Qwen3-Next's configs never count the layer its checkpoints ship (vLLM assumes one)
    if count == 0:
        fields = " / ".join(family.count_keys)
        return Shipped(family, 0, f"its config declares no MTP layers ({fields} unset or 0)")
    if keys is None:
        where = f"{name!r}" if name else "a model that was not loaded from a checkpoint"
        return Shipped(family, 0, f"its config declares {count} MTP layer(s) but no checkpoint tensors can be listed for "
                                  f"{where}")
    if not has:
        return Shipped(family, 0, f"its config declares {count} MTP layer(s) but {name} has no {prefix}* tensors "
                                  "(a checkpoint saved by transformers drops them)")
    return Shipped(family, count)


@contextmanager
def declared(target: torch.nn.Module, layers: int):
    """``target``'s text config seen by transformers' MTP code as holding ``layers`` MTP layers
    of full attention (``num_mtp_layers``, ``mtp_layer_types``) while the block runs; its own
    fields come back afterwards. `MtpModel` and ``get_mtp_config`` read only these names."""
    cfg = target.config.get_text_config(decoder=True)
    wanted = {"num_mtp_layers": layers}
    if getattr(cfg, "layer_types", None) is not None and getattr(cfg, "mtp_layer_types", None) is None:
        wanted["mtp_layer_types"] = ["full_attention"] * layers
    mlp_types = getattr(cfg, "mlp_layer_types", None)
    if mlp_types is not None and getattr(cfg, "mtp_mlp_layer_types", None) is None:
        wanted["mtp_mlp_layer_types"] = [mlp_types[-1]] * layers
    missing = object()
    before = {key: getattr(cfg, key, missing) for key in wanted}
    try:
        for key, value in wanted.items():
            setattr(cfg, key, value)
        yield cfg
    finally:
        for key, value in before.items():
            if value is missing:
                try:
                    delattr(cfg, key)
                except AttributeError:
                    pass
            else:
                setattr(cfg, key, value)


def mtp_config(target: torch.nn.Module):
    """The config of ONE MTP layer of ``target``'s kind (transformers' ``get_mtp_config``: its text
    config with the layer types of the MTP layers, layer indices restarting at 0)."""
    with declared(target, 1):
        return target.config.get_mtp_config()


def read_shipped(target: torch.nn.Module, layers: int) -> dict[str, torch.Tensor]:
    """The first shipped MTP layer's weights, named as `modeling_layers.MtpLayer` names them, read
    by transformers' own `MtpModel.from_pretrained` (every tensor it needs present, or it raises)."""
    from transformers.modeling_layers import MtpModel

    device = target.get_output_embeddings().weight.device
    with declared(target, layers):
        model = MtpModel.from_pretrained(target, device_map={"": device})
    return {k: v.detach() for k, v in model.layers[0].state_dict().items()}

