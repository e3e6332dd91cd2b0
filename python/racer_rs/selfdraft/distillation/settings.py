"""Settings of an offline self-draft distillation, validated once."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from racer_rs import _validate as rules

#: Settings that may change between the runs of one distillation (the rest must match to resume).
RUN_ONLY = ("minutes", "save_every", "report_every")


@dataclass(frozen=True)
class DistillSettings:
    """What to distil and how.

    Attributes:
        layers: K, decoder layers of the self-draft.
        minutes: time budget of the whole distillation (all runs together), data generation
            and training included, model loading excluded.
        vocab: size of the reduced draft vocabulary (the most frequent tokens), or None for
            the full vocabulary.
        data_share: share of the budget spent generating data (at least two batches are made).
        batch_size: prompts per generation batch (one shard); also sequences per training step.
        new_tokens: tokens the target generates per prompt (fewer when it ends its answer).
        max_prompt_tokens: longer prompts keep their last tokens.
        temperature: sampling temperature of the data generation (0: greedy).
        top_p: nucleus threshold of the data generation.
        teacher_top_k: how many of the target's most likely tokens each teacher row keeps.
        lr: Adam learning rate (after a short warm-up).
        warmup: optimiser steps of linear learning-rate warm-up.
        seed: seeds prompt order, sampling and training order.
        save_every: seconds between saves of the training state.
        report_every: seconds between progress lines while training.
    """

    layers: int
    minutes: float
    vocab: int | None = None
    data_share: float = 0.5
    batch_size: int = 8
    new_tokens: int = 256
    max_prompt_tokens: int = 512
    temperature: float = 0.8
    top_p: float = 0.95
    teacher_top_k: int = 64
    lr: float = 3e-4
    warmup: int = 10
    seed: int = 0
    save_every: float = 60.0
    report_every: float = 15.0

    def __post_init__(self) -> None:
        for name in ("layers", "batch_size", "new_tokens", "max_prompt_tokens", "teacher_top_k"):
            rules.integer(name, getattr(self, name), minimum=1)
        rules.integer("warmup", self.warmup, minimum=0)
        rules.seed("seed", self.seed)
        if self.vocab is not None:
            rules.integer("vocab", self.vocab, minimum=1)
        for name in ("minutes", "lr", "save_every", "report_every"):
            rules.real(name, getattr(self, name), above=0.0)
        rules.real("temperature", self.temperature, minimum=0.0)
        rules.probability("top_p", self.top_p, zero=False)
        rules.real("data_share", self.data_share, above=0.0, below=1.0)

    @property
    def budget_seconds(self) -> float:
        return 60.0 * self.minutes

    def plan(self) -> dict[str, Any]:
        """The settings a resumed run must share with the first one."""
        return {key: value for key, value in asdict(self).items() if key not in RUN_ONLY}
