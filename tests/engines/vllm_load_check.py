"""Load draft folders into vLLM's own model classes and run their pieces on given inputs (``--out``).

For drafters vLLM's CPU build cannot serve (DSpark, DFlash2: Model Runner V2 only, which needs
Triton on a GPU), tests/test_vllm_load.py checks the export another way: vLLM's config code reads
the folder (what it resolves is written out), vLLM's loader loads the weights into vLLM's model
class (``Qwen3DSparkForCausalLM``, ``DFlash2Qwen3ForCausalLM``), and that model's own modules run
on inputs the test hands over: the whole draft forward over a block (embedding, every layer with its
q/k norms, RoPE, projections, DFlash2's convolutions, the final norm), with only the attention
KERNEL replaced by plain bidirectional attention within the block (its context keys/values need the
runner's cache), and the sequential stage as vLLM's speculator runs it (DSpark's Markov loop,
DFlash2's selector walk), greedily. The test compares every output with draftheads' own.

Runs INSIDE the vLLM venv and imports nothing from draftheads. Two things are patched, both named
where they are: vLLM's refusal of these methods on the V1 runner (recorded first, unpatched, as
``refusal``), and ``torch.accelerator.empty_cache`` (the loader calls it; a CPU has no accelerator).

Spec (``--spec FILE``): {"target": DIR, "inputs": FILE.safetensors, "drafts": [{"name", "kind":
"dspark" | "dflash2", "speculative_config": {...}}]}. Output: ``--out`` JSON (per draft: the
refusal, the resolved config facts, or an error) and ``<out>.safetensors`` (``name.piece`` tensors).
"""
from __future__ import annotations

