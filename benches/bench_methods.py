"""Every drafting method side by side on the reference model (issue 3's benchmark).

Runs the first ``--limit`` prompts of ``code_completion.jsonl`` and ``human_eval.jsonl`` (raw
text, ``turns[0]``), up to 256 new tokens, greedy and sampling (temperature 0.8, top-p 0.95,
seed = prompt index), and prints per method and setting: MAT, tokens/s (prefill included),
decode tokens/s, speedup over ``ar`` (per request, geometric mean; ``racer_rs.bench.api``), and
the fraction of step time spent outside the target's forward pass. Methods run interleaved per
prompt (``ar`` first and last, the others in a rotating order), so load from other processes
hits them alike; greedy outputs are checked against ``ar``'s. Drafter state is per request (not
persistent).

Example:
    python benches/bench_methods.py --limit 4 --out bench.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from racer_rs.bench.api import BenchResult, MethodSpec, reproduce_command, run_methods, safe_div, timing_totals
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import TokenPrompt, load_questions
from racer_rs.bench.runner import Setting

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SHARED = REPO_ROOT  # the repository ships models/ and data/
SETTINGS: dict[str, Setting] = {
    "greedy": Setting(0.0),
    "sampling": Setting(0.8, top_p=0.95),
}


def row(result: BenchResult, label: str, setting: Setting) -> dict[str, float]:
    """One method's figures in one setting, pooled over the prompts (the engine's timings)."""
    records = result.of(label, setting)
    timings = timing_totals(records)
    tokens = sum(r.new_tokens for r in records)
    steps = sum(r.steps for r in records)
    total = timings["total"]
    step_time = timings["draft"] + timings["verify"] + timings["bookkeeping"]
    return {
        "tokens": tokens,
        "steps": steps,
        "mat": safe_div(tokens, steps),
        "mean_tree_size": safe_div(sum(r.verified_nodes for r in records), steps),
        "tokens_per_s": safe_div(tokens, total),
        "decode_tokens_per_s": safe_div(tokens, total - timings["prefill"]),
        "speedup_vs_ar": result.speedup(label, setting).value,
        "outside_forward": safe_div(step_time - timings["forward"], step_time),
        "seconds": total,
        "prefill_seconds": timings["prefill"],
    }


def load_prompts(data_dir: Path, limit: int, tokenizer: Any) -> list[TokenPrompt]:
    """The first ``limit`` prompts of each dataset, tokenized from their raw text."""
    prompts = []
    for name in ("code_completion", "human_eval"):
        questions = load_questions(data_dir / f"{name}.jsonl")[:limit]
        prompts += [first_turn(tokenizer, question, raw=True, category=name) for question in questions]
    return prompts


def method_configs(methods: list[str], capacities: list[int], default_capacity: int) -> dict[str, MethodSpec]:
    """Label -> configuration for every run; racer and racer_scored get one run per capacity."""
    configs = {}
    for method in methods:
        swept = method in ("racer", "racer_scored")
        for capacity in capacities if swept else [default_capacity]:
            configs[f"{method}@{capacity}" if swept else method] = MethodSpec(method, capacity=capacity)
    return configs


def print_table(setting: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n## {setting}")
    header = (
        f"| {'method':18} | {'MAT':>5} | {'tree':>5} | {'tok/s':>6} | {'decode tok/s':>12} | {'vs ar':>6} "
        f"| {'outside fwd':>11} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for label, row in rows.items():
        print(
            f"| {label:18} | {row['mat']:5.2f} | {row['mean_tree_size']:5.1f} | {row['tokens_per_s']:6.1f} | "
            f"{row['decode_tokens_per_s']:12.1f} | {row['speedup_vs_ar']:5.2f}x | {row['outside_forward']:10.1%} |"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=5, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--methods", default="ar,pld,token_recycling,racer,racer_scored,racer_retrieval,racer_logits")
    parser.add_argument("--capacities", default="16,32,64", help="capacities swept for racer and racer_scored")
    parser.add_argument("--capacity", type=int, default=64, help="capacity of the other methods")
    parser.add_argument("--settings", default="greedy,sampling")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--model", type=Path, default=DEFAULT_SHARED / "models" / "pycode-target-7m")
    parser.add_argument("--data", type=Path, default=DEFAULT_SHARED / "data")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = load_prompts(args.data, args.limit, tokenizer)
    methods = args.methods.split(",")
    if "ar" not in methods:
        methods.insert(0, "ar")
    configs = method_configs(methods, [int(c) for c in args.capacities.split(",")], args.capacity)
    settings = [SETTINGS[name] for name in args.settings.split(",")]

    command = reproduce_command()
    report: dict[str, Any] = {"command": command, "state": "per-request", "threads": args.threads, "settings": {}}
    started = time.perf_counter()
    # No end-of-sequence id: every answer runs to --max-new-tokens.
    result = run_methods(model, tokenizer, configs, prompts, settings=settings, max_new_tokens=args.max_new_tokens)
    for name, setting in zip(args.settings.split(","), settings, strict=True):
        rows = {label: row(result, label, setting) for label in result.methods}
        report["settings"][name] = rows
        print_table(name, rows)
        note = result.disturbance_note(setting)
        if note:
            print(note)
        mismatches = {label: n for label, n in result.mismatches(setting).items() if n}
        if mismatches:
            print(f"greedy outputs that differ from ar's: {mismatches}")
    print(
        f"\n{len(prompts)} prompts ({args.limit} per dataset), max {args.max_new_tokens} new tokens, "
        f"{args.threads} torch thread(s), per-request drafter state, {time.perf_counter() - started:.0f}s"
    )
    print(f"reproduce: {command}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
