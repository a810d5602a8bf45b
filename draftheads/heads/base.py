"""What every head type shares: its config, the frozen target modules it reads, its token counts,
its plans (tree.json), saving, and the drafter their method declares.

A head type (its methods/<type>/heads.py, e.g. methods/medusa/heads.py) subclasses `DraftHeads` and
holds only what makes it different: its modules, its forward pieces and what `for_target` puts in its config.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ..plans import TreePlans, TreeSpec
from ..registry import method_of
from .confidence import ConfidenceCalibration
from .config import HeadsConfig, TargetInfo
from .folder import LEGACY_ATTRIBUTES, plans_view, save_heads, with_attribute
from .tree_check import check_plans


def _deprecated_view(name: str) -> property:
    """``heads.<name>``: what heads carried before plans, now a view of ``heads.plans`` (reading
    and setting both warn; setting rewrites the plans as a one-entry table, as before)."""
    why = (f"heads.{name} is deprecated: decode settings live in heads.plans (tree.json, `draftheads.plans`) "
           "or go to SpeculativeDecoder(target, heads, tree=..., plans=...)")

    def get(self):
        warnings.warn(why, DeprecationWarning, stacklevel=2)
        return plans_view(self.plans)[name]

    def put(self, value):
        warnings.warn(why, DeprecationWarning, stacklevel=2)
        self.plans = with_attribute(self.plans, name, value)

    return property(get, put, doc=f"Deprecated view of ``plans``: {name} of the greedy batch-1 entry.")


def token_context(input_ids: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[B, S, K]``: ``context[b, t, j] = input_ids[b, t+1+j]`` (0 past the end): the tokens a
    head k reads (j <= k) when predicting t+2+k, teacher-forced from the labels."""
    bsz, seq = input_ids.shape
    context = torch.zeros(bsz, seq, num_heads, dtype=input_ids.dtype, device=input_ids.device)
    for j in range(num_heads):
        if 1 + j < seq:
            context[:, : seq - 1 - j, j] = input_ids[:, 1 + j :]
    return context


