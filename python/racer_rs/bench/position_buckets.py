"""Acceptance per generation position: does a draft's acceptance decay as the text grows?

Acceptance length per generation-position bucket (the one computation behind ``racer bench``'s
``acceptance_vs_position.png`` and the long-generation benchmarks' bucket tables), TTS's update
work on the critical path, and the long-generation benchmarks' acceptance-versus-position plot.
Rounds come from anything with ``positions`` and ``accepted_lengths``: a ``GenerationResult`` or
a benchmark :class:`~racer_rs.bench.runner.Record`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BUCKET = 128


def acceptance_by_bucket(
    results: Sequence[Any], n_new: int, bucket: int = BUCKET
) -> tuple[float, list[float], list[int]]:
    """MAT, and acceptance length per ``bucket`` positions with each bucket's round count.

    A round belongs to the bucket of the position it starts at; rounds are pooled over
    ``results`` (one ``GenerationResult`` or record per prompt), buckets cover positions
    ``0 .. n_new - 1``. An empty bucket's acceptance is NaN, and so is the MAT without rounds.
    """
    empty = [np.empty(0, dtype=np.int64)]
    positions = np.concatenate([np.asarray(r.positions) for r in results] or empty)
    accepted = np.concatenate([np.asarray(r.accepted_lengths) for r in results] or empty)
    buckets, rounds = [], []
    for start in range(0, n_new, bucket):
        in_bucket = (positions >= start) & (positions < start + bucket)
        buckets.append(float(accepted[in_bucket].mean()) if in_bucket.any() else float("nan"))
        rounds.append(int(in_bucket.sum()))
    return float(accepted.mean()) if accepted.size else float("nan"), buckets, rounds


def acceptance_curve(results: Sequence[Any], bucket: int) -> tuple[list[float], list[float]]:
    """The centres of the buckets that hold rounds, and their acceptance lengths (a plot's line)."""
    end = max((int(max(r.positions)) + 1 for r in results if len(r.positions)), default=0)
    _, means, rounds = acceptance_by_bucket(results, end, bucket)
    kept = [index for index, count in enumerate(rounds) if count]
    return [(index + 0.5) * bucket for index in kept], [means[index] for index in kept]


def tts_update_summary(results: Sequence[Any], decode_seconds: float) -> dict[str, Any]:
    """TTS's update work, and the part of it on the critical path (barrier waits + weight
    publication) as a share of decode time; empty for methods that do not adapt a draft."""
    if "tts_updates" not in results[0].extras:
        return {}
    critical = sum(r.extras["tts_wait_time"] + r.extras["tts_publish_time"] for r in results)
    return {
        "updates": sum(r.extras["tts_updates"] for r in results),
        "update_s": sum(r.extras["tts_update_time"] for r in results),
        "critical_s": critical,
        "critical_share": critical / decode_seconds,
        "overlapped_s": sum(r.extras["tts_overlapped_time"] for r in results),
        "mean_loss": float(np.nanmean([r.extras["tts_mean_loss"] for r in results])),
    }


def plot_acceptance(rows: list[dict[str, Any]], path: Path, n_new: int, title: str, bucket: int = BUCKET) -> None:
    """Acceptance length per position bucket, one line per method except ``ar``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centers = np.arange(0, n_new, bucket)[: len(rows[0]["buckets"])] + bucket / 2
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for row in rows:
        if row["method"] != "ar":
            ax.plot(centers, row["buckets"], marker="o", label=f"{row['method']} (MAT {row['mat']:.2f})")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(f"generation position (start of round, {bucket}-token buckets)")
    ax.set_ylabel("acceptance length (tokens / round)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def long_generation_row(
    label: str, records: Sequence[Any], n_new: int, speedup: float, bucket: int = BUCKET
) -> dict[str, Any]:
    """One method's row of a long-generation benchmark: MAT and acceptance per position bucket
    (with each bucket's round count), seconds and tokens/s (the engine's total time, prefill
    included), the given speedup over ``ar``, time per round (decode), the draft's and the
    verification's share of it, and TTS's update work (:func:`tts_update_summary`).

    Args:
        label: The method's label.
        records: Its records (or ``GenerationResult``\\ s), one per prompt.
        n_new: New tokens per prompt (the buckets cover them).
        speedup: Its speedup over ``ar`` (from the run's summary).
        bucket: Positions per bucket.
    """
    mat, buckets, rounds = acceptance_by_bucket(records, n_new, bucket)
    n_rounds = sum(len(r.accepted_lengths) for r in records)
    seconds = sum(r.timings["total"] for r in records)
    decode = sum(r.timings["total"] - r.timings["prefill"] for r in records)
    tokens = sum(len(r.tokens) for r in records)
    draft = sum(r.timings["draft"] for r in records)
    verify = sum(r.timings["verify"] for r in records)
    per_round = 1000 / n_rounds if n_rounds else float("nan")
    return {
        "method": label,
        "mat": mat,
        "buckets": buckets,
        "bucket_rounds": rounds,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else float("nan"),
        "speedup": speedup,
        "ms_per_round": decode * per_round,
        "draft_s": draft,
        "verify_s": verify,
        "draft_ms_per_round": draft * per_round,
        "verify_ms_per_round": verify * per_round,
    } | (tts_update_summary(records, decode) if records else {})
