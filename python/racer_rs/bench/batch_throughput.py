"""``racer bench --batch-size B ...``: throughput of :func:`racer_rs.generate_batch`.

For every batch size ``B``, the prompts (the first turn of every question, categories
interleaved so that a batch mixes long and short prompts) are cut into batches of ``B``; every
batch is decoded by every method twice, batched (one ``generate_batch`` call) and sequentially
(``generate`` for one prompt after the other), all modes interleaved per batch with their order
rotated, so that machine noise hits every mode alike. Throughput is total new tokens over total
wall time (prefill included); each method batched is compared with batched ``ar`` and with its own
sequential decoding. Greedy rows are checked against sequential ``ar``, row by row (in half
precision a mismatch at a near-tie within the dtype's rounding is reported apart, as ``racer
bench`` does).

Row ``b`` of batch ``i`` samples with seed ``seed + i * B + b`` in both modes, so sampled rows
give the same text batched and sequential.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from racer_rs._validate import capacity as capacity_rule
from racer_rs.bench.heap import release_free_heap
from racer_rs.bench.prompting import encode_conversation, encode_text
from racer_rs.bench.prompts import Question

#: Methods of the batch benchmark when ``--methods`` is not given (``ar`` is always the baseline).
DEFAULT_METHODS = ("ar", "racer@16", "racer@auto")
MODES = ("batched", "sequential")
#: New-token cap of a warm-up run.
WARMUP_TOKENS = 32


@dataclass
class BatchRecord:
    """One timed decoding of one batch of prompts by one method in one mode."""

    setting: str
    batch_size: int
    batch_index: int
    mode: str
    method: str
    wall_s: float
    new_tokens: int
    steps: list[int]
    mat: list[float]
    prompt_tokens: list[int]
    tokens: list[list[int]] = field(default_factory=list)
    #: Per row: index of the first token that differs from sequential ar (greedy only), or None.
    first_mismatch: list[int | None] = field(default_factory=list)
    #: Per row: the mismatch is a near-tie within the dtype's rounding (half precision only).
    near_tie: list[bool] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)


def split(label: str) -> tuple[str, int | str | None]:
    """``"racer@16"`` -> ``("racer", 16)``; ``"racer@auto"`` -> ``("racer", "auto")``."""
    method, at, capacity = label.partition("@")
    return method, (capacity_rule(f"--methods {label}: capacity", capacity) if at else None)


def interleaved(questions: list[Question]) -> list[Question]:
    """Questions round-robin over their categories, so consecutive prompts differ in kind."""
    by_category: dict[str, list[Question]] = defaultdict(list)
    for question in questions:
        by_category[question.category].append(question)
    queues = list(by_category.values())
    out: list[Question] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def encode(tokenizer: Any, question: Question) -> list[int]:
    """The question's first turn as prompt ids."""
    if question.mode == "completion":
        return encode_text(tokenizer, question.turns[0])
    return encode_conversation(tokenizer, question.turns[:1], [])


class BatchBenchmark:
    """Runs the interleaved batch benchmark.

    Args:
        model: the target; ``tokenizer`` its tokenizer.
        methods: method labels (``ar`` first), a label optionally with its capacity (``racer@16``).
        capacity: the capacity of labels without one; ``max_capacity`` for ``auto``.
        max_new_tokens: every row's budget; ``eos_token_id`` ends a row.
        warmup: untimed runs per mode and method on the first batch of each batch size.
        seed: the base seed.
        options: per label, the method's options.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        methods: list[str],
        capacity: int | str,
        max_capacity: int,
        max_new_tokens: int,
        eos_token_id: Any,
        warmup: int,
        seed: int,
        options: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        import torch

        from racer_rs.engine.generation import generate, generate_batch

        self.model = model
        self.tokenizer = tokenizer
        self.methods = methods
        self.capacity = capacity
        self.max_capacity = max_capacity
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.warmup = warmup
        self.seed = seed
        self.options = options or {}
        self.generate = generate
        self.generate_batch = generate_batch
        parameter = next(model.parameters())
        self.half = parameter.dtype in (torch.bfloat16, torch.float16)
        self._device = parameter.device

    def _synchronize(self) -> None:
        import torch

        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _call(
        self, mode: str, label: str, prompts: list[list[int]], sampling: dict[str, Any], seed: int, budget: int
    ) -> tuple[list[Any], float]:
        import torch

        method, own = split(label)
        options: dict[str, Any] = {
            "method": method,
            "max_new_tokens": budget,
            "eos_token_id": self.eos_token_id,
            "capacity": own if own is not None else self.capacity,
            "max_capacity": self.max_capacity,
            **sampling,
            **self.options.get(label, {}),
        }
        torch.manual_seed(seed)
        release_free_heap()  # outside the timing: each call starts from a trimmed heap
        self._synchronize()
        start = time.perf_counter()
        if mode == "batched":
            results = self.generate_batch(self.model, prompts, seed=seed, **options)
        else:
            results = [self.generate(self.model, p, seed=seed + row, **options) for row, p in enumerate(prompts)]
        self._synchronize()
        return results, time.perf_counter() - start

    def run(
        self,
        prompts: list[list[int]],
        batch_sizes: list[int],
        settings: list[tuple[str, dict[str, Any]]],
        progress: Any = None,
    ) -> list[BatchRecord]:
        """Every setting, batch size, batch, method and mode; the records in run order."""
        records: list[BatchRecord] = []
        modes = [(mode, label) for label in self.methods for mode in MODES]
        for setting, sampling in settings:
            for size in batch_sizes:
                batches = [prompts[i : i + size] for i in range(0, len(prompts) - size + 1, size)]
                warm = min(WARMUP_TOKENS, self.max_new_tokens)
                for _ in range(self.warmup):
                    for mode, label in modes:
                        self._call(mode, label, batches[0], sampling, self.seed, warm)
                for index, batch in enumerate(batches):
                    seed = self.seed + index * size
                    shift = index % len(modes)
                    done = []
                    for mode, label in modes[shift:] + modes[:shift]:
                        results, wall = self._call(mode, label, batch, sampling, seed, self.max_new_tokens)
                        record = BatchRecord(
                            setting=setting,
                            batch_size=size,
                            batch_index=index,
                            mode=mode,
                            method=label,
                            wall_s=wall,
                            new_tokens=sum(len(r.tokens) for r in results),
                            steps=[int(r.steps) for r in results],
                            mat=[float(r.mat) for r in results],
                            prompt_tokens=[len(p) for p in batch],
                            tokens=[list(map(int, r.tokens)) for r in results],
                            extras=[_plain(r.extras) for r in results],
                        )
                        done.append(record)
                        if progress is not None:
                            progress(record)
                    if not sampling:
                        self._check(done, batch)
                    records.extend(done)
        return records

    def _check(self, records: list[BatchRecord], prompts: list[list[int]]) -> None:
        """Mark every row that differs from sequential ar's row (greedy)."""
        reference = next(r for r in records if r.mode == "sequential" and split(r.method)[0] == "ar")
        for record in records:
            record.first_mismatch, record.near_tie = [], []
            for row, (tokens, expected) in enumerate(zip(record.tokens, reference.tokens, strict=True)):
                index = _first_difference(tokens, expected)
                tie = False
                if self.half and index is not None and index < min(len(tokens), len(expected)):
                    from racer_rs.bench.precision import divergence_gap

                    prefix = prompts[row] + expected[:index]
                    gap, tolerance = divergence_gap(self.model, prefix, expected[index], tokens[index])
                    tie = abs(gap) <= tolerance
                record.first_mismatch.append(index)
                record.near_tie.append(tie)


