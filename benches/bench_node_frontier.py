"""What each verified node buys: ``racer@auto``'s MAT and tokens per verified node as the cost of
a node rises, beside SuffixDecoding's (``suffix``), greedy.

``capacity="auto"`` keeps a node only if its calibrated probability pays for what one more node
costs in the step's forward. This script replaces the measured cost curve by frozen linear curves
``t(n) = 1 + c * (n - 1)`` (in units of a one-token forward; no online correction), so the trees
chosen depend on the node probabilities alone, not on this machine's load: the figures are
reproducible on a noisy machine, and trace the frontier (MAT against tokens per node) the
probabilities allow. A cheap node (small ``c``: a GPU at batch 1) grows trees, a costly one (a
big batch, a serving engine) shrinks them. ``--per-node measured`` adds a run on the model's own
measured curve (with its online corrections; that row depends on the machine's load). Example:

    python benches/bench_node_frontier.py --limit 1 --max-new-tokens 64 --per-node 0,0.02,0.05,0.1,0.2,measured
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import racer_rs
from racer_rs.autosize import state
from racer_rs.autosize.cost_model import CostModel
from racer_rs.bench.api import MethodSpec, reproduce_command, run_methods
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import load_benchmark

SIZES = [1, 2, 4, 8, 16, 32, 64]


def linear_cost(per_node: float) -> CostModel:
    """A frozen curve t(n) = 1 + per_node * (n - 1) at every context length."""
    curve = [1 + per_node * (n - 1) for n in SIZES]
    cost = CostModel(SIZES, {128: curve, 1024: curve})
    cost.observe = lambda *args, **kwargs: None  # type: ignore[method-assign]
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", nargs="+", default=["data/spec_bench.jsonl"])
    parser.add_argument("--limit", type=int, default=1, help="questions per group (first turns)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--methods", default="racer", help="racer methods run at capacity=auto")
    parser.add_argument("--per-node", default="0,0.02,0.05,0.1,0.2,measured", help="node costs c, or measured")
    parser.add_argument("--max-capacity", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"reproduce: {reproduce_command()}", flush=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = racer_rs.load_model(args.model, dtype=args.dtype, device="cpu")
    prompts = [first_turn(tokenizer, q) for q in load_benchmark(args.data, args.limit)]
    measured_cost, save_cost, cache_dir = state.cost_model, state.save_cost_model, state.state_dir
    rows = []
    for index, per_node in enumerate(args.per_node.split(",")):
        # Every curve starts from fresh calibrations (no warm start from another curve's run,
        # in memory or on disk); the measured curve stays in the user's cache.
        state._calibrations.clear()
        with tempfile.TemporaryDirectory() as folder:
            state.state_dir = lambda kind, folder=folder: (  # type: ignore[assignment]
                Path(folder) / kind if kind == "calibration" else cache_dir(kind)
            )
            if per_node == "measured":
                state.cost_model, state.save_cost_model = measured_cost, save_cost  # type: ignore[assignment]
            else:
                # A frozen curve is never stored in place of the model's measured one.
                c = float(per_node)
                state.cost_model = lambda model, max_capacity, c=c: linear_cost(c)  # type: ignore[assignment]
                state.save_cost_model = lambda model, cost: None  # type: ignore[assignment]
            methods: dict[str, MethodSpec | str] = {
                f"{m}@auto": MethodSpec(m, capacity="auto") for m in args.methods.split(",")
            }
            if index == 0:
                methods["suffix"] = MethodSpec("suffix", capacity=16)  # racer bench's CPU capacity
            result = run_methods(
                model,
                tokenizer,
                methods,
                prompts,
                max_new_tokens=args.max_new_tokens,
                max_capacity=args.max_capacity,
                eos_token_id=tokenizer.eos_token_id,
                warmup=0,
                with_ar=False,
            )
        for label in methods:
            records = result.of(label)
            tokens = sum(r.new_tokens for r in records)
            steps = sum(r.steps for r in records)
            nodes = sum(r.verified_nodes for r in records)
            per_request = [r.new_tokens / max(r.verified_nodes, 1) for r in records]
            rows.append((label, "-" if label == "suffix" else per_node, tokens / steps, tokens / nodes, per_request))
            mat, per_node_tokens = tokens / steps, tokens / nodes
            print(f"{label:>16} c={rows[-1][1]:>8}: MAT {mat:.2f}, tok/node {per_node_tokens:.2f}", flush=True)
    print("\nmethod, node cost c (x a one-token forward), MAT, tokens per verified node (pooled; per request min-max)")
    for label, c, mat, per_node_tokens, per_request in rows:
        spread = f"{np.min(per_request):.2f}-{np.max(per_request):.2f}"
        print(f"| `{label}` | {c} | {mat:.2f} | {per_node_tokens:.2f} | {spread} |")


if __name__ == "__main__":
    main()
