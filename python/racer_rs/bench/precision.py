"""When greedy outputs may differ in half precision: near-ties within the dtype's rounding.

In float32 every method's greedy output equals plain decoding token for token. In bfloat16 or
float16 a tree forward (n rows in one matmul) and a one-token forward round differently, so the
top-2 logits of a position can swap when they are nearly tied.

A logit is a dot product of the last hidden state with an embedding row, so its rounding error
scales with the size of the whole logit row, not with the logit itself (a logit near zero is as
uncertain as any other). The unit here is therefore the ulp of the row's largest magnitude.
Measured on SmolLM2-135M-Instruct (``python benches/bench_dtype.py --limit 1 --max-new-tokens 128
--threads 2``, 240 positions), the top-2 gap of the same position moves by at most 2 such ulps
between a one-token forward and a 16-node tree forward, in both half types. A divergence is
explained by rounding when the reference's gap between the two tokens is within
:data:`NEAR_TIE_ULPS` of them: four times that measured maximum, a margin for other prompts and
models.
"""

from __future__ import annotations

import math
from typing import Any

#: Tolerance of a near-tie, in ulps of the logit row's largest magnitude (see the module docstring).
NEAR_TIE_ULPS = 8


def ulp(magnitude: float, eps: float) -> float:
    """Spacing of floating-point numbers of relative precision ``eps`` at ``magnitude``."""
    magnitude = abs(magnitude)
    if magnitude == 0.0 or not math.isfinite(magnitude):
        return eps
    return eps * 2.0 ** math.floor(math.log2(magnitude))


def near_tie_tolerance(row_magnitude: float, dtype: Any) -> float:
    """The largest gap between two logits of a row that rounding in ``dtype`` can swap.

    Args:
        row_magnitude: the largest absolute logit of the row.
        dtype: the dtype the logits were computed in.
    """
    import torch

    eps = float(torch.finfo(dtype).eps)
    return NEAR_TIE_ULPS * ulp(row_magnitude, eps)


def divergence_gap(model: Any, prefix: list[int], expected: int, got: int) -> tuple[float, float]:
    """The reference gap between two tokens at a divergence, and the tolerance for it.

    Args:
        model: the target, in the dtype the outputs were produced in.
        prefix: prompt plus the tokens both outputs share, up to the divergence.
        expected: the token plain decoding produced there.
        got: the token the other method produced there.

    Returns:
        ``(gap, tolerance)``: ``logit[expected] - logit[got]`` from one forward of ``prefix``,
        and :func:`near_tie_tolerance` of that logit row.
    """
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(torch.tensor([prefix], device=device), logits_to_keep=1).logits[0, -1].float()
    gap = float(logits[expected] - logits[got])
    return gap, near_tie_tolerance(float(logits.abs().max()), next(model.parameters()).dtype)
