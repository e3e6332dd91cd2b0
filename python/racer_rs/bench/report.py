"""Summaries of benchmark records: the terminal table and the JSON report.

Speedups are per request (:mod:`racer_rs.bench.stats`): each method's tokens/s on a question (all
its turns) over ``ar``'s on the same question in the same run (``ar`` ran first and last; their
mean in log space), aggregated per category and overall by the geometric mean with a bootstrap
95% interval. A question whose two ``ar`` runs differ by more than the disturbance threshold is
left out of the speedups and counted as disturbed. Pooled figures are kept beside them:
``tokens/s = sum(new tokens) / sum(wall)``, ``MAT = sum(new tokens) / sum(steps)`` (tokens
committed per verification step, bonus included) and ``tokens per verified node = sum(new tokens)
/ sum(verified tree nodes)``, what each node a method makes the target verify is worth.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from racer_rs._io import write_or_fall_back
from racer_rs.bench.runner import BASELINE, Record
from racer_rs.bench.stats import Estimate, disturbed, geometric_mean

SCHEMA_VERSION = 3
OVERALL = "overall"
#: transformers' own generate: a second baseline, what a user switching from transformers gains.
HF_BASELINE = "hf"


def _pooled(records: Sequence[Record]) -> dict[str, Any]:
    tokens = sum(r.new_tokens for r in records)
    steps = sum(r.steps for r in records)
    wall = sum(r.wall_s for r in records)
    decode = sum(r.decode_s for r in records)
    nodes = sum(r.verified_nodes for r in records)
    return {
        "runs": len(records),
        "new_tokens": tokens,
        "steps": steps,
        "verified_nodes": nodes,
        "mat": tokens / steps if steps else 0.0,
        "tokens_per_node": tokens / nodes if nodes else math.nan,
        "wall_s": wall,
        "decode_s": decode,
        "ms_per_token": 1000.0 * wall / tokens if tokens else math.nan,
        "decode_ms_per_token": 1000.0 * decode / tokens if tokens else math.nan,
        "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        "mismatches": sum(1 for r in records if r.real_mismatch),
        "near_ties": sum(1 for r in records if r.mismatch and r.near_tie),
        "checked": sum(1 for r in records if r.mismatch is not None),
    }


def _rate(records: Sequence[Record]) -> float:
    tokens = sum(r.new_tokens for r in records)
    wall = sum(r.wall_s for r in records)
    return tokens / wall if wall > 0 and tokens > 0 else math.nan


@dataclasses.dataclass
class _Question:
    """One question's runs in one setting: every method's tokens/s and whether ``ar`` was stable."""

    category: str
    rates: dict[str, float]
    disturbed: bool


def _questions(records: Sequence[Record]) -> list[_Question]:
    by_question: dict[int, list[Record]] = {}
    for record in records:
        by_question.setdefault(record.question_index, []).append(record)
    questions = []
    for rows in by_question.values():
        rates = {}
        for method in dict.fromkeys(r.method for r in rows):
            if method == BASELINE:
                continue
            rates[method] = _rate([r for r in rows if r.method == method])
        passes = [_rate([r for r in rows if r.method == BASELINE and r.ar_pass == k]) for k in (0, 1)]
        present = [rate for rate in passes if not math.isnan(rate)]
        unstable = len(present) == 2 and disturbed(present[0], present[1])
        if present:
            rates[BASELINE] = math.exp(sum(math.log(rate) for rate in present) / len(present))
        questions.append(_Question(rows[0].category, rates, unstable))
    return questions


def _speedup(questions: Sequence[_Question], method: str, base: str) -> Estimate:
    ratios = [
        q.rates[method] / q.rates[base] for q in questions if not q.disturbed and method in q.rates and base in q.rates
    ]
    return geometric_mean(ratios)


def summarise(records: Sequence[Record], methods: Sequence[str]) -> dict[str, Any]:
    """Aggregate records per setting, category (plus ``overall``) and method.

    Returns:
        ``{setting: {category: {method: metrics}}}``: ``speedup`` (geometric mean of per-request
        speedups over ``ar``) with ``speedup_low``/``speedup_high`` (bootstrap 95% interval) and
        ``speedup_requests``; the same ``_vs_hf`` over transformers' ``generate`` (NaN when ``hf``
        did not run); ``requests`` and ``disturbed`` (questions left out); and the pooled
        ``mat``, ``tokens_per_node``, ``tokens_per_s``, ``ms_per_token``, token, step and node
        counts, greedy mismatches against ``ar`` that rounding does not explain
        (``mismatches``) and half-precision near-ties.
    """
    summary: dict[str, Any] = {}
    for setting in dict.fromkeys(r.setting for r in records):
        in_setting = [r for r in records if r.setting == setting]
        questions = _questions(in_setting)
        categories = [*dict.fromkeys(r.category for r in in_setting), OVERALL]
        per_category: dict[str, Any] = {}
        for category in categories:
            rows = [r for r in in_setting if category in (OVERALL, r.category)]
            chosen = [q for q in questions if category in (OVERALL, q.category)]
            per_method = {}
            for method in methods:
                metrics = _pooled([r for r in rows if r.method == method])
                for suffix, base in (("", BASELINE), ("_vs_hf", HF_BASELINE)):
                    estimate = _speedup(chosen, method, base)
                    metrics[f"speedup{suffix}"] = estimate.value
                    metrics[f"speedup{suffix}_low"] = estimate.low
                    metrics[f"speedup{suffix}_high"] = estimate.high
                    metrics[f"speedup{suffix}_requests"] = estimate.requests
                metrics["requests"] = len(chosen)
                metrics["disturbed"] = sum(q.disturbed for q in chosen)
                per_method[method] = metrics
            per_category[category] = per_method
        summary[setting] = per_category
    return summary


def estimate_of(metrics: dict[str, Any], suffix: str = "") -> Estimate:
    """The :class:`Estimate` stored in a summary's metrics (``suffix``: ``""`` or ``"_vs_hf"``)."""
    return Estimate(
        metrics[f"speedup{suffix}"],
        metrics[f"speedup{suffix}_low"],
        metrics[f"speedup{suffix}_high"],
        metrics[f"speedup{suffix}_requests"],
    )


