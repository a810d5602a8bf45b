"""Pre-training the demo target: the model, the learning-rate schedule, the loop and the held-out loss."""

from __future__ import annotations

import math
import time
from typing import Iterator

import torch

from .spec import DemoTargetSpec

def pick_device() -> torch.device:
    """CUDA when present, else CPU; training stays fp32 either way for reproducibility."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_model(spec: DemoTargetSpec, tokenizer):
    """A freshly initialised LlamaForCausalLM; call after seeding torch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if spec.hidden_size % spec.num_heads:
        raise ValueError(f"hidden_size {spec.hidden_size} is not divisible by num_heads {spec.num_heads}")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.resolved_intermediate_size(),
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads,
        max_position_embeddings=spec.seq_len,
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, total_steps: int, spec: DemoTargetSpec) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio * lr``."""
    warmup = max(1, int(total_steps * spec.warmup_fraction))
    if step < warmup:
        return spec.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cosine)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: decaying norm gains pulls them towards zero for no benefit."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _batches(stream: torch.Tensor, spec: DemoTargetSpec, steps: int) -> Iterator[torch.Tensor]:
    """``steps`` batches of packed blocks, reshuffled every epoch by a seeded generator."""
    blocks = stream[: len(stream) // spec.seq_len * spec.seq_len].view(-1, spec.seq_len)
    if len(blocks) < spec.batch_size:
        raise ValueError(
            f"train split has {len(stream)} tokens, fewer than one batch of "
            f"{spec.batch_size} x {spec.seq_len}; lower batch_size/seq_len or raise max_files"
        )
    gen = torch.Generator().manual_seed(spec.seed)
    order = torch.randperm(len(blocks), generator=gen)
    pos = 0
    for _ in range(steps):
        if pos + spec.batch_size > len(order):
            order, pos = torch.randperm(len(blocks), generator=gen), 0
        yield blocks[order[pos : pos + spec.batch_size]]
        pos += spec.batch_size


def train_model(model, stream: torch.Tensor, spec: DemoTargetSpec, device: torch.device, progress: bool) -> dict:
    """Train in place for ``max_tokens`` (rounded down to whole steps); returns run statistics."""
    from tqdm.auto import tqdm

    tokens_per_step = spec.batch_size * spec.seq_len
    steps = max(1, spec.max_tokens // tokens_per_step)
    optimizer = torch.optim.AdamW(
        _param_groups(model, spec.weight_decay), lr=spec.lr, betas=(0.9, 0.95), eps=1e-8
    )
    model.train()
    bar = tqdm(total=steps * tokens_per_step, unit="tok", unit_scale=True, disable=not progress, desc="demo target")
    ema, start = None, time.perf_counter()
    for step, batch in enumerate(_batches(stream, spec, steps)):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, spec)
        batch = batch.to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        bar.update(tokens_per_step)
        elapsed = time.perf_counter() - start
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{(step + 1) * tokens_per_step / elapsed:.0f}", refresh=False)
    bar.close()
    seconds = time.perf_counter() - start
    model.eval()
    return {
        "steps": steps,
        "tokens_trained": steps * tokens_per_step,
        "train_seconds": seconds,
        "train_tokens_per_second": steps * tokens_per_step / seconds,
        "final_train_loss_ema": ema,
        "epochs": steps * tokens_per_step / len(stream),
    }


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq_len: int, device: torch.device, batch_size: int = 8) -> tuple[float, int]:
    """Mean next-token NLL (nats/token) over non-overlapping ``seq_len`` blocks of ``stream``.

    The same packing as training, so the figure is comparable to the training loss; the first
    token of each block has no context inside it and is not scored.
    """
    model.eval()
    total, count = 0.0, 0
    cut = len(stream) // seq_len * seq_len
    pieces = list(stream[:cut].view(-1, seq_len).split(batch_size)) if cut else []
    if len(stream) - cut >= 2:
        pieces.append(stream[cut:].unsqueeze(0))
    for piece in pieces:
        piece = piece.to(device)
        logits = model(input_ids=piece).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), piece[:, 1:].reshape(-1), reduction="sum"
        )
        total += nll.item()
        count += piece[:, 1:].numel()
    if count == 0:
        raise ValueError("held-out split has no tokens to score; raise max_files or heldout_fraction")
    return total / count, count
