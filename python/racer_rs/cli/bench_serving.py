"""``racer bench --concurrency C ...``: the command-line front of the serving benchmark
(:mod:`racer_rs.bench.serving`): arguments in, the table, its command and its JSON report out."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from racer_rs._io import check_writable_folder
from racer_rs.bench.batch_throughput import encode, interleaved
from racer_rs.bench.hf_peers import PEERS
from racer_rs.bench.prompts import load_benchmark
from racer_rs.bench.report import _json_safe, write_json
from racer_rs.bench.runner import BASELINE, INDEX_VARIANT, Setting, uses_index
from racer_rs.bench.serving import (
    DEFAULT_METHODS,
    DEFAULT_REQUESTS,
    ServingBenchmark,
    ServingRecord,
    format_table,
    serving_split,
    summarise,
)
from racer_rs.bench.workloads import WORKLOADS
from racer_rs.cli import common
from racer_rs.cli.errors import EXIT_MISMATCH, EXIT_USAGE, CLIError
from racer_rs.cli.options import parse_options
from racer_rs.cli.resources import resolve_shipped
from racer_rs.errors import RacerError

#: Cost-curve measurement inside timed calls worth a note (seconds, per method).
SETUP_NOTE_S = 0.05
#: The arguments of ``racer bench`` that the serving benchmark does not take.
_REFUSED = (
    ("batch_size", "--batch-size"),
    ("samples", "--samples"),
    ("index", "--index"),
    ("no_learn", "--no-learn"),
    ("persistent", "--persistent"),
)


def check_arguments(args: argparse.Namespace) -> None:
    """Raise CLIError for arguments that do not go with ``--concurrency`` (or ``--requests``
    without it), before anything is loaded."""
    if not getattr(args, "concurrency", None):
        if getattr(args, "requests", None) is not None:
            raise CLIError("--requests: only the serving benchmark (--concurrency) takes it")
        return
    for name, flag in _REFUSED:
        if getattr(args, name, None):
            raise CLIError(f"--concurrency and {flag} do not go together (the serving benchmark runs without it)")
    if args.workload != "spec_bench":
        raise CLIError(
            "--concurrency runs the spec_bench workload's prompt shaping (first turns, categories "
            "interleaved): give other prompts with --data (e.g. --data data/human_eval.jsonl)"
        )


def labels_of(args: argparse.Namespace) -> list[str]:
    """The method labels, ``ar`` first: ``--methods`` or :data:`DEFAULT_METHODS` (those installed)."""
    if args.methods is None:
        return [m for m in DEFAULT_METHODS if common.method_importable(serving_split(m)[0])]
    labels = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not labels:
        raise CLIError("--methods: no method given")
    for label in labels:
        if INDEX_VARIANT in label and not uses_index(label):
            raise CLIError(f"--methods {label}: write METHOD{INDEX_VARIANT}@CAPACITY (the capacity last)")
        try:
            method = serving_split(label)[0]
        except RacerError as exc:
            raise CLIError(str(exc)) from None
        if method in PEERS:
            raise CLIError(f"--methods {label}: transformers' peers are not served by generate_batch")
    common.check_methods(list(dict.fromkeys(serving_split(m)[0] for m in labels)))
    for label in labels:
        if uses_index(label):
            common.check_index_method(label, serving_split(label)[0])
    if len(set(labels)) != len(labels):
        raise CLIError("--methods: a method is listed more than once")
    return [BASELINE, *(label for label in labels if label != BASELINE)]


def _settings(args: argparse.Namespace) -> list[Setting]:
    temperatures = WORKLOADS["spec_bench"].temperatures if args.temperature is None else args.temperature
    return [Setting(t) if t == 0.0 else Setting(t, args.top_p, args.top_k) for t in dict.fromkeys(temperatures)]


def run_serving_bench(args: argparse.Namespace) -> int:
    """``racer bench --concurrency ...``; the exit code (1 when a greedy request mismatched)."""
    from racer_rs.cli.bench import default_capacity

    check_arguments(args)
    labels = labels_of(args)
    options = parse_options(args.option, labels)
    data = (
        [str(p) for p in args.data]
        if args.data
        else [resolve_shipped(p, "--data") for p in WORKLOADS["spec_bench"].data]
    )
    limit = None if args.limit is None else (args.limit or None)  # per group; --all: 0
    questions = interleaved(load_benchmark(data, limit))[: args.requests or DEFAULT_REQUESTS]
    if not questions:
        raise CLIError("no question to run (check --data and --limit)")
    concurrencies = list(dict.fromkeys(args.concurrency))
    settings = _settings(args)
    out = Path(args.out)
    check_writable_folder(out, "--out")  # before any work: results must have somewhere to go

    models = common.LoadedModels(args, [serving_split(m)[0] for m in labels])
    prompts = [encode(models.tokenizer, q) for q in questions]
    bench = ServingBenchmark(
        models.model,
        labels,
        capacity=args.capacity or default_capacity(models.device),
        max_capacity=args.max_capacity,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=common.bench_eos_ids(args, models),
        warmup=args.warmup,
        repeat=args.repeat,
        seed=args.seed,
        options={label: models.method_options(serving_split(label)[0], options[label]) for label in labels},
    )

    def progress(record: ServingRecord) -> None:
        if not args.no_progress:
            print(
                f"[{record.setting} C={record.concurrency} round {record.round}] {record.method}: "
                f"{record.new_tokens / record.wall_s:.1f} tok/s",
                file=sys.stderr,
            )

    load_before = os.getloadavg()
    records = bench.run(prompts, concurrencies, settings, progress)
    load_after = os.getloadavg()
    summary = summarise(records, labels)
    command = shlex.join(["racer", *getattr(args, "argv", [])])
    print(format_table(summary))
    print(f"command: {command}")
    print(
        f"{len(prompts)} requests x {args.max_new_tokens} new tokens at most, {args.repeat} round(s) per "
        f"concurrency; load average (1, 5, 15 min): before {load_before}, after {load_after}"
    )
    disturbed = sum(r["disturbed"] for r in summary if r["method"] == BASELINE)
    if disturbed:
        print(f"note: {disturbed} request run(s) left out of the per-request speedups as disturbed")
    setup = {r["method"]: r["setup_s"] for r in summary if r["setup_s"] > SETUP_NOTE_S}
    for method, seconds in setup.items():
        print(f"note: {method}'s timed calls include {seconds:.1f} s of capacity=auto cost-curve measurement")
    report = _json_safe(
        {
            "command": command,
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": models.model_path,
            "dtype": models.dtype,
            "packed_linear_layers": models.packed_layers,
            "device": models.device,
            "data": data,
            "requests": len(prompts),
            "question_ids": [q.question_id for q in questions],
            "concurrency": concurrencies,
            "methods": labels,
            "settings": [s.label for s in settings],
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": args.ignore_eos,
            "capacity": bench.capacity,
            "max_capacity": args.max_capacity,
            "warmup": args.warmup,
            "repeat": args.repeat,
            "seed": args.seed,
            "machine": {
                "platform": platform.platform(),
                "cpu_count": os.cpu_count(),
                "threads": _torch_threads(),
                "load_average_before": load_before,
                "load_average_after": load_after,
            },
            "summary": summary,
            "records": [_record_dict(r) for r in records],
        }
    )
    path, failure = write_json(report, out / "bench_serving.json")
    print(f"wrote {path}")
    if failure is not None:
        print(f"racer: could not write {out / 'bench_serving.json'} ({failure})", file=sys.stderr)
        return EXIT_USAGE
    ties = sum(r["near_ties"] for r in summary)
    if ties:
        print(f"racer: note: {ties} greedy request(s) part from ar at near-ties within {models.dtype} rounding")
    bad = [(r, row) for r in records for row, i in enumerate(r.first_mismatch) if i is not None and not r.near_tie[row]]
    for record, row in bad:
        print(
            f"racer: MISMATCH: {record.method} C={record.concurrency} round {record.round} request {row} "
            f"differs from ar at token {record.first_mismatch[row]}",
            file=sys.stderr,
        )
    return EXIT_MISMATCH if bad else 0


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _record_dict(record: ServingRecord) -> dict[str, Any]:
    return {**vars(record), "new_tokens": record.new_tokens}
