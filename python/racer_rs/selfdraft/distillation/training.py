"""The offline distillation loss: KL from the target's top-k distribution to the self-draft's.

The teacher is the target's top-k, renormalised, restricted to the draft's vocabulary when that is
reduced (a token the draft cannot propose cannot be matched, and KL to it would be infinite). The student's
logits are computed over its own vocabulary only, so a reduced vocabulary also makes training
cheaper. The reported ``agreement`` is how often the draft's argmax is the target's argmax, the
per-token acceptance rate of greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from racer_rs.selfdraft.distillation.data import Sample
from racer_rs.selfdraft.model import ReducedHead


@dataclass(frozen=True)
class Batch:
    """Samples right-padded into one tensor, with the rows that carry a teacher distribution."""

    input_ids: torch.Tensor  # [b, T]
    rows: tuple[torch.Tensor, torch.Tensor]  # (sample index, position) of every supervised row, [M] each
    teacher_ids: torch.Tensor  # [M, k] ids in the draft's columns, -1 outside its vocabulary
    teacher_logp: torch.Tensor  # [M, k]


def draft_columns(kept_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    """Map a token id to its column in the draft's logits (-1: not in its vocabulary); None: identity."""
    if kept_ids is None:
        return None
    columns = torch.full((vocab_size,), -1, dtype=torch.long)
    columns[kept_ids.cpu()] = torch.arange(kept_ids.numel())
    return columns


def make_batch(
    samples: Sequence[Sample], columns: torch.Tensor | None, device: torch.device, generated_only: bool = False
) -> Batch:
    """Right-pad ``samples`` (causal attention: padding after a row never affects it).

    Every position is supervised (row ``j`` predicts token ``j + 1``), or with ``generated_only``
    only the positions that predict the target's own continuation (what drafting meets).
    """
    width = max(len(s.ids) for s in samples)
    input_ids = torch.zeros((len(samples), width), dtype=torch.long)
    sample_index, position, ids, logp = [], [], [], []
    for index, sample in enumerate(samples):
        input_ids[index, : len(sample.ids)] = sample.ids
        first = sample.prompt_length - 1 if generated_only else 0
        rows = torch.arange(first, sample.teacher_ids.shape[0])
        sample_index.append(torch.full((len(rows),), index, dtype=torch.long))
        position.append(rows)
        ids.append(sample.teacher_ids[rows])
        logp.append(sample.teacher_logp[rows])
    teacher_ids = torch.cat(ids)
    if columns is not None:
        teacher_ids = columns[teacher_ids]
    return Batch(
        input_ids=input_ids.to(device),
        rows=(torch.cat(sample_index).to(device), torch.cat(position).to(device)),
        teacher_ids=teacher_ids.to(device),
        teacher_logp=torch.cat(logp).to(device),
    )


def student_logits(draft: Any, batch: Batch) -> torch.Tensor:
    """The draft's logits over its own vocabulary at the batch's supervised rows, ``[M, N]``."""
    hidden = draft.model(input_ids=batch.input_ids, use_cache=False).last_hidden_state
    hidden = hidden[batch.rows[0], batch.rows[1]]
    head = draft.lm_head
    if isinstance(head, ReducedHead):
        return nn.functional.linear(hidden, head.kept_weight, head.kept_bias)
    logits: torch.Tensor = head(hidden)
    return logits


def batch_kl(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row ``KL(teacher || draft)``, the rows that count, and the argmax agreement per row.

    Rows whose teacher top-k lies wholly outside the draft's vocabulary do not count for the KL
    (there is nothing to match) but count as disagreements.
    """
    log_q = torch.log_softmax(logits.float(), dim=-1)
    inside = batch.teacher_ids >= 0
    usable = inside.any(dim=-1)
    teacher = batch.teacher_logp.masked_fill(~inside, float("-inf"))
    teacher = teacher.masked_fill(~usable.unsqueeze(-1), 0.0)
    log_p = torch.log_softmax(teacher, dim=-1)  # renormalised over the kept part of the top-k
    p = log_p.exp()
    q_at = log_q.gather(1, batch.teacher_ids.clamp_min(0))
    kl = torch.where(p > 0, p * (log_p - q_at), torch.zeros_like(p)).sum(-1)
    # Top-k is sorted, so column 0 is the target's argmax.
    agree = (logits.argmax(dim=-1) == batch.teacher_ids[:, 0]) & inside[:, 0]
    return kl, usable, agree


def train_step(draft: Any, optimizer: torch.optim.Optimizer, batch: Batch, clip: float = 1.0) -> float:
    """One optimiser step on ``batch``; returns its mean KL before the step."""
    with torch.enable_grad():
        kl, usable, _ = batch_kl(student_logits(draft, batch), batch)
        loss = (kl * usable).sum() / usable.sum().clamp_min(1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(draft: Any, samples: Sequence[Sample], columns: torch.Tensor | None, batch_size: int) -> dict[str, float]:
    """Mean KL and argmax agreement of ``draft`` on ``samples`` (held-out data), on the positions
    of the target's own continuations."""
    device = next(draft.parameters()).device
    kl_sum, kl_rows, agree_sum, rows, covered = 0.0, 0, 0, 0, 0.0
    for start in range(0, len(samples), batch_size):
        batch = make_batch(samples[start : start + batch_size], columns, device, generated_only=True)
        kl, usable, agree = batch_kl(student_logits(draft, batch), batch)
        kl_sum += float((kl * usable).sum())
        kl_rows += int(usable.sum())
        agree_sum += int(agree.sum())
        rows += int(agree.numel())
        # The KL is over the teacher renormalised to the draft's vocabulary: say how much of the
        # teacher's top-k mass that vocabulary holds (a tiny vocabulary gives a tiny KL over little).
        inside = (batch.teacher_ids >= 0).float()
        covered += float((batch.teacher_logp.exp() * inside).sum(-1).sum())
    return {
        "kl": kl_sum / max(kl_rows, 1),
        "agreement": agree_sum / max(rows, 1),
        "coverage": covered / max(rows, 1),
    }


def trainable_parameters(draft: Any) -> list[nn.Parameter]:
    """The draft's own decoder layers and final norm (never the shared embedding or head)."""
    params = []
    for name, param in draft.named_parameters():
        own = name.startswith(("model.layers.", "model.norm."))
        param.requires_grad_(own)
        if own:
            params.append(param)
    return params
