"""The target's forward cost per draft-tree size, per dtype and thread count.

Times one verification forward (tree mask, KV cache) of n = 1, 2, 4, ..., 64 tree tokens after a
``--context``-token prefix, for every ``--dtype`` x ``--threads`` combination, and prints the
milliseconds and the ratio to n = 1: how much a bigger tree costs on this machine.

Half-precision weights are packed as ``load_model`` packs them (``--no-pack-weights``: torch's own
layers; ``benches/bench_packed_linear.py`` puts the two side by side).

Example (docs/results.md's cost table, SmolLM2-135M-Instruct on this CPU):
    python benches/bench_forward_cost.py --model smollm2-135m-instruct --dtype float32 bfloat16 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

import torch

from racer_rs.autosize.cost_model import DEFAULT_SIZES, measure_forward_cost
from racer_rs.loading.models import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--context", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", help="write the curves as JSON here")
    parser.add_argument(
        "--no-pack-weights", dest="pack_weights", action="store_false", help="keep torch's own linear layers"
    )
    args = parser.parse_args()

    curves = {}
    for dtype in args.dtype:
        model, _ = load_model(args.model, dtype=dtype, pack_weights=args.pack_weights)
        for threads in args.threads:
            torch.set_num_threads(threads)
            cost = measure_forward_cost(model, args.sizes, context=args.context, rounds=args.rounds)
            curves[f"{dtype}/{threads}t"] = cost
            ms = "  ".join(f"{n}:{1000 * t:.1f}" for n, t in cost.items())
            ratio = "  ".join(f"{n}:{t / cost[min(cost)]:.2f}x" for n, t in cost.items())
            print(f"{dtype:9s} {threads} thread(s)  ms  {ms}\n{'':22s}ratio {ratio}", flush=True)
    print(f"\nmodel {args.model}, context {args.context} tokens, median of {args.rounds} interleaved rounds")
    print("reproduce: python " + shlex.join(sys.argv))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"model": args.model, "context": args.context, "curves": curves}, handle, indent=1)


if __name__ == "__main__":
    main()
