"""Parameters and export size of the heads every shipped config trains (nothing is downloaded).

    python benchmarks/head_sizes.py [configs/smollm2*.yaml ...]    # markdown table on stdout

Each config's heads are built as training builds them (``train.components.build_heads``) on the
meta device, so no weights are allocated. The target's architecture comes from its own config.json
for a target draftheads builds by name (``smollm2``, built on first use), and from the published
numbers below for the Hub models of the large configs. Export size = the tensors written to
model.safetensors: trainable weights in bf16 (fp32 doubles them) plus the int64 buffers (token
counts, draft-vocabulary maps). A config whose target or heads cannot be built is listed with why.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]

# Published architecture numbers (config.json of the Hub repos), so no download is needed.
HUB_TARGETS = {
    "meta-llama/Llama-3.1-8B-Instruct": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=False,
    ),
    "Qwen/Qwen2.5-7B-Instruct": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, rope_theta=1000000.0, tie_word_embeddings=False,
    ),
}


def target_config(name: str):
    """The architecture of ``name`` without its weights."""
    if name in HUB_TARGETS:
        numbers = dict(HUB_TARGETS[name])
        return AutoConfig.for_model(numbers.pop("model_type"), **numbers)
    from draftheads.target import resolve_target

    return AutoConfig.from_pretrained(resolve_target(name))


def sizes(heads: torch.nn.Module) -> tuple[int, int]:
    params = sum(p.numel() for p in heads.parameters())
    buffers = sum(b.numel() * b.element_size() for b in heads.buffers())
    return params, params * 2 + buffers


def rows(paths: list[Path]) -> list[str]:
    from draftheads.config import load_config
    from draftheads.train.components import build_heads

    targets: dict[str, torch.nn.Module | str] = {}
    lines = []
    for path in paths:
        cfg = load_config(path)
        name, spec = cfg.target.name_or_path, cfg.heads
        if name not in targets:
            try:
                config = target_config(name)  # outside the meta device: a named target may be built here
                with torch.device("meta"):
                    targets[name] = AutoModelForCausalLM.from_config(config)
            except Exception as err:  # a named target whose wheel is missing, an unknown Hub id
                targets[name] = f"target not built: {str(err).splitlines()[0][:120]}"
        target = targets[name]
        if isinstance(target, str):
            lines.append(f"| {path.name} | {name} | {spec.head_type} | {target} | | |")
            continue
        try:
            with torch.device("meta"):
                heads = build_heads(spec, target)
        except Exception as err:
            lines.append(f"| {path.name} | {name} | {spec.head_type} | heads not built: {str(err).splitlines()[0][:120]} | | |")
            continue
        params, nbytes = sizes(heads)
        total = sum(p.numel() for p in target.parameters())
        lines.append(f"| {path.name} | {name} | {spec.head_type} | {params / 1e6:,.2f} M | {100 * params / total:.1f}% "
                     f"| {nbytes / 2**20:,.1f} MiB |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*", type=Path, help="default: every configs/*.yaml")
    args = ap.parse_args()
    paths = args.configs or sorted((ROOT / "configs").glob("*.yaml"))
    print("| config | target | head type | parameters | % of target | export (bf16) |")
    print("|---|---|---|---:|---:|---:|")
    print("\n".join(rows(paths)))


if __name__ == "__main__":
    main()
