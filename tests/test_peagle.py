"""P-EAGLE heads: trained with the real COD-sampled loss, K drafts from one forward, lossless.

Heads are trained for a few seconds with `TargetWithHeads` (the loss train.py uses) on the
target's greedy continuations, so exactness runs with drafts that are accepted (asserted).
The training graph is checked against drafting element by element: a wrong attention mask or
position in either would make the draft learn something it never computes at inference.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import draftheads as dh
from draftheads.methods.peagle.heads import resolve_mask_token
from draftheads.inference.sampling import SamplingParams
from draftheads.train.model import TargetWithHeads
from draftheads.methods.peagle.loss import element_states, sample_chains
from draftheads.methods.peagle.search import draft_scores

from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from test_batch import check_rows_exact
from test_sampling import drafts_accepted, empirical_counts, exact_distribution

DEPTHS = 4
MASK = 0  # the mask token of heads built without data
TREE = [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]]


def peagle_for(target, **kwargs):
    torch.manual_seed(0)
    options = {"num_heads": DEPTHS, "num_layers": 1, "draft_vocab_size": 48, "mask_token_id": MASK, **kwargs}
    return dh.PEagleHead.for_target(target, **options)


def trained_peagle(target, steps: int = 40, seed: int = 0, prepare=None, **options):
    """(heads, prompts, first loss, last loss): heads trained on the target's greedy continuations;
    ``options`` go to the heads (e.g. norm_before_fc), ``prepare(heads)`` runs before training."""
    vocab = target.config.vocab_size
    prompts = torch.randint(3, vocab, (32, 6), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        seqs = greedy_reference(target, prompts, 40)
    # The mask token: the id fewest rows hold; those rows are dropped, so the data never holds it.
    rows_with = torch.stack([(seqs == i).any(1) for i in range(vocab)]).sum(1)
    mask = int(rows_with.argmin())
    keep = ~(seqs == mask).any(1)
    seqs, prompts = seqs[keep], prompts[keep]
    assert seqs.shape[0] >= 20, "too few rows left"
    heads = peagle_for(target, mask_token_id=mask, **options)
    if prepare is not None:
        prepare(heads)
    heads.set_draft_vocab(torch.bincount(seqs.flatten(), minlength=vocab))
    model = TargetWithHeads(target, heads)
    opt = torch.optim.Adam(heads.parameters(), lr=3e-3)
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompts.shape[1] :] = 1
    losses = []
    for _ in range(steps):
        model.reseed_noise(0, seqs.device)  # the same COD draw every step: losses comparable
        loss = model(seqs, loss_mask=loss_mask)["loss"]
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval(), prompts, losses[0], losses[-1]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request):
    target = tiny_target(request.param)
    heads, prompts, first, last = trained_peagle(target)
    return request.param, target, heads, prompts, first, last


def test_training_lowers_the_loss(trained):
    arch, _, _, _, first, last = trained
    assert last < first - 1e-3, f"{arch}: P-EAGLE loss did not decrease ({first:.4f} -> {last:.4f})"


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_matches_generate(trained, tree):
    arch, target, heads, prompts, _, _ = trained
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    lengths = []
    for i, new in enumerate((40, 40, 40, 7, 2, 1)):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new)), f"{arch}: output differs from generate"
        if new == 40:
            lengths += out.accept_lengths
            # one draft forward per step; a last step with one token left drafts nothing
            assert len(out.accept_lengths) - 1 <= out.stats["peagle"]["draft_forwards"] <= len(out.accept_lengths)
    fresh = torch.tensor([[5, 9, 33, 17]])  # never seen in training: rejections happen
    assert torch.equal(decoder.generate(fresh, max_new_tokens=30, eos_token_id=[]).sequences, greedy_reference(target, fresh, 30))
    mean = sum(lengths) / len(lengths)
    # tree=None is the chain of the trained depths (it ran Medusa's CPU default tree before P-EAGLE
    # heads had a default of their own); a chain accepts less than a tree read off the same forward,
    # and unused drafts give ~1.0
    bar = 1.3 if tree is None else 1.5
    assert mean > bar, f"{arch}: mean accepted length {mean:.2f}: the drafts are barely used"


def test_left_padded_batch_decodes_every_row_exactly(trained):
    _, target, heads, prompts, _, _ = trained
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]
    check_rows_exact(target, heads, rows)


def test_tree_drafts_each_positions_top_k_of_the_same_forward(trained):
    """Node (depth d, rank r) holds position d's r-th best token: siblings' subtrees repeat it."""
    _, target, heads, prompts, _, _ = trained
    prompt = prompts[0]
    with torch.no_grad():
        out = target(prompt[None], output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i] for i in heads.feature_layers], -1)[0]
    root = int(out.logits[0, -1].argmax())
    chain = heads.proposer(tree=[[0] * d for d in range(1, DEPTHS + 1)])
    chain.start([prompt], [hidden], SamplingParams(), None)
    scores = draft_scores(chain, root, DEPTHS)
    ranked = heads.vocab_ids()[scores.topk(2, dim=-1).indices]
    tree = heads.proposer(tree=TREE)
    tree.start([prompt], [hidden], SamplingParams(), None)
    (drafted,) = tree.propose([root], [DEPTHS])
    by_path = {tuple(p): int(t) for p, t in zip(sorted(map(tuple, TREE), key=lambda c: (len(c), c)), drafted.tokens[1:])}
    for path, token in by_path.items():
        assert token == int(ranked[len(path) - 1, path[-1]]), path
    assert by_path[(1, 0)] == by_path[(0, 0)], "a mask slot does not see the token drafted before it"


def test_training_elements_compute_what_drafting_computes():
    """Element (anchor t, depth d) of the training forward == drafting's slot d after root t+1."""
    target = tiny_target("llama", seed=1)
    heads = peagle_for(target, num_layers=2)
    heads.set_draft_vocab(torch.arange(64).flip(0).clamp(min=1).index_fill(0, torch.tensor([MASK]), 0))
    with torch.no_grad():  # a fresh draft layer is the identity: make attention and MLP matter
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    check_training_elements_equal_drafting(heads, target)


