"""Method configurations side by side, from Python: what ``racer bench`` and the benchmark scripts run.

:func:`run_methods` runs labelled method configurations (label -> :class:`MethodSpec`: a method,
its options, its tree capacity) on prompts (:class:`~racer_rs.bench.prompts.Question`\\ s, or
token ids) with :class:`~racer_rs.bench.runner.BenchmarkRunner`, the loop of ``racer bench``:
every prompt by every method before the next prompt, ``ar`` first and last, the others in an
order that rotates from prompt to prompt; greedy outputs checked against ``ar``'s (in half
precision with the near-tie rule of :mod:`racer_rs.bench.precision`). Its
:class:`BenchResult` holds the records and their summary (:func:`racer_rs.bench.report.summarise`:
per-request speedups over ``ar`` aggregated by geometric mean with a bootstrap interval,
disturbed requests left out, MAT, tokens per verified node). The scripts in ``benches/`` print
their own tables from it. Example::

    result = run_methods(model, tokenizer, {"racer": "racer", "pld@8": MethodSpec("pld", capacity=8)}, prompts)
    print(result.table())
    result.speedup("racer").text()  # '1.47x [1.30, 1.62]'
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from racer_rs._validate import capacity as capacity_rule
from racer_rs.bench.prompts import Question, TokenPrompt
from racer_rs.bench.report import OVERALL, estimate_of, format_table, summarise
from racer_rs.bench.runner import (
    BASELINE,
    BenchConfig,
    BenchmarkRunner,
    MethodSpec,
    PhaseHook,
    ProgressHook,
    Record,
    Setting,
)
from racer_rs.bench.serving import ServingBenchmark, ServingResult
from racer_rs.bench.serving import summarise as summarise_serving
from racer_rs.bench.stats import DISTURBED_RATIO, Estimate
from racer_rs.errors import InvalidArgumentError

__all__ = [
    "GREEDY",
    "BenchResult",
    "MethodSpec",
    "Prompt",
    "Record",
    "Setting",
    "TokenPrompt",
    "as_prompt",
    "method_runner",
    "reproduce_command",
    "run_methods",
    "run_serving",
    "safe_div",
    "timing_totals",
]

#: Greedy decoding, the default setting.
GREEDY = Setting(0.0)

#: A prompt of :func:`run_methods`: a question (encoded by the runner, turn by turn), a
#: :class:`TokenPrompt`, or plain token ids.
Prompt: TypeAlias = "Question | TokenPrompt | Sequence[int]"


def as_prompt(prompt: Prompt, index: int) -> Question | TokenPrompt:
    """A question or token prompt as it is; plain token ids as a :class:`TokenPrompt` named by its index."""
    if isinstance(prompt, (Question, TokenPrompt)):
        return prompt
    return TokenPrompt(tuple(int(token) for token in prompt), question_id=index)


def method_runner(
    model: Any,
    tokenizer: Any,
    methods: Mapping[str, MethodSpec | str],
    *,
    settings: Sequence[Setting] = (GREEDY,),
    max_new_tokens: int = 128,
    capacity: int | str = 64,
    max_capacity: int = 64,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    warmup: int = 1,
    repeat: int = 1,
    persistent: bool = False,
    with_ar: bool = True,
) -> BenchmarkRunner:
    """The runner :func:`run_methods` uses, for a caller that drives it question by question
    (:meth:`BenchmarkRunner.run_question`: several runners interleaved, one per model).

    Args: as :func:`run_methods`.
    """
    from racer_rs import drafters
    from racer_rs.engine import generation

    specs = {label: MethodSpec(spec) if isinstance(spec, str) else spec for label, spec in methods.items()}
    if BASELINE in specs and specs[BASELINE].method != BASELINE:
        raise InvalidArgumentError(f"the label {BASELINE!r} is the baseline: it must stand for method {BASELINE!r}")
    if with_ar:
        specs = {BASELINE: specs.get(BASELINE, MethodSpec(BASELINE))} | specs
    if not specs:
        raise InvalidArgumentError("no method to run")
    capacity = capacity_rule("capacity", capacity)
    specs = {
        label: spec
        if spec.capacity is None
        else replace(spec, capacity=capacity_rule(f"{label}'s capacity", spec.capacity))
        for label, spec in specs.items()
    }
    assisted = [spec.options.get("draft_model") for spec in specs.values() if spec.method == "hf_assisted"]
    eos = [eos_token_id] if isinstance(eos_token_id, int) else None if eos_token_id is None else list(eos_token_id)
    config = BenchConfig(
        methods=list(specs),
        method_options={},
        settings=list(settings),
        max_new_tokens=max_new_tokens,
        capacity=capacity,
        warmup=warmup,
        repeat=repeat,
        seed=seed,
        persistent=persistent,
        eos_token_id=eos,
        draft_model=assisted[0] if assisted else None,
        max_capacity=max_capacity,
        specs=specs,
    )
    # Looked up at call time, as racer bench does, so that tests can substitute the engine.
    return BenchmarkRunner(model, tokenizer, config, generation.generate, drafters.make_drafter)


def run_methods(
    model: Any,
    tokenizer: Any,
    methods: Mapping[str, MethodSpec | str],
    prompts: Sequence[Prompt],
    *,
    settings: Sequence[Setting] = (GREEDY,),
    max_new_tokens: int = 128,
    capacity: int | str = 64,
    max_capacity: int = 64,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    warmup: int = 1,
    repeat: int = 1,
    persistent: bool = False,
    with_ar: bool = True,
    progress: ProgressHook | None = None,
    phase: PhaseHook | None = None,
) -> BenchResult:
    """Run method configurations side by side on the same prompts, interleaved, with ``ar``.

    Args:
        model: The target model; ``tokenizer`` its tokenizer (it encodes questions and decodes
            each turn's answer for the next turn).
        methods: Label -> configuration, in order (a string is a method with no options). ``ar``
            is added first unless ``with_ar`` is False; a label ``ar`` must be the ``ar`` method.
        prompts: Questions, :class:`TokenPrompt`\\ s or token id lists; prompt ``i`` decodes
            with seed ``seed + i``.
        settings: Decoding settings, run one after the other.
        max_new_tokens: Token budget per turn.
        capacity: The tree capacity of configurations without their own (an int or ``"auto"``).
        max_capacity: The largest tree ``"auto"`` may verify.
        eos_token_id: Id(s) that end generation; None: every answer runs to ``max_new_tokens``.
        warmup: Untimed runs of the first prompt per method and setting (at most
            :data:`racer_rs.bench.runner.WARMUP_TOKENS` new tokens each).
        repeat: Timed runs per turn (the median is kept).
        persistent: Keep drafter state across requests.
        with_ar: Add the ``ar`` baseline (the speedups and the greedy check need it).
        progress: Called with every record as soon as it is measured.
        phase: Called when a warm-up or a setting starts.

    Raises:
        InvalidArgumentError: A bad method, method option or capacity (before any timing
            starts), no method, or no prompt.
    """
    if not prompts:
        raise InvalidArgumentError("no prompt to run")
    runner = method_runner(
        model,
        tokenizer,
        methods,
        settings=settings,
        max_new_tokens=max_new_tokens,
        capacity=capacity,
        max_capacity=max_capacity,
        seed=seed,
        eos_token_id=eos_token_id,
        warmup=warmup,
        repeat=repeat,
        persistent=persistent,
        with_ar=with_ar,
    )
    runner.build_drafters()  # a bad option fails before any timing starts
    runner.run([as_prompt(prompt, index) for index, prompt in enumerate(prompts)], progress, phase)
    return BenchResult.from_runner(runner)


def run_serving(
    model: Any,
    methods: Sequence[str],
    prompts: Sequence[Sequence[int]],
    *,
    concurrency: Sequence[int] = (1, 4, 8, 16),
    settings: Sequence[Setting] = (GREEDY,),
    max_new_tokens: int = 128,
    capacity: int | str = 16,
    max_capacity: int = 64,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    warmup: int = 1,
    repeat: int = 1,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Any = None,
) -> ServingResult:
    """Serve ``prompts`` at each steady concurrency with every method, as ``racer bench --concurrency``
    does (:mod:`racer_rs.bench.serving`): one ``generate_batch(max_batch_size=C)`` call per method
    and concurrency, ``ar`` first and last of every round, the others rotating.

    Args:
        model: The target model.
        methods: Method labels (``racer@16``, ``racer@auto``, ``pld``...); ``ar`` is added first.
        prompts: Token id lists, one per request; request ``i`` samples with ``seed + i``.
        concurrency: The concurrencies (at most that many requests live at once), in run order.
        settings, max_new_tokens, capacity, max_capacity, eos_token_id, warmup: as :func:`run_methods`
            (``warmup``: untimed calls per method at each concurrency).
        repeat: Rounds per concurrency and setting.
        options: Per label, its method's options.
        progress: Called with every :class:`~racer_rs.bench.serving.ServingRecord` as it is measured.

    Raises:
        InvalidArgumentError: no prompt, a concurrency below 1, a repeated label or a bad capacity
            (before any timing starts).
    """
    if not prompts:
        raise InvalidArgumentError("no prompt to run")
    concurrencies = [int(c) for c in concurrency]
    if not concurrencies or min(concurrencies) < 1:
        raise InvalidArgumentError(f"concurrency must be >= 1, got {concurrencies}")
    labels = list(methods)
    if len(set(labels)) != len(labels):
        raise InvalidArgumentError("a method label is listed more than once")
    labels = [BASELINE, *(label for label in labels if label != BASELINE)]
    eos = [eos_token_id] if isinstance(eos_token_id, int) else None if eos_token_id is None else list(eos_token_id)
    bench = ServingBenchmark(
        model,
        labels,
        capacity=capacity_rule("capacity", capacity),
        max_capacity=max_capacity,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        warmup=warmup,
        repeat=repeat,
        seed=seed,
        options={label: dict(opts) for label, opts in (options or {}).items()},
    )
    records = bench.run([[int(t) for t in p] for p in prompts], concurrencies, list(settings), progress)
    return ServingResult(labels, concurrencies, records, summarise_serving(records, labels))


def _setting_label(setting: Setting | str) -> str:
    return setting.label if isinstance(setting, Setting) else setting


@dataclass
class BenchResult:
    """The records of a run and their summary.

    Attributes:
        methods: The labels, ``ar`` first when it ran.
        settings: The decoding settings, in run order.
        records: Every timed call, in run order.
        summary: :func:`racer_rs.bench.report.summarise` of the records.
        skipped: Prompts left out because they outgrew the model's window, with the reason.
    """

    methods: list[str]
    settings: list[Setting]
    records: list[Record]
    summary: dict[str, Any]
    skipped: list[dict[str, Any]]

    @classmethod
    def from_runner(cls, runner: BenchmarkRunner) -> BenchResult:
        """The result of everything ``runner`` has measured so far."""
        methods = list(runner.config.methods)
        records = list(runner.records)
        return cls(methods, list(runner.config.settings), records, summarise(records, methods), list(runner.skipped))

    def _setting_name(self, setting: Setting | str) -> str:
        """``setting``'s label, once it is known to be of this run."""
        name = _setting_label(setting)
        if name not in (s.label for s in self.settings):
            known = ", ".join(s.label for s in self.settings)
            raise InvalidArgumentError(f"no setting {name!r} in this run (settings: {known})")
        return name

    def _check(self, label: str, setting: Setting | str) -> str:
        """``setting``'s label, once ``label`` and ``setting`` are known to be of this run."""
        if label not in self.methods:
            raise InvalidArgumentError(f"no method labelled {label!r} in this run (labels: {', '.join(self.methods)})")
        return self._setting_name(setting)

    def of(self, label: str, setting: Setting | str = GREEDY) -> list[Record]:
        """The records of ``label`` in ``setting``, in run order. For ``ar``, its opening run of
        each prompt only: the closing one serves the disturbance check of the speedups, and
        per-method sums stay comparable.

        Raises:
            InvalidArgumentError: ``label`` or ``setting`` is not of this run.
        """
        name = self._check(label, setting)
        return [r for r in self.records if r.method == label and r.setting == name and r.ar_pass == 0]

    def metrics(self, label: str, setting: Setting | str = GREEDY, category: str = OVERALL) -> dict[str, Any]:
        """The summary's metrics of ``label`` (:func:`racer_rs.bench.report.summarise`).

        Raises:
            InvalidArgumentError: ``label``, ``setting`` or ``category`` is not of this run.
        """
        name = self._check(label, setting)
        if name not in self.summary:
            raise InvalidArgumentError(
                f"setting {name!r} has no records (every prompt was skipped: {len(self.skipped)})"
            )
        by_category = self.summary[name]
        if category not in by_category:
            raise InvalidArgumentError(
                f"no category {category!r} in setting {name!r} (categories: {', '.join(by_category)})"
            )
        metrics: dict[str, Any] = by_category[category][label]
        return metrics

    def speedup(self, label: str, setting: Setting | str = GREEDY, category: str = OVERALL) -> Estimate:
        """The geometric mean of ``label``'s per-request speedups over ``ar``, with its interval."""
        return estimate_of(self.metrics(label, setting, category))

    def mismatches(self, setting: Setting | str = GREEDY) -> dict[str, int]:
        """Per label, its greedy outputs that differ from ``ar``'s where rounding does not
        explain it (``ar`` itself: 0; every label 0 when sampling).

        Raises:
            InvalidArgumentError: ``setting`` is not of this run.
        """
        name = self._setting_name(setting)
        return {
            m: sum(1 for r in self.records if r.method == m and r.setting == name and r.real_mismatch)
            for m in self.methods
        }

    def near_ties(self, setting: Setting | str = GREEDY) -> dict[str, int]:
        """Per label, its greedy outputs that part from ``ar``'s at a half-precision near-tie."""
        name = self._setting_name(setting)
        return {
            m: sum(1 for r in self.records if r.method == m and r.setting == name and r.mismatch and r.near_tie)
            for m in self.methods
        }

    def disturbance_note(self, setting: Setting | str = GREEDY) -> str | None:
        """A line saying how many prompts the speedups leave out as disturbed; None when none
        (or when ``ar`` did not run)."""
        if BASELINE not in self.methods:
            return None
        metrics = self.metrics(BASELINE, setting)
        if not metrics["disturbed"]:
            return None
        return (
            f"speedups over ar leave out {metrics['disturbed']} of {metrics['requests']} prompt(s) as disturbed "
            f"(ar's two runs differ by more than {DISTURBED_RATIO:g}x; NaN when every prompt was)"
        )

    def table(self) -> str:
        """``racer bench``'s table of the summary."""
        return format_table(self.summary, self.methods)


def timing_totals(records: Sequence[Record]) -> dict[str, float]:
    """The engine's timings (``prefill``, ``draft``, ``verify``, ``forward``, ..., ``total``)
    summed over ``records``."""
    totals: dict[str, float] = {}
    for record in records:
        for key, value in record.timings.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


def safe_div(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is 0."""
    return numerator / denominator if denominator else math.nan


def reproduce_command(argv: Sequence[str] | None = None, **override: str) -> str:
    """The command line of this run as typed (``python SCRIPT ARGS``), with the options named in
    ``override`` (``temperatures="0"`` for ``--temperatures``) replaced or added."""
    args = list(sys.argv[1:] if argv is None else argv)
    for option, value in override.items():
        flag = "--" + option.replace("_", "-")
        if flag in args:
            index = args.index(flag)
            end = index + 1
            while end < len(args) and not args[end].startswith("--"):
                end += 1
            args[index:end] = [flag, value]
        else:
            args += [flag, value]
    return "python " + shlex.join([sys.argv[0], *args])
