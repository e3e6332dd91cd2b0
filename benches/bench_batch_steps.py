"""Where a steady-concurrency run's time goes: admissions and steps, and every step by its padded size.

    python benches/bench_batch_steps.py --batch 16 --prompts 96 --max-new-tokens 64 --methods ar,racer,ar,racer

runs ``generate_batch(max_batch_size=B)`` on SmolLM2-135M-Instruct (bfloat16, one thread; Spec-Bench
first turns with the chat template, repeated to ``--prompts``) once per method label, in the order
given (repeat labels to alternate them), and prints per run: total tokens/s, the wall time and
the time inside steps (the rest is admissions: prefills and cache growth), and for the steps with
all ``B`` rows live, per padded tree size (nodes per row): how many, the median verify-phase and
step milliseconds, and the tokens every row committed per step. A label is ``method`` or
``method@capacity`` (``racer@1`` is racer's bookkeeping without drafting), optionally followed by
``:draft`` or ``:plain`` to hold ``capacity="auto"``'s drafting switch in one mode above one row
(``racer:plain`` never drafts in a batch, ``racer:draft`` always does), by ``:padded`` to
verify every step padded to its largest tree instead of flat, by ``:flat`` to run every step
whose trees differ in size flat (without the policy's choice of layout,
:func:`racer_rs.autosize.batch_sizer.best_layout_sizes`), by ``:model`` to price drafted
steps by the cost model alone, as before :class:`racer_rs.autosize.batch_sizer.DraftPrice`
(no learned factor, no caution, and drafted steps teaching the machine's load), or by ``:held``
to keep a learned price through the steps that verify no drafted node, as before
:meth:`racer_rs.autosize.batch_sizer.DraftPrice.forget`, or by ``:blind`` to start every batch
size met for the first time with a drafting block and an unlearned drafted-step price, as before
:meth:`racer_rs.engine.capacity.DraftingSwitch.nearest_verdict`, or by ``:unpaced`` to let every
row draft when no request waits, as before :meth:`racer_rs.engine.decode_engine.DecodeEngine.pacing_rows`
(rows ahead of the ones with the most budget left draft too).
``--temperature`` samples (top-p 0.95, seed 0) instead of decoding greedily. Each run also
prints the drafted-step price it learned at ``B`` rows. The last lines give every label's
tokens/s over the first label's, per round (a round: the labels' n-th runs) and their mean, and
the same for the steady rate: tokens per second of the steps with all ``B`` rows live, without
the admissions and the tail where rows finish and no request waits (requests that finish out of
step leave a tail that one-length plain decoding does not have).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from typing import Any

import numpy as np
import torch

import racer_rs
from bench_engine_overhead import chat_prompts  # benches/ is the script's folder
from racer_rs.autosize import batch_sizer
from racer_rs.autosize.cost_model import CostModel
from racer_rs.engine import capacity, generation
from racer_rs.engine.decode_engine import DecodeEngine
from racer_rs.target.batch_verifier import BatchVerifier

#: Every verified step's (rows, padded size, verify seconds, step seconds, tokens committed).
STEPS: list[tuple[int, int, float, float, int]] = []


def record_steps() -> None:
    """Make both capacity policies log every step they observe into :data:`STEPS`."""
    for policy in (capacity.FixedCapacity, capacity.AutoCapacity):
        original = policy.observe

        def observe(self: Any, report: capacity.StepReport, original: Any = original) -> None:
            STEPS.append((len(report.rows), report.padded, report.forward, report.step, sum(report.committed)))
            original(self, report)

        policy.observe = observe  # type: ignore[method-assign]


def run(
    model: Any, prompts: list[list[int]], label: str, batch: int, new_tokens: int, temperature: float
) -> tuple[float, float]:
    """One run of ``label``; prints its breakdown and returns its tokens/s and its steady rate
    (tokens per second of the steps with all ``B`` rows live)."""
    spec, _, mode = label.partition(":")
    method, _, size = spec.partition("@")
    switch = capacity.AutoCapacity.drafts
    layout = batch_sizer.best_layout_sizes
    price = batch_sizer.DraftPrice.cautious, batch_sizer.DraftPrice.factor, batch_sizer.DraftPrice.forget
    observe = CostModel.observe
    nearest, draft_price = capacity.DraftingSwitch.nearest_verdict, capacity.AutoCapacity._draft_price
    pacing = DecodeEngine.pacing_rows
    if mode == "padded":  # every step padded to its largest tree, as before flat forwards
        generation.BatchVerifier = lambda model: BatchVerifier(model, flat_forwards=False)  # type: ignore[assignment,misc]
    elif mode == "flat":  # trees of different sizes always flat, as before the layout choice
        flat_only = batch_sizer.best_flat_sizes
        batch_sizer.best_layout_sizes = lambda p, s, share, overhead=None: (flat_only(p, s, share), True)
    elif mode == "model":  # drafted steps priced by the cost model alone, as before DraftPrice
        batch_sizer.DraftPrice.cautious = lambda self: 1.0  # type: ignore[method-assign]
        batch_sizer.DraftPrice.factor = property(lambda self: 1.0)  # type: ignore[assignment,method-assign]
        # ... and every step teaching the machine's load, drafted ones included.
        CostModel.observe = lambda self, *args, teaches_load=True: observe(self, *args)  # type: ignore[method-assign]
    elif mode == "held":  # a learned price never fades in idle steps, as before DraftPrice.forget
        batch_sizer.DraftPrice.forget = lambda self: None  # type: ignore[method-assign]
    elif mode == "blind":  # a new batch size drafts first at a fresh price, as before nearest_verdict
        capacity.DraftingSwitch.nearest_verdict = lambda self, batch: True  # type: ignore[method-assign]
        capacity.AutoCapacity._draft_price = lambda self, batch: self.draft_prices.setdefault(  # type: ignore[method-assign]
            batch, batch_sizer.DraftPrice()
        )
    elif mode == "unpaced":  # every row drafts when no request waits, as before pacing_rows
        DecodeEngine.pacing_rows = lambda self, live: [True] * len(live)  # type: ignore[method-assign]
    elif mode:
        drafts = {"draft": True, "plain": False}[mode]
        capacity.AutoCapacity.drafts = lambda self, rows: rows == 1 or drafts  # type: ignore[method-assign]
    STEPS.clear()
    # Every run learns its own drafting switch and drafted-step price, as a new process would.
    capacity._switches.clear()
    capacity._draft_prices.clear()
    started = time.perf_counter()
    results = racer_rs.generate_batch(
        model,
        prompts,
        method=method,
        capacity=int(size) if size.isdigit() else "auto",
        max_new_tokens=new_tokens,
        max_batch_size=batch,
        **sampling(temperature),
    )
    wall = time.perf_counter() - started
    slowest = max(len(r.accepted_lengths) for r in results)
    capacity.AutoCapacity.drafts = switch  # type: ignore[method-assign]
    batch_sizer.best_layout_sizes = layout
    batch_sizer.DraftPrice.cautious, batch_sizer.DraftPrice.factor, batch_sizer.DraftPrice.forget = price  # type: ignore[method-assign,misc]
    CostModel.observe = observe  # type: ignore[method-assign]
    capacity.DraftingSwitch.nearest_verdict, capacity.AutoCapacity._draft_price = nearest, draft_price  # type: ignore[method-assign]
    generation.BatchVerifier = BatchVerifier  # type: ignore[misc]
    DecodeEngine.pacing_rows = pacing  # type: ignore[method-assign]
    tokens = sum(len(r.tokens) for r in results)
    in_steps = sum(step[3] for step in STEPS)
    print(
        f"{label}: {tokens / wall:.1f} tok/s, wall {wall:.1f} s, in steps {in_steps:.1f} s "
        f"({len(STEPS)} steps, the slowest request's {slowest})"
    )
    for prices in capacity._draft_prices.values():  # one calibration key: this run's method
        if batch in prices:
            learned = prices[batch]
            print(
                f"  drafted steps at {batch} rows: x{learned.factor:.3f} the model's price above a "
                f"plain step (x{learned.cautious():.3f} cautious) after {learned.steps} steps"
            )
    by_size: dict[int, list[tuple[float, float, int]]] = collections.defaultdict(list)
    for rows, padded, verify, step, committed in STEPS:
        if rows == batch:
            by_size[padded].append((verify, step, committed))
    for padded in sorted(by_size):
        values = np.asarray(by_size[padded])
        print(
            f"   {padded} nodes/row: {len(values)} steps, verify {1e3 * np.median(values[:, 0]):.1f} ms, "
            f"step {1e3 * np.median(values[:, 1]):.1f} ms, committed/row {values[:, 2].mean() / batch:.2f}"
        )
    full = np.asarray([v for values in by_size.values() for v in values]).reshape(-1, 3)
    steady = full[:, 2].sum() / full[:, 1].sum() if len(full) else 0.0
    share = full[:, 1].sum() / in_steps if in_steps > 0 else 0.0
    print(f"   steady: {steady:.1f} tok/s in the steps with all {batch} rows live, {share:.0%} of the step time")
    return tokens / wall, steady


def sampling(temperature: float) -> dict[str, Any]:
    """``generate_batch``'s sampling keywords: greedy at 0, else ``racer bench``'s (top-p 0.95,
    seed 0)."""
    return {"temperature": temperature} | ({"top_p": 0.95, "seed": 0} if temperature > 0 else {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default="ar,racer,ar,racer")
    parser.add_argument("--data", nargs="*", help="prompt files (default: the shipped Spec-Bench)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else top-p 0.95, seed 0")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = racer_rs.load_model(args.model, dtype=args.dtype)
    prompts = chat_prompts(tokenizer, args.prompts, args.data)
    record_steps()
    # Warm-up (and capacity="auto"'s cost curves on first use).
    racer_rs.generate_batch(
        model,
        prompts[: args.batch],
        method="racer",
        max_new_tokens=8,
        max_batch_size=args.batch,
        **sampling(args.temperature),
    )
    rates: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for label in (m.strip() for m in args.methods.split(",")):
        rates[label].append(run(model, prompts, label, args.batch, args.max_new_tokens, args.temperature))
    first = next(iter(rates))
    for label, values in rates.items():
        for name, at in (("", 0), (" (steady)", 1)):
            ratios = [value[at] / base[at] for value, base in zip(values, rates[first], strict=False)]
            text = " ".join(f"{r:.3f}" for r in ratios)
            print(f"{label} over {first}{name}: {text}, mean {np.mean(ratios):.3f}")
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
