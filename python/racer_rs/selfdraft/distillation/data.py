"""Distillation data: text the target generates itself, with its top-k next-token distributions.

A shard is one generation batch: each sample is a prompt plus the target's continuation, with the
target's top-k log-probabilities (raw logits, temperature 1) at every position but the last:
row ``j`` is the target's distribution of token ``j + 1`` given tokens ``0..j``, what the draft
must predict at input position ``j``. The prompt's rows come from the prefill at little cost (the
head over the prompt positions) and add as many training rows as the continuation again; a draft
also has to follow prompts (a summarisation article, say), not only the target's own text.

Shards are written through a temporary file and a rename, so a shard on disk is always whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from racer_rs._io import replace, staged_file

HEAD_CHUNK = 256  # prompt positions per LM-head call (bounds the [rows, vocabulary] logits)


@dataclass(frozen=True)
class Sample:
    """One prompt and continuation, with the teacher's distribution at every position but the last."""

    ids: torch.Tensor  # int64 [L], L = prompt_length + generated
    prompt_length: int
    teacher_ids: torch.Tensor  # int64 [L - 1, k]
    teacher_logp: torch.Tensor  # float32 [L - 1, k]

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_length


@dataclass(frozen=True)
class Shard:
    """The samples of one generation batch, stored flat."""

    tokens: torch.Tensor  # int32 [sum of L]
    offsets: torch.Tensor  # int64 [n + 1]
    prompt_lengths: torch.Tensor  # int64 [n]
    teacher_ids: torch.Tensor  # int32 [sum of (L - 1), k]
    teacher_logp: torch.Tensor  # float16 [sum of (L - 1), k]

    def samples(self) -> Iterator[Sample]:
        row = 0
        for index in range(len(self.prompt_lengths)):
            ids = self.tokens[int(self.offsets[index]) : int(self.offsets[index + 1])].long()
            rows = len(ids) - 1
            yield Sample(
                ids,
                int(self.prompt_lengths[index]),
                self.teacher_ids[row : row + rows].long(),
                self.teacher_logp[row : row + rows].float(),
            )
            row += rows

    @property
    def new_tokens(self) -> int:
        """Tokens the target generated (the prompts excluded)."""
        return int((self.offsets[1:] - self.offsets[:-1] - self.prompt_lengths).sum())


