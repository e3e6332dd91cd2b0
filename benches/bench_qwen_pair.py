"""A real target/draft pair on long code generations: Qwen2.5-Coder-1.5B-Instruct drafted by the 0.5B.

Target ``qwen2.5-coder-1.5b-instruct`` (22 part packages), draft ``qwen2.5-coder-0.5b-instruct``
(6 part packages; same tokenizer), prompts: the first ``--limit`` tasks of ``data/long_code.jsonl``
(each asks for a complete module with its tests and docs, answers of 1,000+ tokens; chat
template, first turn). Each prompt is continued for exactly ``--max-new-tokens`` tokens (the
end-of-turn token does not stop generation unless ``--stop-at-eos``; where ``ar``'s answer ends
early is reported), so every method decodes the same length and late buckets have samples.
Methods run interleaved per prompt (``ar`` first and last, the others in a rotating order;
``racer_rs.bench.api``), so load from other processes hits them alike; sampling uses the same
seed per prompt for every method.

Methods (labels; ``--methods`` selects; ``ar`` always runs):

* ``ar``: plain decoding, the reference (greedy outputs of every method are checked against it);
* ``draft_model``: the static 0.5B drafting ``--canvas`` tokens per round;
* ``tts_S1``, ``tts_S5``: the 0.5B adapted online (TTS, asynchronous) every 1 or 5 rounds; the
  trainable part is ``--trainable`` (default ``last:4``, the last four decoder layers and the final
  norm: TTS keeps a serving and a shadow copy of the draft, and Adam's state of the whole 0.5B
  would not fit next to the 1.5B in 24 GB);
* optional ``racer`` and ``racer_tts`` (RACER's tree, and with the adapted draft's chain merged in).

Reported per temperature (greedy, and T=0.8 / top-p 0.95 by default): acceptance length per
``--bucket``-position bucket (tokens committed by the rounds starting in the bucket / those
rounds, pooled over prompts; ``racer_rs.bench.position_buckets``), MAT, tokens/s and speedup
over ``ar`` (per prompt, geometric mean), and
what a round costs: the draft's ms per drafted token, the target's verification ms per round,
``ar``'s ms per token, and the *break-even accepted length* L* = (ms per round) / (``ar``'s ms per
token): a method beats ``ar`` exactly when its MAT exceeds L*. Where it does not, the report says by
how much (MAT / L*, and the tokens per round it is short). For TTS, its update work on the
critical path. Writes ``qwen_pair_results.json`` (and a plot per temperature) to ``--out``.

``--forward-cost`` instead measures the 1.5B's forward cost curve: one verification forward of n
tree tokens at a ``--context``-token prefix, for n in ``--sizes`` (default 1..64), as ms and
t(n)/t(1) (``racer_rs.autosize.cost_model.measure_forward_cost``, the curve capacity="auto" uses).

Examples (the full run takes hours on a 2-core CPU: about 0.3 to 0.5 s per 1.5B token in float32;
run the smoke test first):

    python benches/bench_qwen_pair.py --limit 3 --max-new-tokens 1024        # the measurement
    python benches/bench_qwen_pair.py --limit 1 --max-new-tokens 32 --bucket 16 --temperatures 0  # smoke
    python benches/bench_qwen_pair.py --forward-cost --threads 1 2            # t(n)/t(1), n = 1..64
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

import racer_rs
from racer_rs.bench.api import MethodSpec, reproduce_command, run_methods, safe_div
from racer_rs.bench.position_buckets import long_generation_row, plot_acceptance
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import TokenPrompt, load_questions
from racer_rs.bench.runner import Record, Setting

ROOT = Path(__file__).resolve().parents[1]
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
LABELS = ("ar", "draft_model", "tts_S1", "tts_S5", "racer", "racer_tts")
DEFAULT_METHODS = "draft_model,tts_S1,tts_S5"


def trainable_names(draft: Any, spec: str) -> str | list[str]:
    """``--trainable``: ``all``, ``no_embeddings``, or ``last:K`` (the last K layers + final norm)."""
    if spec in ("all", "no_embeddings"):
        return spec
    if spec.startswith("last:") and spec[5:].isdigit() and int(spec[5:]) >= 1:
        layers = draft.config.num_hidden_layers
        keep = min(int(spec[5:]), layers)
        return [f"model.layers.{i}." for i in range(layers - keep, layers)] + ["model.norm."]
    sys.exit(f"--trainable must be all, no_embeddings or last:K, got {spec!r}")


def method_table(args: argparse.Namespace, trainable: str | list[str]) -> dict[str, tuple[str, bool, dict[str, Any]]]:
    """Label -> (method, uses the draft, options)."""
    tts = {"canvas": args.canvas, "lr": args.lr, "trainable": trainable}
    table: dict[str, tuple[str, bool, dict[str, Any]]] = {
        "ar": ("ar", False, {}),
        "draft_model": ("draft_model", True, {"canvas": args.canvas}),
        "tts_S1": ("tts", True, tts | {"update_every": 1}),
        "tts_S5": ("tts", True, tts | {"update_every": 5}),
        "racer": ("racer", False, {"capacity": args.capacity}),
        "racer_tts": ("racer_tts", True, tts | {"update_every": 5, "capacity": args.capacity}),
    }
    selected = [m for m in args.methods.split(",") if m]
    unknown = [m for m in selected if m not in table]
    if unknown:
        sys.exit(f"unknown --methods {unknown}; choose from {list(LABELS)}")
    return {label: table[label] for label in ["ar", *[m for m in selected if m != "ar"]]}


def specs(methods: dict[str, tuple[str, bool, dict[str, Any]]], draft: Any, canvas: int) -> dict[str, MethodSpec]:
    """The run's configurations: the draft put in where a label uses it, capacity canvas + 1 unless given."""
    configs = {}
    for label, (method, uses_draft, options) in methods.items():
        options = dict(options)
        capacity = options.pop("capacity", canvas + 1)
        if uses_draft:
            options["draft_model"] = draft
        configs[label] = MethodSpec(method, options, capacity)
    return configs


