"""Benchmark of Automaton persistence on a large index (not a test).

Builds an index over a synthetic code-like token stream (~10M tokens by default: line templates of
keyword tokens with identifier slots, identifiers drawn from per-function pools over a Zipf
vocabulary, and copy-pasted functions), then times `to_bytes`, `save`, `from_bytes` and `load`
(each load re-verifies the whole image: length, CRC-32, every field, the linear-time integrity
check), per million trie nodes, and the cost of drafting with the index as `shared`. Run:

    python benches/bench_index.py [--tokens 10000000] [--ngram 10] [--repeat 3] [--dir /tmp]

Measured (`python benches/bench_index.py --tokens 10000000 --repeat 2 --draft-calls 1000`, 2 shared
CPU cores at load average ~5, the job getting 58% of one; best of 2): 10M tokens, ngram 10,
56.5M nodes (5.65 per token; tokenised stdlib code gives 6.1), 4.7 GiB in memory, image 1348 MiB
(25 bytes/node). build 3.3 us/token; save 4.2 s (0.074 s/M nodes); to_bytes 3.8 s (0.068);
from_bytes 16.6 s (0.29 s/M nodes); load 18.2 s (0.32 s/M nodes), about half of it system time
for page faults on the fresh memory; peak RSS 9.2 GiB. Drafting (capacity 64) with that index as
`shared`: p50 167 us halving / 180 us scored, p99 40 / 75 ms (hub strings with thousands of
children: child lists are unordered, so each expansion walks them all).
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from racer_rs import Automaton, LogitsTable, build_draft_tree

KEYWORDS = 400  # token ids below this are keywords and punctuation
IDENTIFIERS = 20_000
VOCAB = KEYWORDS + IDENTIFIERS
NEWLINE = 1
SLOT = -1


def code_like_stream(n_tokens: int, seed: int = 0) -> np.ndarray:
    """A token stream with the statistics that make code retrieval work: frequent keyword
    patterns, identifiers that repeat within a function, and whole functions copied."""
    rng = np.random.default_rng(seed)
    n_templates = 3000
    lengths = rng.integers(3, 13, size=n_templates)
    flat = []
    for length in lengths:
        tokens = rng.integers(2, KEYWORDS, size=length)
        tokens[rng.random(length) < 0.4] = SLOT
        flat.append(np.append(tokens, NEWLINE))
    lengths = lengths + 1
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat_tokens = np.concatenate(flat)
    template_p = 1.0 / np.arange(1, n_templates + 1) ** 1.1
    template_p /= template_p.sum()
    n_lines = int(n_tokens / (lengths * template_p).sum() * 0.95) + 1
    line_templates = rng.choice(n_templates, size=n_lines, p=template_p)
    line_lengths = lengths[line_templates]
    line_starts = np.cumsum(line_lengths) - line_lengths
    total = int(line_lengths.sum())
    within = np.arange(total) - np.repeat(line_starts, line_lengths)
    stream = flat_tokens[np.repeat(offsets[line_templates], line_lengths) + within]
    # Functions of ~24 lines, each with a pool of 8 local names drawn from a Zipf vocabulary.
    line_function = np.arange(n_lines) // 24
    n_functions = int(line_function[-1]) + 1
    ident_p = 1.0 / np.arange(1, IDENTIFIERS + 1) ** 1.05
    ident_p /= ident_p.sum()
    pools = KEYWORDS + rng.choice(IDENTIFIERS, size=(n_functions, 8), p=ident_p)
    slots = np.flatnonzero(stream == SLOT)
    token_function = np.repeat(line_function, line_lengths)[slots]
    local = pools[token_function, rng.integers(0, 8, size=len(slots))]
    global_ = KEYWORDS + rng.choice(IDENTIFIERS, size=len(slots), p=ident_p)
    stream[slots] = np.where(rng.random(len(slots)) < 0.8, local, global_)
    # Copy-paste: one function in ten is followed by a copy of an earlier one.
    function_starts = np.concatenate(
        [[0], np.cumsum(np.bincount(line_function, weights=line_lengths).astype(np.int64))]
    )
    pieces = []
    for f in range(n_functions):
        pieces.append(stream[function_starts[f] : function_starts[f + 1]])
        if f > 0 and rng.random() < 0.1:
            g = int(rng.integers(0, f))
            pieces.append(stream[function_starts[g] : function_starts[g + 1]])
    return np.concatenate(pieces)[:n_tokens].astype(np.int32)


def timed(fn, repeat: int = 1):  # type: ignore[no-untyped-def]
    """(result of the last call, best seconds, all seconds)."""
    times, result = [], None
    for _ in range(repeat):
        result = None  # free the previous result first
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, min(times), times


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def drafting_us(shared: Automaton | None, stream: np.ndarray, calls: int, scored: bool) -> tuple[float, float]:
    """p50 and p99 microseconds of one `build_draft_tree` call (capacity 64), request contexts
    taken from the stream, with or without the shared index."""
    rng = np.random.default_rng(1)
    table = LogitsTable(VOCAB, 8)
    times = []
    for _ in range(calls):
        at = int(rng.integers(100, len(stream) - 1))
        request = Automaton(ngram=10, capacity=10_000)
        request.extend(stream[at - 64 : at])
        start = time.perf_counter()
        build_draft_tree(request, table, int(stream[at]), 64, scored=scored, shared=shared)
        times.append(time.perf_counter() - start)
    us = np.asarray(times) * 1e6
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--ngram", type=int, default=10)
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed repetitions of each save/load step (best is reported)"
    )
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="folder for the saved image")
    parser.add_argument("--draft-calls", type=int, default=2000)
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)

    start = time.perf_counter()
    stream = code_like_stream(args.tokens)
    generate_s = time.perf_counter() - start
    capacity = min(args.ngram * len(stream), 2**32 - 3)
    index = Automaton(ngram=args.ngram, capacity=capacity, min_depth=2)
    start = time.perf_counter()
    for chunk in range(0, len(stream), 1_000_000):
        index.extend(stream[chunk : chunk + 1_000_000])
    build_s = time.perf_counter() - start
    nodes = len(index)
    mnodes = nodes / 1e6
    rows: list[tuple[str, float, str]] = []

    # One large automaton alive at a time: build, save, to_bytes, drop it, then read back.
    path = Path(args.dir) / f"bench-index-{os.getpid()}.racer"
    memory_gib = index.memory_bytes() / 2**30
    try:
        _, save_s, _ = timed(lambda built=index: built.save(path), args.repeat)
        image, to_bytes_s, _ = timed(index.to_bytes, args.repeat)
        del index
        size = len(image)
        loaded, from_bytes_s, _ = timed(lambda data=image: Automaton.from_bytes(data), args.repeat)
        assert len(loaded) == nodes
        del loaded
        loaded, load_s, load_all = timed(lambda: Automaton.load(path), args.repeat)
        assert len(loaded) == nodes and loaded.to_bytes() == image
        del image
    finally:
        path.unlink(missing_ok=True)

    rows.append(("build (extend, 1M-token calls)", build_s, f"{build_s / len(stream) * 1e9:.0f} ns/token"))
    rows.append(("save (image + write + fsync)", save_s, f"{save_s / mnodes:.3f} s/M nodes"))
    rows.append(("to_bytes", to_bytes_s, f"{to_bytes_s / mnodes:.3f} s/M nodes"))
    rows.append(("from_bytes (verify + rebuild)", from_bytes_s, f"{from_bytes_s / mnodes:.3f} s/M nodes"))
    rows.append(("load (read + verify + rebuild)", load_s, f"{load_s / mnodes:.3f} s/M nodes"))

    print(f"command: {command}")
    print(
        f"stream: {len(stream):,} code-like tokens (generated in {generate_s:.1f} s); "
        f"index: ngram {args.ngram}, {nodes:,} nodes ({nodes / len(stream):.2f} per token), "
        f"{memory_gib:.2f} GiB in memory; image {size / 2**20:.0f} MiB "
        f"({size / nodes:.1f} bytes/node)"
    )
    print(f"timings: best of {args.repeat}; load runs: {', '.join(f'{t:.3f}' for t in load_all)} s")
    print()
    print(f"| {'step':<32} | {'seconds':>8} | {'rate':>18} |")
    print(f"|{'-' * 34}|{'-' * 10}|{'-' * 20}|")
    for name, seconds, rate in rows:
        print(f"| {name:<32} | {seconds:>8.3f} | {rate:>18} |")
    print()
    if args.draft_calls:
        print(f"drafting, capacity 64 (p50 / p99 us per call, Python call included, {args.draft_calls} calls):")
        for scored in (False, True):
            without = drafting_us(None, stream, args.draft_calls, scored)
            with_shared = drafting_us(loaded, stream, args.draft_calls, scored)
            name = "scored" if scored else "halving"
            print(
                f"  {name:<8} without shared {without[0]:7.1f} / {without[1]:7.1f}   "
                f"with the loaded index as shared {with_shared[0]:7.1f} / {with_shared[1]:7.1f}"
            )
    print(f"peak RSS: {peak_rss_gib():.1f} GiB")


if __name__ == "__main__":
    main()
