"""Heads exported by draftheads, run in a real vLLM (its CPU build), accept what draftheads accepts.

For every head type with a vLLM layout (Medusa with its own and with the shared LM head, EAGLE-1,
EAGLE-3 through the speculators format, also as ``method: eagle3`` and as ``LLM(model=SPEC_DIR)``,
EAGLE-3 with both EAGLE 3.1 options (``fc_norm``, ``norm_output``) through the same format, and
with the speculators trainer's defaults (``norm_before_fc`` + ``norm_output``, case ``eagle31_nbf``),
P-EAGLE through the speculators ``peagle`` format, as ``method: eagle3`` + ``parallel_drafting`` and
as ``LLM(model=SPEC_DIR)``, and with ``norm_before_fc`` (case ``peagle_nbf``: vLLM puts mask_hidden
through input_norm before fc, as draftheads does, so its mask slots' acceptance per position checks that); DFlash in the z-lab layout, ``method: dflash``) heads are built on a tiny random Llama (the target's own next-token guess plus noise in every tensor,
see `identity_plus_noise`; P-EAGLE and DFlash heads are trained for a few seconds instead, as their mask slots
draft nothing useful untrained, see `trained_peagle`, `trained_dflash_heads`), exported with ``export_heads(..., "vllm")`` and run by vLLM greedily in fp32 on the same prompts as draftheads' own CHAIN decoding of the same heads
(vLLM drafts a chain: each step takes the argmax of every draft position). Checked:

- vLLM's output with speculation == vLLM's plain output == transformers' greedy ``generate``;
- vLLM's accepted tokens per draft position (``vllm:spec_decode_num_accepted_tokens_per_pos``) and
  number of drafts == draftheads' own, position by position. Equal output alone proves nothing
  about the export (verification makes any draft lossless, and vLLM's loader silently skips a
  tensor it does not expect); equal acceptance does;
- the comparison can fail: exports with a classic conversion bug (Medusa block biases without
  ``medusa_fc_bias``, EAGLE-1 fc halves in the wrong order, EAGLE-3 ``d2t`` all zeros, EAGLE 3.1 with
  ``norm_output`` or ``fc_norm`` (and its weights) dropped, P-EAGLE without
  its own embedding, so that vLLM shares the target's, P-EAGLE with ``norm_before_fc`` and its
  ``input_norm`` dropped, a DFlash block made causal or its layer ids
  left in draftheads' numbering, a DFlash draft vocabulary's ``d2t`` all zeros) decode the same text
  in vLLM but accept differently.

DFlash also runs with a calibrated draft vocabulary (case ``dflash_vocab``: the 64 most frequent
tokens, exported as ``lm_head.weight`` rows + ``d2t``).

How vLLM counts steps (no shorter drafts near ``max_tokens``; accepted tokens past it still
counted) and how draftheads' decoding is replayed to count the same steps: tests/engines/vllm_counting.py.

vLLM lives in its own venv (scripts/setup_vllm_env.sh, run by .ci/run): ``$DRAFTHEADS_VLLM_PYTHON``
or ``<repo>/.venv-vllm/bin/python``. Without it these tests skip, except when ``CI`` is set in the
environment: there they fail, so that CI never passes without running the engine. All engines run
in one subprocess (tests/engines/vllm_runner.py).
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import draftheads as dh
from draftheads.plans import given_tree
from engines.vllm_counting import decode_budget, vllm_counts

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "engines" / "vllm_runner.py"
K = 3  # num_speculative_tokens: every head type drafts a chain of 3
MAX_TOKENS = 40
VOCAB = 256
NUM_PROMPTS = 6
PROMPT_LEN = 8
RUN_TIMEOUT_S = 900


def vllm_python() -> Path:
    """The vLLM venv's python; skips (fails under CI) when there is none."""
    configured = os.environ.get("DRAFTHEADS_VLLM_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-vllm" / "bin" / "python"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    reason = (
        f"$DRAFTHEADS_VLLM_PYTHON={path} is not an executable file" if configured
        else f"no vLLM venv at {path.parent.parent}: run scripts/setup_vllm_env.sh (or set $DRAFTHEADS_VLLM_PYTHON)"
    )
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the vLLM engine test: {reason}", pytrace=False)
    pytest.skip(reason)


# -- the target and heads (project venv) ------------------------------------------------------------
def tiny_llama_target(path: Path) -> torch.nn.Module:
    """A random 4-layer Llama saved as an HF folder and read back from it (so heads record the
    folder as their target). Head dim 32: vLLM's CPU attention takes 32, 64, 80, ... only."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def greedy(target: torch.nn.Module, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    return target.generate(
        prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=None, pad_token_id=0,
    )


def noisy(param: torch.Tensor, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        param.add_(torch.randn(param.shape, generator=gen) * std)


def identity_plus_noise(target, head_type: str, noise: float, seed: int = 0, draft_counts: torch.Tensor | None = None):
    """Heads that reproduce the target's own next-token guess one position further (every draft
    repeats the last token), then every tensor perturbed with noise. No training (a test must not
    spend minutes on it), yet the drafts are right often but not always, and every exported tensor
    changes them: a dropped or misplaced tensor changes the acceptance."""
    gen = torch.Generator().manual_seed(seed)
    d = target.config.hidden_size
    if head_type in ("medusa", "medusa_shared"):
        heads = dh.MedusaHeads.for_target(target, num_heads=K, num_layers=1, lm_head="own" if head_type == "medusa" else "shared")
        for block in heads.blocks:  # identity at init (zero weight and bias); x is ~1 per element
            noisy(block[0].linear.weight, noise / d**0.5, gen)
            noisy(block[0].linear.bias, noise, gen)
        for proj in heads.lm_heads or []:
            noisy(proj.weight, 0.5 * noise * float(proj.weight.detach().std()), gen)
        return heads.eval()
    if head_type == "eagle":
        heads = dh.EagleHead.for_target(target, num_heads=1, num_layers=1)  # fc = [0 | I]: f_t passed through
    else:
        options = {"eagle31": {"fc_norm": True, "norm_output": True},
                   "eagle31_nbf": {"norm_before_fc": True, "norm_output": True}}.get(head_type, {})
        heads = dh.Eagle3Head.for_target(target, num_heads=K, num_layers=1, draft_vocab_size=160, **options)
        heads.set_draft_vocab(draft_counts)
        with torch.no_grad():  # fc picks the deepest fused feature; norm + LM head are the target's
            deepest = max(range(len(heads.feature_layers)), key=lambda i: heads.feature_layers[i])
            heads.fc.weight.zero_()
            heads.fc.weight[:, deepest * d : (deepest + 1) * d] = torch.eye(d)
            heads.norm.weight.copy_(target.model.norm.weight)
            heads.lm_head.weight.copy_(target.lm_head.weight[heads.draft_to_target])
        noisy(heads.lm_head.weight, 0.5 * noise * float(heads.lm_head.weight.detach().std()), gen)
        for norm in (heads.embed_norm, heads.hidden_norm, heads.norm, *(heads.fc_norm or [])):
            noisy(norm.weight, 0.2 * noise, gen)
        if head_type == "eagle31":
            # Norms of weight ~1 make both options near no-ops: fc picks one fused chunk and
            # hidden_norm rescales it anyway, and hidden_norm(norm(x)) ~ hidden_norm(x). Weights of
            # 0.25-1.75 per channel make each option change the drafts (so dropping one is seen).
            with torch.no_grad():
                for norm in (heads.norm, *heads.fc_norm):
                    norm.weight.mul_(1.5 * torch.rand(norm.weight.shape, generator=gen) + 0.25)
        if head_type == "eagle31_nbf":
            # input_norm's weights of 0.25-1.75 per channel, and fc's picked columns divided by them: the
            # draft still passes the deepest feature on (scaled by 1/rms of the whole input), so it
            # drafts right often, but only when the engine applies input_norm, with its entries in fc's
            # column order; without it the passed feature is distorted per channel.
            with torch.no_grad():
                w = heads.input_norm.weight
                w.mul_(1.5 * torch.rand(w.shape, generator=gen) + 0.25)
                cols = slice(deepest * d, (deepest + 1) * d)
                heads.fc.weight[:, cols] /= w[cols][None, :]
    noisy(heads.fc.weight, noise / (heads.fc.weight.shape[1]) ** 0.5, gen)
    layer = heads.layers[0]
    for lin in (layer.o_proj, layer.down_proj):  # zero at init: the layer was the identity
        noisy(lin.weight, noise / lin.weight.shape[1] ** 0.5, gen)
    noisy(layer.post_attention_layernorm.weight, 0.2 * noise, gen)
    return heads.eval()


def trained_peagle(target, prompts: torch.Tensor, steps: int = 60, norm_before_fc: bool = False):
    """P-EAGLE heads (K depths, one layer) trained with train.py's loss on the target's greedy
    continuations of ``prompts`` and of more random prompts: their mask slots draft something the
    target accepts, at every position. The mask token is an id none of those rows holds.
    ``norm_before_fc`` (case ``peagle_nbf``): with input_norm, its weights drawn in 0.25..1.75 before
    training (weights near 1 would hide a dropped norm); vLLM then normalises mask_hidden with it too."""
    from draftheads.train.model import TargetWithHeads

    more = torch.randint(3, VOCAB, (26, PROMPT_LEN), generator=torch.Generator().manual_seed(11))
    seqs = greedy(target, torch.cat([prompts, more]), MAX_TOKENS + K + 1)
    present = torch.zeros(VOCAB, dtype=torch.bool)
    present[seqs.flatten()] = True
    mask_token = int((~present).nonzero()[0]) if bool((~present).any()) else None
    assert mask_token is not None, "every id occurs in the training rows: no mask token to pick"
    torch.manual_seed(0)
    heads = dh.PEagleHead.for_target(target, num_heads=K, num_layers=1, draft_vocab_size=160, mask_token_id=mask_token,
                                     norm_before_fc=norm_before_fc)
    if norm_before_fc:
        with torch.no_grad():
            w = heads.input_norm.weight
            w.copy_(1.5 * torch.rand(w.shape, generator=torch.Generator().manual_seed(12)) + 0.25)
    heads.set_draft_vocab(torch.bincount(seqs.flatten(), minlength=VOCAB))
    model = TargetWithHeads(target, heads)
    opt = torch.optim.Adam(heads.parameters(), lr=3e-3)
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, PROMPT_LEN:] = 1
    for step in range(steps):
        model.reseed_noise(step, seqs.device)
        loss = model(seqs, loss_mask=loss_mask)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval()


@dataclass
class Case:
    """One set of exported heads as vLLM runs it, and how draftheads drafts the same chain."""

    name: str
    heads_dir: Path
    export_dir: Path
    speculative_config: dict | None
    chain: object  # the `tree` argument of SpeculativeDecoder that makes a chain of K
    llm_kwargs: dict = field(default_factory=dict)


# Noise per head type: the drafts stay right often enough at every position (EAGLE-3 feeds its own
# output back at depth, so noise compounds there and it gets less).
NOISE = {"medusa": 0.2, "medusa_shared": 0.2, "eagle": 0.2, "eagle3": 0.03, "eagle31": 0.03, "eagle31_nbf": 0.03}


def build_heads(target, root: Path, draft_counts: torch.Tensor) -> dict[str, tuple[Path, object]]:
    """Heads of each exportable type, saved; returns name -> (heads folder, chain tree)."""
    eagle_chain = {"total_tokens": K + 1, "depth": K, "top_k": 1}  # EAGLE's dynamic tree, top-1 only
    out = {}
    for seed, (name, noise) in enumerate(NOISE.items()):
        heads = identity_plus_noise(target, name, noise, seed=seed, draft_counts=draft_counts)
        heads.save_pretrained(root / f"heads-{name}")
        out[name] = (root / f"heads-{name}", dh.TreeShape.chain(K) if name.startswith("medusa") else eagle_chain)
    return out


def trained_dflash_heads(target, root: Path, prompts: torch.Tensor) -> Path:
    """DFlash heads (block K+1, features of layers 1..3) trained for a few seconds with draftheads'
    own loss on the target's greedy continuations of half the prompts: no hand-made identity
    exists for a block drafter, and these draft right at every position sometimes, not always."""
    from test_dflash import trained_dflash

    heads, _, _, _ = trained_dflash(target, steps=40, prompts=prompts[: NUM_PROMPTS // 2], block_size=K + 1,
                                    feature_layers=[1, 2, 3], mask_token_id=VOCAB - 1)  # not the zero pad row
    heads.save_pretrained(root / "heads-dflash")
    return root / "heads-dflash"


DFLASH_VOCAB = 64  # of VOCAB: small enough that some of the target's greedy tokens cannot be drafted


def dflash_vocab_heads(dflash_dir: Path, root: Path, target, draft_counts: torch.Tensor) -> Path:
    """The trained DFlash heads drafting from the DFLASH_VOCAB most frequent tokens of the target's
    greedy continuations (saved with the chain, as a calibrated draft_vocab_size): the export
    carries it as lm_head rows + d2t, and acceptance is equal only if vLLM drafts from that set."""
    heads = dh.load_heads(dflash_dir, target=target)
    heads.token_counts.copy_(draft_counts)
    heads.save_pretrained(root / "heads-dflash-vocab", plans=given_tree(dh.StaticTree.chain(K), DFLASH_VOCAB))
    return root / "heads-dflash-vocab"


def perturb(src: Path, dst: Path, how: str) -> None:
    """A copy of an exported folder with one classic conversion bug (see the module docstring)."""
    import shutil

    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    tensors = load_file(weights)
    config = json.loads((dst / "config.json").read_text())
    if how == "medusa_bias_flag_dropped":  # vLLM then ignores the block biases without a word
        config["medusa_fc_bias"] = False
    elif how == "eagle_fc_halves_swapped":  # [hidden, embedding] instead of vLLM's [embedding, hidden]
        w = tensors["fc.weight"]
        d = w.shape[0]
        tensors["fc.weight"] = torch.cat([w[:, d:], w[:, :d]], dim=1).contiguous()
    elif how in ("eagle3_d2t_zero", "dflash_vocab_d2t_zero"):  # a d2t of zeros (a known bug): draft index i read as target id i
        tensors["d2t"] = torch.zeros_like(tensors["d2t"])
    elif how == "eagle31_norm_output_dropped":  # vLLM then feeds the pre-norm state to the next step
        config["norm_output"] = False
    elif how == "eagle31_fc_norm_dropped":  # vLLM then fuses the raw target features
        config["fc_norm"] = False
        tensors = {k: v for k, v in tensors.items() if not k.startswith("fc_norm.")}
    elif how == "peagle_embedding_dropped":  # vLLM then embeds with the target's table (mask row included)
        del tensors["embed_tokens.weight"]
    elif how == "peagle_nbf_input_norm_dropped":  # vLLM then fuses target features and mask_hidden without the norm
        config["norm_before_fc"] = False
        del tensors["input_norm.weight"]
    elif how == "dflash_causal_flag":  # vLLM then makes the block causal: slots no longer see later masks
        config["dflash_config"]["causal"] = True
    elif how == "dflash_layer_ids_unshifted":  # draftheads' feature ids written as z-lab ids (off by one layer)
        config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
    else:
        raise ValueError(how)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))


def draftheads_acceptance(engine_run, case: Case) -> tuple[int, list[int]]:
    """draftheads' own chain decoding of ``case``'s heads, counted as vLLM counts (cached per heads)."""
    cache = engine_run["acceptance"]
    if case.heads_dir not in cache:
        cache[case.heads_dir] = _draftheads_acceptance(engine_run["target"], case, engine_run["prompts"])
    return cache[case.heads_dir]


def _draftheads_acceptance(target, case: Case, prompts: torch.Tensor) -> tuple[int, list[int]]:
    heads = dh.load_heads(case.heads_dir, target=target)
    decoder = dh.SpeculativeDecoder(target, heads, tree=case.chain)
    drafts, per_pos = 0, [0] * K
    for prompt in prompts:
        out = decoder.generate(prompt[None], max_new_tokens=decode_budget(MAX_TOKENS, K), eos_token_id=[])
        n, pos = vllm_counts(out.accept_lengths, MAX_TOKENS, K)
        drafts += n
        per_pos = [a + b for a, b in zip(per_pos, pos)]
    return drafts, per_pos


# -- one vLLM subprocess for every engine --------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    python = vllm_python()
    # DRAFTHEADS_VLLM_ENGINES=a,b: run only these engines besides plain (with -k on their tests: minutes less)
    only = os.environ.get("DRAFTHEADS_VLLM_ENGINES")
    return prepare_and_run(python, tmp_path_factory.mktemp("vllm-engine"), only=set(only.split(",")) if only else None)


def prepare_and_run(python: Path, root: Path, reuse: bool = False, only: set[str] | None = None) -> dict:
    """Target, trained heads, exports (good and broken) under ``root``; then every engine in one
    vLLM subprocess. ``reuse``: read an existing result.json instead of running vLLM (debugging);
    ``only``: run just these engines besides plain (debugging one head type)."""
    target_dir = root / "target"
    target = tiny_llama_target(target_dir)
    prompts = torch.randint(3, VOCAB, (NUM_PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(7))

    from draftheads.export import export_heads

    cases: dict[str, Case] = {}
    draft_counts = torch.bincount(greedy(target, prompts, MAX_TOKENS).flatten(), minlength=VOCAB)
    for name, (heads_dir, chain) in build_heads(target, root, draft_counts).items():
        out = export_heads(heads_dir, root / f"vllm-{name}", "vllm", verifier=str(target_dir), num_speculative_tokens=K)
        method = "medusa" if name.startswith("medusa") else "eagle" if name == "eagle" else None
        config = {"model": str(out), "num_speculative_tokens": K}
        if method:
            config["method"] = method
        cases[name] = Case(name, heads_dir, out, config, chain)
    dflash_dir = trained_dflash_heads(target, root, prompts)
    out = export_heads(dflash_dir, root / "vllm-dflash", "vllm", verifier=str(target_dir), num_speculative_tokens=K)
    cases["dflash"] = Case("dflash", dflash_dir, out, {"method": "dflash", "model": str(out), "num_speculative_tokens": K},
                           None)  # None: the dflash heads' default tree, the chain of their block (K)
    vocab_dir = dflash_vocab_heads(dflash_dir, root, target, draft_counts)
    out = export_heads(vocab_dir, root / "vllm-dflash-vocab", "vllm", verifier=str(target_dir), num_speculative_tokens=K)
    cases["dflash_vocab"] = Case("dflash_vocab", vocab_dir, out,
                                 {"method": "dflash", "model": str(out), "num_speculative_tokens": K}, None)
    eagle3 = cases["eagle3"]
    cases["eagle3_method"] = Case(
        "eagle3_method", eagle3.heads_dir, eagle3.export_dir,
        {"method": "eagle3", "model": str(eagle3.export_dir), "num_speculative_tokens": K}, eagle3.chain,
    )
    # The speculators folder as the model: vLLM reads the verifier and the draft length from its config.
    cases["eagle3_as_model"] = Case(
        "eagle3_as_model", eagle3.heads_dir, eagle3.export_dir, None, eagle3.chain, {"model": str(eagle3.export_dir)}
    )
    peagle_dir = root / "heads-peagle"
    trained_peagle(target, prompts).save_pretrained(peagle_dir)
    out = export_heads(peagle_dir, root / "vllm-peagle", "vllm", verifier=str(target_dir), num_speculative_tokens=K)
    peagle_method = {"method": "eagle3", "model": str(out), "num_speculative_tokens": K, "parallel_drafting": True}
    cases["peagle"] = Case("peagle", peagle_dir, out, peagle_method, dh.TreeShape.chain(K))
    cases["peagle_as_model"] = Case("peagle_as_model", peagle_dir, out, None, dh.TreeShape.chain(K), {"model": str(out)})
    # The speculators trainer's P-EAGLE default: norm_before_fc (vLLM fuses mask_hidden through input_norm too).
    nbf_dir = root / "heads-peagle-nbf"
    trained_peagle(target, prompts, norm_before_fc=True).save_pretrained(nbf_dir)
    out = export_heads(nbf_dir, root / "vllm-peagle-nbf", "vllm", verifier=str(target_dir), num_speculative_tokens=K)
    cases["peagle_nbf"] = Case("peagle_nbf", nbf_dir, out, {**peagle_method, "model": str(out)}, dh.TreeShape.chain(K))
    negatives = [("medusa", "medusa_bias_flag_dropped"), ("eagle", "eagle_fc_halves_swapped"), ("eagle3", "eagle3_d2t_zero"),
                 ("eagle31", "eagle31_norm_output_dropped"), ("eagle31", "eagle31_fc_norm_dropped"),
                 ("peagle", "peagle_embedding_dropped"), ("peagle_nbf", "peagle_nbf_input_norm_dropped"),
                 ("dflash", "dflash_causal_flag"),
                 ("dflash", "dflash_layer_ids_unshifted"), ("dflash_vocab", "dflash_vocab_d2t_zero")]
    broken: dict[str, Case] = {}
    for name, how in negatives:
        good = cases[name]
        perturb(good.export_dir, root / f"broken-{how}", how)
        config = {**good.speculative_config, "model": str(root / f"broken-{how}")}
        broken[how] = Case(how, good.heads_dir, root / f"broken-{how}", config, good.chain)

    engines = [{"name": "plain", "speculative_config": None}]
    engines += [
        {"name": c.name, "speculative_config": c.speculative_config, "llm_kwargs": c.llm_kwargs}
        for c in [*cases.values(), *broken.values()] if only is None or c.name in only
    ]
    spec = {
        "model": str(target_dir), "dtype": "float32", "max_model_len": 256, "max_num_seqs": NUM_PROMPTS,
        "engines": engines,
        "runs": [{"name": "greedy", "prompts": prompts.tolist(), "max_tokens": MAX_TOKENS}],
    }
    spec_path, result_path = root / "spec.json", root / "result.json"
    spec_path.write_text(json.dumps(spec))
    if not (reuse and result_path.exists()):
        run_runner(python, spec_path, result_path)
    result = json.loads(result_path.read_text())
    return {"target": target, "prompts": prompts, "cases": cases, "broken": broken, "result": result,
            "acceptance": {}}


def run_runner(python: Path, spec_path: Path, result_path: Path) -> None:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the vLLM venv has its own packages; nothing of ours is imported there
    proc = subprocess.run(
        [str(python), str(RUNNER), "--spec", str(spec_path), "--out", str(result_path)],
        env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    if proc.returncode != 0 or not result_path.exists():
        pytest.fail(f"the vLLM runner failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")


def engine(engine_run, name: str) -> dict:
    got = engine_run["result"]["engines"][name]
    assert "error" not in got, f"vLLM engine {name!r} failed:\n{got['error']}"
    return got["runs"]["greedy"]


def test_vllm_counting_replays_the_schedulers_rule():
    """Steps commit 1, 2, 4, 1, 3 tokens after the prefill's one: the 5th reaches 10 and is the
    last counted, with its 2 accepted drafts although only 1 token of it is kept."""
    assert vllm_counts([1, 2, 4, 1, 3, 4, 4], max_tokens=10, k=3) == (5, [3, 2, 1])
    assert vllm_counts([4], max_tokens=1, k=3) == (0, [0, 0, 0])  # the prefill's token is all
    with pytest.raises(ValueError, match="decode max_tokens"):
        vllm_counts([1, 1], max_tokens=10, k=3)


CASES = ["medusa", "medusa_shared", "eagle", "eagle3", "eagle3_method", "eagle3_as_model", "eagle31", "eagle31_nbf", "peagle",
         "peagle_as_model", "peagle_nbf", "dflash", "dflash_vocab"]


def test_vllm_plain_greedy_equals_transformers_generate(engine_run):
    prompts = engine_run["prompts"]
    expected = greedy(engine_run["target"], prompts, MAX_TOKENS)[:, PROMPT_LEN:].tolist()
    assert engine(engine_run, "plain")["outputs"] == expected


@pytest.mark.parametrize("name", CASES)
def test_vllm_speculative_greedy_equals_plain(engine_run, name):
    assert engine(engine_run, name)["outputs"] == engine(engine_run, "plain")["outputs"]


@pytest.mark.parametrize("name", CASES)
def test_vllm_accepts_per_position_what_draftheads_accepts(engine_run, name):
    case = engine_run["cases"][name]
    counters = engine(engine_run, name)["counters"][0]
    drafts, per_pos = draftheads_acceptance(engine_run, case)
    assert (counters["num_drafts"], counters["accepted_per_pos"]) == (drafts, per_pos), (
        f"{name}: vLLM drafts/accepted per position {counters['num_drafts']}/{counters['accepted_per_pos']}, "
        f"draftheads {drafts}/{per_pos}"
    )
    assert counters["num_draft_tokens"] == K * drafts
    # Informative: the first position accepts sometimes but not always, and deeper drafts are used.
    assert 0 < per_pos[0] < drafts, f"{name}: first-position acceptance {per_pos[0]}/{drafts} proves little"
    assert per_pos[-1] > 0, f"{name}: the last draft position never accepted ({per_pos})"


@pytest.mark.parametrize("how", ["medusa_bias_flag_dropped", "eagle_fc_halves_swapped", "eagle3_d2t_zero",
                                 "eagle31_norm_output_dropped", "eagle31_fc_norm_dropped",
                                 "peagle_embedding_dropped", "peagle_nbf_input_norm_dropped", "dflash_causal_flag",
                                 "dflash_layer_ids_unshifted",
                                 "dflash_vocab_d2t_zero"])
def test_a_conversion_bug_changes_vllm_acceptance_not_its_output(engine_run, how):
    """The acceptance comparison can fail: an export with one classic bug still decodes exactly
    (verification is lossless) but no longer accepts what draftheads accepts."""
    case = engine_run["broken"][how]
    got = engine(engine_run, how)
    assert got["outputs"] == engine(engine_run, "plain")["outputs"]
    drafts, per_pos = draftheads_acceptance(engine_run, case)
    assert got["counters"][0]["accepted_per_pos"] != per_pos, f"{how}: vLLM still accepts {per_pos}"
