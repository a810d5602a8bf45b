"""MTP heads (``head_type: mtp``, draftheads/methods/mtp/) on a tiny Qwen3.5 that ships its MTP layer
the way real checkpoints do (tests/mtp_utils.py): the layer is read from the checkpoint's own
``mtp.*`` tensors (which transformers drops at load), drafts through the one verifier exactly
(greedy equal to generate, singles, left-padded batches, chains and trees; sampling keeps the
target's law), saves and loads, and is usable untrained as ``builtin-mtp``. A target that ships no
MTP layer gets a fresh one, said once; ``builtin-mtp`` refuses it, naming why."""
from __future__ import annotations

import itertools
import math
import warnings
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

import draftheads as dh
from draftheads.cli import main
from draftheads.methods.mtp.heads import MtpHead

import mtp_utils as mu

NEW = 24
CHAIN = {"total_tokens": 4, "depth": 3, "top_k": 1}
TREE = {"total_tokens": 10, "depth": 3, "top_k": 3}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_tokenizer):
    return mu.save_with_mtp(mu.qwen35_config(), tmp_path_factory.mktemp("qwen35-mtp"), tokenizer=tiny_tokenizer)


@pytest.fixture(scope="module")
def target(folder):
    return mu.load(folder)


@pytest.fixture(scope="module")
def builtin(target):
    return dh.load_heads("builtin-mtp", target=target)


def exact(target, heads, tree, **options):
    """Every draft drafted in full (no online budget), never plain by plan."""
    return dh.SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, batch_plan=None, **options)


# -- the shipped layer ---------------------------------------------------------------------------------
#: vLLM's names of the shipped tensors -> the names transformers' MtpLayer (the heads' layer) gives them.
def heads_name(vllm_name: str) -> str:
    rest = vllm_name[len("mtp."):]
    renamed = {"fc.weight": "eh_proj.weight", "pre_fc_norm_embedding.weight": "enorm.weight",
               "pre_fc_norm_hidden.weight": "hnorm.weight", "norm.weight": "post_norm.weight"}
    if rest in renamed:
        return "layers.0." + renamed[rest]
    return "layers.0.mtp_block." + rest[len("layers.0."):]


def test_the_shipped_layer_is_read_from_the_checkpoints_mtp_tensors(folder, target, builtin):
    stored = load_file(folder / "model.safetensors")
    assert sorted(k for k in stored if k.startswith("mtp.")) == sorted(mu.QWEN35_MTP_NAMES)
    assert not any(k.startswith("mtp") for k in target.state_dict())  # transformers dropped them at load
    assert builtin.config.extra["origin"] == "shipped" and builtin.config.extra["family"] == "qwen3_5"
    assert type(builtin.layers[0].mtp_block).__name__ == "Qwen3_5DecoderLayer"
    mine = builtin.state_dict()
    for name in mu.QWEN35_MTP_NAMES:
        assert torch.equal(mine[heads_name(name)], stored[name]), name
    assert set(mine) == {heads_name(n) for n in mu.QWEN35_MTP_NAMES} | {"token_counts"}


# -- exact decoding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", [CHAIN, TREE], ids=["chain", "tree"])
def test_builtin_mtp_decodes_exactly(target, builtin, tree):
    ids = mu.prompts(3)
    want = mu.greedy(target, ids, NEW)
    lengths = []
    for r in range(ids.shape[0]):
        out = exact(target, builtin, tree).generate(ids[r : r + 1], max_new_tokens=NEW, eos_token_id=[])
        assert out.sequences.tolist() == want[r : r + 1].tolist()
        lengths += out.accept_lengths
    assert max(lengths) >= 3, "the MTP drafts were hardly accepted: the rollback went untested"
    assert min(lengths) == 1, "no MTP draft was rejected: the rollback went untested"


def test_builtin_mtp_decodes_a_left_padded_batch_exactly(target, builtin):
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(3, mu.VOCAB, (n,), generator=gen) for n in (10, 7, 4)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    want = mu.greedy(target, ids, NEW, attention_mask=mask)
    out = exact(target, builtin, TREE).generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
    assert out.sequences.tolist() == want.tolist()
    assert len(set(map(tuple, out.stats["row_accept_lengths"]))) > 1  # the rows advanced unevenly


