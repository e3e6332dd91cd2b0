"""Sampling on a CPU: the walk drawing only the nodes it reaches against drawing every node.

    python benches/bench_sampling_walk.py --methods racer,suffix,ar --prompts 16 --threads 2

runs ``generate`` (batch 1) or ``generate_batch`` (``--batch B``) on SmolLM2-135M-Instruct
(bfloat16, Spec-Bench first turns with the chat template, T=0.8, top-p 0.95) for each method with
the engine as it is (on a CPU it draws each step's roots with the step and deeper nodes only when
the acceptance walk reaches them) and with every node drawn up front (the engine's way on other
devices, and on the CPU before), alternating which goes first per prompt. Prints tokens/s per
method and variant, their ratio, milliseconds per step, and how many outputs are identical (a
node's draw reads the same uniform either way).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time

import torch

import racer_rs
from bench_engine_overhead import chat_prompts  # benches/ is the script's folder
from racer_rs.engine import decode_engine
from racer_rs.engine.generation import generate, generate_batch

LAZY = decode_engine.LAZY_DRAW_NODES_PER_ROW


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="racer,suffix,ar")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1, help="1: generate; more: generate_batch(max_batch_size=B)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("command:", shlex.join(["python", *sys.argv]), flush=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = racer_rs.load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
    prompts = chat_prompts(tokenizer, args.prompts)
    options = {"max_new_tokens": args.max_new_tokens, "temperature": 0.8, "top_p": 0.95}
    methods = args.methods.split(",")
    # Nodes per row above which only the reached nodes are drawn (infinite: every node, always).
    variants = {"reached only": LAZY, "every node": math.inf}
    totals = {(m, v): [0.0, 0, 0] for m in methods for v in variants}
    same = dict.fromkeys(methods, 0)
    groups = [prompts[i : i + args.batch] for i in range(0, len(prompts), args.batch)]
    for method in methods:  # warm-up, untimed (a batch's first call measures its cost curves)
        for variant in variants.values():
            decode_engine.LAZY_DRAW_NODES_PER_ROW = variant  # type: ignore[assignment]
            generate_batch(model, groups[0], method=method, seed=0, max_batch_size=args.batch, **options)
    for index, group in enumerate(groups):
        for method in methods:
            outputs = {}
            for variant in list(variants)[:: 1 if index % 2 == 0 else -1]:
                decode_engine.LAZY_DRAW_NODES_PER_ROW = variants[variant]  # type: ignore[assignment]
                started = time.perf_counter()
                if args.batch == 1:
                    results = [generate(model, group[0], method=method, seed=index, **options)]
                else:
                    results = generate_batch(
                        model, group, method=method, seed=index, max_batch_size=args.batch, **options
                    )
                seconds = time.perf_counter() - started
                total = totals[(method, variant)]
                total[0] += seconds
                total[1] += sum(len(r.tokens) for r in results)
                total[2] += sum(r.steps for r in results)
                outputs[variant] = [list(r.tokens) for r in results]
            same[method] += sum(a == b for a, b in zip(*outputs.values(), strict=True))
    decode_engine.LAZY_DRAW_NODES_PER_ROW = LAZY
    print("| method | variant | tokens/s | ms/step | identical outputs |")
    print("|---|---|---|---|---|")
    for method in methods:
        for variant in variants:
            seconds, tokens, steps = totals[(method, variant)]
            rate, step_ms = tokens / seconds, 1e3 * seconds / steps
            print(f"| {method} | {variant} | {rate:.2f} | {step_ms:.2f} | {same[method]}/{len(prompts)} |")
        ratio = (totals[(method, "reached only")][1] / totals[(method, "reached only")][0]) / (
            totals[(method, "every node")][1] / totals[(method, "every node")][0]
        )
        print(f"| {method} | reached only / every node | {ratio:.3f}x | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
