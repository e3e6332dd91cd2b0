"""Throughput of ``racer_rs.generate_batch``: batched RACER (fixed 16 and auto) against batched
``ar`` and against sequential decoding of the same prompts, on SmolLM2-135M-Instruct.

A thin front for ``racer bench --batch-size`` (:mod:`racer_rs.bench.batch_throughput`) with this benchmark's
settings: bfloat16, Spec-Bench first turns (categories interleaved, so a batch mixes long and short
prompts), B = 4 and 8, greedy, methods ``ar,racer@16,racer@auto``, every mode interleaved per
batch; greedy rows are checked against sequential ``ar``. The goals: batched ``racer@auto`` at
least 1.2x batched ``ar`` at B = 4 and never below it at B = 8, and batched racer at least twice
sequential racer's tokens/s. Example:

    python benches/bench_batch.py --limit 4 --threads 2 --out bench_out/batch

prints the table (tokens/s, MAT, speedups) and the load average seen before and after, and
writes ``bench_batch.json`` under ``--out``. Its first run measures auto's batched cost curves
(cached afterwards under ``$RACER_RS_CACHE``).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from racer_rs.cli import main as racer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", default="data/spec_bench.jsonl")
    parser.add_argument("--limit", type=int, default=4, help="questions per Spec-Bench group (6 groups)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--methods", default="ar,racer@16,racer@auto")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-capacity", type=int, default=32, help="largest tree auto may verify per row")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default="bench_out/batch")
    args = parser.parse_args()
    argv = [
        "bench",
        "--batch-size",
        *map(str, args.batch_size),
        "--model",
        args.model,
        "--data",
        args.data,
        "--limit",
        str(args.limit),
        "--methods",
        args.methods,
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--max-capacity",
        str(args.max_capacity),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--warmup",
        str(args.warmup),
        "--temperature",
        "0",
        "--out",
        args.out,
    ]
    print("reproduce: python " + " ".join(shlex.quote(a) for a in sys.argv), flush=True)
    print("runs: racer " + " ".join(shlex.quote(a) for a in argv), flush=True)
    return racer(argv)


if __name__ == "__main__":
    sys.exit(main())
