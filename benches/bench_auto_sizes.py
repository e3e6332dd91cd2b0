"""Which tree sizes ``capacity="auto"`` picks, per method and decoding mode, on one model.

Runs ``generate(capacity="auto")`` on the first ``--limit`` questions of a prompt file (first
turn; the model's chat template where it has one), the methods interleaved per question
(``racer_rs.bench.api``; no ``ar``: nothing is timed against it), and prints, per method and mode:
the histogram of chosen sizes, predicted and observed tokens per step, and the cost curve it used. Example
(the 7M test model, float32, one thread):

    python benches/bench_auto_sizes.py --model pycode-target-7m --data data/code_completion.jsonl \\
        --limit 4 --max-new-tokens 128 --threads 1
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import torch

import racer_rs
from racer_rs.bench.api import MethodSpec, reproduce_command, run_methods
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import load_questions
from racer_rs.bench.runner import Setting

#: Greedy, and sampling at T=0.8 / top-p 0.95.
SETTINGS = (Setting(0.0), Setting(0.8, top_p=0.95))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", default="data/spec_bench.jsonl", help="prompt file (.jsonl, Spec-Bench format)")
    parser.add_argument("--limit", type=int, default=4, help="questions (the file's first)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default="racer,racer_scored")
    parser.add_argument("--max-capacity", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"reproduce: {reproduce_command()}", flush=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = racer_rs.load_model(args.model, dtype=args.dtype, device="cpu")
    prompts = [first_turn(tokenizer, q) for q in load_questions(args.data)[: args.limit]]
    methods = args.methods.split(",")
    result = run_methods(
        model,
        tokenizer,
        {method: MethodSpec(method, capacity="auto") for method in methods},
        prompts,
        settings=SETTINGS,
        max_new_tokens=args.max_new_tokens,
        max_capacity=args.max_capacity,
        eos_token_id=tokenizer.eos_token_id,
        warmup=0,
        with_ar=False,
    )
    for setting in SETTINGS:
        for method in methods:
            reports = [record.extras["auto_capacity"] for record in result.of(method, setting)]
            sizes: Counter[int] = Counter()
            for report in reports:
                sizes.update(report["chosen_sizes"])
            predicted = [report["predicted_tokens_per_step"] * report["steps"] for report in reports]
            observed = [report["observed_tokens_per_step"] * report["steps"] for report in reports]
            steps = sum(sizes.values())
            mode = "greedy" if setting.greedy else f"T={setting.temperature:g}, top-p {setting.top_p:g}"
            print(f"\n{args.model} {args.dtype} {args.threads}t, {method}, {mode}: {steps} steps")
            print("  sizes chosen:", dict(sorted(sizes.items())))
            print(
                f"  tokens per step: predicted {np.sum(predicted) / steps:.2f}, observed {np.sum(observed) / steps:.2f}"
            )
            print("  cost curve (ms):", reports[-1]["cost_curve_ms"])


if __name__ == "__main__":
    main()
