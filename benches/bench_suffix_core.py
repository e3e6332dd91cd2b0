"""SuffixDecoding's suffix trees (ArcticInference, C++) against RACER's Rust core, on one stream.

A decode-like run over one token stream (default: the first 60K tokens of the texts of
data/code_completion.jsonl, tokenised with models/pycode-target-7m's tokenizer; ``--synthetic``:
a repetitive stream of random phrases). Each step commits ``--step`` tokens (3) and drafts once,
and every structure below sees the very same steps, interleaved (the order rotates per step):

- ``SuffixDecodingCache.add_active_response`` (one request: extends its own tree and the global
  one) and ``SuffixDecodingCache.speculate`` (pattern: the last 24 tokens; at most 16 drafted
  tokens; vLLM's ``max_spec_factor=1.0``, ``min_token_prob=0.1``), with ``use_tree_spec``
  True (method ``suffix``) and False (``suffix_chain``, vLLM's);
- the raw C++ ``arctic_inference.suffix_decoding._C.SuffixTree(24)``: ``extend_ndarray`` and
  ``speculate_ndarray`` (tree mode), without the cache's Python layer;
- ``racer_rs.Automaton(ngram=10, capacity=10_000)`` (RACER's defaults; ``--max-nodes`` lifts
  the LRU node budget, the suffix trees have none): ``extend``, and
  ``build_draft_tree`` at capacity 16 (root included, so up to 15 drafted tokens), retrieval
  only and with a copy-logit table (each token's most frequent followers, a stand-in for the
  target's top-8 that needs no model);
- ``racer_rs.DraftPool`` holding this one request (same options, the same copy-logit rows):
  ``extend`` and ``propose`` (capacity 16), the per-request cost of a serving engine's batch
  calls at batch size 1.

``--only NAME[,NAME]`` runs only the named calls (``none``: none), for instruction counts
under ``valgrind --tool=callgrind``: the difference between a run with a call and one without,
divided by the steps, is that call's instructions (``benches/callgrind_core.sh``).

Every call is timed alone (``perf_counter_ns``, Python call included); extends are reported per
token and per call, drafts per call (median and p90), with the mean drafted nodes. Run:

    python benches/bench_suffix_core.py [--tokens 60000] [--step 3] [--synthetic] [--max-nodes 10000]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from racer_rs import Automaton, DraftPool, LogitsTable, build_draft_tree

ROOT = Path(__file__).resolve().parents[1]
DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth
SPEC_TOKENS = 16


def code_stream(tokens: int) -> np.ndarray:
    """The texts of data/code_completion.jsonl, tokenised and concatenated (cycled if short)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ROOT / "models/pycode-target-7m/tokenizer.json"))
    ids: list[int] = []
    rows = [json.loads(line) for line in (ROOT / "data/code_completion.jsonl").read_text().splitlines() if line]
    while len(ids) < tokens:
        for row in rows:
            ids.extend(tokenizer.encode(row["turns"][0]).ids)
    return np.asarray(ids[:tokens], dtype=np.int32)


def synthetic_stream(tokens: int, seed: int = 0) -> np.ndarray:
    """Random phrases (8-40 tokens of a 2000-token vocabulary), each used many times, with noise."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, 2000, rng.integers(8, 40)) for _ in range(300)]
    parts: list[np.ndarray] = []
    total = 0
    while total < tokens:
        part = phrases[int(rng.zipf(1.3)) % len(phrases)] if rng.random() < 0.8 else rng.integers(0, 2000, 5)
        parts.append(part)
        total += len(part)
    return np.concatenate(parts)[:tokens].astype(np.int32)


def bigram_rows(stream: np.ndarray, top_k: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Each token's ``top_k`` most frequent followers (the first repeated if fewer)."""
    followers: dict[int, Counter[int]] = defaultdict(Counter)
    for a, b in zip(stream[:-1].tolist(), stream[1:].tolist(), strict=False):
        followers[a][b] += 1
    tokens = np.fromiter(followers, dtype=np.int32)
    rows = np.zeros((len(tokens), top_k), dtype=np.int32)
    for i, t in enumerate(tokens.tolist()):
        top = [b for b, _ in followers[t].most_common(top_k)]
        rows[i] = (top + [top[0]] * top_k)[:top_k]
    return tokens, rows


