"""The per-step reductions over a decode step's logits on the CPU: torch's ops against the Rust
kernel (``racer_rs.target.sampling.logits_summary``).

For each shape ``[B, n, V]`` and dtype, the variants run in interleaved rounds (each round times
every variant once, ``--reps`` calls each; the median round is printed, in ms per call):

- ``torch argmax``: ``greedy_ids`` (``max(-1).indices``), what a plain greedy step needs;
- ``torch topk+lse``: ``torch.topk`` and the blocked float ``logsumexp`` (``topk_with_probs``
  before the kernel);
- ``torch step``: both, what a greedy racer step read before (argmax, top-k, probabilities);
- ``rust summary``: ``logits_summary`` (top-k, probabilities and argmax in one pass per row,
  the tensor-to-numpy views included);
- ``torch topk`` and ``rust topk``: the top-k ids alone (``torch.topk`` against ``topk_ids``,
  the serving proposers' copy-logit rows).

Example (one thread, as in the engine profile):

    flock /tmp/racer_bench.lock python benches/bench_logits_summary.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from racer_rs.target.sampling import greedy_ids, logits_summary, topk_ids

SHAPES = ((16, 1, 49152), (16, 3, 49152), (1, 1, 49152), (1, 16, 49152))


def torch_topk_lse(logits: torch.Tensor, k: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_with_probs`` as it was before the kernel: ``torch.topk`` + a blocked logsumexp."""
    scale = 1.0 / temperature if temperature > 0 else 1.0
    values, ids = torch.topk(logits, k, dim=-1)
    rows = logits.reshape(-1, logits.shape[-1])
    norms = [
        torch.logsumexp(block.float() * scale if scale != 1.0 else block.float(), dim=-1) for block in rows.split(8)
    ]
    log_norm = torch.cat(norms).view(*logits.shape[:-1], 1)
    return ids, (values.float() * scale - log_norm).exp()


def median_ms(variants: dict[str, Callable[[], object]], rounds: int, reps: int) -> dict[str, float]:
    """Median over ``rounds`` interleaved rounds of each variant's mean time per call, in ms."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for call in variants.values():
        call()  # warm-up
    for _ in range(rounds):
        for name, call in variants.items():
            start = time.perf_counter()
            for _ in range(reps):
                call()
            times[name].append((time.perf_counter() - start) / reps * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    k, temperature = args.k, args.temperature
    print(f"threads {args.threads}, k {k}, temperature {temperature}; ms per call, median of {args.rounds} rounds")
    print(
        f"{'shape':>16} {'dtype':>9} {'torch argmax':>13} {'torch topk+lse':>15} {'torch step':>11} "
        f"{'rust summary':>13} {'speed-up':>9} {'torch topk':>11} {'rust topk':>10}"
    )
    generator = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            logits = (3 * torch.randn(*shape, generator=generator)).to(dtype)
            variants: dict[str, Callable[[], object]] = {
                "argmax": lambda logits=logits: greedy_ids(logits),
                "topk_lse": lambda logits=logits: torch_topk_lse(logits, k, temperature),
                "step": lambda logits=logits: (greedy_ids(logits), torch_topk_lse(logits, k, temperature)),
                "rust": lambda logits=logits: logits_summary(logits, k, temperature),
                "torch_topk": lambda logits=logits: torch.topk(logits, k, dim=-1).indices,
                "rust_topk": lambda logits=logits: topk_ids(logits, k),
            }
            ms = median_ms(variants, args.rounds, args.reps)
            print(
                f"{list(shape)!s:>16} {str(dtype).removeprefix('torch.'):>9} {ms['argmax']:13.3f} "
                f"{ms['topk_lse']:15.3f} {ms['step']:11.3f} {ms['rust']:13.3f} {ms['step'] / ms['rust']:8.1f}x "
                f"{ms['torch_topk']:11.3f} {ms['rust_topk']:10.3f}"
            )


if __name__ == "__main__":
    main()
