"""The engine's own time per step: everything but the target's forward, at a steady batch size.

    python benches/bench_engine_overhead.py --batch 16 --prompts 32 --max-new-tokens 48 --threads 2

runs ``generate_batch(max_batch_size=B)`` on SmolLM2-135M-Instruct (``--model``; bfloat16;
Spec-Bench first turns with the chat template, or ``--data``'s) for each method, methods
interleaved over ``--rounds``, and prints, per method: steps, mean live rows, milliseconds per
step, of which the forward and the rest (drafting, the cut, the mask, acceptance, commit,
admission's prefills excluded), and the rest as a share of the step. The issue's goal: below
10% at B = 16.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

import racer_rs
from racer_rs.bench.prompting import encode_conversation
from racer_rs.bench.prompts import load_benchmark
from racer_rs.cli.resources import DEFAULT_BENCH_DATA, resolve_shipped
from racer_rs.engine import generation


def measure(model: Any, prompts: list[list[int]], label: str, batch: int, new_tokens: int) -> dict[str, float]:
    """One run of ``label`` (``method@capacity``); per-step times of the decode steps."""
    method, _, capacity = label.partition("@")
    steps: list[tuple[float, float, int]] = []
    real = generation.DecodeEngine

    class Timed(real):  # type: ignore[misc, valid-type]
        def step(self) -> None:
            rows = len(self.live)
            forward = self.verifier.model_seconds
            started = time.perf_counter()
            super().step()
            steps.append((time.perf_counter() - started, self.verifier.model_seconds - forward, rows))

    generation.DecodeEngine = Timed  # type: ignore[misc]
    try:
        racer_rs.generate_batch(
            model,
            prompts,
            method=method,
            capacity=int(capacity) if capacity.isdigit() else (capacity or "auto"),
            max_new_tokens=new_tokens,
            max_batch_size=batch,
        )
    finally:
        generation.DecodeEngine = real  # type: ignore[misc]
    full = [s for s in steps if s[2] == batch] or steps  # the steady part: every row live
    step_ms = 1000 * statistics.fmean(s[0] for s in full)
    forward_ms = 1000 * statistics.fmean(s[1] for s in full)
    return {
        "steps": len(full),
        "rows": statistics.fmean(s[2] for s in full),
        "step_ms": step_ms,
        "forward_ms": forward_ms,
        "rest_ms": step_ms - forward_ms,
        "rest_share": (step_ms - forward_ms) / step_ms,
    }


def chat_prompts(tokenizer: Any, count: int, data: list[str] | None = None) -> list[list[int]]:
    """``count`` prompts: the first turns of ``data`` (the shipped Spec-Bench by default) with
    the chat template, repeated."""
    questions = load_benchmark([resolve_shipped(p, "data") for p in (data or DEFAULT_BENCH_DATA)], None)
    prompts = [encode_conversation(tokenizer, q.turns[:1], []) for q in questions if q.mode != "completion"]
    return (prompts * (1 + count // max(1, len(prompts))))[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--methods", default="ar,racer@auto,racer@8,pld@8")
    parser.add_argument("--data", nargs="+", help="prompt sets (default: the shipped Spec-Bench)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = racer_rs.load_model(args.model, dtype=args.dtype)
    prompts = chat_prompts(tokenizer, args.prompts, args.data)
    labels = [m.strip() for m in args.methods.split(",")]
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    measure(model, prompts[: args.batch], labels[0], args.batch, 8)  # warm-up (and auto's cost curves)
    for round_index in range(args.rounds):
        for label in labels[round_index % len(labels) :] + labels[: round_index % len(labels)]:
            runs[label].append(measure(model, prompts, label, args.batch, args.max_new_tokens))
    setup = f"{args.prompts} prompts x {args.max_new_tokens} tokens, {args.dtype}, {args.threads} threads"
    print(f"B={args.batch}, {setup}")
    print(f"{'method':<14} {'steps':>6} {'rows':>5} {'ms/step':>8} {'forward':>8} {'rest':>7} {'rest %':>7}")
    for label, results in runs.items():
        mean = {key: statistics.fmean(r[key] for r in results) for key in results[0]}
        print(
            f"{label:<14} {mean['steps']:>6.0f} {mean['rows']:>5.1f} {mean['step_ms']:>8.1f} "
            f"{mean['forward_ms']:>8.1f} {mean['rest_ms']:>7.1f} {100 * mean['rest_share']:>6.1f}%"
        )
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