def bigram_table(stream: np.ndarray, top_k: int = 8) -> LogitsTable:
    table = LogitsTable(int(stream.max()) + 1, top_k)
    table.update(*bigram_rows(stream, top_k))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=60_000)
    parser.add_argument("--step", type=int, default=3, help="tokens committed per step")
    parser.add_argument("--prompt", type=int, default=512, help="tokens given as the request's prompt")
    parser.add_argument("--synthetic", action="store_true", help="a synthetic repetitive stream instead of code")
    parser.add_argument("--max-nodes", type=int, default=10_000, help="Automaton node budget (RACER's default)")
    parser.add_argument("--only", default="", help="comma-separated call names to run (none: no call)")
    args = parser.parse_args()
    print("reproduce: python " + " ".join(shlex.quote(a) for a in sys.argv), flush=True)

    from importlib.metadata import version

    import arctic_inference.suffix_decoding as sd
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    from arctic_inference.suffix_decoding._C import SuffixTree

    stream = synthetic_stream(args.tokens) if args.synthetic else code_stream(args.tokens)
    kind = "synthetic phrases" if args.synthetic else "data/code_completion.jsonl, pycode-target-7m tokenizer"
    print(
        f"stream: {len(stream)} tokens ({kind}), {len(np.unique(stream))} distinct; prompt {args.prompt}, "
        f"{args.step} tokens per step; arctic-inference {version('arctic-inference')} ({sd.__file__})"
    )
    table = bigram_table(stream)

    prompt = np.ascontiguousarray(stream[: args.prompt])
    cache = SuffixDecodingCache(max_tree_depth=DEPTH, max_cached_requests=10_000)
    cache.start_request(0, prompt)
    raw = SuffixTree(DEPTH)
    raw.extend_ndarray(0, prompt)
    automaton = Automaton(ngram=10, capacity=args.max_nodes)
    automaton.extend(prompt)
    pool = DraftPool(int(stream.max()) + 1, ngram=10, max_nodes=args.max_nodes, breadth=8)
    pool.add(0, prompt)
    pool.update_topk(0, *bigram_rows(stream))
    only = set(args.only.split(",")) if args.only else None
    pool_ids = [0]

    times: dict[str, list[int]] = defaultdict(list)
    nodes: dict[str, list[int]] = defaultdict(list)

    def timed(name: str, call: Any, *call_args: Any, **call_kwargs: Any) -> Any:
        if only is not None and name not in only:
            return None
        start = time.perf_counter_ns()
        out = call(*call_args, **call_kwargs)
        times[name].append(time.perf_counter_ns() - start)
        return out

    def step_ops(chunk: np.ndarray, pattern: np.ndarray, root: int) -> list:
        def cache_extend() -> None:
            timed("cache.add_active_response", cache.add_active_response, 0, chunk)

        def cache_tree() -> None:
            if only is not None and "cache.speculate tree" not in only:
                return
            d = timed(
                "cache.speculate tree",
                cache.speculate,
                0,
                pattern,
                max_spec_tokens=SPEC_TOKENS,
                max_spec_factor=1.0,
                min_token_prob=0.1,
                use_tree_spec=True,
            )
            nodes["cache.speculate tree"].append(len(d.token_ids))

        def cache_chain() -> None:
            if only is not None and "cache.speculate chain" not in only:
                return
            d = timed(
                "cache.speculate chain",
                cache.speculate,
                0,
                pattern,
                max_spec_tokens=SPEC_TOKENS,
                max_spec_factor=1.0,
                min_token_prob=0.1,
                use_tree_spec=False,
            )
            nodes["cache.speculate chain"].append(len(d.token_ids))

        def raw_extend() -> None:
            timed("SuffixTree.extend_ndarray", raw.extend_ndarray, 0, chunk)

        def raw_tree() -> None:
            if only is not None and "SuffixTree.speculate_ndarray tree" not in only:
                return
            d = timed(
                "SuffixTree.speculate_ndarray tree", raw.speculate_ndarray, pattern, SPEC_TOKENS, 1.0, 0.0, 0.1, True
            )
            nodes["SuffixTree.speculate_ndarray tree"].append(len(d.token_ids))

        def ours_extend() -> None:
            timed("Automaton.extend", automaton.extend, chunk)

        def ours_retrieval() -> None:
            if only is not None and "build_draft_tree retrieval" not in only:
                return
            t = timed(
                "build_draft_tree retrieval", build_draft_tree, automaton, table, root, SPEC_TOKENS, use_logits=False
            )
            nodes["build_draft_tree retrieval"].append(len(t) - 1)

        def ours_full() -> None:
            if only is not None and "build_draft_tree retrieval+logits" not in only:
                return
            t = timed("build_draft_tree retrieval+logits", build_draft_tree, automaton, table, root, SPEC_TOKENS)
            nodes["build_draft_tree retrieval+logits"].append(len(t) - 1)

        def pool_extend() -> None:
            timed("DraftPool.extend", pool.extend, pool_ids, [chunk])

        def pool_propose() -> None:
            if only is not None and "DraftPool.propose" not in only:
                return
            d = timed("DraftPool.propose", pool.propose, pool_ids, [root], SPEC_TOKENS)
            nodes["DraftPool.propose"].append(len(d.tokens) - 1)

        # Extends before drafts (a draft follows its step's commit); each group rotates.
        return [
            [cache_extend, raw_extend, ours_extend, pool_extend],
            [cache_tree, cache_chain, raw_tree, ours_retrieval, ours_full, pool_propose],
        ]

    step = args.step
    started = time.perf_counter()
    count = 0
    for at in range(args.prompt, len(stream) - step - 1, step):
        chunk = np.ascontiguousarray(stream[at : at + step])
        end = at + step
        # Suffix trees match a pattern ending at the newest token (vLLM's pattern); our tree is
        # rooted at the token after the committed context (the engine's next_token).
        pattern = np.ascontiguousarray(stream[max(0, end - DEPTH) : end])
        root = int(stream[end])
        for group in step_ops(chunk, pattern, root):
            shift = count % len(group)
            for op in group[shift:] + group[:shift]:
                op()
        count += 1
    wall = time.perf_counter() - started
    cache.stop_request(0)

    print(f"{count} steps in {wall:.1f} s (all structures); times in microseconds, Python call included\n")
    print(f"{'call':<36} {'per call p50':>12} {'p90':>8} {'per token p50':>14} {'p90':>8} {'mean nodes':>11}")
    for name, values in times.items():
        us = np.asarray(values, dtype=np.float64) / 1e3
        p50, p90 = np.percentile(us, 50), np.percentile(us, 90)
        per_token = (
            f"{p50 / step:>14.3f} {p90 / step:>8.3f}"
            if "extend" in name.lower() or "add_" in name
            else f"{'':>14} {'':>8}"
        )
        mean_nodes = f"{np.mean(nodes[name]):>11.2f}" if name in nodes else f"{'':>11}"
        print(f"{name:<36} {p50:>12.3f} {p90:>8.3f} {per_token} {mean_nodes}")
    print(
        f"\nmemory: SuffixTree {raw.estimate_memory()} bytes (its depth-{DEPTH} tree of the whole stream), "
        f"Automaton {automaton.memory_bytes()} bytes ({len(automaton)} nodes, LRU-capped at {args.max_nodes})"
    )


if __name__ == "__main__":
    main()