def test_sampling_with_mtp_drafts_keeps_the_target_law(tmp_path):
    """The first three tokens' law, by the chain rule over the target, against seeded decodes whose
    MTP drafts are drawn (a chain of two)."""
    from draftheads.inference.sampling import SamplingParams
    from stats import law_pvalue

    vocab, new, runs = 6, 3, 1000
    config = mu.qwen35_config(vocab_size=vocab, initializer_range=0.05, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    target = mu.load(mu.save_with_mtp(config, tmp_path / "t", seed=3))
    heads = dh.load_heads("builtin-mtp", target=target)
    decoder = exact(target, heads, {"total_tokens": 3, "depth": 2, "top_k": 1})
    ids = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=new - 1):
            probs = params.probs(target(torch.cat([ids, torch.tensor([seq])], dim=1)).logits[0, -new:])
            head = math.prod(float(probs[i, seq[i]]) for i in range(new - 1))
            for last in range(vocab):
                law[(*seq, last)] = head * float(probs[-1, last])
    gen = torch.Generator().manual_seed(1234)
    counts, drafted = Counter(), 0
    for _ in range(runs):
        out = decoder.generate(ids, max_new_tokens=new, temperature=0.9, top_k=5, eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, ids.shape[1]:].tolist())] += 1
        drafted += max(out.accept_lengths) > 1
    pvalue = law_pvalue(counts, law)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: the decoded law differs from the target's"
    assert drafted > runs // 10, "MTP drafts were (almost) never accepted: the test would be vacuous"


# -- heads folders -------------------------------------------------------------------------------------
def test_mtp_heads_save_load_and_draft_the_same(tmp_path, target, builtin):
    path = builtin.save_pretrained(tmp_path / "heads")
    loaded = dh.load_heads(path, target=target)
    assert type(loaded) is MtpHead
    for name, value in builtin.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value.cpu()), name
    ids = mu.prompts(1, seed=7)
    a = exact(target, builtin, TREE).generate(ids, max_new_tokens=NEW, eos_token_id=[])
    b = exact(target, loaded, TREE).generate(ids, max_new_tokens=NEW, eos_token_id=[])
    assert a.sequences.tolist() == b.sequences.tolist() and a.accept_lengths == b.accept_lengths


def test_heads_of_a_config_naming_a_class_outside_transformers_are_refused(tmp_path, target, builtin):
    import json

    path = builtin.save_pretrained(tmp_path / "heads")
    config = json.loads((path / "config.json").read_text())
    config["extra"]["decoder_layer"] = "os.system"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="decoder_layer 'os.system'.*transformers' own classes only"):
        dh.load_heads(path, target=target)


# -- targets without an MTP layer ----------------------------------------------------------------------
def test_a_target_without_mtp_tensors_gets_a_fresh_layer_said_once(tmp_path):
    """Its config declares one (mtp_num_hidden_layers: 1) but its checkpoint was saved by transformers,
    which drops the layer: fresh heads, one warning saying why, and builtin-mtp refused naming it."""
    target = mu.load(mu.save_with_mtp(mu.qwen35_config(), tmp_path / "t", mtp=False))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        heads = MtpHead.for_target(target, num_heads=2)
    said = [str(w.message) for w in said if "mtp" in str(w.message)]
    assert len(said) == 1 and "no mtp.* tensors" in said[0] and "starts fresh" in said[0], said
    assert heads.config.extra["origin"] == "fresh"
    ids = mu.prompts(1)
    out = exact(target, heads, CHAIN).generate(ids, max_new_tokens=NEW, eos_token_id=[])
    assert out.sequences.tolist() == mu.greedy(target, ids, NEW).tolist()
    with pytest.raises(ValueError, match="builtin-mtp: .* ships no MTP layer: .*no mtp.\\* tensors"):
        dh.load_heads("builtin-mtp", target=target)


def test_a_model_of_a_family_without_mtp_layers_gets_a_fresh_layer_of_its_kind(tiny_llama):
    with pytest.warns(UserWarning, match="model type 'llama' ships no MTP layers.*starts fresh"):
        heads = MtpHead.for_target(tiny_llama)
    assert type(heads.layers[0].mtp_block).__name__ == "LlamaDecoderLayer"
    with pytest.raises(ValueError, match="builtin-mtp: .*ships no MTP layer.*'llama'"):
        dh.load_heads("builtin-mtp", target=tiny_llama)


def test_builtin_names_only_methods_whose_targets_ship_heads(target):
    with pytest.raises(ValueError, match="'builtin-medusa' names no heads a target ships itself; valid: builtin-mtp"):
        dh.load_heads("builtin-medusa", target=target)
    with pytest.raises(ValueError, match="pass target="):
        dh.load_heads("builtin-mtp")


