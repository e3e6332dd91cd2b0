"""One offline distillation of a self-draft, within a time budget, resumable.

The output folder holds the checkpoint (``manifest.json`` + weights, see
:mod:`racer_rs.selfdraft.checkpoint`) once the distillation is finished, and a ``work/`` folder with
everything needed to resume:

* ``plan.json``: the settings that must not change between runs, the target's architecture and a
  fingerprint of the prompts; ``probe.pt``: a sample of the target's weights;
* ``shard-NNNNN.pt``: generated data, one file per generation batch (shard 0 is held out for
  evaluation, so at least two are made);
* ``vocab.pt``: the reduced vocabulary, chosen once the data is complete;
* ``train.pt``: the draft's trained tensors, the optimiser state and the position in the data;
* ``state.json``: how far the run got and the time spent so far.

Every file is written through a temporary file and a rename, and ``state.json`` is written
after the files it counts, so an interruption at any point loses at most the work since the last
save (one shard, or ``save_every`` seconds of training). The budget counts the time of saved work
across runs; a run whose budget is spent finishes (at least one training step is taken) and
writes the checkpoint. Rerunning a finished distillation with a larger budget trains further.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from racer_rs._io import check_writable_folder, write_text_atomically
from racer_rs.errors import InvalidArgumentError, InvalidTypeError
from racer_rs.selfdraft.checkpoint import (
    MANIFEST,
    PROBE_ATOL,
    PROBE_RTOL,
    is_checkpoint,
    save_self_draft,
    target_architecture,
    target_probe,
)
from racer_rs.selfdraft.distillation.data import (
    Sample,
    Shard,
    frequent_tokens,
    generate_shard,
    load_shard,
    save_atomic,
    save_shard,
    token_mass,
)
from racer_rs.selfdraft.distillation.settings import DistillSettings
from racer_rs.selfdraft.distillation.training import (
    draft_columns,
    evaluate,
    make_batch,
    train_step,
    trainable_parameters,
)
from racer_rs.selfdraft.model import check_self_draft_target, self_draft
from racer_rs.target.verifier import vocab_size as target_vocab_size

WORK = "work"
Progress = Callable[[str], None]


class DistillError(InvalidArgumentError):
    """The output folder cannot hold this distillation (foreign files, other settings or target)."""


@dataclass
class DistillResult:
    """What a distillation produced.

    Attributes:
        checkpoint: the checkpoint folder (load it with ``--draft-model`` or
            :func:`racer_rs.selfdraft.checkpoint.load_self_draft`).
        shards: generation batches made; samples: prompts continued; new_tokens: tokens generated.
        steps: optimiser steps taken.
        spent: seconds of the budget used (all runs).
        before / after: held-out ``kl`` and ``agreement`` of the undistilled / distilled draft.
    """

    checkpoint: Path
    shards: int
    samples: int
    new_tokens: int
    steps: int
    spent: float
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)


@dataclass
class _State:
    spent: float = 0.0
    shards: int = 0
    data_done: bool = False
    steps: int = 0
    before: dict[str, float] | None = None
    finished: bool = False


class _Clock:
    """Budget time: what earlier runs saved, plus this run's time."""

    def __init__(self, spent: float) -> None:
        self._base = spent
        self._start = time.perf_counter()

    def spent(self) -> float:
        return self._base + time.perf_counter() - self._start