def mismatched_records(records: Sequence[Record]) -> list[Record]:
    """The greedy records whose tokens differ from ar's where rounding does not explain it."""
    return [r for r in records if r.real_mismatch]


TABLE_HEADER = (
    "category",
    "method",
    "speedup [95% CI]",
    "vs hf",
    "MAT",
    "tok/node",
    "tok/s",
    "ms/tok",
    "tokens",
    "requests",
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


def _requests_cell(metrics: dict[str, Any]) -> str:
    used = metrics["requests"] - metrics["disturbed"]
    return f"{used}/{metrics['requests']}" + (f" ({metrics['disturbed']} disturbed)" if metrics["disturbed"] else "")


def _number(value: float, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _render_rows(rows: Sequence[Sequence[str]]) -> list[str]:
    """Align rows: the first two columns left, the numbers right, a rule under the first row."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def format_table(summary: dict[str, Any], methods: Sequence[str], workload: str | None = None) -> str:
    """Render the summary as a plain-text table, one block per setting (titled with the
    workload, when given: ``== best_of_n / T=0.8,top_p=0.95 ==``)."""
    blocks = []
    for setting, per_category in summary.items():
        rows: list[tuple[str, ...]] = [TABLE_HEADER]
        for category, per_method in per_category.items():
            for position, method in enumerate(methods):
                m = per_method[method]
                speedup = "1.00x (ref)" if method == BASELINE else estimate_of(m).text()
                rows.append(
                    (
                        category if position == 0 else "",
                        method,
                        speedup,
                        estimate_of(m, "_vs_hf").text() if method != BASELINE else "-",
                        f"{m['mat']:.2f}",
                        _number(m["tokens_per_node"], 2),
                        _number(m["tokens_per_s"], 1),
                        _number(m["ms_per_token"], 2),
                        str(m["new_tokens"]),
                        _requests_cell(m),
                        _check_cell(setting, method, m),
                    )
                )
        title = f"{workload} / {setting}" if workload else setting
        blocks.append("\n".join([f"== {title} ==", *_render_rows(rows)]))
    note = (
        "speedup: geometric mean over requests of each method's tokens/s over ar's on the same request "
        "(ar timed first and last); [95% bootstrap interval]; disturbed requests (ar's two runs differ by "
        "more than 25%) are left out. MAT: tokens per step; tok/node: tokens per verified tree node."
    )
    return "\n\n".join(blocks) + "\n\n" + note


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


def write_json(report: dict[str, Any], path: Path) -> tuple[Path, str | None]:
    """Write the report as indented JSON (non-finite numbers already mapped to null); when
    ``path`` cannot be written, to a file in the temporary folder instead.

    Returns:
        Where it was written, and why ``path`` could not be (``None`` when it was).
    """
    return write_or_fall_back(path, json.dumps(report, indent=1, allow_nan=False) + "\n")