def check_training_elements_equal_drafting(heads, target) -> None:
    """Every element (anchor t, depth d) of one training forward over a random sequence equals
    drafting's slot d after root t + 1, for three anchors."""
    seq = torch.randint(3, 64, (1, 14), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = target(seq, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in heads.feature_layers], -1)
    n = seq.shape[1] - 1
    everything = [(torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool)) for _ in range(DEPTHS - 1)]
    with torch.no_grad():
        state, anchor, depth, _ = element_states(heads.eval(), features, seq, torch.ones_like(seq), everything)
        train_logits = heads.logits(state[0])
    for t in (0, 4, 9):
        drafter = heads.proposer()
        drafter.start([seq[0, : t + 1]], [features[0, : t + 1]], SamplingParams(), None)
        draft_logits = draft_scores(drafter, int(seq[0, t + 1]), DEPTHS)
        for d in range(DEPTHS):
            col = int(((anchor[0] == t) & (depth == d)).nonzero())
            assert torch.allclose(train_logits[col], draft_logits[d], atol=1e-4), f"anchor {t}, depth {d}"


def test_cod_sampling_keeps_contiguous_chains_of_the_configured_sizes():
    valid = torch.ones(2, 5, 40, dtype=torch.bool)
    valid[1, :, 30:] = False  # a shorter row
    chains = sample_chains(valid, [40, 28, 20, 14, 8], torch.Generator().manual_seed(0))
    alive = torch.ones(2, 40, dtype=torch.bool)
    for d, (picked, real) in enumerate(chains, start=1):
        assert picked.shape[1] == [28, 20, 14, 8][d - 1]
        assert bool(alive.gather(1, picked)[real].all()), f"depth {d} extends a chain that stopped"
        assert not bool((picked[1][real[1]] >= 30).any()), "a chain past the row's supervised positions"
        alive = torch.zeros_like(alive).scatter_(1, picked, real)


