"""Generation engines for ``distill`` and ``--synthesize``: prompt token ids in, new token ids out.

Two engines behind one call, ``generate(prompts, seed, sampling)``: ``hf`` (``model.generate``
with left padding) and ``vllm`` (vLLM's offline ``LLM``, fed the same token ids). Each prompt
carries its own ``Sampling`` so one batch can mix greedy and sampled answers: vLLM takes a
parameter list natively, the HF engine runs one ``generate`` per distinct setting.

Ids go in and come out as ids: the caller keeps the target's exact tokens (decoding them to text
and back is lossy, see ``exact_ids``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class DistillError(ValueError):
    """Bad input or settings for ``distill`` / ``--synthesize`` (or an engine that cannot run here),
    with what to do about it."""


@dataclass(frozen=True)
class Sampling:
    """How one prompt is continued: temperature 0 is greedy (``top_p`` then unused)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 1024

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


Result = tuple[list[int], bool]  # new token ids without the end-of-sequence token, finished by it


class Engine(Protocol):
    context_length: int | None  # prompt + new tokens must fit; None: unknown

    def generate(self, prompts: Sequence[list[int]], seed: int, sampling: Sequence[Sampling]) -> list[Result]:
        """For each prompt (continued as its ``sampling`` says): (new ids, finished by eos).

        Sampled prompt ``i`` is seeded from ``seed + i`` where the engine can seed per prompt."""


def stop_ids(*values: Any) -> set[int]:
    """Every id that ends a turn, from eos settings that may be an int, a list or None."""
    ids: set[int] = set()
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The generation config's eos ids and the tokenizer's eos."""
    return stop_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id)


def cut_at_eos(ids: Sequence[int], stop: set[int]) -> Result:
    for i, tok in enumerate(ids):
        if tok in stop:
            return list(ids[:i]), True
    return list(ids), False


class HFEngine:
    """Batched ``model.generate`` with left padding (real tokens stay adjacent to the new ones)."""

    def __init__(self, model: Any, tokenizer: Any, settings: Any = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop = eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad = int(pad if pad is not None else 0)
        self.context_length = getattr(getattr(model, "config", None), "max_position_embeddings", None)

    def generate(self, prompts: Sequence[list[int]], seed: int, sampling: Sequence[Sampling]) -> list[Result]:
        groups: dict[Sampling, list[int]] = {}
        for i, s in enumerate(sampling):
            groups.setdefault(s, []).append(i)
        out: list[Result | None] = [None] * len(prompts)
        for g, (s, rows) in enumerate(groups.items()):
            for i, result in zip(rows, self._generate([prompts[i] for i in rows], seed + g, s)):
                out[i] = result
        return [r for r in out if r is not None]

    def _generate(self, prompts: Sequence[list[int]], seed: int, s: Sampling) -> list[Result]:
        import torch

        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        kwargs: dict[str, Any] = {"do_sample": not s.greedy, "max_new_tokens": s.max_new_tokens}
        if s.greedy:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=0)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                pad_token_id=self.pad,
                eos_token_id=sorted(self.stop) or None,
                **kwargs,
            )
        return [cut_at_eos(row[width:].tolist(), self.stop) for row in out.cpu()]


VLLM_MISSING = (
    "--engine vllm needs the vllm package, which is not importable in this Python ({err}); create the "
    "project's vLLM environment with scripts/setup_vllm_env.sh (draftheads then runs the distill there by "
    "itself), point $DRAFTHEADS_VLLM_PYTHON at a Python that has vllm, or use --engine hf"
)


class VLLMEngine:
    """vLLM's offline ``LLM`` fed token ids (the same prompts the HF engine would get)."""

    def __init__(self, model_path: str, tokenizer: Any, settings: Any = None, dtype: str = "auto", seed: int = 0) -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise DistillError(VLLM_MISSING.format(err=err)) from err
        self.tokenizer = tokenizer
        seed = getattr(settings, "seed", seed)
        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, enforce_eager=True)
        self.params_cls = SamplingParams
        self.context_length = int(self.llm.llm_engine.model_config.max_model_len)
        # vLLM's CPU build cannot seed a request ("CPU Generator does not use offset"): there the
        # engine's seed (above) drives every sampled answer, so a run is still reproducible as a whole.
        from vllm.platforms import current_platform
        self.seeds_requests = not current_platform.is_cpu()
        hf_eos = getattr(self.llm.llm_engine.model_config.hf_config, "eos_token_id", None)
        self.stop = stop_ids(hf_eos, tokenizer.eos_token_id)

    def generate(self, prompts: Sequence[list[int]], seed: int, sampling: Sequence[Sampling]) -> list[Result]:
        params = [
            self.params_cls(
                temperature=s.temperature, top_p=1.0 if s.greedy else s.top_p, max_tokens=s.max_new_tokens,
                seed=seed + i if self.seeds_requests and not s.greedy else None, stop_token_ids=sorted(self.stop),
            )
            for i, s in enumerate(sampling)
        ]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        return [cut_at_eos(list(o.outputs[0].token_ids), self.stop) for o in outs]