class DraftHeads(nn.Module):
    """Base of every head type. Class attributes describe the type to training and drafting."""

    head_type: str = ""
    #: Whether head_states also takes the tokens before each head's target (Hydra).
    reads_tokens = False
    #: Which targets the heads learn (`registry.Method.learns_next_tokens` reads it); how they draft
    #: is their method's `registry.TreeKind`.
    training_objective = "future_tokens"
    #: The `HeadsSpec` (config ``heads:``) fields that `for_target` takes besides num_heads/num_layers.
    spec_options: tuple[str, ...] = ()
    #: `HeadsSpec` fields training reads when it starts fresh heads of this type (not saved with them).
    init_options: tuple[str, ...] = ()
    #: config.json "extra" keys the head is built from (checked at load).
    required_extra: tuple[str, ...] = ()
    #: One module per head: num_heads sizes the weights, so a folder continued from must have as
    #: many (for a draft layer it only counts the steps or depths trained).
    weights_per_head = False
    #: Its own LM head covers a draft vocabulary that fresh heads take from the training data's
    #: most frequent tokens (`set_draft_vocab`) before training.
    own_draft_vocabulary = False
    #: The target layers whose hidden states it reads (None: the last hidden state after the final norm).
    feature_layers: list[int] | None = None

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
        # How often each token was a training label: ranks the vocabulary so that drafting can
        # rank the most frequent tokens only. int64, so dtype casts of the heads leave it alone.
        self.register_buffer("token_counts", torch.zeros(config.vocab_size, dtype=torch.long))
        # The target's frozen embedding and LM head, set by bind_target. A plain dict, so they are
        # not submodules: never saved, trained or moved with the heads.
        self._bound: dict[str, nn.Module] = {}
        self.plans = None
        self.confidence = None

    #: The folder's tree.json as loaded (`plans.TreePlans`: what to run per device type, batch size
    #: and temperature), the way a transformers model carries its generation_config: set by
    #: load_heads, saved by save_pretrained, followed by SpeculativeDecoder unless given plans=.
    #: The only decode setting heads hold; drafters take theirs as arguments.
    plans: TreePlans | None = None
    #: The folder's confidence.json as loaded (`heads.confidence.ConfidenceCalibration`): the measured
    #: chance of acceptance by rank and draft probability, which EAGLE trees rank their nodes by
    #: (None: by draft probability). Set by load_heads and `draftheads calibrate`, saved by save_pretrained.
    confidence: ConfidenceCalibration | None = None
    tree, draft_vocab_size, tree_origin, batch_plan = (_deprecated_view(name) for name in LEGACY_ATTRIBUTES)

    def use_plans(self, plans: TreePlans | None, where: str | os.PathLike = "plans"):
        """Decode with ``plans`` from now on (None: the device default), as loading a heads folder,
        an import or training sets them: checked first, so a tree that does not fit these heads
        is refused here, naming ``where`` it came from. Returns the heads."""
        check_plans(self, plans, where)
        self.plans = plans
        return self

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def target_config(
        cls, target: nn.Module, num_heads: int, num_layers: int, lm_head: str, extra: dict | None = None
    ) -> HeadsConfig:
        """The config of fresh heads of this type sized for ``target``."""
        info = TargetInfo.from_model(target)
        return HeadsConfig(
            head_type=cls.head_type,
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=info.hidden_size,
            vocab_size=info.vocab_size,
            lm_head=lm_head,
            target=info,
            extra=dict(extra or {}),
        )

    @classmethod
    def from_config_for(cls, config: HeadsConfig, target: nn.Module):
        """Fresh heads built from ``config``, initialised from and bound to ``target``, on its device."""
        heads = cls(config)
        heads.init_from_target(target)
        heads.bind_target(target)
        return heads.to(device=target.get_output_embeddings().weight.device)

    @classmethod
    def resolve_options(cls, options: dict, target: nn.Module, tokenizer) -> dict:
        """The `HeadsSpec` options of fresh heads, with what is chosen from the target or the
        tokenizer settled (default: as given)."""
        return options

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Take the draft vocabulary from the training data's token counts (``own_draft_vocabulary``)."""
        raise NotImplementedError(f"{self.head_type} heads have no draft vocabulary of their own")

    def settle_tokenizer(self, tokenizer) -> str | None:
        """Settle and check what these heads take from the tokenizer before training (a mask token);
        returns a line for the run's log, or None when they take nothing."""
        return None

    def validate_loaded(self) -> None:
        """Check weights just loaded from a folder (raise ValueError naming what is wrong)."""

    @classmethod
    def card_rows(cls, config: dict) -> list[tuple[str, object]]:
        """What the model card's heads table says about heads of this type, from their config.json
        (a draft layer's steps and geometry; Medusa-style heads say what differs for them)."""
        extra = config.get("extra") or {}
        rows: list[tuple[str, object]] = [("draft steps in training", config["num_heads"]),
                                          ("decoder layers", config["num_layers"])]
        for key in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "feature_layers",
                    "draft_vocab_size"):
            if key in extra:
                rows.append((key.replace("_", " "), extra[key]))
        return rows

    def init_from_target(self, target: nn.Module) -> None:
        """Copy what a fresh head starts from out of the target (default: nothing)."""

    def save_pretrained(self, path: str | os.PathLike, tree: TreeSpec | list[list[int]] | dict | None = None,
                        plans: TreePlans | None = None) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (heads only) and ``tree.json``, atomically:
        ``tree`` (one tree for any device), else ``plans``, else ``self.plans`` (`folder.save_heads`)."""
        return save_heads(self, path, tree=tree, plans=plans)

    def bind_target(self, target: nn.Module):
        """Check that ``target`` is the model these heads were trained for and remember its frozen
        embedding and LM head (never copied into the heads)."""
        check_target(self.config, target)
        self._bound = {"embedding": target.get_input_embeddings(), "lm_head": target.get_output_embeddings()}
        return self

    def target_embedding(self) -> nn.Module:
        """The bound target's input embedding."""
        return self._bound_module("embedding", "embedding")

    def target_lm_head(self) -> nn.Module:
        """The bound target's LM head (its output embedding)."""
        return self._bound_module("lm_head", "LM head")

    def _bound_module(self, key: str, what: str) -> nn.Module:
        module = self._bound.get(key)
        if module is None:
            raise RuntimeError(f"these {self.head_type} heads read the target's {what}: call heads.bind_target(target) first")
        return module

    def proposer(self, tree: TreeSpec | list[list[int]] | dict | None = None, **options):
        """The drafter for these heads (an `inference.proposers.drafter.Drafter`): the one their
        method declares (draftheads/methods/), drafting ``tree`` (None: the method's own default,
        never ``plans``: which entry applies depends on the request, `inference.planned` decides)."""
        return method_of(self).drafter(self, tree=tree, **options)

    # -- vocabulary -----------------------------------------------------------------------------
    def draft_vocab(self, size: int | None) -> torch.Tensor | None:
        """The ``size`` most frequent training tokens, sorted by id (None: the whole vocabulary,
        also when the heads carry no counts)."""
        if size is None or size >= self.config.vocab_size or int(self.token_counts.sum()) == 0:
            return None
        return self.token_counts.topk(size).indices.sort().values


def check_target(config: HeadsConfig, target: nn.Module) -> None:
    """Raise a ValueError naming every difference between the heads' recorded target and ``target``."""
    actual = TargetInfo.from_model(target)
    problems = []
    if config.hidden_size != actual.hidden_size:
        problems.append(f"hidden_size: heads expect {config.hidden_size}, target has {actual.hidden_size}")
    if config.vocab_size != actual.vocab_size:
        problems.append(f"vocab_size: heads expect {config.vocab_size}, target has {actual.vocab_size}")
    if not problems and config.target is not None:
        problems = config.target.mismatches(actual)
    if problems:
        trained_for = config.target.name_or_path if config.target else "an unknown target"
        raise ValueError(
            f"these {config.head_type} heads were trained for {trained_for or 'another model'!s} and do not fit "
            f"the target {actual.name_or_path or type(target).__name__}:\n  - " + "\n  - ".join(problems)
        )
