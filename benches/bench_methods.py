"""Every drafting method side by side on the reference model (issue 3's benchmark).

Runs the first ``--limit`` prompts of ``code_completion.jsonl`` and ``human_eval.jsonl`` (raw
text, ``turns[0]``), up to 256 new tokens, greedy and sampling (temperature 0.8, top-p 0.95,
seed = prompt index), and prints per method and setting: MAT, tokens/s (prefill included),
decode tokens/s, speedup over ``ar`` from the same run, and the fraction of step time spent
outside the target's forward pass. Methods run round-robin per prompt, so load from other
processes hits them alike. Drafter state is per request (not persistent).

Example:
    python benches/bench_methods.py --limit 4 --out bench.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SHARED = REPO_ROOT  # the repository ships models/ and data/
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "sampling": {"temperature": 0.8, "top_p": 0.95},
}


@dataclass
class Tally:
    """Accumulated results of one method configuration in one setting."""

    tokens: int = 0
    steps: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    tree_nodes: float = 0.0

    def add(self, result: Any) -> None:
        self.tokens += len(result.tokens)
        self.steps += result.steps
        self.tree_nodes += result.extras["mean_tree_size"] * result.steps
        for key, value in result.timings.items():
            self.timings[key] = self.timings.get(key, 0.0) + value

    def summary(self, ar_seconds: float | None) -> dict[str, float]:
        total = self.timings["total"]
        step_time = self.timings["draft"] + self.timings["verify"] + self.timings["bookkeeping"]
        return {
            "tokens": self.tokens,
            "steps": self.steps,
            "mat": self.tokens / self.steps,
            "mean_tree_size": self.tree_nodes / self.steps,
            "tokens_per_s": self.tokens / total,
            "decode_tokens_per_s": self.tokens / (total - self.timings["prefill"]),
            "speedup_vs_ar": (ar_seconds / total) if ar_seconds else float("nan"),
            "outside_forward": (step_time - self.timings["forward"]) / step_time,
            "seconds": total,
            "prefill_seconds": self.timings["prefill"],
        }


def load_prompts(data_dir: Path, limit: int, tokenizer: Any) -> list[tuple[str, list[int]]]:
    """The first ``limit`` prompts of each dataset, tokenized from their raw text."""
    prompts = []
    for name in ("code_completion", "human_eval"):
        with (data_dir / f"{name}.jsonl").open() as handle:
            for index, line in zip(range(limit), handle, strict=False):
                prompts.append((f"{name}/{index}", tokenizer(json.loads(line)["turns"][0])["input_ids"]))
    return prompts


def method_configs(methods: list[str], capacities: list[int], default_capacity: int) -> list[tuple[str, str, int]]:
    """``(label, method, capacity)`` for every run; racer gets one run per capacity."""
    configs = []
    for method in methods:
        swept = method in ("racer", "racer_scored")
        for capacity in capacities if swept else [default_capacity]:
            label = f"{method}@{capacity}" if swept else method
            configs.append((label, method, capacity))
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

    import racer_rs

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = load_prompts(args.data, args.limit, tokenizer)
    methods = args.methods.split(",")
    if "ar" not in methods:
        methods.insert(0, "ar")
    configs = method_configs(methods, [int(c) for c in args.capacities.split(",")], args.capacity)
    for _, method, capacity in configs:  # warm-up (allocations, lazy imports)
        racer_rs.generate(model, prompts[0][1][:64], method=method, capacity=capacity, max_new_tokens=16)

    command = " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv])
    report: dict[str, Any] = {"command": command, "state": "per-request", "threads": args.threads, "settings": {}}
    started = time.perf_counter()
    for setting in args.settings.split(","):
        tallies = {label: Tally() for label, _, _ in configs}
        for index, (_, prompt) in enumerate(prompts):
            for label, method, capacity in configs:
                result = racer_rs.generate(
                    model,
                    prompt,
                    method=method,
                    capacity=capacity,
                    max_new_tokens=args.max_new_tokens,
                    seed=index,
                    **SETTINGS[setting],
                )
                tallies[label].add(result)
        ar_seconds = tallies["ar"].timings["total"]
        rows = {label: tally.summary(ar_seconds) for label, tally in tallies.items()}
        report["settings"][setting] = rows
        print_table(setting, rows)
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
