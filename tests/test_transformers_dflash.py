"""DFlash heads exported for transformers' own DFlash drafter, run by transformers' own ``generate``.

``draftheads export HEADS OUT --format transformers`` writes a ``MuseGlimmerAssistantModel``
folder (methods/dflash/transformers_layout.py); ``target.generate(..., assistant_model=DRAFT,
speculation_type="dflash")`` then drafts with it through ``DFlashTokenCandidateGenerator``.
Checked, on a tiny Llama and a tiny hybrid (Qwen3.5: Gated DeltaNet + gated attention):

- the folder loads with ``AutoModel`` as that class, every tensor used (no missing or unexpected key),
  and its forward computes draftheads' block states (random heads, several RoPE scalings);
- transformers' dflash ``generate`` equals its plain greedy ``generate``;
- transformers accepts, step by step, exactly the tokens draftheads' own CHAIN decoding of the
  same heads accepts (its streamer receives each step's accepted tokens + 1, the unit of
  draftheads' ``accept_lengths``), on prompts the heads were trained on (long acceptances) and
  fresh ones (rejections). Equal output alone proves nothing: verification makes any draft lossless;
- the comparison can fail: a folder with a classic conversion bug (feature layers left in
  draftheads' numbering, the context norm dropped, transformers' default sliding layers) decodes
  the same text but accepts differently;
- what transformers has no equivalent for is refused by name (a restricted draft vocabulary, a
  draft length other than the block's, length-dependent RoPE, a target embedding with an
  ``embed_norm``), and the folder imports back (``--format transformers``) into the same heads.

Heads are trained for a few seconds with draftheads' own loss on the target's cached outputs
(`trained_heads`), so drafts are accepted often (asserted).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

import draftheads as dh
from draftheads.export import ExportError, export_heads, import_heads
from draftheads.methods.dflash.heads import DFlashHeads
from draftheads.plans import given_tree
from draftheads.train.model import TargetWithHeads
from hybrid_utils import tiny_hybrid
from inference_utils import tiny_target

BLOCK = 4  # K = 3 drafted tokens per step
K = BLOCK - 1
NEW = 40
TRAIN_PROMPTS = 16


class StepTokens(BaseStreamer):
    """The tokens `generate` emits per put: the prompt, the prefill's token, then each assisted
    step's accepted drafts + the target's next token (transformers/generation/utils.py,
    `_assisted_decoding`: ``streamer.put(valid_tokens)``)."""

    def __init__(self) -> None:
        self.puts: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(int(value.numel()))

    def end(self) -> None:
        pass


def greedy(target, ids: torch.Tensor, new: int) -> torch.Tensor:
    return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                           eos_token_id=None, pad_token_id=0)


def transformers_dflash(target, draft, ids: torch.Tensor, new: int = NEW) -> tuple[torch.Tensor, list[int]]:
    """transformers' DFlash decoding of ``ids``: (sequences, tokens committed per verify step)."""
    steps = StepTokens()  # generate's own settings as `greedy`'s (a GenerationConfig would take the model's EOS back)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, speculation_type="dflash",
                          do_sample=False, max_new_tokens=new, eos_token_id=None, pad_token_id=0, streamer=steps)
    assert steps.puts[0] == ids.numel() and steps.puts[1] == 1, steps.puts[:2]  # the prompt, the prefill's token
    return out, steps.puts[2:]


def draftheads_chain(target, heads, ids: torch.Tensor, new: int = NEW):
    """draftheads' own chain decoding of the whole block, never capped by the draft budget."""
    decoder = dh.SpeculativeDecoder(target, heads, tree=dh.TreeShape.chain(K), draft_budget=None)
    return decoder.generate(ids, max_new_tokens=new, eos_token_id=[])


