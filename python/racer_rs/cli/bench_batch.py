"""``racer bench --batch-size B ...``: the command-line front of the batch throughput benchmark
(:mod:`racer_rs.bench.batch_throughput`): arguments in, the table and its JSON report out."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from racer_rs.bench.batch_throughput import (
    DEFAULT_METHODS,
    BatchBenchmark,
    BatchRecord,
    encode,
    format_table,
    interleaved,
    split,
    summarise,
)
from racer_rs.bench.prompts import load_benchmark
from racer_rs.bench.workloads import WORKLOADS
from racer_rs.cli import common
from racer_rs.cli.errors import EXIT_MISMATCH, CLIError
from racer_rs.cli.options import parse_options
from racer_rs.cli.resources import DEFAULT_BENCH_DATA, resolve_shipped
from racer_rs.errors import RacerError


def run_batch_bench(args: argparse.Namespace) -> int:
    """``racer bench --batch-size ...``; the exit code (1 when a greedy row mismatched)."""
    from racer_rs.cli.bench import default_capacity

    labels = [m.strip() for m in (args.methods or ",".join(DEFAULT_METHODS)).split(",") if m.strip()]
    try:
        parsed = [split(label) for label in labels]
    except RacerError as exc:
        raise CLIError(str(exc)) from None
    common.check_methods(list(dict.fromkeys(m for m, _ in parsed)))
    if len(set(labels)) != len(labels):
        raise CLIError("--methods: a method is listed more than once")
    if not any(m == "ar" for m, _ in parsed):
        labels.insert(0, "ar")
    if args.workload != "spec_bench" or args.index is not None or args.samples is not None:
        raise CLIError(
            "--batch-size runs the spec_bench workload without a shared index (no --workload, --index, --samples)"
        )
    options = parse_options(args.option, labels)
    data = [str(p) for p in args.data] if args.data else [resolve_shipped(p, "--data") for p in DEFAULT_BENCH_DATA]
    limit = WORKLOADS["spec_bench"].limit if args.limit is None else (args.limit or None)  # --all: 0
    questions = interleaved(load_benchmark(data, limit))
    sizes = sorted(dict.fromkeys(args.batch_size))
    if len(questions) < max(sizes):
        raise CLIError(
            f"--batch-size {max(sizes)} needs at least {max(sizes)} questions, got {len(questions)} "
            "(raise --limit, or pass --all)"
        )
    models = common.LoadedModels(args, [split(m)[0] for m in labels])
    prompts = [encode(models.tokenizer, q) for q in questions]
    settings: list[tuple[str, dict[str, Any]]] = []
    temperatures = WORKLOADS["spec_bench"].temperatures if args.temperature is None else args.temperature
    for temperature in dict.fromkeys(temperatures):
        if temperature == 0.0:
            settings.append(("greedy", {}))
        else:
            label = f"T={temperature:g},top_p={args.top_p:g}" + (f",top_k={args.top_k}" if args.top_k else "")
            settings.append((label, {"temperature": temperature, "top_p": args.top_p, "top_k": args.top_k}))
    bench = BatchBenchmark(
        models.model,
        models.tokenizer,
        labels,
        capacity=args.capacity or default_capacity(models.device),
        max_capacity=args.max_capacity,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=common.bench_eos_ids(args, models),
        warmup=args.warmup,
        seed=args.seed,
        options={label: models.method_options(split(label)[0], options[label]) for label in labels},
    )
    load_before = os.getloadavg()
    started = time.perf_counter()

    def progress(record: BatchRecord) -> None:
        if not args.no_progress:
            print(
                f"[{record.setting} B={record.batch_size} batch {record.batch_index}] {record.method} "
                f"{record.mode}: {record.new_tokens / record.wall_s:.1f} tok/s",
                file=sys.stderr,
            )

    records = bench.run(prompts, sizes, settings, progress)
    load_after = os.getloadavg()
    summary = summarise(records)
    print(format_table(summary))
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "command": ["racer", *getattr(args, "argv", [])],
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": models.model_path,
        "dtype": models.dtype,
        "packed_linear_layers": models.packed_layers,
        "device": models.device,
        "data": data,
        "questions": len(questions),
        "batch_sizes": sizes,
        "methods": labels,
        "max_new_tokens": args.max_new_tokens,
        "capacity": bench.capacity,
        "max_capacity": args.max_capacity,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "wall_s": time.perf_counter() - started,
        },
        "summary": summary,
        "records": [asdict(r) for r in records],
    }
    path = out / "bench_batch.json"
    path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"wrote {path}")
    parted = [(r, row) for r in records for row, index in enumerate(r.first_mismatch) if index is not None]
    bad = [(r, row) for r, row in parted if not r.near_tie[row]]
    ties = len(parted) - len(bad)
    if ties:
        print(f"racer: note: {ties} greedy row(s) part from sequential ar at near-ties within {models.dtype} rounding")
    for record, row in bad:
        print(
            f"racer: MISMATCH: {record.method} {record.mode} B={record.batch_size} batch {record.batch_index} "
            f"row {row} differs from sequential ar at token {record.first_mismatch[row]}",
            file=sys.stderr,
        )
    return EXIT_MISMATCH if bad else 0