def load_prompts(tokenizer: Any, limit: int) -> list[TokenPrompt]:
    """The first ``limit`` long_code tasks, their first turn only."""
    questions = load_questions(ROOT / "data" / "long_code.jsonl")[:limit]
    return [first_turn(tokenizer, q) for q in questions]


def row(
    label: str, records: list[Record], args: argparse.Namespace, speedup: float, ar_ms_per_token: float, drafts: bool
) -> dict[str, Any]:
    """One method's row, with what a drafted token costs and the break-even accepted length."""
    row = long_generation_row(label, records, args.max_new_tokens, speedup, args.bucket)
    n_rounds = sum(len(r.accepted_lengths) for r in records)
    # The canvas is cut only near the end of a request; canvas tokens per round is close enough.
    row["draft_ms_per_token"] = safe_div(1000 * row["draft_s"], n_rounds * args.canvas) if drafts else 0.0
    row["break_even"] = row["ms_per_round"] / ar_ms_per_token
    row["pays"] = row["mat"] > row["break_even"]
    return row


def print_table(rows: list[dict[str, Any]], temperature: float, args: argparse.Namespace, ar_ms: float) -> None:
    n_buckets = len(rows[0]["buckets"])
    setting = "greedy" if temperature == 0 else f"T={temperature:g} / top-p {args.top_p:g}"
    print(f"\n== {setting}: acceptance length per {args.bucket}-position bucket (round start), pooled over prompts")
    print(f"reproduce: {reproduce_command(temperatures=f'{temperature:g}')}")
    print(
        f"{'method':12s} {'MAT':>5s} {'tok/s':>6s} {'vs ar':>6s} {'draft ms/tok':>12s} {'verify ms/rnd':>13s} "
        f"{'ms/rnd':>7s} {'L*':>5s} " + " ".join(f"{i * args.bucket:>6d}" for i in range(n_buckets))
    )
    for row in rows:
        buckets = " ".join(f"{b:6.2f}" for b in row["buckets"])
        print(
            f"{row['method']:12s} {row['mat']:5.2f} {row['tokens_per_s']:6.2f} {row['speedup']:5.2f}x "
            f"{row['draft_ms_per_token']:12.1f} {row['verify_ms_per_round']:13.1f} {row['ms_per_round']:7.1f} "
            f"{row['break_even']:5.2f} {buckets}"
        )
    print(f"{'(rounds per bucket)':12s} " + " ".join(str(r) for r in rows[-1]["bucket_rounds"]))
    print(f"ar: {ar_ms:.1f} ms per target token (decode); L* = ms per round / that = the MAT a method needs to tie ar")
    for row in rows:
        if "updates" in row:
            print(
                f"{row['method']:12s} updates {row['updates']:5d}  update {row['update_s']:7.2f}s  critical "
                f"{row['critical_s']:6.3f}s = {100 * row['critical_share']:.1f}% of decode  "
                f"mean loss {row['mean_loss']:.3f}"
            )
    for row in rows:
        if row["method"] == "ar":
            continue
        if row["pays"]:
            print(f"{row['method']:12s} pays for itself: MAT {row['mat']:.2f} > L* {row['break_even']:.2f}")
        else:
            ratio = row["draft_ms_per_token"] / ar_ms if row["draft_ms_per_token"] else float("nan")
            print(
                f"{row['method']:12s} does not pay for itself: MAT {row['mat']:.2f} < L* {row['break_even']:.2f} "
                f"({row['break_even'] - row['mat']:.2f} tokens per round short, "
                f"{row['mat'] / row['break_even']:.2f}x of break-even); "
                f"a draft token costs {row['draft_ms_per_token']:.1f} ms = {ratio:.2f} target tokens"
            )
    by = {row["method"]: row for row in rows}
    static = by.get("draft_model")
    if static is not None:
        for label in ("tts_S1", "tts_S5"):
            if label in by and not math.isnan(static["buckets"][-1]):
                ratio = by[label]["buckets"][-1] / static["buckets"][-1]
                print(f"{label}: last-bucket acceptance / static draft = {ratio:.2f}x")