# -- sampling: the target's exact law, with drafts that are accepted --------------------------------
def test_sampling_follows_the_target_distribution():
    vocab = 6
    target = tiny_target("llama", seed=3, vocab=vocab, hidden=32, layers=1)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    heads = dh.PEagleHead.for_target(target, num_heads=2, draft_vocab_size=5, mask_token_id=0)
    heads.set_draft_vocab(torch.tensor([0, 5, 4, 3, 2, 6]))
    # top-k trees (drawn chains: test_drawn_drafts)
    decoder = dh.SpeculativeDecoder(target, heads, tree=[[0], [1], [0, 0], [0, 1], [1, 0]], draw_drafts=False)
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    pvalue = law_pvalue(empirical_counts(decoder, prompt, params), exact_distribution(target, prompt, params))
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: not the target's distribution"
    accepted = drafts_accepted(decoder, prompt, params)
    assert accepted >= 5, f"drafts accepted in only {accepted}/50 runs: the test would be vacuous"


# -- save/load, export ----------------------------------------------------------------------------------
def test_save_load_round_trip_stores_its_own_embedding(trained, tmp_path):
    _, target, heads, prompts, _, _ = trained
    heads.save_pretrained(tmp_path / "heads")
    loaded = dh.load_heads(tmp_path / "heads", target=target)
    assert type(loaded) is dh.PEagleHead and loaded.mask_token_id == heads.mask_token_id
    a = dh.SpeculativeDecoder(target, heads).generate(prompts[:1], max_new_tokens=20, eos_token_id=[])
    b = dh.SpeculativeDecoder(target, loaded).generate(prompts[:1], max_new_tokens=20, eos_token_id=[])
    assert torch.equal(a.sequences, b.sequences) and a.accept_lengths == b.accept_lengths
    stored = load_file(str(tmp_path / "heads" / "model.safetensors"))
    assert not torch.equal(stored["embed_tokens.weight"], target.get_input_embeddings().weight), "the embedding trains"


def test_speculators_export_writes_the_peagle_layout(tmp_path):
    from draftheads.export.common import ExportError
    from draftheads.methods.peagle.export import export_peagle as export

    target = tiny_target("llama", layers=4)
    heads = peagle_for(target, feature_layers=[3, 0, 2])  # listed out of layer order on purpose
    heads.set_draft_vocab(torch.arange(64).clamp(min=1).index_fill(0, torch.tensor([MASK]), 0))
    folder = export(heads, verifier="some/target", verifier_cfg=target.config.to_dict(), num_speculative_tokens=3)
    cfg = folder.config
    assert cfg["speculators_model_type"] == "peagle" and cfg["architectures"] == ["PEagleSpeculator"]
    assert cfg["speculators_config"]["algorithm"] == "peagle" and cfg["mask_token_id"] == MASK
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 3
    assert "fc_norm" not in cfg and "norm_output" not in cfg
    d = heads.config.hidden_size
    mask_hidden = heads.mask_hidden.detach().reshape(-1)
    # the engine's fc columns (and so mask_hidden) follow layer order 0, 2, 3
    expected = torch.cat([mask_hidden[d:2 * d], mask_hidden[2 * d:], mask_hidden[:d]])
    assert folder.tensors["mask_hidden"].shape == (1, 1, 3 * d)
    assert torch.equal(folder.tensors["mask_hidden"].reshape(-1), expected)
    assert torch.equal(folder.tensors["embed_tokens.weight"], heads.embed_tokens.weight.detach())
    with pytest.raises(ExportError, match=r"num_speculative_tokens 5 exceeds the 4 depths"):
        export(heads, verifier="some/target", verifier_cfg=target.config.to_dict(), num_speculative_tokens=5)


# -- bad input --------------------------------------------------------------------------------------------
class FakeTokenizer:
    """What `resolve_mask_token` reads from a tokenizer."""

    def __init__(self, size, special=(), mask=None, pad=None, bos=1, eos=2):
        self.size, self.all_special_ids, self.mask_token_id = size, list(special), mask
        self.pad_token_id, self.bos_token_id, self.eos_token_id = pad, bos, eos
        self.added_tokens_decoder = {}

    def __len__(self):
        return self.size

    def convert_ids_to_tokens(self, i):
        return f"tok{i}"