def trained_heads(target, prompts: torch.Tensor, steps: int, mask_token_id: int, seed: int = 0) -> DFlashHeads:
    """DFlash heads trained with `TargetWithHeads`' loss (what train.py runs) on the target's greedy
    continuations of ``prompts``, from the target's outputs computed once (the feature cache's
    path), so a hybrid target's slow recurrent kernels run once, not every step."""
    with torch.no_grad():
        seqs = greedy(target, prompts, NEW)
    torch.manual_seed(seed)
    heads = DFlashHeads.for_target(target, num_layers=1, block_size=BLOCK, mask_token_id=mask_token_id, num_anchors=16,
                                   feature_layers=[1, 2, 3])
    model = TargetWithHeads(target, heads)
    hidden, features, labels = model.target_outputs(seqs)
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompts.shape[1]:] = 1
    opt = torch.optim.Adam(heads.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        model.reseed_noise(step, seqs.device)
        out = model(seqs, loss_mask=loss_mask, hidden=hidden, features=features, target_labels=labels)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    return heads.eval()


def saved_and_reloaded(target, folder: Path):
    """``target`` as a model folder, read back (the heads record the folder as their verifier)."""
    target.save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


CASES = {
    # name: (build the target, training steps, mask token id)
    "llama": (lambda: tiny_target("llama", layers=4, vocab=64, tie_word_embeddings=False), 80, 63),
    "qwen3_5": (lambda: tiny_hybrid("qwen3_5_text", num_hidden_layers=4, vocab=64,
                                    layer_types=["linear_attention", "full_attention"] * 2), 300, 63),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, target, heads folder, export folder, loaded transformers draft, prompts, runs): ``runs``
    per prompt (greedy output, draftheads' chain decoding, transformers' dflash output and steps),
    decoded once for the tests below."""
    build, steps, mask = CASES[request.param]
    root = tmp_path_factory.mktemp(f"tf-dflash-{request.param}")
    target = saved_and_reloaded(build(), root / "target")
    vocab = target.config.vocab_size
    prompts = torch.randint(3, vocab, (TRAIN_PROMPTS, 6), generator=torch.Generator().manual_seed(0))
    heads = trained_heads(target, prompts, steps, mask)
    heads.save_pretrained(root / "heads")
    export = export_heads(root / "heads", root / "export", "transformers")
    draft = AutoModel.from_pretrained(export, dtype=torch.float32).eval()
    fresh = torch.randint(3, vocab, (2, 6), generator=torch.Generator().manual_seed(99))  # never trained on
    prompts = torch.cat([prompts[:6], fresh])
    heads = dh.load_heads(root / "heads", target=target)
    runs = [(greedy(target, ids[None], NEW), draftheads_chain(target, heads, ids[None]),
             *transformers_dflash(target, draft, ids[None])) for ids in prompts]
    return request.param, target, root / "heads", export, draft, prompts, runs


def test_export_loads_as_transformers_dflash_drafter(case):
    name, target, heads_dir, export, *_ = case
    draft, info = AutoModel.from_pretrained(export, dtype=torch.float32, output_loading_info=True)
    assert type(draft).__name__ == "MuseGlimmerAssistantModel"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    heads = dh.load_heads(heads_dir)
    config = json.loads((export / "config.json").read_text())
    assert config["target_layer_ids"] == [f - 1 for f in heads.feature_layers] == [0, 1, 2]
    assert config["layer_types"] == ["full_attention"] and config["block_size"] == BLOCK
    assert config["mask_token_id"] == heads.mask_token_id
    tensors = load_file(str(export / "model.safetensors"))
    state = {k: v for k, v in heads.state_dict().items() if k != "token_counts"}
    assert torch.equal(tensors["encoder.fc.weight"], state.pop("fc.weight"))
    assert torch.equal(tensors["encoder.output_norm_enc.weight"], state.pop("hidden_norm.weight"))
    assert all(torch.equal(tensors[k], v) for k, v in state.items()) and len(tensors) == len(state) + 2
    card = (export / "README.md").read_text()
    assert "speculation_type='dflash'" in card and "## Run in transformers" in card


def test_transformers_dflash_generate_equals_greedy(case):
    name, *_, runs = case
    for i, (reference, ours, theirs, _) in enumerate(runs):
        assert torch.equal(ours.sequences, reference), f"{name} prompt {i}: draftheads' output differs from greedy"
        assert torch.equal(theirs, reference), f"{name} prompt {i}: transformers' dflash output differs from greedy"


def test_transformers_accepts_per_step_what_draftheads_accepts(case):
    name, *_, runs = case
    ours = []
    for i, (_, out, _, steps) in enumerate(runs):
        assert steps == out.accept_lengths, f"{name} prompt {i}: transformers {steps} != draftheads {out.accept_lengths}"
        ours += out.accept_lengths
    mean = sum(ours) / len(ours)
    assert mean > 1.5 and any(n == BLOCK for n in ours) and any(1 < n < BLOCK for n in ours), (
        f"{name}: accepted lengths {sorted(set(ours))}, mean {mean:.2f}: the drafts are too rarely (or never partly) "
        "accepted for the comparison to mean much")


def perturb(export: Path, dst: Path, how: str) -> Path:
    """A copy of the export with one classic conversion bug."""
    shutil.copytree(export, dst)
    config = json.loads((dst / "config.json").read_text())
    tensors = load_file(str(dst / "model.safetensors"))
    if how == "layer_ids_unshifted":  # draftheads' feature ids written as transformers' ids (one layer off)
        config["target_layer_ids"] = [i + 1 for i in config["target_layer_ids"]]
    elif how == "context_norm_dropped":  # hidden_norm not renamed: transformers starts output_norm_enc at ones
        tensors["hidden_norm.weight"] = tensors.pop("encoder.output_norm_enc.weight")
    elif how == "default_sliding_layers":  # layer_types left out: transformers' sliding default (window 2048 there)
        del config["layer_types"]
        config["sliding_window"] = 4
    else:
        raise ValueError(how)
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("case", ["llama"], indirect=True)  # one target shows that the comparison can fail
@pytest.mark.parametrize("how", ["layer_ids_unshifted", "context_norm_dropped", "default_sliding_layers"])
def test_a_conversion_bug_changes_transformers_acceptance_not_its_output(case, how, tmp_path):
    name, target, _, export, _, prompts, runs = case
    broken = AutoModel.from_pretrained(perturb(export, tmp_path / how, how), dtype=torch.float32).eval()
    wrong = []
    for ids, (reference, *_) in zip(prompts, runs):
        out, steps = transformers_dflash(target, broken, ids[None])
        assert torch.equal(out, reference), f"{how}: verification keeps the output lossless"
        wrong.append(steps)
    assert wrong != [steps for *_, steps in runs], f"{how}: the broken export accepts exactly what the right one accepts"


def test_the_export_imports_back_into_the_same_heads(case, tmp_path):
    name, target, heads_dir, export, _, prompts, _ = case
    out = import_heads(export, tmp_path / "back", target)
    back, heads = dh.load_heads(out, target=target), dh.load_heads(heads_dir, target=target)
    assert json.loads((out / "draftheads_import.json").read_text())["format"] == "transformers"
    assert back.feature_layers == heads.feature_layers and back.block_size == BLOCK
    assert back.mask_token_id == heads.mask_token_id
    for (k, a), (_, b) in zip(heads.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    ids = prompts[:1]
    assert draftheads_chain(target, back, ids).accept_lengths == draftheads_chain(target, heads, ids).accept_lengths


# -- the forward itself, on random heads and several RoPE scalings --------------------------------------
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
}


def random_heads(target, seed: int = 0) -> DFlashHeads:
    heads = DFlashHeads.for_target(target, num_layers=2, block_size=BLOCK, mask_token_id=63, feature_layers=[1, 3])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():  # norms away from one, so a dropped or misplaced norm shows
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim == 1 else 0.1) + (1.0 if p.ndim == 1 else 0.0))
    return heads.eval()


@pytest.mark.parametrize("rope", list(ROPES))
def test_the_exported_forward_computes_the_heads_block_states(rope, tmp_path):
    scaling = ROPES[rope]
    params = {"rope_theta": 10000.0, **(scaling or {"rope_type": "default"})}
    target = saved_and_reloaded(tiny_target("llama", layers=4, rope_parameters=params, max_position_embeddings=256),
                                tmp_path / "target")
    heads = random_heads(target)
    assert (heads.config.extra.get("rope_scaling") or {}).get("rope_type", "default") == rope
    heads.save_pretrained(tmp_path / "heads")
    draft = AutoModel.from_pretrained(export_heads(tmp_path / "heads", tmp_path / "export", "transformers"),
                                      dtype=torch.float32).eval()
    heads = dh.load_heads(tmp_path / "heads", target=target)
    g = torch.Generator().manual_seed(1)
    T, start = 7, 60  # past the scalings' original 32 positions
    features = torch.randn(1, T, 2 * target.config.hidden_size, generator=g)
    tokens = heads.block_inputs(torch.tensor([11]))  # [1, BLOCK]
    positions = start + torch.arange(T + BLOCK)[None]
    with torch.no_grad():
        kv = heads.context_kv(heads.context(features), positions[:, :T])
        ours = heads.block_states(tokens, positions[:, T:], kv, None)
        theirs = draft(noise_embeds=target.get_input_embeddings()(tokens), context_hidden_states=features,
                       position_ids=positions).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5), f"{rope}: max difference {(ours - theirs).abs().max():.2e}"


# -- refusals ------------------------------------------------------------------------------------------
@pytest.fixture
def saved_heads(tmp_path):
    target = saved_and_reloaded(tiny_target("llama", layers=4), tmp_path / "target")
    heads = random_heads(target)
    heads.save_pretrained(tmp_path / "heads")
    return target, heads


def test_a_restricted_draft_vocabulary_is_refused(saved_heads, tmp_path):
    _, heads = saved_heads
    heads.token_counts.copy_(torch.arange(heads.config.vocab_size))
    heads.save_pretrained(tmp_path / "vocab", plans=given_tree(dh.StaticTree.chain(K), 16))
    with pytest.raises(ExportError, match=r"restricted vocabulary \(device any, temperature 0.0: draft_vocab_size 16"):
        export_heads(tmp_path / "vocab", tmp_path / "out", "transformers")
    assert not (tmp_path / "out").exists()
    heads.save_pretrained(tmp_path / "whole", plans=given_tree(dh.StaticTree.chain(K)))  # the whole vocabulary: fine
    export_heads(tmp_path / "whole", tmp_path / "out", "transformers")


def test_a_draft_length_other_than_the_block_is_refused(saved_heads, tmp_path):
    with pytest.raises(ExportError, match=r"always drafts block_size - 1 = 3 tokens \(got num_speculative_tokens 2\)"):
        export_heads(tmp_path / "heads", tmp_path / "out", "transformers", num_speculative_tokens=2)
    export_heads(tmp_path / "heads", tmp_path / "out", "transformers", num_speculative_tokens=K)


@pytest.mark.parametrize("rope", [{"rope_type": "dynamic", "factor": 2.0},
                                  {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                                   "original_max_position_embeddings": 64}])
def test_length_dependent_rope_is_refused(rope, tmp_path):
    target = tiny_target("llama", layers=4, rope_parameters={"rope_theta": 10000.0, **rope}, max_position_embeddings=256)
    target = saved_and_reloaded(target, tmp_path / "target")
    random_heads(target).save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=f"rope type '{rope['rope_type']}'.*dynamic_rope_update"):
        export_heads(tmp_path / "heads", tmp_path / "out", "transformers")


def inkling_target(folder: Path):
    """A tiny Inkling (its input embedding applies an ``embed_norm``, which transformers' DFlash
    generator bypasses for the mask slots)."""
    from transformers import AutoConfig

    torch.manual_seed(0)
    config = AutoConfig.for_model("inkling_text", vocab_size=64, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return saved_and_reloaded(AutoModelForCausalLM.from_config(config), folder)


def test_a_target_embedding_with_an_embed_norm_is_refused_both_ways(saved_heads, tmp_path):
    inkling = inkling_target(tmp_path / "inkling")
    assert getattr(inkling.get_input_embeddings(), "embed_norm", None) is not None
    random_heads(inkling).save_pretrained(tmp_path / "inkling-heads")
    with pytest.raises(ExportError, match=r"embedding \(InklingNormedEmbedding\) applies an embed_norm"):
        export_heads(tmp_path / "inkling-heads", tmp_path / "out", "transformers")
    export = export_heads(tmp_path / "heads", tmp_path / "llama-export", "transformers")
    with pytest.raises(ValueError, match="embed_norm"):
        import_heads(export, tmp_path / "back", inkling, format="transformers")


def test_a_checkpoint_with_transformers_default_sliding_layers_is_refused_on_import(saved_heads, tmp_path):
    target, _ = saved_heads
    export = export_heads(tmp_path / "heads", tmp_path / "export", "transformers")
    config = json.loads((export / "config.json").read_text())
    del config["layer_types"]  # transformers then makes every layer sliding_attention (window 2048)
    (export / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="sliding-window draft layers"):
        import_heads(export, tmp_path / "back", target)