def distill_self_draft(
    target: Any,
    prompts: Sequence[Sequence[int]],
    out: str | Path,
    settings: DistillSettings | None = None,
    *,
    target_name: str = "target",
    eos_token_ids: Sequence[int] = (),
    keep_tokens: Sequence[int] = (),
    progress: Progress | None = None,
    **options: Any,
) -> DistillResult:
    """Distil ``target`` into a self-draft saved in ``out``; resume what ``out`` already holds.

    Args:
        target: a Llama-style transformers causal LM.
        prompts: prompt token ids to generate the distillation data from (not benchmark prompts).
        out: output folder (created; a folder of an earlier run of the same distillation resumes).
        settings: the settings; or pass them as keyword ``options`` (``layers=4, minutes=10, ...``).
        target_name: how the target is named (recorded in the checkpoint).
        eos_token_ids: ids that end a generated answer (always kept in a reduced vocabulary).
        keep_tokens: more ids a reduced vocabulary always keeps (e.g. the special tokens).
        progress: called with one line of text per progress report (with the time left).

    Raises:
        TypeError / ValueError: bad settings, prompts or target.
        DistillError: ``out`` holds something else, or a distillation with other settings or
            another target.
    """
    if settings is None:
        settings = DistillSettings(**options)
    elif options:
        raise InvalidTypeError("pass either settings or keyword options, not both")
    check_self_draft_target(target)
    if settings.layers > target.config.num_hidden_layers:
        raise InvalidArgumentError(
            f"layers must be <= {target.config.num_hidden_layers} (the target's layers), got {settings.layers}"
        )
    vocab_size = target_vocab_size(target)
    if settings.vocab is not None and settings.vocab > vocab_size:
        raise InvalidArgumentError(f"vocab must be <= {vocab_size} (the target's vocabulary), got {settings.vocab}")
    always = {int(t) for t in (*eos_token_ids, *keep_tokens) if 0 <= int(t) < vocab_size}
    if settings.vocab is not None and settings.vocab <= len(always):
        raise InvalidArgumentError(
            f"vocab must be > {len(always)}, the end-of-sequence and special tokens a reduced vocabulary always "
            f"keeps (it would hold nothing else to draft with), got {settings.vocab}"
        )
    ordered = _order_prompts(prompts, settings)
    say = progress or (lambda line: None)
    run = _Run(target, ordered, Path(out), settings, target_name, tuple(eos_token_ids), tuple(keep_tokens), say)
    return run.execute()