def _first_difference(tokens: list[int], reference: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _plain(extras: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready part of a result's extras (what the report keeps)."""
    keep: dict[str, Any] = {}
    for key in ("mean_tree_size", "auto_capacity", "batch"):
        if key in extras:
            keep[key] = json.loads(json.dumps(extras[key], default=str))
    return keep


def summarise(records: list[BatchRecord]) -> list[dict[str, Any]]:
    """Per setting, batch size, method and mode: tokens/s and the speedups the benchmark reports."""
    totals: dict[tuple[str, int, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in records:
        entry = totals[(r.setting, r.batch_size, r.method, r.mode)]
        entry[0] += r.new_tokens
        entry[1] += r.wall_s
        entry[2] += sum(r.steps)
        entry[3] += sum(1 for i, mis in enumerate(r.first_mismatch) if mis is not None and not r.near_tie[i])
    rows: list[dict[str, Any]] = []
    speed: dict[tuple[str, int, str, str], float] = {}
    for (setting, size, method, mode), (tokens, wall, steps, mismatches) in totals.items():
        speed[(setting, size, method, mode)] = tokens / wall if wall else 0.0
        rows.append(
            {
                "setting": setting,
                "batch_size": size,
                "method": method,
                "mode": mode,
                "new_tokens": int(tokens),
                "wall_s": wall,
                "tokens_per_s": speed[(setting, size, method, mode)],
                "mat": tokens / steps if steps else 0.0,
                "mismatched_rows": int(mismatches),
            }
        )
    for row in rows:
        key: tuple[str, int] = (row["setting"], row["batch_size"])
        ar_batched = speed.get((*key, _ar_label(speed, key), "batched"))
        sequential = speed.get((*key, row["method"], "sequential"))
        row["vs_batched_ar"] = row["tokens_per_s"] / ar_batched if ar_batched else None
        row["vs_own_sequential"] = row["tokens_per_s"] / sequential if sequential else None
    return rows


def _ar_label(speed: dict[tuple[str, int, str, str], float], key: tuple[str, int]) -> str:
    return next((k[2] for k in speed if k[:2] == key and split(k[2])[0] == "ar"), "ar")


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a text table."""
    header = (
        f"{'setting':<22} {'B':>3} {'method':<18} {'mode':<10} {'tok/s':>8} {'MAT':>5} {'vs batched ar':>13} "
        f"{'vs own seq':>10} {'mismatch':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in sorted(rows, key=lambda r: (r["setting"], r["batch_size"], r["method"] != "ar", r["method"], r["mode"])):
        vs_ar = f"{r['vs_batched_ar']:.2f}x" if r["vs_batched_ar"] else "-"
        vs_seq = f"{r['vs_own_sequential']:.2f}x" if r["vs_own_sequential"] else "-"
        lines.append(
            f"{r['setting']:<22} {r['batch_size']:>3} {r['method']:<18} {r['mode']:<10} {r['tokens_per_s']:>8.1f} "
            f"{r['mat']:>5.2f} {vs_ar:>13} {vs_seq:>10} {r['mismatched_rows']:>8}"
        )
    return "\n".join(lines)