def test_mask_token_choice_and_refusals():
    assert resolve_mask_token(FakeTokenizer(60, mask=7), 64, None) == 7
    assert resolve_mask_token(FakeTokenizer(60), 64, None) == 60  # the first unused embedding row
    assert resolve_mask_token(FakeTokenizer(64, special=[0, 1, 2], pad=0), 64, None) == 0
    assert resolve_mask_token(FakeTokenizer(64, special=[0, 1, 2, 63]), 64, 63) == 63  # a special token
    with pytest.raises(ValueError, match=r"mask_token_id 9 is the text token 'tok9', which the tokenizer emits"):
        resolve_mask_token(FakeTokenizer(64, special=[0, 1, 2]), 64, 9)
    with pytest.raises(ValueError, match=r"no id is free for the P-EAGLE mask token"):
        resolve_mask_token(FakeTokenizer(64, special=[1, 2], pad=2), 64, None)
    with pytest.raises(ValueError, match=r"outside the target's vocabulary"):
        resolve_mask_token(None, 64, 64)
    heads = peagle_for(tiny_target("llama"))
    counts = torch.ones(64, dtype=torch.long)
    with pytest.raises(ValueError, match=r"mask token id 0 occurs 1 time\(s\) in the training data"):
        heads.set_draft_vocab(counts)


def test_bad_trees_and_layers_are_refused():
    target = tiny_target("llama")
    heads = peagle_for(target)
    heads.set_draft_vocab(torch.arange(64).index_fill(0, torch.tensor([MASK]), 0))
    with pytest.raises(ValueError, match=r"the tree is 5 deep but these peagle heads were trained for 4 depths"):
        heads.proposer(tree=[[0] * d for d in range(1, 6)])
    with pytest.raises(ValueError, match=r"peagle heads take a static tree"):
        heads.proposer(tree={"total_tokens": 4, "depth": 3, "top_k": 1})
    with pytest.raises(ValueError, match=r"draft from their own trained vocabulary"):
        heads.proposer(tree=[[0]], draft_vocab_size=16)
    with pytest.raises(ValueError, match=r"feature layer 2 is the target's final output"):
        peagle_for(target, feature_layers=[0, 2])
    with pytest.raises(ValueError, match=r"need a mask_token_id"):
        dh.PEagleHead.for_target(target, num_heads=2)


def test_config_options_reach_the_heads(tmp_path):
    from draftheads.config import HeadsSpec
    from draftheads.train.loop import build_heads

    target = tiny_target("llama")
    spec = HeadsSpec(head_type="peagle", num_heads=3, num_layers=2, draft_vocab_size=16, cod_ratio=0.5,
                     cod_min_ratio=0.3, mask_token_id=0)
    heads = build_heads(spec, target)
    ex = heads.config.extra
    assert (ex["cod_ratio"], ex["cod_min_ratio"], ex["mask_token_id"], heads.config.num_layers) == (0.5, 0.3, 0, 2)
    saved = heads.save_pretrained(tmp_path / "h")
    assert json.loads((saved / "config.json").read_text())["head_type"] == "peagle"


