"""``racer bench --concurrency C ...``: serving-style throughput and latency of :func:`racer_rs.generate_batch`.

N requests (the first turn of every question, categories interleaved) are decoded at a steady
concurrency ``C``: one ``generate_batch(prompts, max_batch_size=C)`` call per method and
concurrency, which keeps at most ``C`` rows live and admits the next request as soon as a row
finishes, as a serving engine does. A *round* is one call per method on the same requests at one
concurrency: ``ar`` runs first and last (its two runs tell whether the machine was disturbed in
between), the other methods in between in an order that rotates by one place from round to round
(:func:`round_order`), so that machine noise hits every method alike.

Per method and concurrency the benchmark reports:

- total tokens/s (new tokens over the call's wall time, prefill included) and its ratio to
  ``ar``'s, pooled over both of ``ar``'s runs of every round, the opening and the closing one
  (which bracket the method's own call), with the range of the per-round ratios over each of
  them (:func:`_throughput_range`: how far the machine drifted around the method's own call; with
  several rounds, how much the ratio varies between them). Both runs, because where a run sits
  in the round moves its speed: at 16 rows the opening ``ar`` run, which follows the previous
  round's closing one, was faster than the closing one in 13 of 16 rounds (by 4.3%, geometric
  mean; SmolLM2-135M and Qwen2.5-Coder-0.5B, five runs of this benchmark), at 8 rows slower in
  10 of 13 (by 3.5%); ``pld`` and ``suffix`` on Qwen2.5-Coder at 16 rows, which drafted nothing
  there (MAT 1.00), made 0.93x the opening runs and 1.01x the closing ones;
- per-request speedup over ``ar``: request ``i``'s tokens/s (its new tokens over its latency,
  ``total - admitted_s``) over ``ar``'s on the same request in the same round (the geometric mean
  of its two runs), aggregated by the geometric mean with a bootstrap 95% interval
  (:mod:`racer_rs.bench.stats`); a request whose two ``ar`` runs differ by more than the
  disturbance threshold is left out and counted;
- time per output token (TPOT, per request ``(total - first_token_s) / (tokens - 1)``), median;
- time to first token (``first_token_s - admitted_s``), median;
- latency percentiles p50, p90, p99 of ``total - admitted_s`` (the queueing before admission is
  not part of a request's latency: every method waits behind the same ``C``);
- MAT and, greedy, the requests whose tokens differ from ``ar``'s (in half precision a mismatch
  at a near-tie within the dtype's rounding is counted apart, :mod:`racer_rs.bench.precision`).

Request ``i`` samples with seed ``seed + i`` (``generate_batch``'s per-row seeds), so sampled
requests give the same text under every concurrency.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from racer_rs.bench.batch_throughput import split
from racer_rs.bench.heap import release_free_heap
from racer_rs.bench.runner import BASELINE, INDEX_VARIANT, Setting, first_difference, uses_index
from racer_rs.bench.stats import Estimate, disturbed, geometric_mean
from racer_rs.errors import InvalidArgumentError

#: Methods of ``racer bench --concurrency`` when ``--methods`` is not given (``suffix`` where
#: arctic-inference is installed; ``ar`` is always the baseline).
DEFAULT_METHODS = ("ar", "racer@auto", "racer@16", "suffix", "pld")
#: Requests when ``--requests`` is not given.
DEFAULT_REQUESTS = 32
#: The default setting of :class:`ServingResult`'s lookups.
GREEDY = Setting(0.0)
#: Latency percentiles of the report.
PERCENTILES = (50, 90, 99)


@dataclass
class ServingRecord:
    """One timed ``generate_batch(max_batch_size=C)`` call: every request, one method.

    Attributes:
        setting: the decoding setting's label.
        concurrency: ``C``, the most rows live at once.
        round: the round's index over the whole run (its place in the rotation).
        repeat: the repeat of this concurrency the round belongs to.
        method: the method label.
        ar_pass: 0, or 1 for ``ar``'s closing run of the round.
        wall_s: the call's wall time.
        tokens: per request, its new tokens.
        admitted_s, first_token_s, total_s: per request, seconds from the call's start to its
            admission, to its first committed token, and to its end.
        steps: per request, its decoding steps.
        first_mismatch: per request, the first token that differs from ``ar``'s in the same
            round (greedy only; None where equal); empty when not checked.
        near_tie: per request, that mismatch is a half-precision near-tie.
        setup_s: seconds of the call spent measuring ``capacity="auto"``'s cost curves (the
            largest ``extras["auto_capacity"]["setup_s"]`` of its requests; 0 when none).
    """

    setting: str
    concurrency: int
    round: int
    repeat: int
    method: str
    ar_pass: int
    wall_s: float
    tokens: list[list[int]]
    admitted_s: list[float]
    first_token_s: list[float]
    total_s: list[float]
    steps: list[int]
    first_mismatch: list[int | None] = field(default_factory=list)
    near_tie: list[bool] = field(default_factory=list)
    setup_s: float = 0.0

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    def latency(self) -> list[float]:
        """Per request, seconds from its admission to its end."""
        return [t - a for t, a in zip(self.total_s, self.admitted_s, strict=True)]

    def request_rates(self) -> list[float]:
        """Per request, its new tokens over its latency (NaN when either is 0)."""
        return [len(t) / s if s > 0 and t else math.nan for t, s in zip(self.tokens, self.latency(), strict=True)]

    def tpot(self) -> list[float]:
        """Per request with at least two tokens, seconds per output token after the first."""
        return [
            (total - first) / (len(tokens) - 1)
            for tokens, first, total in zip(self.tokens, self.first_token_s, self.total_s, strict=True)
            if len(tokens) > 1
        ]

    def ttft(self) -> list[float]:
        """Per request, seconds from its admission to its first committed token."""
        return [f - a for f, a in zip(self.first_token_s, self.admitted_s, strict=True)]


#: A ``METHOD+index`` label's options (the user's win): an in-memory index of the call's own,
#: shared by its rows and empty at every call's start, so the method learns from the call's
#: finished requests as ``suffix``'s global tree does, and no call sees another's answers.
CALL_INDEX: dict[str, Any] = {"index": "memory", "index_scope": "drafter", "learn": True}


def serving_split(label: str) -> tuple[str, int | str | None]:
    """``"racer@16"`` -> ``("racer", 16)``; ``"racer+index@auto"`` -> ``("racer", "auto")``
    (the ``+index`` variant's index is in its options: :data:`CALL_INDEX`)."""
    return split(label.replace(INDEX_VARIANT, "", 1))


def round_order(methods: Sequence[str], round_index: int) -> list[tuple[str, int]]:
    """The (method, ar pass) calls of round ``round_index``: ``ar`` first and last, the other
    methods in between, rotated left by ``round_index`` places (as ``racer bench``'s runner
    rotates them from question to question)."""
    others = [m for m in methods if m != BASELINE]
    shift = round_index % len(others) if others else 0
    rotated = others[shift:] + others[:shift]
    if BASELINE not in methods:
        return [(m, 0) for m in rotated]
    return [(BASELINE, 0), *((m, 0) for m in rotated), (BASELINE, 1)]


def _sampling(setting: Setting) -> dict[str, Any]:
    if setting.greedy:
        return {}
    return {"temperature": setting.temperature, "top_p": setting.top_p, "top_k": setting.top_k}


class ServingBenchmark:
    """Runs the serving benchmark.

    Args:
        model: the target.
        methods: method labels (``ar`` first), a label optionally with its capacity (``racer@16``).
        capacity: the capacity of labels without one; ``max_capacity`` for ``auto``.
        max_new_tokens: every request's budget; ``eos_token_id`` ends a request.
        warmup: untimed calls per method at each concurrency and setting (on the first ``C``
            requests, at the full budget); with any, each level opens with one untimed call of
            the first method (``ar``) over every request (see :meth:`run`).
        repeat: rounds per concurrency and setting.
        seed: request ``i`` samples with ``seed + i``.
        options: per label, the method's options.
    """

    def __init__(
        self,
        model: Any,
        methods: Sequence[str],
        *,
        capacity: int | str,
        max_capacity: int,
        max_new_tokens: int,
        eos_token_id: Any,
        warmup: int,
        repeat: int,
        seed: int,
        options: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        import torch

        # The module, not its function: looked up at call time, so that tests can swap it.
        from racer_rs.engine import generation as engine_generation

        for label in methods:
            serving_split(label)  # a bad capacity fails before any timing
        self.model = model
        self.methods = list(methods)
        self.capacity = capacity
        self.max_capacity = max_capacity
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.warmup = warmup
        self.repeat = repeat
        self.seed = seed
        self.options = options or {}
        self._engine = engine_generation
        parameter = next(model.parameters())
        self.half = parameter.dtype in (torch.bfloat16, torch.float16)
        self._device = parameter.device
        self.records: list[ServingRecord] = []

    def _synchronize(self) -> None:
        import torch

        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _call(
        self, label: str, prompts: list[list[int]], setting: Setting, concurrency: int, budget: int
    ) -> tuple[list[Any], float]:
        import torch

        method, own = serving_split(label)
        options: dict[str, Any] = {
            "method": method,
            "max_new_tokens": budget,
            "eos_token_id": self.eos_token_id,
            "capacity": own if own is not None else self.capacity,
            "max_capacity": self.max_capacity,
            **_sampling(setting),
            **(CALL_INDEX if uses_index(label) else {}),
            **self.options.get(label, {}),
        }
        torch.manual_seed(self.seed)
        release_free_heap()  # outside the timing: each call starts from a trimmed heap
        self._synchronize()
        start = time.perf_counter()
        results = self._engine.generate_batch(
            self.model, prompts, seed=self.seed, max_batch_size=concurrency, **options
        )
        self._synchronize()
        return results, time.perf_counter() - start

    def run(
        self,
        prompts: list[list[int]],
        concurrencies: Sequence[int],
        settings: Sequence[Setting],
        progress: Callable[[ServingRecord], None] | None = None,
    ) -> list[ServingRecord]:
        """Every setting, concurrency, repeat and method; the records in run order (also kept in
        :attr:`records`, so that a run stopped early keeps what it measured)."""
        if not prompts:
            raise InvalidArgumentError("no prompt to run")
        if not concurrencies or min(concurrencies) < 1:
            raise InvalidArgumentError(f"concurrencies must be >= 1, got {list(concurrencies)}")
        round_index = 0
        for setting in settings:
            for concurrency in concurrencies:
                if self.warmup:
                    # Every request's prefill and context lengths met once before the timing: the
                    # opening ar run of a level, after warm-ups of the first C requests and 32
                    # tokens, took 39.2 and 39.5 s against 34.0-35.1 for ar's later runs
                    # (Qwen2.5-Coder-0.5B, 48 requests at C = 16); ar opens every round, so this
                    # fell on the baseline. (It narrowed the gap in the one run measured since,
                    # 86.0 against 88.1-88.6 tokens/s; it is not the only cause of slow opening
                    # runs on this machine.)
                    self._call(self.methods[0], prompts, setting, concurrency, self.max_new_tokens)
                for warmup in range(self.warmup):
                    # A full wave per method, so that what a method learns once per process (its
                    # tree shapes, the drafting switch's first tries) is not timed either: racer's
                    # first timed call of a one-wave level took 12.8 s, its second 11.4 s, both
                    # 58-59 steps (Qwen2.5-Coder-0.5B, 16 requests at C = 16). The first pass
                    # skips the first method: its call over every request warmed it up.
                    for label in self.methods[1 if warmup == 0 else 0 :]:
                        self._call(label, prompts[:concurrency], setting, concurrency, self.max_new_tokens)
                for repeat in range(self.repeat):
                    done = []
                    for label, ar_pass in round_order(self.methods, round_index):
                        results, wall = self._call(label, prompts, setting, concurrency, self.max_new_tokens)
                        record = _record(setting.label, concurrency, round_index, repeat, label, ar_pass, wall, results)
                        done.append(record)
                        if progress is not None:
                            progress(record)
                    if setting.greedy:
                        self._check(done, prompts)
                    self.records.extend(done)
                    round_index += 1
        return self.records

    def _check(self, records: list[ServingRecord], prompts: list[list[int]]) -> None:
        """Mark every request whose tokens differ from ``ar``'s opening run of the round (greedy)."""
        reference = next((r for r in records if r.method == BASELINE and r.ar_pass == 0), None)
        if reference is None:
            return
        for record in records:
            record.first_mismatch, record.near_tie = [], []
            for row, (tokens, expected) in enumerate(zip(record.tokens, reference.tokens, strict=True)):
                index = first_difference(tokens, expected)
                tie = False
                if self.half and index is not None and index < min(len(tokens), len(expected)):
                    from racer_rs.bench.precision import divergence_gap

                    gap, tolerance = divergence_gap(
                        self.model, prompts[row] + expected[:index], expected[index], tokens[index]
                    )
                    tie = abs(gap) <= tolerance
                record.first_mismatch.append(index)
                record.near_tie.append(tie)


def _record(
    setting: str, concurrency: int, round_index: int, repeat: int, label: str, ar_pass: int, wall: float, results: Any
) -> ServingRecord:
    for row, result in enumerate(results):
        if getattr(result, "error", None) is not None:
            raise InvalidArgumentError(f"{label} at concurrency {concurrency}: request {row} failed: {result.error}")
        if "admitted_s" not in result.extras:
            raise InvalidArgumentError(
                "generate_batch's results have no extras['admitted_s']: this engine does not serve"
            )

    def first_token(result: Any) -> float:
        value = result.extras.get("first_token_s")  # None: no token committed
        return float(result.timings["total"] if value is None else value)

    return ServingRecord(
        setting=setting,
        concurrency=concurrency,
        round=round_index,
        repeat=repeat,
        method=label,
        ar_pass=ar_pass,
        wall_s=wall,
        tokens=[list(map(int, r.tokens)) for r in results],
        admitted_s=[float(r.extras["admitted_s"]) for r in results],
        first_token_s=[first_token(r) for r in results],
        total_s=[float(r.timings["total"]) for r in results],
        steps=[int(r.steps) for r in results],
        setup_s=max((_setup_seconds(r.extras) for r in results), default=0.0),
    )


def _setup_seconds(extras: dict[str, Any]) -> float:
    auto = extras.get("auto_capacity")
    return float(auto.get("setup_s") or 0.0) if isinstance(auto, dict) else 0.0


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _median(values: Sequence[float]) -> float:
    return _percentile(values, 50)


def summarise(records: Sequence[ServingRecord], methods: Sequence[str]) -> list[dict[str, Any]]:
    """Per setting, concurrency and method (in ``methods`` order): throughput, TPOT, latency
    percentiles, the speedups over ``ar`` and the greedy check. ``ar``'s closing runs serve the
    disturbance check only."""
    by_key: dict[tuple[str, int], list[ServingRecord]] = defaultdict(list)
    for record in records:
        by_key[(record.setting, record.concurrency)].append(record)
    rows: list[dict[str, Any]] = []
    for (setting, concurrency), group in by_key.items():
        rounds: dict[int, dict[tuple[str, int], ServingRecord]] = defaultdict(dict)
        for record in group:
            rounds[record.round][(record.method, record.ar_pass)] = record
        ar_rate = _pooled_rate([r for r in group if r.method == BASELINE])  # both runs of every round
        for method in methods:
            own = [r for r in group if r.method == method and r.ar_pass == 0]
            if not own:
                continue
            ratios, left_out, requests = _request_ratios(rounds, method)
            tokens = sum(r.new_tokens for r in own)
            steps = sum(sum(r.steps) for r in own)
            latency = [s for r in own for s in r.latency()]
            rate = ar_rate if method == BASELINE else _pooled_rate(own)
            estimate = geometric_mean(ratios)
            low, high = _throughput_range(rounds, method)
            row: dict[str, Any] = {
                "setting": setting,
                "concurrency": concurrency,
                "method": method,
                "rounds": len(own),
                "requests": requests,
                "new_tokens": tokens,
                "wall_s": sum(r.wall_s for r in own),
                "tokens_per_s": rate,
                "vs_ar_tokens_per_s": rate / ar_rate if ar_rate > 0 else math.nan,
                "vs_ar_low": low,
                "vs_ar_high": high,
                "speedup": estimate.value,
                "speedup_low": estimate.low,
                "speedup_high": estimate.high,
                "disturbed": left_out,
                "tpot_ms_p50": 1000.0 * _median([t for r in own for t in r.tpot()]),
                "ttft_ms_p50": 1000.0 * _median([t for r in own for t in r.ttft()]),
                "mat": tokens / steps if steps else math.nan,
                "mismatches": sum(
                    1 for r in own for i, m in enumerate(r.first_mismatch) if m is not None and not r.near_tie[i]
                ),
                "near_ties": sum(
                    1 for r in own for i, m in enumerate(r.first_mismatch) if m is not None and r.near_tie[i]
                ),
                "checked": sum(len(r.first_mismatch) for r in own),
                "setup_s": sum(r.setup_s for r in own),
            }
            for q in PERCENTILES:
                row[f"latency_s_p{q}"] = _percentile(latency, q)
            rows.append(row)
    return rows


def _pooled_rate(records: Sequence[ServingRecord]) -> float:
    wall = sum(r.wall_s for r in records)
    return sum(r.new_tokens for r in records) / wall if wall > 0 else math.nan


def _throughput_range(rounds: dict[int, dict[tuple[str, int], ServingRecord]], method: str) -> tuple[float, float]:
    """The lowest and highest ratio of ``method``'s tokens/s in a round to one of the round's ``ar``
    runs (opening or closing), over every round; NaN when there is none."""
    ratios: list[float] = []
    for calls in rounds.values():
        own = calls.get((method, 0))
        if own is None:
            continue
        rate = _pooled_rate([own])
        for ar_pass in (0, 1):
            ar = calls.get((BASELINE, ar_pass))
            ar_rate = _pooled_rate([ar]) if ar is not None else math.nan
            if ar_rate > 0:
                ratios.append(rate / ar_rate)
    return (min(ratios), max(ratios)) if ratios else (math.nan, math.nan)


def _request_ratios(
    rounds: dict[int, dict[tuple[str, int], ServingRecord]], method: str
) -> tuple[list[float], int, int]:
    """Per request and round, ``method``'s tokens/s over ``ar``'s (the geometric mean of its two
    runs of the round); how many were left out as disturbed (``ar``'s two runs of the request
    differ too much); how many there were."""
    ratios: list[float] = []
    left_out = requests = 0
    for calls in rounds.values():
        own, first, last = calls.get((method, 0)), calls.get((BASELINE, 0)), calls.get((BASELINE, 1))
        if own is None or first is None:
            continue
        closing = last.request_rates() if last is not None else first.request_rates()
        for mine, ar, ar_again in zip(own.request_rates(), first.request_rates(), closing, strict=True):
            requests += 1
            if disturbed(ar, ar_again):
                left_out += 1
                continue
            ratios.append(mine / math.sqrt(ar * ar_again))
    return ratios, left_out, requests


def estimate(row: dict[str, Any]) -> Estimate:
    """The per-request speedup of a summary row."""
    return Estimate(row["speedup"], row["speedup_low"], row["speedup_high"], row["requests"] - row["disturbed"])


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a text table (rows in summary order)."""
    header = ["setting", "C", "method", "tok/s", "vs ar [range]", "per-request vs ar [95%]", "TPOT ms", "TTFT ms"]
    header += [f"p{q} s" for q in PERCENTILES] + ["MAT", "mismatch"]
    table = [header]
    for r in rows:
        speed = "-" if r["method"] == BASELINE else estimate(r).text()
        mismatch = str(r["mismatches"]) + (f" (+{r['near_ties']} ties)" if r["near_ties"] else "")
        table.append(
            [
                r["setting"],
                str(r["concurrency"]),
                r["method"],
                f"{r['tokens_per_s']:.1f}",
                _throughput_text(r),
                speed,
                f"{r['tpot_ms_p50']:.1f}",
                f"{r['ttft_ms_p50']:.1f}",
                *(f"{r[f'latency_s_p{q}']:.2f}" for q in PERCENTILES),
                f"{r['mat']:.2f}",
                mismatch if r["checked"] else "-",
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in table
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _throughput_text(row: dict[str, Any]) -> str:
    """``"1.02x [0.99, 1.04]"``: the tokens/s ratio to ``ar`` and its range (no range for ``ar``
    itself, or where a round had no ``ar`` run)."""
    text = f"{row['vs_ar_tokens_per_s']:.2f}x"
    low, high = row.get("vs_ar_low", math.nan), row.get("vs_ar_high", math.nan)
    if row["method"] == BASELINE or not (math.isfinite(low) and math.isfinite(high)):
        return text
    return f"{text} [{low:.2f}, {high:.2f}]"


@dataclass
class ServingResult:
    """The records of a serving run and their summary.

    Attributes:
        methods: the labels, ``ar`` first.
        concurrencies: the concurrencies, in run order.
        records: every timed call, in run order.
        summary: :func:`summarise` of the records.
    """

    methods: list[str]
    concurrencies: list[int]
    records: list[ServingRecord]
    summary: list[dict[str, Any]]

    def row(self, label: str, concurrency: int, setting: Setting | str = GREEDY) -> dict[str, Any]:
        """The summary row of ``label`` at ``concurrency`` in ``setting``.

        Raises:
            InvalidArgumentError: no such row in this run.
        """
        name = setting.label if isinstance(setting, Setting) else setting
        for row in self.summary:
            if (row["method"], row["concurrency"], row["setting"]) == (label, concurrency, name):
                return row
        raise InvalidArgumentError(f"no {label!r} at concurrency {concurrency} in setting {name!r} in this run")

    def speedup(self, label: str, concurrency: int, setting: Setting | str = GREEDY) -> Estimate:
        """The geometric mean of ``label``'s per-request speedups over ``ar``, with its interval."""
        return estimate(self.row(label, concurrency, setting))

    def mismatches(self) -> int:
        """Greedy requests, over every method, that differ from ``ar``'s where rounding does not explain it."""
        return sum(int(row["mismatches"]) for row in self.summary)

    def table(self) -> str:
        """The summary as ``racer bench --concurrency`` prints it."""
        return format_table(self.summary)
