"""Test-Time Speculation with a self-draft on SmolLM2-135M-Instruct, long generations (issue 10).

Prompts: the first ``--per-category`` questions of each of the Spec-Bench categories writing,
roleplay and summarization (``data/spec_bench.jsonl``, first turn, chat template). Each is
continued for exactly ``--max-new-tokens`` tokens (>= 768 for the issue's measurement): the
end-of-turn token does not stop generation, so every method decodes the same length and late
position buckets have samples. Greedy, then T=0.8 / top-p 0.95 (``--temperatures``); methods run
interleaved per prompt (``ar`` first and last, the others in a rotating order;
``racer_rs.bench.api``) so load from other processes hits them alike; sampling uses the same seed
per prompt for every method.

Methods (labels; ``--methods`` selects):

* ``ar``: plain decoding (the reference; greedy outputs of every method are checked against it);
* ``self_undistilled``: ``draft_model`` with ``self_draft(target, K, vocab=<the checkpoint's>)``,
  the target's first K layers as they are (same layers and vocabulary as the distilled draft);
* ``distilled``: ``draft_model`` with the distilled checkpoint, static;
* ``distilled_fullvocab``: the distilled layers with the full LM head (what the reduced
  vocabulary costs in acceptance and saves in time);
* ``tts_S1``, ``tts_S5``, ``tts_S10``: ``tts`` from the distilled draft, async, S = 1, 5, 10;
* ``racer``; ``racer_tts``: RACER plus the distilled draft adapted online (S = 5).

Reported per temperature and method: acceptance length per 128-position bucket (tokens committed
by the rounds starting in the bucket / those rounds, pooled over prompts, with the bucket's round
count), MAT, tokens/s and speedup over ``ar`` (per prompt, geometric mean), the draft's ms per
round, and for TTS the update work on the critical path (barrier waits + weight publication) as
a share of decode time. Then the goals: last-bucket ``tts`` / ``distilled`` acceptance
(>= 1.3x), critical share (< 10%), ``racer_tts`` vs the faster of ``racer`` and the best
``tts``. ``--head-timing`` also times one draft forward per token with the full and the reduced
head. Writes ``self_draft_results.json``
(and a plot per temperature) to ``--out``. Example (the smoke run):

    python benches/bench_self_draft.py --checkpoint /tmp/sd4 --per-category 1 --max-new-tokens 64 \\
        --temperatures 0 --methods ar,distilled,tts_S5,racer_tts
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import racer_rs
from racer_rs.bench.api import MethodSpec, reproduce_command, run_methods
from racer_rs.bench.position_buckets import BUCKET, long_generation_row, plot_acceptance
from racer_rs.bench.prompting import first_turn
from racer_rs.bench.prompts import TokenPrompt, load_questions
from racer_rs.bench.runner import Record, Setting

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = ("writing", "roleplay", "summarization")
LABELS = (
    "ar",
    "self_undistilled",
    "distilled",
    "distilled_fullvocab",
    "tts_S1",
    "tts_S5",
    "tts_S10",
    "racer",
    "racer_tts",
)


def method_table(args: argparse.Namespace) -> dict[str, tuple[str, str | None, dict[str, Any]]]:
    """Label -> (method, draft key, options)."""
    tts = {"canvas": args.canvas, "lr": args.lr, "trainable": args.trainable}
    table: dict[str, tuple[str, str | None, dict[str, Any]]] = {
        "ar": ("ar", None, {}),
        "self_undistilled": ("draft_model", "undistilled", {"canvas": args.canvas}),
        "distilled": ("draft_model", "distilled", {"canvas": args.canvas}),
        "distilled_fullvocab": ("draft_model", "distilled_fullvocab", {"canvas": args.canvas}),
        "tts_S1": ("tts", "distilled", tts | {"update_every": 1}),
        "tts_S5": ("tts", "distilled", tts | {"update_every": 5}),
        "tts_S10": ("tts", "distilled", tts | {"update_every": 10}),
        "racer": ("racer", None, {"capacity": args.capacity}),
        "racer_tts": ("racer_tts", "distilled", tts | {"update_every": 5, "capacity": args.capacity}),
    }
    selected = args.methods.split(",") if args.methods else list(LABELS)
    unknown = [m for m in selected if m not in table]
    if unknown:
        sys.exit(f"unknown --methods {unknown}; choose from {list(LABELS)}")
    return {label: table[label] for label in ["ar", *[m for m in selected if m != "ar"]]}


def specs(methods: dict[str, tuple[str, str | None, dict[str, Any]]], drafts: dict[str, Any]) -> dict[str, MethodSpec]:
    """The run's configurations: each label's draft put in, capacity 64 unless given."""
    configs = {}
    for label, (method, key, options) in methods.items():
        options = dict(options)
        capacity = options.pop("capacity", 64)
        if key is not None:
            options["draft_model"] = drafts[key]
        configs[label] = MethodSpec(method, options, capacity)
    return configs


def build_drafts(target: Any, checkpoint: Path, needed: set[str]) -> dict[str, Any]:
    """The drafts the selected methods use (built once, shared by every prompt)."""
    from racer_rs.selfdraft.model import self_draft

    distilled = racer_rs.load_self_draft(target, checkpoint)
    kept = getattr(distilled.lm_head, "kept_ids", None)
    drafts: dict[str, Any] = {"distilled": distilled}
    if "undistilled" in needed:
        drafts["undistilled"] = self_draft(target, distilled.config.num_hidden_layers, vocab=kept)
    if "distilled_fullvocab" in needed:
        full = racer_rs.load_self_draft(target, checkpoint)
        full.lm_head = target.get_output_embeddings()
        drafts["distilled_fullvocab"] = full
    return drafts


def load_prompts(tokenizer: Any, per_category: int) -> list[TokenPrompt]:
    """The first ``per_category`` questions of each category, their first turn only."""
    questions = load_questions(ROOT / "data" / "spec_bench.jsonl")
    prompts = []
    for category in CATEGORIES:
        chosen = [q for q in questions if q.subcategory == category][:per_category]
        prompts += [first_turn(tokenizer, q, category=category) for q in chosen]
    return prompts


def progress(record: Record) -> None:
    print(
        f"{record.setting} prompt {record.question_index} ({record.category}, {record.prompt_tokens} tok) "
        f"{record.method:20s} {record.wall_s:7.2f}s MAT {record.mat:.2f}",
        flush=True,
    )


def head_timing(target: Any, drafts: dict[str, Any], repeats: int = 50) -> dict[str, float]:
    """Milliseconds per draft forward of one token (cache of 256 tokens), reduced vs full head."""
    from transformers import DynamicCache

    out = {}
    for key in ("distilled", "distilled_fullvocab"):
        draft = drafts.get(key)
        if draft is None:
            continue
        cache = DynamicCache(config=draft.config)
        with torch.inference_mode():
            draft(input_ids=torch.randint(0, 1000, (1, 256)), cache=cache, use_cache=True, logits_to_keep=1)
            token = torch.tensor([[42]])
            start = time.perf_counter()
            for _ in range(repeats):
                draft(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
                cache.crop(-1)
            out[key] = 1000 * (time.perf_counter() - start) / repeats
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        target(input_ids=torch.randint(0, 1000, (1, 256)), cache=cache, use_cache=True, logits_to_keep=1)
        start = time.perf_counter()
        for _ in range(repeats // 5):
            target(input_ids=torch.tensor([[42]]), cache=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)
        out["target"] = 1000 * (time.perf_counter() - start) / (repeats // 5)
    return out


def print_table(rows: list[dict[str, Any]], temperature: float) -> None:
    n_buckets = len(rows[0]["buckets"])
    print(f"\n== T={temperature:g}: acceptance length per {BUCKET}-position bucket (round start), pooled over prompts")
    print(
        f"{'method':20s} {'MAT':>5s} {'tok/s':>6s} {'speedup':>7s} {'draft ms':>8s} "
        + " ".join(f"{i * BUCKET:>5d}" for i in range(n_buckets))
    )
    for row in rows:
        buckets = " ".join(f"{b:5.2f}" for b in row["buckets"])
        print(
            f"{row['method']:20s} {row['mat']:5.2f} {row['tokens_per_s']:6.2f} {row['speedup']:7.2f} "
            f"{row['draft_ms_per_round']:8.2f} {buckets}"
        )
    print(f"{'(rounds per bucket)':20s} " + " ".join(str(r) for r in rows[-1]["bucket_rounds"]))
    for row in rows:
        if "updates" in row:
            print(
                f"{row['method']:20s} updates {row['updates']:5d}  update {row['update_s']:7.2f}s  critical "
                f"{row['critical_s']:6.3f}s = {100 * row['critical_share']:.1f}% of decode  "
                f"mean loss {row['mean_loss']:.3f}"
            )
    by = {row["method"]: row for row in rows}
    static = by.get("distilled")
    if static is not None:
        for label in ("tts_S1", "tts_S5", "tts_S10"):
            if label in by:
                ratio = by[label]["buckets"][-1] / static["buckets"][-1]
                print(f"goal: {label} last-bucket acceptance / distilled = {ratio:.2f}x (goal >= 1.3x)")
    tts_rows = [by[label] for label in ("tts_S1", "tts_S5", "tts_S10") if label in by]
    if "racer_tts" in by and "racer" in by and tts_rows:
        best = max([by["racer"], *tts_rows], key=lambda r: r["tokens_per_s"])
        print(
            f"goal: racer_tts {by['racer_tts']['tokens_per_s']:.2f} tok/s vs the faster of racer and tts "
            f"({best['method']}, {best['tokens_per_s']:.2f} tok/s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="folder made by racer distill-draft")
    parser.add_argument("--per-category", type=int, default=2, help="questions per category")
    parser.add_argument("--max-new-tokens", type=int, default=768)
    parser.add_argument("--temperatures", default="0,0.8", help="comma-separated; > 0 samples with --top-p")
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--canvas", type=int, default=4, help="draft tokens per round")
    parser.add_argument(
        "--capacity", type=int, default=16, help="racer / racer_tts tree capacity (16: racer bench's CPU default)"
    )
    parser.add_argument("--lr", type=float, default=1e-4, help="TTS learning rate")
    parser.add_argument("--trainable", default="all", help="TTS trainable scope")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--methods", default="", help=f"comma-separated labels (default: all of {','.join(LABELS)})")
    parser.add_argument("--head-timing", action="store_true", help="time the draft forward, full vs reduced head")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benches" / "out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    command = reproduce_command()
    print(f"reproduce: {command}", flush=True)

    target, tokenizer = racer_rs.load_model("smollm2-135m-instruct", dtype="float32", device="cpu")
    methods = method_table(args)
    needed = {key for _, key, _ in methods.values() if key} | ({"distilled_fullvocab"} if args.head_timing else set())
    drafts = build_drafts(target, args.checkpoint, needed)
    kept = getattr(drafts["distilled"].lm_head, "kept_ids", None)
    prompts = load_prompts(tokenizer, args.per_category)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    print(
        f"{len(prompts)} prompts ({', '.join(CATEGORIES)}), {args.max_new_tokens} new tokens each, draft "
        f"{drafts['distilled'].config.num_hidden_layers} layers, vocabulary "
        f"{'full' if kept is None else kept.numel()}, threads {args.threads}",
        flush=True,
    )
    if args.head_timing:
        print(
            "draft forward ms per token:", {k: round(v, 2) for k, v in head_timing(target, drafts).items()}, flush=True
        )

    settings = [Setting(t, args.top_p) if t > 0 else Setting(0.0) for t in temperatures]
    # No end-of-sequence id: every answer runs to --max-new-tokens.
    result = run_methods(
        target,
        tokenizer,
        specs(methods, drafts),
        prompts,
        settings=settings,
        max_new_tokens=args.max_new_tokens,
        seed=1000,
        progress=progress,
    )
    payload: dict[str, Any] = {"command": command, "threads": args.threads, "prompts": len(prompts), "runs": {}}
    for temperature, setting in zip(temperatures, settings, strict=True):
        rows = [
            long_generation_row(
                label, result.of(label, setting), args.max_new_tokens, result.speedup(label, setting).value
            )
            for label in result.methods
        ]
        print_table(rows, temperature)
        note = result.disturbance_note(setting)
        if note:
            print(note)
        if kept is not None:
            produced = np.concatenate([np.asarray(r.tokens) for r in result.of("ar", setting)])
            coverage = float(np.isin(produced, kept.numpy()).mean())
            print(f"reduced vocabulary covers {100 * coverage:.1f}% of the tokens ar produced")
        mismatches = result.mismatches(setting)
        if temperature == 0:
            print("greedy mismatches vs ar:", mismatches)
        payload["runs"][f"T={temperature:g}"] = {"rows": rows, "mismatches": mismatches if temperature == 0 else None}
        if not args.no_plots:
            args.out.mkdir(parents=True, exist_ok=True)
            title = f"SmolLM2-135M-Instruct, self-draft, T={temperature:g}"
            plot_acceptance(rows, args.out / f"self_draft_T{temperature:g}.png", args.max_new_tokens, title)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "self_draft_results.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out / 'self_draft_results.json'}")


if __name__ == "__main__":
    main()
