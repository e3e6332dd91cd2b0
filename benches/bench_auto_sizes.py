"""Which tree sizes ``capacity="auto"`` picks, per method and decoding mode, on one model.

Runs ``generate(capacity="auto")`` on the first ``--limit`` questions of a prompt file (first
turn; the model's chat template where it has one) and prints, per method and mode: the histogram
of chosen sizes, predicted and observed tokens per step, and the cost curve it used. Example
(the 7M test model, float32, one thread):

    python benches/bench_auto_sizes.py --model pycode-target-7m --data data/code_completion.jsonl \\
        --limit 4 --max-new-tokens 128 --threads 1
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter

import numpy as np
import torch

import racer_rs
from racer_rs.bench.prompting import encode_conversation
from racer_rs.bench.prompts import load_questions


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
    print("reproduce: python " + " ".join(shlex.quote(a) for a in sys.argv), flush=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = racer_rs.load_model(args.model, dtype=args.dtype, device="cpu")
    prompts = [encode_conversation(tokenizer, [q.turns[0]], []) for q in load_questions(args.data)[: args.limit]]
    for temperature in (0.0, 0.8):
        for method in args.methods.split(","):
            sizes: Counter[int] = Counter()
            predicted, observed = [], []
            for seed, ids in enumerate(prompts):
                result = racer_rs.generate(
                    model,
                    ids,
                    method=method,
                    capacity="auto",
                    max_capacity=args.max_capacity,
                    max_new_tokens=args.max_new_tokens,
                    temperature=temperature,
                    top_p=0.95 if temperature else 1.0,
                    seed=seed,
                    eos_token_id=tokenizer.eos_token_id,
                )
                report = result.extras["auto_capacity"]
                sizes.update(report["chosen_sizes"])
                predicted.append(report["predicted_tokens_per_step"] * report["steps"])
                observed.append(report["observed_tokens_per_step"] * report["steps"])
            steps = sum(sizes.values())
            mode = "greedy" if temperature == 0 else f"T={temperature:g}, top-p 0.95"
            print(f"\n{args.model} {args.dtype} {args.threads}t, {method}, {mode}: {steps} steps")
            print("  sizes chosen:", dict(sorted(sizes.items())))
            print(
                f"  tokens per step: predicted {np.sum(predicted) / steps:.2f}, observed {np.sum(observed) / steps:.2f}"
            )
            print("  cost curve (ms):", report["cost_curve_ms"])


if __name__ == "__main__":
    main()
