"""Benchmark of the Rust core through the Python API on a realistic token stream.

Measures `Automaton.extend` (microseconds per token at several context sizes, in decode-sized
calls and in one bulk call), `build_draft_tree` at capacity 64, paper merge and scored
(p50/p99 microseconds per call, Python call included), and the memory used. Run:

    python benches/bench_core.py [--tokens 200000] [--tokenizer PATH/tokenizer.json]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import sysconfig
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from racer_rs import Automaton, LogitsTable, build_draft_tree

ROOT = Path(__file__).resolve().parents[1]


def find_tokenizer(explicit: str | None) -> Path:
    candidates = [explicit] if explicit else []
    shared = str(ROOT)  # the repository ships models/ and data/
    candidates += [
        str(ROOT / "models/pycode-target-7m/tokenizer.json"),
        str(Path(shared) / "models/pycode-target-7m/tokenizer.json"),
    ]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    sys.exit(f"no tokenizer.json found (tried {candidates}); pass --tokenizer")


def source_stream(tokenizer_path: Path, n_tokens: int) -> np.ndarray:
    """Tokenised Python source files of the standard library, concatenated."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    stdlib = sysconfig.get_paths()["stdlib"]
    ids: list[int] = []
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        ids.extend(tok.encode(Path(path).read_text(errors="replace")).ids)
        if len(ids) >= n_tokens:
            break
    return np.asarray(ids[:n_tokens], dtype=np.int32)


def bigram_table(stream: np.ndarray, top_k: int = 8) -> LogitsTable:
    """A copy-logit table filled with each token's most frequent followers (a proxy for the
    target's top-k, which needs no model)."""
    followers: dict[int, Counter[int]] = defaultdict(Counter)
    for a, b in zip(stream[:-1].tolist(), stream[1:].tolist(), strict=True):
        followers[a][b] += 1
    vocab = int(stream.max()) + 1
    table = LogitsTable(vocab, top_k)
    tokens = np.fromiter(followers, dtype=np.int32)
    rows = np.zeros((len(tokens), top_k), dtype=np.int32)
    for i, t in enumerate(tokens.tolist()):
        top = [b for b, _ in followers[t].most_common(top_k)]
        rows[i] = (top + [top[0]] * top_k)[:top_k]
    table.update(tokens, rows)
    return table


def measure_at(stream: np.ndarray, context: int, table: LogitsTable, window: int, step: int):
    a = Automaton(ngram=10, capacity=10_000)
    a.extend(stream[:context])
    # Decode-like: calls of `step` tokens, one draft tree per call.
    chunk = stream[context : context + window]
    tree_us, scored_us = [], []
    t0 = time.perf_counter()
    for i in range(0, len(chunk), step):
        a.extend(chunk[i : i + step])
    extend_us = (time.perf_counter() - t0) / len(chunk) * 1e6
    for i in range(len(chunk) - 1):
        nxt = int(chunk[i])
        s = time.perf_counter()
        build_draft_tree(a, table, nxt, 64)
        tree_us.append((time.perf_counter() - s) * 1e6)
        s = time.perf_counter()
        build_draft_tree(a, table, nxt, 64, scored=True)
        scored_us.append((time.perf_counter() - s) * 1e6)
        a.extend(chunk[i : i + 1])
    bulk = Automaton(ngram=10, capacity=10_000)
    bulk.extend(stream[:context])
    t0 = time.perf_counter()
    bulk.extend(chunk)
    bulk_us = (time.perf_counter() - t0) / len(chunk) * 1e6
    a.check_integrity()
    trees = [np.percentile(x, q) for x in (tree_us, scored_us) for q in (50, 99)]
    return extend_us, bulk_us, *trees, len(a), a.memory_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--window", type=int, default=5_000, help="tokens measured per size")
    parser.add_argument("--step", type=int, default=4, help="tokens per extend call (decode-like)")
    args = parser.parse_args()
    stream = source_stream(find_tokenizer(args.tokenizer), args.tokens)
    table = bigram_table(stream)
    print(f"stream: {len(stream)} tokens of stdlib source, vocab seen {len(np.unique(stream))}")
    print(
        f"{'context':>8} | {'extend us/tok (step)':>20} | {'extend us/tok (bulk)':>20} | "
        f"{'tree p50/p99 us':>15} | {'scored p50/p99 us':>17} | {'nodes':>6} | {'bytes':>9}"
    )
    for context in (1_000, 10_000, 100_000):
        if context + args.window > len(stream):
            continue
        e, b, p50, p99, s50, s99, nodes, mem = measure_at(stream, context, table, args.window, args.step)
        print(
            f"{context:>8} | {e:>20.3f} | {b:>20.3f} | {f'{p50:.1f} / {p99:.1f}':>15} | "
            f"{f'{s50:.1f} / {s99:.1f}':>17} | {nodes:>6} | {mem:>9}"
        )
    full = Automaton(ngram=10, capacity=10_000)
    t0 = time.perf_counter()
    full.extend(stream)
    total = time.perf_counter() - t0
    print(
        f"whole stream in one call: {total / len(stream) * 1e6:.3f} us/token, "
        f"{len(full)} nodes, {full.memory_bytes()} bytes; table {table.memory_bytes()} bytes"
    )
    print("reproduce: python benches/bench_core.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