def generate_shard(
    target: Any,
    prompts: Sequence[Sequence[int]],
    *,
    new_tokens: int,
    temperature: float,
    top_p: float,
    teacher_top_k: int,
    eos_token_ids: Sequence[int],
    seed: int,
) -> Shard:
    """Continue ``prompts`` with the target in one left-padded batch; keep its top-k distributions.

    Sampling (``temperature > 0``) draws from the teacher's top-k renormalised and then nucleus
    filtered: this is training data, not lossless decoding, and reading only the top-k keeps a
    step cheap (transformers' ``generate`` sorts the whole vocabulary per step and row, which
    doubled the time of a step here). Each continuation is cut after its first end-of-sequence
    token; the batch stops when every row has ended.
    """
    from transformers import DynamicCache

    device = next(target.parameters()).device
    pad = int(eos_token_ids[0]) if eos_token_ids else 0
    eos = torch.tensor(sorted({int(e) for e in eos_token_ids}) or [-1], device=device)
    width = max(len(p) for p in prompts)
    batch = len(prompts)
    input_ids = torch.full((batch, width), pad, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    cache = DynamicCache(config=target.config)
    head = target.get_output_embeddings()
    steps_ids, steps_logp, steps_tokens = [], [], []
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    with torch.no_grad():
        hidden = target.model(
            input_ids=input_ids, attention_mask=mask, position_ids=_positions(mask), cache=cache, use_cache=True
        ).last_hidden_state
        prompt_top = [_prompt_rows(head, hidden[row, width - len(p) :], teacher_top_k) for row, p in enumerate(prompts)]
        logits = head(hidden[:, -1])
        for _ in range(new_tokens):
            top = torch.log_softmax(logits.float(), dim=-1).topk(teacher_top_k, dim=-1)
            token = _pick(top.values, top.indices, temperature, top_p, generator)
            token = torch.where(done, torch.full_like(token, pad), token)
            steps_ids.append(top.indices)
            steps_logp.append(top.values)
            steps_tokens.append(token)
            done |= torch.isin(token, eos)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(token).unsqueeze(1)], dim=1)
            logits = target(
                input_ids=token.unsqueeze(1),
                attention_mask=mask,
                position_ids=_positions(mask)[:, -1:],
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
    top_ids = torch.stack(steps_ids, dim=1).cpu()  # [B, G, k]: row j predicts generated token j
    top_logp = torch.stack(steps_logp, dim=1).cpu()
    continuations = torch.stack(steps_tokens, dim=1).cpu()
    stop = {int(e) for e in eos_token_ids}
    tokens, offsets, lengths, ids_rows, logp_rows = [], [0], [], [], []
    for row, prompt in enumerate(prompts):
        generated = continuations[row].tolist()
        n_new = next((i + 1 for i, t in enumerate(generated) if t in stop), len(generated))
        sequence = torch.as_tensor(list(prompt) + generated[:n_new], dtype=torch.int32)
        tokens.append(sequence)
        offsets.append(offsets[-1] + len(sequence))
        lengths.append(len(prompt))
        # Prompt rows 0..P-2 predict prompt tokens 1..P-1; then the generated tokens' rows.
        ids_rows += [prompt_top[row][0], top_ids[row, :n_new]]
        logp_rows += [prompt_top[row][1], top_logp[row, :n_new]]
    return Shard(
        tokens=torch.cat(tokens),
        offsets=torch.tensor(offsets, dtype=torch.long),
        prompt_lengths=torch.tensor(lengths, dtype=torch.long),
        teacher_ids=torch.cat(ids_rows).to(torch.int32),
        teacher_logp=torch.cat(logp_rows).to(torch.float16),
    )


def _positions(mask: torch.Tensor) -> torch.Tensor:
    # Left padding: a row's first real token is at position 0.
    return (mask.cumsum(-1) - 1).clamp_min(0)


def _prompt_rows(head: Any, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (ids, log-probabilities) of the prompt positions but the last (its row is the first generated one)."""
    ids, logp = [], []
    rows = hidden[:-1]
    for start in range(0, rows.shape[0], HEAD_CHUNK):
        top = torch.log_softmax(head(rows[start : start + HEAD_CHUNK]).float(), dim=-1).topk(k, dim=-1)
        ids.append(top.indices.cpu())
        logp.append(top.values.cpu())
    if not ids:
        return torch.empty((0, k), dtype=torch.long), torch.empty((0, k))
    return torch.cat(ids), torch.cat(logp)


def _pick(
    logp: torch.Tensor, ids: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> torch.Tensor:
    """The next token of every row from its sorted top-k (``logp``, ``ids``: ``[B, k]``)."""
    if temperature <= 0:
        return ids[:, 0]
    probs = torch.softmax(logp / temperature, dim=-1)
    # Nucleus: keep the smallest prefix whose mass reaches top_p (the first token always).
    before = probs.cumsum(-1) - probs
    probs = probs.masked_fill(before >= top_p * probs.sum(-1, keepdim=True), 0.0)
    choice = torch.multinomial(probs, 1, generator=generator)
    return ids.gather(1, choice).squeeze(1)


def save_shard(shard: Shard, path: Path) -> None:
    """Write ``shard`` to ``path`` atomically."""
    save_atomic(
        {
            "tokens": shard.tokens,
            "offsets": shard.offsets,
            "prompt_lengths": shard.prompt_lengths,
            "teacher_ids": shard.teacher_ids,
            "teacher_logp": shard.teacher_logp,
        },
        path,
    )


def load_shard(path: Path) -> Shard:
    """Read a shard written by :func:`save_shard`."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    return Shard(**data)


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file and a rename (a reader never sees half a file)."""
    with staged_file(path.parent, f".{path.name}-") as temporary:
        torch.save(obj, temporary)
        replace(temporary, path)


def token_mass(shards: Sequence[Shard], vocab_size: int) -> torch.Tensor:
    """Expected token counts: the teacher's probability mass per token, summed over every position.

    Soft counts rank tokens the target finds plausible but did not happen to sample, which hard
    counts of a few thousand generated tokens would miss.
    """
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for shard in shards:
        mass.index_add_(0, shard.teacher_ids.reshape(-1).long(), shard.teacher_logp.reshape(-1).double().exp())
    return mass


def frequent_tokens(mass: torch.Tensor, size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """A reduced draft vocabulary of ``size`` ids, ``always`` included (FR-Spec: frequent tokens).

    FR-Spec ranks tokens by their frequency in a general corpus. The distillation data is narrow
    (math, code, several languages), so only half of the ids come from its ``mass``; the other half
    are the lowest ids not yet chosen: byte-level BPE ids follow merge order, which follows
    frequency in the tokenizer's own (general) training text. On SmolLM2 at 8,192 ids, ranking by
    the data alone covered 98% of held-out distillation text but only 77% of the target's answers
    to writing prompts; merge order alone 69% and 86%; this half-and-half rule 98% and 85%.
    """
    vocab_size = mass.numel()
    size = min(size, vocab_size)
    chosen = list(dict.fromkeys(int(i) for i in always if 0 <= int(i) < vocab_size))[:size]
    taken = set(chosen)
    # Stable sort: equal masses keep ascending id order.
    by_mass = [t for t in torch.sort(mass, descending=True, stable=True).indices.tolist() if mass[t] > 0]
    for token in by_mass:
        if len(chosen) >= size // 2:
            break
        if token not in taken:
            chosen.append(token)
            taken.add(token)
    for token in range(vocab_size):
        if len(chosen) >= size:
            break
        if token not in taken:
            chosen.append(token)
            taken.add(token)
    return torch.tensor(sorted(chosen), dtype=torch.long)
