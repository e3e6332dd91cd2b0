"""Summaries of benchmark records: the terminal table and the JSON report.

Metrics follow Spec-Bench / RACER's evaluation: ``ms/token = 1000 * sum(wall) / sum(new tokens)``
per category and overall, ``speedup = ar ms/token / method ms/token`` within the same run and
setting, and ``MAT = sum(new tokens) / sum(steps)`` (the mean tokens committed per verification
step, bonus included). The decode-only columns leave out prefill time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from racer_rs._io import write_text_atomically
from racer_rs.bench.runner import Record

SCHEMA_VERSION = 2
OVERALL = "overall"
BASELINE = "ar"
#: transformers' own generate: a second baseline, what a user switching from transformers gains.
HF_BASELINE = "hf"


def _summarise(records: Sequence[Record]) -> dict[str, Any]:
    tokens = sum(r.new_tokens for r in records)
    steps = sum(r.steps for r in records)
    wall = sum(r.wall_s for r in records)
    decode = sum(r.decode_s for r in records)
    return {
        "requests": len(records),
        "new_tokens": tokens,
        "steps": steps,
        "mat": tokens / steps if steps else 0.0,
        "wall_s": wall,
        "decode_s": decode,
        "ms_per_token": 1000.0 * wall / tokens if tokens else math.nan,
        "decode_ms_per_token": 1000.0 * decode / tokens if tokens else math.nan,
        "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        "mismatches": sum(1 for r in records if r.real_mismatch),
        "near_ties": sum(1 for r in records if r.mismatch and r.near_tie),
        "checked": sum(1 for r in records if r.mismatch is not None),
    }


def summarise(records: Sequence[Record], methods: Sequence[str]) -> dict[str, Any]:
    """Aggregate records per setting, category (plus ``overall``) and method.

    Returns:
        ``{setting: {category: {method: metrics}}}`` where metrics hold ``mat``,
        ``ms_per_token``, ``speedup`` (over ``ar``), ``speedup_vs_hf`` (over transformers'
        ``generate``, NaN when ``hf`` did not run), ``decode_ms_per_token``, ``decode_speedup``,
        ``tokens_per_s``, token and step counts, the number of greedy mismatches against ``ar``
        that rounding does not explain (``mismatches``) and of half-precision near-ties.
    """
    summary: dict[str, Any] = {}
    for setting in dict.fromkeys(r.setting for r in records):
        in_setting = [r for r in records if r.setting == setting]
        categories = [*list(dict.fromkeys(r.category for r in in_setting)), OVERALL]
        per_category: dict[str, Any] = {}
        for category in categories:
            rows = [r for r in in_setting if category in (OVERALL, r.category)]
            per_method = {m: _summarise([r for r in rows if r.method == m]) for m in methods}
            base, hf = per_method.get(BASELINE), per_method.get(HF_BASELINE)
            for metrics in per_method.values():
                metrics["speedup"] = _ratio(base, metrics, "ms_per_token")
                metrics["decode_speedup"] = _ratio(base, metrics, "decode_ms_per_token")
                metrics["speedup_vs_hf"] = _ratio(hf, metrics, "ms_per_token")
            per_category[category] = per_method
        summary[setting] = per_category
    return summary


def _ratio(base: dict[str, Any] | None, metrics: dict[str, Any], key: str) -> float:
    if base is None or not metrics[key] or math.isnan(metrics[key]):
        return math.nan
    return float(base[key] / metrics[key])


def mismatched_records(records: Sequence[Record]) -> list[Record]:
    """The greedy records whose tokens differ from ar's where rounding does not explain it."""
    return [r for r in records if r.real_mismatch]


TABLE_HEADER = (
    "category",
    "method",
    "MAT",
    "tok/s",
    "ms/tok",
    "speedup",
    "vs hf",
    "dec ms/tok",
    "dec speedup",
    "tokens",
    "check",
)


def _check_cell(setting: str, method: str, metrics: dict[str, Any]) -> str:
    if method == BASELINE and setting == "greedy":
        return "ref"
    if metrics["checked"] == 0:
        return "-"  # sampling: outputs are not comparable token by token
    if metrics["mismatches"]:
        return f"MISMATCH {metrics['mismatches']}/{metrics['checked']}"
    if metrics["near_ties"]:
        return f"near-tie {metrics['near_ties']}/{metrics['checked']}"
    return "ok"


def _times(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _render_rows(rows: Sequence[Sequence[str]]) -> list[str]:
    """Align rows: the first two columns left, the numbers right, a rule under the first row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=False)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def format_table(summary: dict[str, Any], methods: Sequence[str]) -> str:
    """Render the summary as a plain-text table, one block per setting."""
    blocks = []
    for setting, per_category in summary.items():
        rows: list[tuple[str, ...]] = [TABLE_HEADER]
        for category, per_method in per_category.items():
            for position, method in enumerate(methods):
                m = per_method[method]
                rows.append(
                    (
                        category if position == 0 else "",
                        method,
                        f"{m['mat']:.2f}",
                        f"{m['tokens_per_s']:.1f}",
                        f"{m['ms_per_token']:.2f}",
                        f"{m['speedup']:.2f}x",
                        _times(m["speedup_vs_hf"]),
                        f"{m['decode_ms_per_token']:.2f}",
                        f"{m['decode_speedup']:.2f}x",
                        str(m["new_tokens"]),
                        _check_cell(setting, method, m),
                    )
                )
        blocks.append("\n".join([f"== {setting} ==", *_render_rows(rows)]))
    return "\n\n".join(blocks)


def _json_safe(value: Any) -> Any:
    """Convert numpy/torch scalars and arrays, tuples and odd objects to JSON-ready values."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(item) for item in value]
    if hasattr(value, "tolist"):  # numpy arrays/scalars, torch tensors
        return _json_safe(value.tolist())
    return str(value)


def _record_dict(record: Record) -> dict[str, Any]:
    # Not dataclasses.asdict: it deep-copies extras, which may hold tensors. The prompt's ids
    # serve only the in-process output check; every method and turn would repeat them.
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "prompt_ids"}


def build_report(config: dict[str, Any], records: Sequence[Record], summary: dict[str, Any]) -> dict[str, Any]:
    """Assemble the JSON report (schema version :data:`SCHEMA_VERSION`)."""
    mismatches = mismatched_records(records)
    report: dict[str, Any] = _json_safe(
        {
            "schema_version": SCHEMA_VERSION,
            "config": config,
            "summary": summary,
            "mismatches": [
                {
                    "setting": r.setting,
                    "question_id": r.question_id,
                    "source": r.source,
                    "turn": r.turn,
                    "method": r.method,
                    "first_mismatch": r.first_mismatch,
                }
                for r in mismatches
            ],
            "near_ties": [
                {
                    "setting": r.setting,
                    "question_id": r.question_id,
                    "turn": r.turn,
                    "method": r.method,
                    "first_mismatch": r.first_mismatch,
                    "gap": r.tie_gap,
                    "tolerance": r.tie_tolerance,
                }
                for r in records
                if r.mismatch and r.near_tie
            ],
            "ok": not mismatches,
            "records": [_record_dict(r) for r in records],
        }
    )
    return report


def write_json(report: dict[str, Any], path: Path) -> None:
    """Write the report as indented JSON (non-finite numbers already mapped to null)."""
    write_text_atomically(path, json.dumps(report, indent=1, allow_nan=False) + "\n")
