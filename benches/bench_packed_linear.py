"""What packing the linear weights once buys a tree forward (``racer_rs.target.packed_linear``).

Two measurements, packed and unpacked interleaved round by round (this machine's speed drifts):

1. one weight matrix of the model (of the shape holding most of its weights, the one
   ``pack_linear_weights`` probes) multiplied by 1, 2, 4, ... 64 token rows with torch's
   ``F.linear`` and with the packed oneDNN product;
2. the model's verification forward (the engine's path, one row) of n = 1, 2, 4, ... 64 tree
   tokens after a ``--context``-token prefix, its weights unpacked and packed: milliseconds and
   the ratio to n = 1, the cost curve ``capacity="auto"`` decides with.

It also prints the memory the packed copies take and whether the model's logits over a
``--context``-token input are the same packed and unpacked (the largest difference).

Example (docs/results.md's figures, SmolLM2-135M-Instruct on this CPU):
    python benches/bench_packed_linear.py --model smollm2-135m-instruct --dtype bfloat16 --threads 1 2
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch

from racer_rs.autosize.cost_model import DEFAULT_SIZES, measure_forward_cost
from racer_rs.loading.models import load_model
from racer_rs.target import packed_linear
from racer_rs.target.packed_linear import pack_linear_weights, unpack_linear_weights


def layer_times(layer: torch.nn.Linear, sizes: list[int], rounds: int) -> dict[str, dict[int, float]]:
    """Median microseconds of one product per row count, ``F.linear`` against the packed one."""
    weight = layer.weight.detach()
    packed = packed_linear._pack(weight)
    samples: dict[str, dict[int, list[float]]] = {"F.linear": {}, "packed": {}}
    with torch.no_grad():
        for _ in range(rounds):
            for rows in sizes:
                x = torch.randn(rows, weight.shape[1]).to(weight.dtype)
                for name, call in (
                    ("F.linear", lambda x=x: torch.nn.functional.linear(x, weight)),
                    ("packed", lambda x=x: packed_linear._packed_product(x, packed, None)),
                ):
                    call()
                    start = time.perf_counter()
                    for _ in range(20):
                        call()
                    samples[name].setdefault(rows, []).append((time.perf_counter() - start) / 20 * 1e6)
    return {name: {rows: statistics.median(times) for rows, times in by.items()} for name, by in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--context", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    for dtype in args.dtype:
        model, _ = load_model(args.model, dtype=dtype, pack_weights=False)
        linears = packed_linear._plain_linears(model)
        mlp = packed_linear._most_weight(linears)
        copies = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        ids = torch.randint(0, model.config.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0))
        for threads in args.threads:
            torch.set_num_threads(threads)
            with torch.no_grad():
                plain = model(ids).logits
                pack_linear_weights(model, measure=False)
                packed = model(ids).logits
                unpack_linear_weights(model)
            difference = (plain.float() - packed.float()).abs().max().item()
            print(
                f"\n{args.model} {dtype}, {threads} thread(s): {len(linears)} linear layers, packed copies "
                f"{copies / 1e9:.2f} GB; logits over {args.context} tokens "
                f"{'identical' if torch.equal(plain, packed) else 'differ'} packed and unpacked "
                f"(largest difference {difference:.3g})"
            )
            times = layer_times(mlp, args.sizes, args.rounds)
            shape = "x".join(str(d) for d in mlp.weight.shape)
            print(f"{args.model} {dtype}, {threads} thread(s): one {shape} product, us (median of {args.rounds})")
            print("rows      " + "".join(f"{n:>8d}" for n in args.sizes))
            for name, by in times.items():
                print(f"{name:10s}" + "".join(f"{by[n]:8.1f}" for n in args.sizes))
            curves: dict[str, dict[int, list[float]]] = {"unpacked": {}, "packed": {}}
            for _ in range(args.rounds):
                for name in ("unpacked", "packed"):
                    if name == "packed":
                        pack_linear_weights(model, measure=False)
                    cost = measure_forward_cost(model, args.sizes, context=args.context, rounds=1)
                    unpack_linear_weights(model)
                    for n, seconds in cost.items():
                        curves[name].setdefault(n, []).append(seconds)
            print(f"tree forward at a {args.context}-token context, ms and t(n)/t(1) (median of {args.rounds} rounds)")
            print("n         " + "".join(f"{n:>14d}" for n in args.sizes))
            for name, by in curves.items():
                medians = {n: statistics.median(v) for n, v in by.items()}
                one = medians[min(medians)]
                print(f"{name:10s}" + "".join(f"{1000 * medians[n]:7.1f} {medians[n] / one:5.2f}x" for n in args.sizes))
    print("\nreproduce: python " + shlex.join(sys.argv))


if __name__ == "__main__":
    main()
