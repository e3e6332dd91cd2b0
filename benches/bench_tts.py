"""Test-Time Speculation on long completions (issue 4's benchmark).

Target ``pycode-target-7m`` and draft ``pycode-draft-1m`` (trained on 128-token windows only)
from the repository's ``models/``; prompts are the first ``--limit`` rows of
``code_completion.jsonl`` (``turns[0]``, cut to their last ``--max-prompt-tokens`` tokens).
Each prompt is completed greedily for ``--max-new-tokens`` (>= 1024) tokens by ``ar``,
``draft_model``, ``tts`` with S = 1, 5, 10 (async), ``tts`` S = 5 sync, and ``racer_tts``
(S = 5); methods run interleaved per prompt (``ar`` first and last, the others in a rotating
order; ``racer_rs.bench.api``) so load from other processes hits them alike.

Reported per method: acceptance length per 128-token bucket of generation position (tokens
committed by the rounds starting in the bucket / those rounds, pooled over prompts), overall
MAT, wall-clock seconds and speedup over ``ar`` (per prompt, geometric mean), and for TTS the
update time, the part of it on the critical path (time blocked at barriers + weight
publication) as a fraction of decode time, and the number of updates. Every method's tokens
are checked against ``ar``'s (greedy must match). Writes ``tts_acceptance.png`` and
``tts_results.json`` to ``--out``. Run:

    python benches/bench_tts.py [--limit 3] [--max-new-tokens 1024] [--threads 1] [--out benches/out]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from racer_rs.bench.api import MethodSpec, reproduce_command, run_methods
from racer_rs.bench.position_buckets import BUCKET, long_generation_row, plot_acceptance
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import TokenPrompt, load_questions
from racer_rs.bench.runner import Record

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT  # the repository ships models/ and data/
DRAFTED = ("draft_model", "tts", "racer_tts")


def method_table(args: argparse.Namespace, draft: Any) -> dict[str, MethodSpec]:
    """Label -> configuration (capacity 64 unless given)."""
    tts = {"canvas": args.canvas, "lr": args.lr, "lam": args.lam}
    table: dict[str, tuple[str, dict[str, Any]]] = {
        "ar": ("ar", {}),
        "draft_model": ("draft_model", {"canvas": args.canvas}),
        "tts_S1": ("tts", tts | {"update_every": 1}),
        "tts_S5": ("tts", tts | {"update_every": 5}),
        "tts_S10": ("tts", tts | {"update_every": 10}),
        "tts_S5_sync": ("tts", tts | {"update_every": 5, "asynchronous": False}),
        "racer": ("racer", {}),
        "racer_tts": ("racer_tts", tts | {"update_every": 5, "capacity": args.capacity}),
    }
    selected = args.methods.split(",") if args.methods else list(table)
    unknown = [m for m in selected if m not in table]
    if unknown:
        sys.exit(f"unknown --methods {unknown}; choose from {list(table)}")
    specs = {}
    for label in ["ar", *[m for m in selected if m != "ar"]]:
        method, options = table[label]
        options = dict(options)
        capacity = options.pop("capacity", 64)
        if method in DRAFTED:
            options["draft_model"] = draft
        specs[label] = MethodSpec(method, options, capacity)
    return specs


def load_prompts(tokenizer: Any, limit: int, max_prompt_tokens: int) -> list[TokenPrompt]:
    """The first ``limit`` rows of code_completion.jsonl, each cut to its last ``max_prompt_tokens`` tokens."""
    questions = load_questions(SHARED / "data" / "code_completion.jsonl")[:limit]
    return [first_turn(tokenizer, q, raw=True, keep_last=max_prompt_tokens) for q in questions]


def progress(record: Record) -> None:
    print(
        f"prompt {record.question_index} ({record.prompt_tokens} tok) {record.method:12s} "
        f"{record.wall_s:6.2f}s MAT {record.mat:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=3, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--canvas", type=int, default=6, help="draft tokens per round")
    parser.add_argument("--capacity", type=int, default=64, help="racer_tts tree capacity")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lam", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--methods", default="", help="comma-separated labels (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benches" / "out")
    args = parser.parse_args()
    if args.max_new_tokens < BUCKET:
        sys.exit("--max-new-tokens must be >= 128")
    torch.set_num_threads(args.threads)
    command = reproduce_command()
    print(f"reproduce: {command}", flush=True)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    models = SHARED / "models"
    target = AutoModelForCausalLM.from_pretrained(models / "pycode-target-7m", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "pycode-draft-1m", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(models / "pycode-target-7m")
    prompts = load_prompts(tokenizer, args.limit, args.max_prompt_tokens)
    methods = method_table(args, draft)

    # Greedy, no end-of-sequence id: every answer runs to --max-new-tokens.
    result = run_methods(target, tokenizer, methods, prompts, max_new_tokens=args.max_new_tokens, progress=progress)
    rows = [
        long_generation_row(label, result.of(label), args.max_new_tokens, result.speedup(label).value)
        for label in result.methods
    ]
    mismatches = result.mismatches()
    note = result.disturbance_note()
    n_buckets = len(rows[0]["buckets"])
    header = f"{'method':12s} {'MAT':>5s} {'sec':>7s} {'speedup':>7s} {'ms/rnd':>6s} " + " ".join(
        f"{i * BUCKET:>5d}" for i in range(n_buckets)
    )
    print("\nacceptance length per 128-token bucket (round start), pooled over prompts")
    print(header)
    for row in rows:
        buckets = " ".join(f"{b:5.2f}" for b in row["buckets"])
        print(
            f"{row['method']:12s} {row['mat']:5.2f} {row['seconds']:7.2f} {row['speedup']:7.2f} "
            f"{row['ms_per_round']:6.2f} {buckets}"
        )
    if note:
        print(note)
    print("\nTTS updates: total update time, time on the critical path (barrier waits + publication)")
    for row in rows:
        if "updates" in row:
            print(
                f"{row['method']:12s} updates {row['updates']:4d}  update {row['update_s']:6.2f}s  "
                f"critical {row['critical_s']:6.3f}s ({100 * row['critical_share']:.1f}% of decode)  "
                f"overlapped {row['overlapped_s']:6.2f}s  mean loss {row['mean_loss']:.3f}"
            )
    static = next((r for r in rows if r["method"] == "draft_model"), None)
    if static is not None:
        print("\nvs the static draft: last-bucket acceptance ratio (goal >= 1.3x), and the round-time increase,")
        print("which also counts what the barrier misses (CPU cores and the GIL shared with the update thread)")
        for row in rows:
            if row["method"].startswith("tts"):
                ratio = row["buckets"][-1] / static["buckets"][-1]
                slower = row["ms_per_round"] / static["ms_per_round"] - 1
                print(f"{row['method']:12s} last bucket {ratio:.2f}x   time per round {100 * slower:+.1f}%")
    print("greedy mismatches vs ar:", dict(mismatches.items()))

    args.out.mkdir(parents=True, exist_ok=True)
    title = "pycode-target-7m + pycode-draft-1m (trained on 128-token windows), greedy"
    plot_acceptance(rows, args.out / "tts_acceptance.png", args.max_new_tokens, title)
    payload = {"command": command, "threads": args.threads, "prompts": len(prompts), "rows": rows}
    (args.out / "tts_results.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out / 'tts_acceptance.png'} and {args.out / 'tts_results.json'}")


if __name__ == "__main__":
    main()
