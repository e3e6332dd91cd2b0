"""Benchmark of `DraftPool.propose` (not a test).

Every request holds a 4K-token context from a code-like stream (chunks of a small
vocabulary repeated with mutations, so retrieval finds real continuations) and a copy-logit
row for every token of it. Two measurements, for batches of 1, 8, 64 and 256 requests, at
``threads`` 1 and 2, the thread counts interleaved round by round on the same pool so that
machine noise hits both alike:

- ``propose``: wall time of one ``DraftPool.propose`` call (capacity 16), Python call
  included; median and p90 over the rounds, and per request;
- ``step``: one decode step per request: ``extend`` by 3 committed tokens, then ``propose``
  16 nodes, in microseconds per request per step (median over the rounds);
- ``loop``: the same step done the way one ``RacerDrafter`` per request does it, a Python
  loop of ``Automaton.extend`` + ``build_draft_tree`` over independent pairs (the baseline
  the pool replaces; its trees are the same).

Run:

    python benches/bench_pool.py [--rounds 30] [--context 4096] [--vocab 32000] [--capacity 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

from racer_rs import Automaton, DraftPool, LogitsTable, build_draft_tree


def code_like(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    """Random but repetitive: 64 "lines" of 6-20 tokens from a 2K-token "keyword" range,
    drawn at random, one in four with one token replaced by an arbitrary id."""
    keywords = rng.integers(0, min(vocab, 2048), 256)
    lines = [keywords[rng.integers(0, 256, int(rng.integers(6, 21)))] for _ in range(64)]
    out: list[int] = []
    while len(out) < n:
        line = lines[int(rng.integers(64))].copy()
        if rng.random() < 0.25:
            line[int(rng.integers(len(line)))] = rng.integers(vocab)
        out.extend(line.tolist())
    return np.asarray(out[:n], dtype=np.int32)


def build_pool(args: argparse.Namespace, requests: int, rng: np.random.Generator):
    """A pool of `requests` requests with `context` tokens each, their streams' next tokens,
    and the rest of each stream (fed 3 tokens per step)."""
    pool = DraftPool(args.vocab, threads=1)
    ids = [f"req-{i}" for i in range(requests)]
    futures = []
    pairs = []
    for rid in ids:
        stream = code_like(rng, args.context + 9 * (args.rounds + 1) + 1, args.vocab)  # 3 steps a round
        context = stream[: args.context]
        pool.add(rid, context)
        # As after prefill: a copy-logit row for every context token (last write wins), the
        # true next token first and 7 other context tokens (so rows chain into deep trees).
        topk = np.column_stack([np.roll(context, -1), rng.choice(context, (len(context), 7))])
        probs = rng.dirichlet(np.ones(8), len(context)).astype(np.float32)
        pool.update_topk(rid, context, topk, probs)
        a = Automaton(ngram=10, capacity=10_000, min_depth=2)
        a.extend(context)
        table = LogitsTable(args.vocab, 8)
        table.update(context, topk, probs)
        pairs.append((a, table))
        futures.append(stream[args.context :])
    return pool, ids, futures, pairs


def measure(args: argparse.Namespace, requests: int, rng: np.random.Generator) -> dict:
    pool, ids, futures, pairs = build_pool(args, requests, rng)
    last = np.array([f[0] for f in futures], dtype=np.int32)
    propose: dict[int, list[float]] = {1: [], 2: []}
    step: dict[int, list[float]] = {1: [], 2: []}
    loop: list[float] = []
    position = 0
    for threads in (1, 2):  # warm-up, untimed
        pool.threads = threads
        pool.propose(ids, last, args.capacity)
    for _ in range(args.rounds):
        for threads in (1, 2):
            pool.threads = threads
            t0 = time.perf_counter()
            pool.propose(ids, last, args.capacity)
            propose[threads].append(time.perf_counter() - t0)
            # One decode step: commit 3 tokens (the root and two drafted ones), draft again.
            committed = [f[position : position + 3] for f in futures]
            nexts = np.array([f[position + 3] for f in futures], dtype=np.int32)
            t0 = time.perf_counter()
            pool.extend(ids, committed)
            pool.propose(ids, nexts, args.capacity)
            step[threads].append(time.perf_counter() - t0)
            position += 3
        # The baseline: one (automaton, table) pair per request, driven from Python.
        t0 = time.perf_counter()
        for (a, table), f in zip(pairs, futures, strict=False):
            a.extend(f[position : position + 3])
            build_draft_tree(a, table, int(f[position + 3]), args.capacity)
        loop.append(time.perf_counter() - t0)
        position += 3
    memory = pool.memory_bytes()
    return {"propose": propose, "step": step, "loop": loop, "memory": memory}


def p90(xs: list[float]) -> float:
    return float(np.percentile(xs, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(
        f"# DraftPool.propose, capacity {args.capacity}, {args.context}-token contexts, "
        f"vocab {args.vocab}, {args.rounds} interleaved rounds"
    )
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    header = (
        f"{'requests':>8} {'threads':>7} {'propose p50':>12} {'p90':>10} {'per request':>12} "
        f"{'step/request':>13} {'loop/request':>13} {'memory':>10}"
    )
    print(header)
    print("-" * len(header))
    for requests in args.batches:
        r = measure(args, requests, rng)
        for threads in (1, 2):
            t = r["propose"][threads]
            s = r["step"][threads]
            med = statistics.median(t)
            print(
                f"{requests:>8} {threads:>7} {med * 1e6:>10.1f}us {p90(t) * 1e6:>8.1f}us "
                f"{med * 1e6 / requests:>10.2f}us {statistics.median(s) * 1e6 / requests:>11.2f}us "
                f"{statistics.median(r['loop']) * 1e6 / requests:>11.2f}us "
                f"{r['memory'] / 2**20:>8.1f}Mi"
            )
    print()
    print(
        f"# step/request: DraftPool.extend(3 committed tokens) + DraftPool.propose({args.capacity} nodes), "
        "per request, median"
    )
    print("# loop/request: the same step as a Python loop of Automaton.extend + build_draft_tree per request")
    print("# memory: DraftPool.memory_bytes() (MiB)")
    print(f"# reproduce: python benches/bench_pool.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
