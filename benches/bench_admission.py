"""What admitting a request into an empty batch costs beyond its prefill, one live row at a time
(``generate_batch(max_batch_size=1)``): the batch keeps its KV buffers when its last row
finishes (``kept``), against a new batch cache for every request (``fresh``: what every
admission did before, allocating and faulting in the cache's pages).

The two variants alternate request by request on the same prompts (random ids, 200-500 tokens);
the median milliseconds beyond the prefill are printed per variant, the command first.

    flock /tmp/racer_bench.lock python benches/bench_admission.py --threads 1
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import numpy as np
import torch

from racer_rs.loading.models import load_model
from racer_rs.target.batch_verifier import BatchVerifier


def admit(verifier: BatchVerifier, prompt: np.ndarray) -> float:
    """Seconds of one admission beyond the prompt's own prefill; the row then finishes."""
    prefill: list[float] = []
    start = time.perf_counter()
    verifier.add_rows([prompt], timings=prefill)
    seconds = time.perf_counter() - start - prefill[0]
    verifier.commit([None])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--requests", type=int, default=24)
    args = parser.parse_args()
    print("command: python " + shlex.join(sys.argv))
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, dtype=args.dtype)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rng = np.random.default_rng(0)
    kept = BatchVerifier(model)
    kept.prefill([rng.integers(0, vocab, 8).astype(np.int32)])  # the call's first request
    kept.commit([None])
    seconds: dict[str, list[float]] = {"kept": [], "fresh": []}
    for index in range(args.requests):
        prompt = rng.integers(0, vocab, int(rng.integers(200, 500))).astype(np.int32)
        order = ["kept", "fresh"] if index % 2 == 0 else ["fresh", "kept"]
        for variant in order:
            verifier = kept if variant == "kept" else BatchVerifier(model)
            if variant == "fresh":
                verifier.prefill([prompt[:1]])  # a batch cache of its own, then emptied
                verifier.commit([None])
                verifier.cache = None  # as every admission into an empty batch did before
            seconds[variant].append(admit(verifier, prompt))
    for variant, values in seconds.items():
        values = values[2:]  # the first admissions warm the allocator up
        print(
            f"{variant:6s} admission beyond the prefill: median {1e3 * statistics.median(values):.1f} ms, "
            f"max {1e3 * max(values):.1f} ms over {len(values)} requests"
        )


if __name__ == "__main__":
    main()
