"""The vLLM proposer's own time per step, without vLLM: ``RacerProposer.propose`` and its logits
wrapper's top-k on a simulated batch of 1, 4 and 8 running requests (SmolLM2's vocabulary,
contexts of a few hundred tokens, chains accepted in part), adaptive drafting on and off.

    python benches/serving/proposer_cost.py [--steps 200]

Prints milliseconds per call (median over the steps), the command first.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from racer_rs import optional_deps
from racer_rs.integrations.options import ServingOptions
from racer_rs.integrations.vllm import RacerProposer

VOCAB, K, MAX_LEN = 49152, 8, 2048


def run(rows: int, adaptive: bool, steps: int) -> tuple[float, float]:
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, get_vocab_size=lambda: VOCAB),
    )
    proposer = RacerProposer(config, options=ServingOptions(adaptive=adaptive, log_every=0))
    target = SimpleNamespace(compute_logits=lambda hidden: hidden)
    proposer.load_model(target)
    rng = np.random.default_rng(0)
    contexts = [list(np.tile(rng.integers(0, VOCAB, 40), 8)) for _ in range(rows)]
    ids = np.zeros((rows, MAX_LEN), dtype=np.int32)
    sampled = [[c[-1]] for c in contexts]
    out: list[list[int]] = [[] for _ in range(rows)]
    propose, logits = [], []
    for _ in range(steps):
        lens = np.array([len(c) for c in contexts], dtype=np.int32)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = c
        hidden = torch.randn(sum(len(o) + 1 for o in out), VOCAB)
        start = time.perf_counter()
        target.compute_logits(hidden)
        logits.append(time.perf_counter() - start)
        start = time.perf_counter()
        out = proposer.propose(sampled, lens, ids)
        propose.append(time.perf_counter() - start)
        sampled = [[*o[: int(rng.integers(0, len(o) + 1))], int(rng.integers(VOCAB))] for o in out]
        contexts = [c + s for c, s in zip(contexts, sampled, strict=True)]
    return 1e3 * float(np.median(propose)), 1e3 * float(np.median(logits))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print("command:", shlex.join(["python", *sys.argv]))
    optional_deps.require = lambda extra, purpose: None  # type: ignore[assignment]  # no vLLM needed
    torch.set_num_threads(1)
    print("| requests | adaptive | propose ms/call | logits wrapper ms/call (incl. identity model) |")
    print("|---|---|---|---|")
    for rows in (1, 4, 8):
        for adaptive in (True, False):
            p, lg = run(rows, adaptive, args.steps)
            print(f"| {rows} | {adaptive} | {p:.3f} | {lg:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
