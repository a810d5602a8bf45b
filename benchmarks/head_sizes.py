"""Parameters and export size of every head type, computed from configs (nothing is downloaded).

    python benchmarks/head_sizes.py            # markdown table on stdout

Targets: the demo target (its real config, from the cache) and the real models of the shipped
configs, built on the meta device from their published architecture numbers (no weights). Each
head type is built with the settings of the matching config in configs/. Export size = the
tensors written to model.safetensors: trainable weights in bf16 (fp32 doubles them) plus the
int64 buffers (token counts, EAGLE-3's vocabulary maps).
"""
from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import draftheads as dh
from draftheads.config import load_config

# Published architecture numbers (config.json of the hub repos).
REAL_TARGETS = {
    "llama3.1-8b-instruct": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=False,
    ),
    "qwen2.5-7b-instruct": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, rope_theta=1000000.0, tie_word_embeddings=False,
    ),
}
KINDS = {"medusa": "", "hydra": "-hydra", "eagle": "-eagle", "eagle3": "-eagle3"}


def build_heads(target, spec) -> torch.nn.Module:
    cls = dh.heads.head_types()[spec.head_type]
    kwargs = {"num_heads": spec.num_heads, "num_layers": spec.num_layers, "lm_head": spec.lm_head}
    if spec.head_type == "eagle3":
        kwargs.update(feature_layers=spec.feature_layers, draft_vocab_size=spec.draft_vocab_size)
    return cls.for_target(target, **kwargs)


def sizes(heads) -> tuple[int, int]:
    params = sum(p.numel() for p in heads.parameters())
    buffers = sum(b.numel() * b.element_size() for b in heads.buffers())
    return params, params * 2 + buffers


def main() -> None:
    from draftheads.demo import resolve_target

    rows = []
    with torch.device("meta"):
        targets = {"demo": AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_target("demo")))}
        for name, numbers in REAL_TARGETS.items():
            numbers = dict(numbers)
            targets[name] = AutoModelForCausalLM.from_config(AutoConfig.for_model(numbers.pop("model_type"), **numbers))
        for name, target in targets.items():
            total = sum(p.numel() for p in target.parameters())
            for kind, suffix in KINDS.items():
                cfg = load_config(f"configs/{name}{suffix}.yaml")
                heads = build_heads(target, cfg.heads)
                params, nbytes = sizes(heads)
                rows.append((name, kind, cfg.heads, params, nbytes, total))
    print("| target | head type | settings | parameters | % of target | export (bf16) |")
    print("|---|---|---|---:|---:|---:|")
    for name, kind, spec, params, nbytes, total in rows:
        settings = f"{spec.num_heads} {'heads' if kind in ('medusa', 'hydra') else 'steps'}, {spec.num_layers} layer(s)"
        if kind in ("medusa", "hydra"):
            settings += f", lm_head {spec.lm_head}"
        if kind == "eagle3":
            settings += f", draft vocab {spec.draft_vocab_size}"
        print(f"| {name} | {kind} | {settings} | {params / 1e6:,.2f} M | {100 * params / total:.1f}% | {nbytes / 2**20:,.1f} MiB |")


if __name__ == "__main__":
    main()
