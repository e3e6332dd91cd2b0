"""A batched verification forward over rows with trees of different sizes: flat against padded.

    python benches/bench_flat_forward.py --batch 16 --contexts 150 500 --threads 1

times ``BatchVerifier.forward_trees`` on SmolLM2-135M-Instruct (bfloat16 by default) with
``--batch`` rows of a random ``context``-token prefix, for a few mixes of tree sizes, once flat
(the real nodes only; attention laid out padded) and once padded to the largest tree, interleaved
over ``--rounds`` rounds (the fastest round is kept: other load only ever adds time). ``K`` is the
real nodes, ``m`` the largest tree. It then prints the token share and the flat layout's
overhead ``capacity="auto"`` measures for that batch size
(:func:`racer_rs.autosize.batch_sizer.measure_token_share`).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

import racer_rs
from racer_rs.autosize.batch_sizer import measure_token_share
from racer_rs.autosize.cost_model import synthetic_tree
from racer_rs.target.batch_verifier import BatchVerifier
from racer_rs.target.verifier import vocab_size


def mixes(batch: int) -> list[list[int]]:
    """Tree sizes per row: a quarter of the rows deep, a spread, all equal, all roots, one row
    of two nodes and every row of two (the choice ``capacity="auto"`` makes most often: one
    node more for one row flat, or for every row padded)."""
    quarter = max(1, batch // 4)
    spread = [16, 8, 4, 2][:batch]
    return [
        [8] * quarter + [1] * (batch - quarter),
        [4] * (batch - quarter) + [1] * quarter,
        spread + [1] * (batch - len(spread)),
        [8] * batch,
        [1] * batch,
        [2] + [1] * (batch - 1),
        [2] * batch,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--contexts", type=int, nargs="+", default=[150, 500])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = racer_rs.load_model(args.model, dtype=args.dtype)
    vocab = vocab_size(model)
    rng = np.random.default_rng(0)
    for context in args.contexts:
        prefixes = [rng.integers(0, vocab, context).astype(np.int32) for _ in range(args.batch)]
        verifiers = {}
        for flat in (True, False):
            verifiers[flat] = BatchVerifier(model, flat_forwards=flat)
            verifiers[flat].prefill(prefixes)
        best: dict[tuple[int, bool], float] = {}
        for round_index in range(args.rounds + 1):
            for index, sizes in enumerate(mixes(args.batch)):
                trees = [synthetic_tree(n, vocab) for n in sizes]
                for flat, verifier in verifiers.items():
                    started = time.perf_counter()
                    verifier.forward_trees(trees)
                    elapsed = time.perf_counter() - started
                    verifier.discard_uncommitted()
                    if round_index:  # the first round warms up
                        best[(index, flat)] = min(best.get((index, flat), np.inf), elapsed)
        print(f"{args.batch} rows, {context}-token context:")
        for index, sizes in enumerate(mixes(args.batch)):
            flat, padded = best[(index, True)], best[(index, False)]
            print(
                f"   K={sum(sizes):>3} m={max(sizes):>2}: flat {1e3 * flat:6.1f} ms, padded {1e3 * padded:6.1f} ms"
                f" ({padded / flat:.2f}x)"
            )
    share = measure_token_share(model, args.batch, args.contexts)
    print(
        "token share (share of a step's cost above a plain one that grows with the nodes) and flat "
        "overhead (a flat step with one row at m over the padded one with every row at m):"
    )
    for context in args.contexts:
        values = share.at(int(share.sizes.max()), context)[share.sizes - 1]
        overheads = share.overhead_at(int(share.sizes.max()), context)[share.sizes - 1]
        print(
            f"   {context}-token context: "
            + ", ".join(
                f"m={m} {v:.2f} (+{100 * o:.1f}%)" for m, v, o in zip(share.sizes, values, overheads, strict=True)
            )
        )
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