def check_output_folder(out: str | Path) -> None:
    """Raise :class:`DistillError` unless ``out`` is absent, empty, or an earlier run's output."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DistillError(f"output {out} exists and is not a folder")
    check_writable_folder(out, "output")  # a long run must not find this out at the end
    if out.is_dir() and not (out / WORK / "plan.json").exists():
        if (out / MANIFEST).exists():
            raise DistillError(
                f"{out} holds a self-draft checkpoint without its work folder; choose another output folder"
            )
        if any(out.iterdir()):
            raise DistillError(f"output folder {out} is not empty and holds no distillation; choose another one")


def _order_prompts(prompts: Sequence[Sequence[int]], settings: DistillSettings) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InvalidTypeError("prompts must be a sequence of token-id sequences")
    cleaned = []
    for prompt in prompts:
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence) or not prompt:
            raise InvalidArgumentError("every prompt must be a non-empty sequence of token ids")
        cleaned.append([int(t) for t in prompt][-settings.max_prompt_tokens :])
    if len(cleaned) < 2 * settings.batch_size:
        raise InvalidArgumentError(
            f"need at least {2 * settings.batch_size} prompts (two batches: one held out), got {len(cleaned)}"
        )
    order = torch.randperm(len(cleaned), generator=torch.Generator().manual_seed(settings.seed)).tolist()
    shuffled = [cleaned[i] for i in order]
    # Batches of similar lengths pad less; sorting within groups of 8 batches keeps the sets mixed.
    group = 8 * settings.batch_size
    return [p for start in range(0, len(shuffled), group) for p in sorted(shuffled[start : start + group], key=len)]


class _Run:
    def __init__(
        self,
        target: Any,
        prompts: list[list[int]],
        out: Path,
        settings: DistillSettings,
        target_name: str,
        eos: tuple[int, ...],
        keep: tuple[int, ...],
        say: Progress,
    ) -> None:
        self.target = target
        self.prompts = prompts
        self.out = out
        self.work = out / WORK
        self.settings = settings
        self.target_name = target_name
        self.eos = eos
        self.keep = keep
        self.say = say
        self.budget = settings.budget_seconds
        self.state = _State()
        self.clock = _Clock(0.0)

    # --- the run ---------------------------------------------------------------------------

    def execute(self) -> DistillResult:
        self._prepare_folder()
        self.state = self._read_state()
        self.clock = _Clock(self.state.spent)
        if self.state.finished and self.state.spent >= self.budget and is_checkpoint(self.out):
            self.say(f"already finished: {self.out} ({_duration(self.state.spent)} of {_duration(self.budget)} spent)")
            return self._result()
        if self.state.shards or self.state.steps:
            self.say(
                f"resuming: {self.state.shards} shard(s) and {self.state.steps} training step(s) done, "
                f"{_duration(self.state.spent)} of {_duration(self.budget)} spent"
            )
        shards = self._make_data()
        kept = self._vocabulary(shards)
        self._train(shards, kept)
        return self._result()

    def _make_data(self) -> list[Shard]:
        shards = [load_shard(self._shard_path(i)) for i in range(self.state.shards)]
        size = self.settings.batch_size
        while not self.state.data_done:
            batch = self.prompts[len(shards) * size : (len(shards) + 1) * size]
            enough = len(shards) >= 2 and self.clock.spent() >= self.settings.data_share * self.budget
            if enough or not batch:
                self.state.data_done = True
                self._save_state()
                break
            shard = generate_shard(
                self.target,
                batch,
                new_tokens=self.settings.new_tokens,
                temperature=self.settings.temperature,
                top_p=self.settings.top_p,
                teacher_top_k=self.settings.teacher_top_k,
                eos_token_ids=self.eos,
                seed=self.settings.seed * 100_003 + len(shards),
            )
            save_shard(shard, self._shard_path(len(shards)))
            shards.append(shard)
            self.state.shards = len(shards)
            self._save_state()
            total = sum(s.new_tokens for s in shards)
            role = "held out" if len(shards) == 1 else "training"
            self.say(
                f"data: shard {len(shards)} ({role}, {len(batch)} prompts, {shard.new_tokens:,} new tokens; "
                f"{total:,} in all) | {self._time_line()}"
            )
        return shards

    def _vocabulary(self, shards: list[Shard]) -> torch.Tensor | None:
        if self.settings.vocab is None:
            return None
        path = self.work / "vocab.pt"
        if path.exists():
            kept: torch.Tensor = torch.load(path, weights_only=True)
            return kept
        vocab_size = target_vocab_size(self.target)
        kept = frequent_tokens(token_mass(shards[1:], vocab_size), self.settings.vocab, self.eos + self.keep)
        save_atomic(kept, path)
        return kept

    def _train(self, shards: list[Shard], kept: torch.Tensor | None) -> None:
        settings = self.settings
        draft = self_draft(self.target, settings.layers, vocab=kept)
        params = trainable_parameters(draft)
        optimizer = torch.optim.Adam(params, lr=settings.lr)
        position = {"epoch": 0, "cursor": 0}
        train_path = self.work / "train.pt"
        if self.state.steps and train_path.exists():
            saved = torch.load(train_path, map_location="cpu", weights_only=True)
            self._restore(draft, optimizer, saved)
            self.state.steps = int(saved["steps"])
            position = {"epoch": int(saved["epoch"]), "cursor": int(saved["cursor"])}
        else:
            self.state.steps = 0
        vocab_size = target_vocab_size(self.target)
        columns = draft_columns(kept, vocab_size)
        held_out = list(shards[0].samples())
        training = [sample for shard in shards[1:] for sample in shard.samples()]
        if self.state.before is None:
            self.state.before = evaluate(draft, held_out, columns, settings.batch_size)
            self._save_state()
            self.say(
                f"eval: undistilled draft, held-out KL {self.state.before['kl']:.3f} (over the "
                f"{100 * self.state.before.get('coverage', 1.0):.1f}% of the target's top-k mass the draft's "
                f"vocabulary holds), top-1 agreement {100 * self.state.before['agreement']:.1f}%"
            )

        def save() -> None:
            state = {name: param.detach().cpu() for name, param in draft.named_parameters() if param.requires_grad}
            save_atomic(
                {"params": state, "optimizer": optimizer.state_dict(), "steps": self.state.steps, **position},
                train_path,
            )
            self._save_state()

        device = next(draft.parameters()).device
        last_save = last_report = time.perf_counter()
        losses: list[float] = []
        try:
            while self.state.steps == 0 or self.clock.spent() < self.budget:
                batch_samples = self._next_batch(training, position)
                for group in optimizer.param_groups:
                    group["lr"] = settings.lr * min(1.0, (self.state.steps + 1) / (settings.warmup + 1))
                losses.append(train_step(draft, optimizer, make_batch(batch_samples, columns, device)))
                self.state.steps += 1
                now = time.perf_counter()
                if now - last_save >= settings.save_every:
                    save()
                    last_save = now
                if now - last_report >= settings.report_every:
                    mean = sum(losses) / len(losses)
                    epoch = position["epoch"] + 1
                    self.say(f"train: step {self.state.steps} (epoch {epoch}), KL {mean:.3f} | {self._time_line()}")
                    losses.clear()
                    last_report = now
        except KeyboardInterrupt:
            save()  # keep the steps taken so far
            raise
        save()
        after = evaluate(draft, held_out, columns, settings.batch_size)
        before = self.state.before
        stats = {
            "shards": len(shards),
            "samples": sum(len(s.prompt_lengths) for s in shards),
            "new_tokens": sum(s.new_tokens for s in shards),
            "steps": self.state.steps,
            "minutes_spent": round(self.clock.spent() / 60, 2),
            "held_out_kl_before": before["kl"],
            "held_out_kl_after": after["kl"],
            "agreement_before": before["agreement"],
            "agreement_after": after["agreement"],
            "settings": self.settings.plan(),
        }
        save_self_draft(draft, self.target, self.out, target_name=self.target_name, stats=stats)
        self.state.finished = True
        self._save_state()
        self.say(
            f"done: {self.state.steps} steps; held-out KL {before['kl']:.3f} -> {after['kl']:.3f}, top-1 agreement "
            f"{100 * before['agreement']:.1f}% -> {100 * after['agreement']:.1f}% | checkpoint {self.out}"
        )

    def _next_batch(self, training: list[Sample], position: dict[str, int]) -> list[Sample]:
        order = torch.randperm(
            len(training), generator=torch.Generator().manual_seed(self.settings.seed * 7919 + position["epoch"])
        ).tolist()
        start = position["cursor"]
        chosen = order[start : start + self.settings.batch_size]
        position["cursor"] = start + len(chosen)
        if position["cursor"] >= len(training):
            position["epoch"] += 1
            position["cursor"] = 0
        return [training[i] for i in chosen]

    # --- the folder ------------------------------------------------------------------------

    def _prepare_folder(self) -> None:
        out, plan_path = self.out, self.work / "plan.json"
        check_output_folder(out)
        plan = self._plan()
        probe = target_probe(self.target, self.settings.layers)
        if plan_path.exists():
            try:
                recorded = json.loads(plan_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise DistillError(f"{plan_path} is unreadable ({exc}); delete {out} to start over") from None
            differences = [
                f"{key}: {recorded.get(key)!r} before, {value!r} now"
                for key, value in plan.items()
                if recorded.get(key) != value
            ]
            if differences:
                raise DistillError(
                    f"{out} holds a distillation with other settings ({'; '.join(differences[:3])}); "
                    "use another output folder, or the same settings to resume"
                )
            saved_probe = torch.load(self.work / "probe.pt", weights_only=True)
            if saved_probe.shape != probe.shape or not torch.allclose(probe, saved_probe, PROBE_RTOL, PROBE_ATOL):
                raise DistillError(f"{out} holds a distillation of another target (its weights differ)")
            return
        self.work.mkdir(parents=True, exist_ok=True)
        save_atomic(probe, self.work / "probe.pt")
        write_text_atomically(plan_path, json.dumps(plan, indent=2) + "\n")

    def _plan(self) -> dict[str, Any]:
        digest = hashlib.sha256(json.dumps(self.prompts).encode()).hexdigest()
        return {
            "settings": self.settings.plan(),
            "target": target_architecture(self.target),
            "prompts": {"count": len(self.prompts), "sha256": digest},
            "eos_token_ids": list(self.eos),
            "keep_tokens": list(self.keep),
        }

    def _read_state(self) -> _State:
        path = self.work / "state.json"
        if not path.exists():
            return _State()
        try:
            return _State(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            raise DistillError(f"{path} is unreadable ({exc}); delete {self.out} to start over") from None

    def _save_state(self) -> None:
        self.state.spent = self.clock.spent()
        write_text_atomically(self.work / "state.json", json.dumps(self.state.__dict__, indent=2) + "\n")

    def _restore(self, draft: Any, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
        params = dict(draft.named_parameters())
        with torch.no_grad():
            for name, value in saved["params"].items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))
        optimizer.load_state_dict(saved["optimizer"])

    def _shard_path(self, index: int) -> Path:
        return self.work / f"shard-{index:05d}.pt"

    def _time_line(self) -> str:
        spent = self.clock.spent()
        return f"{_duration(spent)} of {_duration(self.budget)}, ETA {_duration(max(0.0, self.budget - spent))}"

    def _result(self) -> DistillResult:
        manifest = json.loads((self.out / MANIFEST).read_text(encoding="utf-8"))
        stats = manifest.get("stats", {})
        return DistillResult(
            checkpoint=self.out,
            shards=int(stats.get("shards", self.state.shards)),
            samples=int(stats.get("samples", 0)),
            new_tokens=int(stats.get("new_tokens", 0)),
            steps=int(stats.get("steps", self.state.steps)),
            spent=self.state.spent,
            before={"kl": stats.get("held_out_kl_before"), "agreement": stats.get("agreement_before")},
            after={"kl": stats.get("held_out_kl_after"), "agreement": stats.get("agreement_after")},
        )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
