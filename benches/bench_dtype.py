"""bfloat16 against float32 on this machine: speed, and where greedy outputs part.

Three measurements on the same model:

1. rounding noise: at ``--noise-positions`` decode positions, the top-2 logit gap of the same
   position computed by a one-token forward and by a 16-node tree forward (the two paths the
   engine mixes), in each half dtype; its largest change in ulps of the logit row's largest
   magnitude backs ``racer_rs.bench.precision.NEAR_TIE_ULPS``;
2. speed: greedy decoding with every method in float32 and bfloat16, for each thread count,
   interleaved per question (the dtype order rotates; per dtype ``racer_rs.bench``'s runner:
   ``ar`` first and last, the other methods in a rotating order), tokens/s and the bf16/fp32
   ratio;
3. divergence: every method's greedy output against ``ar``'s in the same dtype; at each first
   divergence the reference top-2 gap against the near-tie tolerance (the runner's check).

Example (docs/results.md's dtype table):
    python benches/bench_dtype.py --model smollm2-135m-instruct --threads 1 2
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch

import racer_rs
from racer_rs.autosize.cost_model import synthetic_tree
from racer_rs.bench.api import GREEDY, BenchResult, MethodSpec, method_runner, reproduce_command
from racer_rs.bench.precision import divergence_gap, ulp
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import load_benchmark
from racer_rs.bench.runner import BASELINE, Record
from racer_rs.loading.models import load_model
from racer_rs.target.verifier import TreeVerifier

REPO_DATA = "data/spec_bench.jsonl"


def rounding_noise(model: Any, prompts: list[list[int]], positions: int) -> dict[str, float]:
    """Change of the top-2 gap between a one-token and a 16-node tree forward, in logits and ulps."""
    eps = float(torch.finfo(next(model.parameters()).dtype).eps)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    shape = synthetic_tree(16, vocab)
    changes, in_ulps = [], []
    per_prompt = max(1, positions // len(prompts))
    for prompt in prompts:
        verifier = TreeVerifier(model)
        token = int(verifier.prefill(np.asarray(prompt, dtype=np.int32)).last_logits.argmax())
        for _ in range(per_prompt):
            tokens = shape.tokens.copy()
            tokens[0] = token
            tree = racer_rs.DraftTree(tokens, shape.parents)
            in_tree = verifier.forward_tree(tree.tokens, tree.depths, tree.attention_mask())[0].float()
            verifier.discard_uncommitted()
            alone = verifier.forward_tree(tokens[:1], tree.depths[:1], None)[0].float()
            first, second = torch.topk(alone, 2).indices.tolist()
            change = abs(float(alone[first] - alone[second]) - float(in_tree[first] - in_tree[second]))
            changes.append(change)
            in_ulps.append(change / ulp(float(alone.abs().max()), eps))
            verifier.commit(np.asarray([0]))
            token = first
    return {
        "positions": len(changes),
        "max_change": max(changes),
        "median_change": float(np.median(changes)),
        "max_ulps": max(in_ulps),
        "p99_ulps": float(np.quantile(in_ulps, 0.99)),
    }


def divergence(model: Any, dtype: str, record: Record, reference: Record) -> dict[str, Any] | None:
    """Where a greedy output parts from ``ar``'s, with the reference top-2 gap and the near-tie
    tolerance there (the runner measured them in half precision; measured here otherwise)."""
    at = record.first_mismatch
    if at is None or at >= min(len(record.tokens), len(reference.tokens)):
        return None
    gap, tolerance = record.tie_gap, record.tie_tolerance
    if gap is None or tolerance is None:
        gap, tolerance = divergence_gap(
            model, reference.prompt_ids + reference.tokens[:at], reference.tokens[at], record.tokens[at]
        )
    return {
        "dtype": dtype,
        "method": record.method,
        "question": record.question_id,
        "category": record.category,
        "position": at,
        "gap": gap,
        "tolerance": tolerance,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--data", default=REPO_DATA)
    parser.add_argument("--limit", type=int, default=1, help="questions per Spec-Bench group")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default="ar,pld,token_recycling,racer,racer_scored")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--noise-positions", type=int, default=240)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    methods = args.methods.split(",")

    models = {dtype: load_model(args.model, dtype=dtype) for dtype in ("float32", "bfloat16", "float16")}
    tokenizer = models["float32"][1]
    eos = tokenizer.eos_token_id
    questions = load_benchmark([args.data], args.limit)
    prompts = [first_turn(tokenizer, q) for q in questions]
    results: dict[str, Any] = {"model": args.model, "noise": {}, "speed": {}, "divergences": []}

    torch.set_num_threads(1)
    for dtype in ("bfloat16", "float16"):
        noise = rounding_noise(models[dtype][0], [list(p.ids) for p in prompts], args.noise_positions)
        results["noise"][dtype] = noise
        print(
            f"{dtype}: top-2 gap change, one-token vs 16-node tree forward, over {noise['positions']} positions: "
            f"max {noise['max_change']:.4f} ({noise['max_ulps']:.1f} ulps), median {noise['median_change']:.4f}, "
            f"p99 {noise['p99_ulps']:.1f} ulps",
            flush=True,
        )
    del models["float16"]

    configs = {method: MethodSpec(method) for method in methods}
    for threads in args.threads:
        torch.set_num_threads(threads)
        runners = {
            dtype: method_runner(
                model,
                tokenizer,
                configs,
                max_new_tokens=args.max_new_tokens,
                capacity=args.capacity,
                eos_token_id=eos,
                warmup=0,
            )
            for dtype, (model, _) in models.items()
        }
        drafters = {dtype: runner.build_drafters() for dtype, runner in runners.items()}
        for index, prompt in enumerate(prompts):
            dtypes = list(models)[index % 2 :] + list(models)[: index % 2]
            for dtype in dtypes:
                records = runners[dtype].run_question(index, prompt, GREEDY, drafters[dtype])
                reference = next((r for r in records if r.method == BASELINE and r.ar_pass == 0), None)
                if threads != args.threads[0] or reference is None:
                    continue  # divergences are listed for the first thread count (and a skipped prompt has none)
                for record in records:
                    found = divergence(models[dtype][0], dtype, record, reference) if record.mismatch else None
                    if found is not None:
                        results["divergences"].append(found)
        runs_of = {dtype: BenchResult.from_runner(runner) for dtype, runner in runners.items()}
        speed = {f"{d}/{m}": runs_of[d].metrics(m)["tokens_per_s"] for d in models for m in methods}
        results["speed"][f"{threads}t"] = speed
        print(f"\n{threads} thread(s): tokens/s (greedy, prefill included)")
        for method in methods:
            fp32, bf16 = speed[f"float32/{method}"], speed[f"bfloat16/{method}"]
            print(f"  {method:16s} float32 {fp32:6.1f}  bfloat16 {bf16:6.1f}  bf16/fp32 {bf16 / fp32:.2f}x", flush=True)

    runs = len(prompts) * len(methods)
    for dtype in models:
        mine = [d for d in results["divergences"] if d["dtype"] == dtype]
        within = sum(abs(d["gap"]) <= d["tolerance"] for d in mine)
        print(f"\n{dtype}: {len(mine)} of {runs} greedy outputs part from {dtype} ar; {within} at near-ties")
        for d in mine:
            print(
                f"  {d['method']:16s} q{d['question']} ({d['category']}) token {d['position']}: "
                f"gap {d['gap']:.4f}, tolerance {d['tolerance']:.4f}"
            )
    print(f"\nmodel {args.model}; reproduce: {reproduce_command()}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