def test_speculators_peagle_checkpoint_imports_and_decodes_the_same(tmp_path):
    """An exported speculators peagle folder (the layout vLLM accepts per position in
    test_vllm_engine.py) read back: the same heads, the same decoding; without embed_tokens the
    target's embedding (what vLLM then uses); without mask_hidden refused."""
    import shutil

    from safetensors.torch import save_file

    from draftheads.export import export_heads
    from draftheads.export.importers import read_heads

    target = tiny_target("llama", layers=3)
    heads = peagle_for(target, feature_layers=[2, 0], num_layers=2)
    heads.set_draft_vocab(torch.arange(64).clamp(min=1).index_fill(0, torch.tensor([MASK]), 0))
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "spec", "speculators", verifier="some/target")
    imported = read_heads(out, target)
    assert type(imported) is dh.PEagleHead and imported.config.num_heads == DEPTHS
    assert imported.feature_layers == [0, 2] and imported.mask_token_id == MASK
    ids = torch.tensor([[5, 9, 33, 17, 4]])
    a = dh.SpeculativeDecoder(target, heads).generate(ids, max_new_tokens=20, eos_token_id=[])
    b = dh.SpeculativeDecoder(target, imported).generate(ids, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(a.sequences, b.sequences) and a.accept_lengths == b.accept_lengths
    tensors = load_file(str(out / "model.safetensors"))
    shutil.copy(out / "config.json", tmp_path / "config.json")
    del tensors["embed_tokens.weight"]
    (tmp_path / "noemb").mkdir()
    shutil.copy(out / "config.json", tmp_path / "noemb" / "config.json")
    save_file(tensors, str(tmp_path / "noemb" / "model.safetensors"))
    shared = read_heads(tmp_path / "noemb", target)
    assert torch.equal(shared.embed_tokens.weight, target.get_input_embeddings().weight)
    del tensors["mask_hidden"]
    save_file(tensors, str(tmp_path / "noemb" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"needs mask_hidden"):
        read_heads(tmp_path / "noemb", target)


def test_heads_without_a_chosen_tree_decode_the_chain_of_their_depths(trained):
    """No tree.json (heads trained without a final evaluation, or never calibrated): the decoder drafts the
    chain of every trained depth, as engines do, not another head type's default tree."""
    _, target, heads, prompts, _, _ = trained
    decoder = dh.SpeculativeDecoder(target, heads)
    assert decoder.proposer.shape.parents == dh.TreeShape.chain(heads.config.num_heads).parents
    out = decoder.generate(prompts[:1], max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, prompts[:1], 12))


def test_training_chooses_a_tree_with_one_draft_forward_per_depth(trained):
    """The end of training picks a static tree from the evaluation's per-depth table (it refused
    P-EAGLE before), costing each depth one draft forward; the tree decodes exactly."""
    from draftheads.tune.training import choose_export_tree

    _, target, heads, prompts, _, _ = trained
    table = [[0.9] + [0.05] * 9] * DEPTHS  # an accurate first rank at every depth
    data = choose_export_tree(target, heads, [greedy_reference(target, prompts[:1], 20)[0]], rank_accuracy=table)
    drafted = {int(k) for k in data["draft_seconds"] if int(k) > 0}
    assert drafted == set(range(1, DEPTHS + 1))
    assert data["chosen_by"] == "training" and data["tree"] and all(len(p) <= DEPTHS for p in data["tree"])
    decoder = dh.SpeculativeDecoder(target, heads, tree=data["tree"])
    ids = prompts[:1]
    assert torch.equal(decoder.generate(ids, max_new_tokens=20, eos_token_id=[]).sequences, greedy_reference(target, ids, 20))


def test_depth_table_is_what_decoding_accepts(trained):
    """The calibration table's rank-0 share at depth 1 is the share of chain-of-1 steps whose
    draft the verifier accepts, on the same greedy continuation (each root drafted as decoding
    drafts it)."""
    from draftheads.methods.peagle.search import depth_accuracy_table

    _, target, heads, prompts, _, _ = trained
    ids = prompts[:1]
    seq = greedy_reference(target, ids, 24)[0]
    table = depth_accuracy_table(target, heads, [seq], max_rank=3, skip_prompt=[ids.shape[1]])
    assert table.shape == (DEPTHS, 3) and float(table[0, 0]) > 0.1  # some drafts right: the check below can fail
    # Decode the same continuation with the chain of 1: every step drafts from the root at its
    # position; the steps that accepted it are the roots whose depth-1 guess was right.
    decoder = dh.SpeculativeDecoder(target, heads, tree=[[0]], draft_budget=None)
    out = decoder.generate(ids, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences[0], seq)
    hits = []
    drafter = heads.proposer(tree=[[0]])  # the decoder's drafter, afresh
    with torch.no_grad():
        from draftheads.inference.features import FeatureTap

        tap = FeatureTap(target, heads.feature_layers)
        with tap.capture() as got:
            o = target(seq[None], **tap.forward_kwargs())
        feats = tap.features(got, o)[0]
    start = ids.shape[1]
    drafter.start([seq[:start]], [feats[:start]], SamplingParams(), None)
    for root in range(start, seq.numel() - 1):
        hits.append(int(drafter.propose([int(seq[root])], [1])[0].tokens[1]) == int(seq[root + 1]))
        drafter.accepted([seq[root : root + 1]], [feats[root : root + 1]])
    assert abs(float(table[0, 0]) - sum(hits) / len(hits)) < 1e-6
    # ... and at every root the decoder visited, it accepted the draft exactly when the table hit.
    position = 0
    for emitted in out.accept_lengths[:-1]:
        assert (emitted == 2) == hits[position], f"root {start + position}: decoding and the table disagree"
        position += emitted


def test_calibrate_chooses_a_peagle_tree(trained, tmp_path):
    """`calibrate` measures P-EAGLE's per-depth acceptance on the target's own continuations and
    its draft cost by depth, and returns a tree the decoder runs exactly."""
    from draftheads.tune.calibrate import calibrate

    _, target, heads, prompts, _, _ = trained
    result = calibrate(target, heads, [prompts[i : i + 1] for i in range(2)], new_tokens=16, max_rank=4, max_nodes=8)
    assert set(d for d in result.draft_seconds if d > 0) == set(range(1, DEPTHS + 1))
    assert len(result.accuracy) == DEPTHS and all(len(p) <= DEPTHS for p in result.tree)
    decoder = dh.SpeculativeDecoder(target, heads, tree=result.tree or None)
    ids = prompts[2:3]
    assert torch.equal(decoder.generate(ids, max_new_tokens=16, eos_token_id=[]).sequences, greedy_reference(target, ids, 16))


def _peagle_counts(target, heads, seq, loss_mask, greedy_path: bool):
    from draftheads.train.head_loss import LossBatch
    from draftheads.methods.peagle.loss import PEagleLoss

    heads.config.extra["greedy_path"] = greedy_path
    with torch.no_grad():
        hidden, features, _ = TargetWithHeads(target, heads).target_outputs(seq)
        out = PEagleLoss()(heads, LossBatch(seq, loss_mask=loss_mask, hidden=hidden, features=features,
                                                generator=torch.Generator().manual_seed(0)))
    return out.count


def test_greedy_path_trains_a_depth_only_after_the_targets_own_tokens():
    """heads.greedy_path: depth d of anchor t trains only where the data's tokens t+2..t+1+d are
    the target's greedy tokens. On the target's own greedy text nothing changes; on other text no
    depth d >= 1 trains more elements than there are anchors on the target's path."""
    target = tiny_target("llama")
    vocab = target.config.vocab_size
    heads = peagle_for(target, draft_vocab_size=vocab)
    counts = torch.ones(vocab, dtype=torch.long)
    counts[MASK] = 0
    heads.set_draft_vocab(counts)  # every id draftable: the counts below are all trained elements
    prompts = torch.randint(3, vocab, (3, 6), generator=torch.Generator().manual_seed(1))
    greedy = greedy_reference(target, prompts, 24)
    on_text = torch.zeros_like(greedy)
    on_text[:, prompts.shape[1] :] = 1
    assert torch.equal(_peagle_counts(target, heads, greedy, on_text, True),
                       _peagle_counts(target, heads, greedy, on_text, False))

    text = torch.randint(3, vocab, (3, 30), generator=torch.Generator().manual_seed(2))
    everything = torch.ones_like(text)
    off = _peagle_counts(target, heads, text, everything, False)
    on = _peagle_counts(target, heads, text, everything, True)
    with torch.no_grad():
        follows = target(text).logits.argmax(-1)[:, :-1] == text[:, 1:]  # follows[:, p-1]: token p is greedy
    seq = text.shape[1]
    for d in range(1, DEPTHS):
        on_path = sum(int(follows[r, t + 1 : t + 1 + d].all()) for r in range(3) for t in range(seq - 2 - d))
        assert int(on[d]) <= on_path, f"depth {d}: {int(on[d])} elements trained, {on_path} anchors on the path"
    assert on[0] == off[0] and int(on[1:].sum()) < int(off[1:].sum())