import argparse
import json
import os
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def block_attention(block: int, heads: int, kv_heads: int, head_dim: int):
    """vLLM's attention kernel replaced by SDPA over each block of ``block`` rows, bidirectional."""
    import torch

    class BlockAttention(torch.nn.Module):
        def forward(self, q, k, v):
            n = q.shape[0]
            q = q.view(n // block, block, heads, head_dim).transpose(1, 2)
            k = k.view(n // block, block, kv_heads, head_dim).transpose(1, 2)
            v = v.view(n // block, block, kv_heads, head_dim).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=heads != kv_heads)
            return out.transpose(1, 2).reshape(n, heads * head_dim)

    return BlockAttention()


def engine_config(target: str, speculative_config: dict):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=target, dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
                      speculative_config=dict(speculative_config))
    return args.create_engine_config()


def run_draft(spec: dict, draft: dict, inputs: dict, out: dict) -> dict:
    from vllm.config import VllmConfig

    report: dict = {}
    try:
        engine_config(spec["target"], draft["speculative_config"])
        report["refusal"] = None
    except Exception as e:  # what the CPU build says when asked to serve it
        report["refusal"] = str(e)
    original = VllmConfig._validate_v1_model_runner
    VllmConfig._validate_v1_model_runner = lambda self: None  # patched: only to build the model classes
    try:
        return build_and_run(spec, draft, inputs, out, report)
    finally:
        VllmConfig._validate_v1_model_runner = original


def build_and_run(spec: dict, draft: dict, inputs: dict, out: dict, report: dict) -> dict:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

    name, kind = draft["name"], draft["kind"]
    cfg = engine_config(spec["target"], draft["speculative_config"])
    sc = cfg.speculative_config
    hf = sc.draft_model_config.hf_config
    with set_current_vllm_config(cfg):
        target = get_model(vllm_config=cfg, model_config=cfg.model_config)
        if kind == "dspark":
            from vllm.v1.worker.gpu.spec_decode.dspark.utils import load_dspark_model

            model = load_dspark_model(target, cfg)
        else:
            from vllm.v1.worker.gpu.spec_decode.dflash.utils import load_dflash_model

            model = load_dflash_model(target, cfg)
        report.update({
            "method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens,
            "architecture": type(model).__name__, "mask_token_id": get_parallel_drafting_token_id(hf),
            "aux_layers": list(get_eagle3_aux_layers_from_config(sc) or []),
            "causal": model.get_draft_attn_causal(),
            "sample_from_anchor": getattr(hf, "sample_from_anchor", None),
            "lm_head_is_targets": model.lm_head is target.lm_head,
        })
        inner = model.model
        k = sc.num_speculative_tokens
        block = k if (kind == "dspark" and getattr(hf, "sample_from_anchor", True)) else k + 1
        attn = inner.layers[0].self_attn
        for layer in inner.layers:  # only the kernel: qkv, q/k norms, RoPE and o_proj stay vLLM's
            layer.self_attn.attn = block_attention(block, attn.num_heads, attn.num_kv_heads, attn.head_dim)
        with torch.inference_mode():
            ids, positions = inputs["block_ids"], inputs["block_positions"]
            x = inner.embed_input_ids(ids)
            residual = None
            for layer in inner.layers:
                x, residual = layer(positions, x, residual)
            states, _ = inner.norm(x, residual)
            out[f"{name}.block_states"] = states.clone()
            out[f"{name}.fc"] = inner.fc(inputs["features"]).clone()
            out[f"{name}.hidden_norm"] = inner.hidden_norm(inputs["features_h"]).clone()
            h = inputs["slot_states"]  # [rows, K, H]
            anchors = inputs["anchors"]  # [rows]
            rows = h.shape[0]
            if kind == "dspark":
                report["markov_rank"] = hf.markov_rank
                report["confidence_head"] = inner.confidence_head is not None
                base = model.compute_draft_logits(h.flatten(0, 1)).view(rows, k, -1)
                prev = anchors.clone()
                tokens, confidence = [], []
                for i in range(k):  # vLLM's DSparkSpeculator._sample_sequential, greedy
                    embed = model.markov_embed(prev)
                    logits = base[:, i] + model.markov_bias(embed)
                    drafted = model.map_draft_to_target(logits.argmax(dim=-1))
                    if inner.confidence_head is not None:
                        confidence.append(model.compute_confidence(h[:, i], embed))
                    tokens.append(drafted)
                    prev = drafted
                out[f"{name}.chain"] = torch.stack(tokens, 1)
                if confidence:
                    out[f"{name}.confidence"] = torch.stack(confidence, 1)
                out[f"{name}.markov_bias"] = model.markov_bias(model.markov_embed(inputs["previous"])).clone()
            else:
                report["selector_top_k"] = inner.candidate_selector.top_k
                report["conv_block"] = inner.layers[0].attention_conv.block_size
                candidates, unary = model.compute_candidates(h.flatten(0, 1))
                top = inner.candidate_selector.top_k
                candidates, unary = candidates.view(rows, k, top), unary.view(rows, k, top)
                scores = inner.candidate_selector(candidates, unary, h, anchors)  # [rows, K, K(prev), K]
                tokens, previous = [], torch.zeros(rows, dtype=torch.long)
                for step in range(k):  # the walk of vLLM's _selector_walk_kernel, greedy
                    row_scores = scores[torch.arange(rows), step, previous]
                    index = row_scores.argmax(-1)
                    tokens.append(candidates[torch.arange(rows), step, index])
                    previous = index
                out[f"{name}.chain"] = torch.stack(tokens, 1)
                out[f"{name}.candidates"] = candidates.clone()
                out[f"{name}.unary"] = unary.clone()
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch
    from safetensors.torch import load_file, save_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    torch.accelerator.empty_cache = lambda: None  # patched: the loader empties an accelerator cache a CPU lacks
    spec = json.loads(open(args.spec).read())
    inputs = load_file(spec["inputs"])
    results, tensors = {}, {}
    first = True
    for draft in spec["drafts"]:
        try:
            if first:  # one process group for every draft (world size 1)
                cfg = engine_config(spec["target"], {"method": "ngram", "num_speculative_tokens": 1,
                                                     "prompt_lookup_max": 1, "prompt_lookup_min": 1})
                with set_current_vllm_config(cfg):
                    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                 distributed_init_method="tcp://127.0.0.1:" + str(spec.get("port", 29533)))
                    ensure_model_parallel_initialized(1, 1)
                first = False
            results[draft["name"]] = run_draft(spec, draft, inputs, tensors)
        except Exception:
            results[draft["name"]] = {"error": traceback.format_exc()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out + ".safetensors")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
