"""One summary table from ``own_engine.sh``'s two ``racer bench`` reports.

    python benches/gpu/summarise.py FLOAT32_BENCH_JSON BFLOAT16_BENCH_JSON

Per method: the float32 greedy check against ``ar`` (outputs equal token for token, or the
number that differ), then per bfloat16 setting its tokens/s, speedup over ``ar`` and MAT, over
all questions. Exits 1 when a float32 greedy output differs from ``ar``'s.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

OVERALL = "overall"


def load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def cell(metrics: dict[str, Any] | None) -> str:
    if not metrics or not metrics.get("requests"):
        return "-"
    speedup = metrics.get("speedup")
    speedup_text = f"{speedup:.2f}x" if isinstance(speedup, (int, float)) and not math.isnan(speedup) else "-"
    return f"{metrics['tokens_per_s']:.1f} tok/s {speedup_text} (MAT {metrics['mat']:.2f})"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    exact, fast = load(argv[0]), load(argv[1])
    greedy = exact["summary"].get("greedy", {}).get(OVERALL, {})
    settings = list(fast["summary"])
    methods = list(dict.fromkeys([*greedy, *(m for s in settings for m in fast["summary"][s][OVERALL])]))
    headers = ["method", "float32 greedy vs ar", *(f"bfloat16 {s}" for s in settings)]
    rows = []
    failed = False
    for method in methods:
        check = greedy.get(method)
        if check is None or not check.get("checked"):
            verdict = "-" if method == "ar" or check is None else "not checked"
        elif check["mismatches"]:
            verdict = f"MISMATCH {check['mismatches']}/{check['checked']}"
            failed = True
        else:
            verdict = f"equal ({check['checked']}/{check['checked']})"
        rows.append([method, verdict, *(cell(fast["summary"][s][OVERALL].get(method)) for s in settings)])
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    config = fast.get("config", {})
    print(
        f"\n{config.get('model', '?')} + draft {config.get('draft_model', '?')} on {config.get('device', '?')}: "
        f"tokens/s, speedup over ar, MAT (overall)"
    )
    for row in [headers, ["-" * w for w in widths], *rows]:
        print("  ".join(str(value).ljust(width) for value, width in zip(row, widths, strict=False)))
    near = len(fast.get("near_ties", []))
    print(f"bfloat16: {near} greedy outputs parted from ar at near-ties (within rounding; racer bench checks them)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