def forward_cost(args: argparse.Namespace) -> None:
    from racer_rs.autosize.cost_model import measure_forward_cost

    sizes = args.sizes or list(range(1, 65))
    curves: dict[str, dict[int, float]] = {}
    for dtype in args.dtype:
        model, _ = racer_rs.load_model(TARGET, dtype=dtype, device=args.device)
        for threads in args.threads:
            torch.set_num_threads(threads)
            start = time.perf_counter()
            cost = measure_forward_cost(model, sizes, context=args.context, rounds=args.rounds)
            curves[f"{dtype}/{threads}t"] = cost
            print(f"{dtype} {threads} thread(s): measured in {time.perf_counter() - start:.0f}s", flush=True)
        del model
    print(
        f"\n== {TARGET}: one verification forward of n tree tokens at a {args.context}-token context, "
        f"ms (t(n)/t(1)), median of {args.rounds} rounds"
    )
    print(f"reproduce: {reproduce_command()}")
    print(f"{'n':>4s} " + " ".join(f"{key:>18s}" for key in curves))
    for n in sizes:
        cells = []
        for cost in curves.values():
            cells.append(f"{1000 * cost[n]:9.1f} ({cost[n] / cost[min(cost)]:5.2f})")
        print(f"{n:4d} " + " ".join(f"{c:>18s}" for c in cells))
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"command": reproduce_command(), "model": TARGET, "context": args.context, "curves": curves}
    (args.out / "qwen_forward_cost.json").write_text(json.dumps(payload, indent=1))
    print(f"wrote {args.out / 'qwen_forward_cost.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=3, help="long_code tasks (prompts)")
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--bucket", type=int, default=256, help="positions per acceptance bucket")
    parser.add_argument("--temperatures", default="0,0.8", help="comma-separated; > 0 samples with --top-p")
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--canvas", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--capacity", type=int, default=16, help="racer / racer_tts tree capacity")
    parser.add_argument("--lr", type=float, default=1e-4, help="TTS learning rate")
    parser.add_argument("--trainable", default="last:4", help="TTS trainable part: all, no_embeddings, last:K")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated, of {','.join(LABELS)}")
    parser.add_argument("--stop-at-eos", action="store_true", help="end each answer at the end-of-turn token")
    parser.add_argument(
        "--dtype", nargs="+", default=["float32"], help="float32 (greedy outputs must equal ar's), bfloat16"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1], help="torch threads (TTS trains on another core)"
    )
    parser.add_argument("--forward-cost", action="store_true", help="measure the 1.5B's t(n)/t(1) instead")
    parser.add_argument("--sizes", type=int, nargs="+", help="--forward-cost tree sizes (default 1..64)")
    parser.add_argument("--context", type=int, default=500, help="--forward-cost prefix tokens")
    parser.add_argument("--rounds", type=int, default=3, help="--forward-cost timed rounds")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benches" / "out")
    args = parser.parse_args()
    print(f"reproduce: {reproduce_command()}", flush=True)
    if args.forward_cost:
        forward_cost(args)
        return
    if len(args.dtype) != 1 or len(args.threads) != 1:
        sys.exit("--dtype and --threads take one value each, except with --forward-cost")
    torch.set_num_threads(args.threads[0])

    start = time.perf_counter()
    target, tokenizer = racer_rs.load_model(TARGET, dtype=args.dtype[0], device=args.device)
    draft, draft_tokenizer = racer_rs.load_model(DRAFT, dtype=args.dtype[0], device=args.device)
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        sys.exit("the draft's tokenizer differs from the target's")
    print(
        f"loaded {TARGET} and {DRAFT} ({args.dtype[0]}, {args.device}) in {time.perf_counter() - start:.0f}s",
        flush=True,
    )
    methods = method_table(args, trainable_names(draft, args.trainable))
    prompts = load_prompts(tokenizer, args.limit)
    eos = tokenizer.eos_token_id if args.stop_at_eos else None
    print(
        f"{len(prompts)} long_code prompts, {args.max_new_tokens} new tokens each, canvas {args.canvas}, "
        f"threads {args.threads[0]}, methods {', '.join(methods)}",
        flush=True,
    )

    def progress(record: Record) -> None:
        print(
            f"{record.setting} task {record.question_id} ({record.prompt_tokens} tok) {record.method:12s} "
            f"{record.wall_s:7.1f}s MAT {record.mat:.2f}",
            flush=True,
        )
        if record.method == "ar" and record.ar_pass == 1 and tokenizer.eos_token_id in record.tokens:
            end = record.tokens.index(tokenizer.eos_token_id) + 1
            print(f"  task {record.question_id}: ar's answer ends (end of turn) at token {end}")

    temperatures = [float(t) for t in args.temperatures.split(",")]
    settings = [Setting(t, args.top_p) if t > 0 else Setting(0.0) for t in temperatures]
    result = run_methods(
        target,
        tokenizer,
        specs(methods, draft, args.canvas),
        prompts,
        settings=settings,
        max_new_tokens=args.max_new_tokens,
        seed=1000,
        eos_token_id=eos,
        progress=progress,
    )
    payload: dict[str, Any] = {
        "command": reproduce_command(),
        "threads": args.threads[0],
        "prompts": len(prompts),
        "runs": {},
    }
    greedy_mismatches = 0
    for temperature, setting in zip(temperatures, settings, strict=True):
        ar = result.of("ar", setting)
        ar_ms = safe_div(
            1000 * sum(r.timings["total"] - r.timings["prefill"] for r in ar), sum(len(r.accepted_lengths) for r in ar)
        )
        rows = [
            row(label, result.of(label, setting), args, result.speedup(label, setting).value, ar_ms, methods[label][1])
            for label in result.methods
        ]
        print_table(rows, temperature, args, ar_ms)
        note = result.disturbance_note(setting)
        if note:
            print(note)
        mismatches = result.mismatches(setting)
        if temperature == 0:
            print("greedy mismatches vs ar:", mismatches)
            greedy_mismatches += sum(mismatches.values())
        payload["runs"][f"T={temperature:g}"] = {
            "rows": rows,
            "ar_ms_per_token": ar_ms,
            "mismatches": mismatches if temperature == 0 else None,
        }
        if not args.no_plots:
            args.out.mkdir(parents=True, exist_ok=True)
            title = f"Qwen2.5-Coder 1.5B target, 0.5B draft, long_code, T={temperature:g}"
            plot_acceptance(rows, args.out / f"qwen_pair_T{temperature:g}.png", args.max_new_tokens, title, args.bucket)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "qwen_pair_results.json").write_text(json.dumps(payload, indent=2, default=float))
    print(f"wrote {args.out / 'qwen_pair_results.json'}")
    if greedy_mismatches and args.dtype[0] == "float32":
        sys.exit("a greedy output differs from ar's in float32: a losslessness bug")


if __name__ == "__main__":
    main()