# -- the command line ----------------------------------------------------------------------------------
def test_generate_with_builtin_mtp_prints_the_targets_own_text(folder, target, tiny_tokenizer, capsys):
    code = main(["generate", "--target", str(folder), "--heads", "builtin-mtp", "--prompt", "for x in y:",
                 "--max-new-tokens", "12", "--no-chat-template", "--quiet", "--dtype", "float32"])
    assert code == 0
    printed = capsys.readouterr().out.strip()
    ids = tiny_tokenizer("for x in y:", return_tensors="pt").input_ids
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                          eos_token_id=tiny_tokenizer.eos_token_id, pad_token_id=tiny_tokenizer.pad_token_id)
    assert printed == tiny_tokenizer.decode(ref[0, ids.shape[1]:], skip_special_tokens=True).strip()


# -- training ------------------------------------------------------------------------------------------
def test_the_trainer_fine_tunes_the_shipped_layer(tmp_path, folder, target, builtin, tiny_text_jsonl):
    """``heads.head_type: mtp`` through train.py's trainer: it starts from the checkpoint's own layer
    (not a fresh one), unrolls two MTP steps, moves the weights, exports heads that load and decode exactly."""
    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    cfg = config_from_dict({
        "target": {"name_or_path": str(folder), "dtype": "float32"},
        "heads": {"head_type": "mtp", "num_heads": 2, "num_layers": 1},
        "data": {"path": str(tiny_text_jsonl), "format": "text", "max_length": 32, "eval_fraction": 0.1,
                 "cache_dir": str(tmp_path / "hf-cache")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 4, "batch_size": 4, "lr": 1e-3, "eval_every": 0,
                  "eval_batches": 1, "save_every": 0, "log_every": 2, "choose_tree": False},
    }, [])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a fresh layer would be said: it must not be one
        result = run(cfg)
    trained = dh.load_heads(result.heads_dir, target=target)
    assert trained.config.extra["origin"] == "shipped" and trained.config.num_heads == 2
    moved = [n for n, v in trained.state_dict().items() if n != "token_counts" and not torch.equal(v, builtin.state_dict()[n])]
    assert "layers.0.eh_proj.weight" in moved and any("mtp_block" in n for n in moved)
    ids = mu.prompts(1, seed=3)
    out = exact(target, trained, TREE).generate(ids, max_new_tokens=NEW, eos_token_id=[])
    assert out.sequences.tolist() == mu.greedy(target, ids, NEW).tolist()


# -- export --------------------------------------------------------------------------------------------
def test_the_vllm_export_writes_the_checkpoints_own_names_which_transformers_reads(tmp_path, folder, target, builtin):
    """The export holds the layer under the names the checkpoint shipped it with (vLLM's qwen3_5_mtp
    names), the target's embedding and LM head (vLLM's strict loader wants its drafter's), and a
    config counting one MTP layer; transformers' MtpModel reads the layer back from it."""
    import json

    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    from draftheads.export import export_heads

    heads_dir = builtin.save_pretrained(tmp_path / "heads")
    out = export_heads(heads_dir, tmp_path / "export", "vllm", verifier=str(folder), num_speculative_tokens=2)
    written = load_file(out / "model.safetensors")
    assert set(written) == set(mu.QWEN35_MTP_NAMES) | {"model.embed_tokens.weight", "lm_head.weight"}
    shipped = load_file(folder / "model.safetensors")
    for name, value in written.items():
        assert torch.equal(value, shipped[name]), name
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["mtp_num_hidden_layers"] == 1
    main = AutoModelForCausalLM.from_pretrained(folder)
    main.config._name_or_path = str(out)  # MtpModel opens the main model's checkpoint: here, the export
    main.config.num_mtp_layers, main.config.mtp_layer_types = 1, ["full_attention"]
    read = MtpModel.from_pretrained(main).layers[0].state_dict()
    for name, value in builtin.state_dict().items():
        if name != "token_counts":
            assert torch.equal(read[name[len("layers.0."):]], value), name


def test_an_mtp_export_for_a_model_vllm_has_no_mtp_drafter_for_is_refused_by_name(tmp_path, tiny_target_dir):
    from transformers import AutoModelForCausalLM

    from draftheads.export import export_heads
    from draftheads.export.common import ExportError

    llama = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fresh layer: Llama ships none
        heads_dir = MtpHead.for_target(llama).save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=r"vLLM has no MTP drafter for LlamaForCausalLM \(model type 'llama'\).*"
                                          r"qwen3_5 \(qwen3_5_mtp\)"):
        export_heads(heads_dir, tmp_path / "export", "vllm", verifier=str(tiny_target_dir))
    assert not (tmp_path / "export").exists()
