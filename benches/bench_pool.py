"""Benchmark of `DraftPool.propose` (not a test).

Every request holds a 4K-token context from a code-like stream (chunks of a small
vocabulary repeated with mutations, so retrieval finds real continuations) and a copy-logit
row for every token of it. Measurements for batches of 1, 16, 64 and 256 requests, at
``threads`` 1 and 2, the thread counts interleaved round by round on the same pool so that
machine noise hits both alike:

- ``propose``: wall time of one ``DraftPool.propose`` call (capacity 16), Python call
  included; median and p90 over the rounds, and per request;
- ``step``: one decode step per request: ``extend`` by 3 committed tokens, then ``propose``
  16 nodes, in microseconds per request per step (median over the rounds);
- ``loop``: the same step done the way one ``RacerDrafter`` per request does it, a Python
  loop of ``Automaton.extend`` + ``build_draft_tree`` over independent pairs (the baseline
  the pool replaces; its trees are the same);
- ``suffix``: the same step as SuffixDecoding takes it, a Python loop over one C++
  ``arctic_inference.suffix_decoding._C.SuffixTree`` per request (``extend_ndarray`` by the 3
  tokens, ``speculate_ndarray`` of up to 16 tokens from the last 24, tree mode, vLLM's
  ``min_token_prob=0.1``; the raw trees, without ``SuffixDecodingCache``'s Python layer),
  when arctic-inference is installed;
- ``cpu``: process CPU time of the same ``propose`` (and of the suffix loop), which a busy
  shared machine distorts far less than wall time;
- ``of step``: the one-thread ``propose`` CPU time as a share of one target step of ``--step-ms``
  milliseconds (default 31: SmolLM2-135M's step at batch 1, as measured for the issue on
  this CPU; an assumption here, not measured by this script; larger batches take longer
  steps, so this overstates the share there).

Run:

    python benches/bench_pool.py [--rounds 30] [--context 4096] [--vocab 32000] [--capacity 16] [--step-ms 31]
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
        pairs.append((a, table, context))
        futures.append(stream[args.context :])
    return pool, ids, futures, pairs


def measure(args: argparse.Namespace, requests: int, rng: np.random.Generator) -> dict:
    pool, ids, futures, pairs = build_pool(args, requests, rng)
    suffix = suffix_trees(futures, pairs, args.context)
    suffix_times: list[float] = []
    last = np.array([f[0] for f in futures], dtype=np.int32)
    propose: dict[int, list[float]] = {1: [], 2: []}
    propose_cpu: dict[int, list[float]] = {1: [], 2: []}
    suffix_cpu: list[float] = []
    step: dict[int, list[float]] = {1: [], 2: []}
    loop: list[float] = []
    position = 0
    for threads in (1, 2):  # warm-up, untimed
        pool.threads = threads
        pool.propose(ids, last, args.capacity)
    for _ in range(args.rounds):
        for threads in (1, 2):
            pool.threads = threads
            t0, c0 = time.perf_counter(), time.process_time()
            pool.propose(ids, last, args.capacity)
            propose[threads].append(time.perf_counter() - t0)
            propose_cpu[threads].append(time.process_time() - c0)
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
        for (a, table, _), f in zip(pairs, futures, strict=False):
            a.extend(f[position : position + 3])
            build_draft_tree(a, table, int(f[position + 3]), args.capacity)
        loop.append(time.perf_counter() - t0)
        if suffix is not None:
            # SuffixDecoding's step, one C++ tree per request, over the same 3 tokens.
            t0, c0 = time.perf_counter(), time.process_time()
            for (tree, context), f in zip(suffix, futures, strict=False):
                chunk = np.ascontiguousarray(f[position : position + 3])
                tree.extend_ndarray(0, chunk)
                pattern = np.ascontiguousarray(np.concatenate([context, f[: position + 3]])[-24:])
                tree.speculate_ndarray(pattern, args.capacity, 1.0, 0.0, 0.1, True)
            suffix_times.append(time.perf_counter() - t0)
            suffix_cpu.append(time.process_time() - c0)
        position += 3
    memory = pool.memory_bytes()
    return {
        "propose": propose,
        "propose_cpu": propose_cpu,
        "step": step,
        "loop": loop,
        "suffix": suffix_times,
        "suffix_cpu": suffix_cpu,
        "memory": memory,
    }


def suffix_trees(futures: list[np.ndarray], pairs: list, context: int) -> list | None:
    """One SuffixDecoding tree (depth 24) per request holding its context, or None without
    arctic-inference."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError:
        return None
    trees = []
    for i in range(len(futures)):
        tail = pairs[i][2]
        tree = SuffixTree(24)
        tree.extend_ndarray(0, np.ascontiguousarray(tail))
        trees.append((tree, tail[-24:]))
    return trees


def p90(xs: list[float]) -> float:
    return float(np.percentile(xs, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--step-ms", type=float, default=31.0, help="target step time (ms) for the 'of step' column")
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
        f"{'cpu p50':>10} {'step/request':>13} {'loop/request':>13} {'suffix/request':>15} {'suffix cpu':>11} "
        f"{'of step':>8} {'memory':>10}"
    )
    print(header)
    print("-" * len(header))
    for requests in args.batches:
        r = measure(args, requests, rng)
        for threads in (1, 2):
            t = r["propose"][threads]
            s = r["step"][threads]
            med = statistics.median(t)
            nan = float("nan")
            suffix = statistics.median(r["suffix"]) * 1e6 / requests if r["suffix"] else nan
            suffix_cpu = statistics.median(r["suffix_cpu"]) * 1e6 / requests if r["suffix_cpu"] else nan
            cpu = statistics.median(r["propose_cpu"][threads])
            share = statistics.median(r["propose_cpu"][1]) / (args.step_ms / 1e3)
            print(
                f"{requests:>8} {threads:>7} {med * 1e6:>10.1f}us {p90(t) * 1e6:>8.1f}us "
                f"{med * 1e6 / requests:>10.2f}us {cpu * 1e6:>8.0f}us {statistics.median(s) * 1e6 / requests:>11.2f}us "
                f"{statistics.median(r['loop']) * 1e6 / requests:>11.2f}us {suffix:>13.2f}us {suffix_cpu:>9.2f}us "
                f"{share:>7.1%} "
                f"{r['memory'] / 2**20:>8.1f}Mi"
            )
    print()
    print(
        f"# step/request: DraftPool.extend(3 committed tokens) + DraftPool.propose({args.capacity} nodes), "
        "per request, median"
    )
    print("# loop/request: the same step as a Python loop of Automaton.extend + build_draft_tree per request")
    print("# suffix/request: the same step with one SuffixDecoding C++ tree per request (extend + speculate)")
    print(
        "# cpu p50 / suffix cpu: process CPU time (time.process_time, both threads counted; its ticks are coarse "
        "for the small batches) of the call / per request: on a shared, oversubscribed machine the wall times "
        "include time the scheduler gave to others"
    )
    print(f"# of step: one-thread propose cpu p50 over a {args.step_ms:g} ms target step (assumed, not measured)")
    print("# memory: DraftPool.memory_bytes() (MiB)")
    print(f"# reproduce: python benches/bench_pool.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
