"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed).

- ``speedup.png`` and ``mat.png``: grouped bars per category (plus overall) and method, one panel
  per decoding setting.
- ``acceptance_vs_position.png``: mean tokens committed per step against the generation position
  (bucketed by :mod:`racer_rs.bench.position_buckets`), one line per drafting method, one panel
  per setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from racer_rs.bench.position_buckets import acceptance_curve
from racer_rs.bench.runner import BASELINE, Record


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bar_chart(summary: dict[str, Any], methods: Sequence[str], key: str, title: str, path: Path) -> None:
    plt = _pyplot()
    settings = list(summary)
    figure, axes = plt.subplots(
        len(settings), 1, figsize=(max(7.5, 2.4 * len(methods)), 3.6 * len(settings)), squeeze=False
    )
    for axis, setting in zip(axes[:, 0], settings, strict=False):
        categories = list(summary[setting])
        width = 0.8 / len(methods)
        for offset, method in enumerate(methods):
            values = [summary[setting][c][method][key] or 0.0 for c in categories]
            positions = [i + (offset - (len(methods) - 1) / 2) * width for i in range(len(categories))]
            axis.bar(positions, values, width=width, label=method)
        axis.set_xticks(range(len(categories)))
        axis.set_xticklabels(categories, rotation=20, ha="right")
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axis.set_title(f"{title} ({setting})")
        axis.set_ylabel(title)
        # Outside the axes, so that it never hides a bar.
        axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _acceptance_curves(
    records: Sequence[Record], methods: Sequence[str], bucket: int
) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """Per setting and drafting method: bucket centres and mean accepted length per bucket."""
    curves: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for setting in dict.fromkeys(r.setting for r in records):
        curves[setting] = {
            method: acceptance_curve([r for r in records if r.setting == setting and r.method == method], bucket)
            for method in methods
            if method != BASELINE
        }
    return curves


def _acceptance_plot(records: Sequence[Record], methods: Sequence[str], bucket: int, path: Path) -> None:
    plt = _pyplot()
    curves = _acceptance_curves(records, methods, bucket)
    figure, axes = plt.subplots(len(curves), 1, figsize=(9.0, 3.6 * len(curves)), squeeze=False)
    for axis, (setting, per_method) in zip(axes[:, 0], curves.items(), strict=False):
        for method, (xs, ys) in per_method.items():
            axis.plot(xs, ys, marker="o", markersize=3, label=method)
        axis.set_title(f"acceptance length vs generation position ({setting}, {bucket}-token buckets)")
        axis.set_xlabel("generation position (tokens)")
        axis.set_ylabel("tokens per step")
        if per_method:
            axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(
    summary: dict[str, Any], records: Sequence[Record], methods: Sequence[str], max_new_tokens: int, out: Path
) -> list[Path]:
    """Write the three PNGs into ``out`` and return their paths."""
    paths = [out / "speedup.png", out / "mat.png", out / "acceptance_vs_position.png"]
    _bar_chart(summary, methods, "speedup", "speedup over ar", paths[0])
    _bar_chart(summary, methods, "mat", "MAT", paths[1])
    _acceptance_plot(records, methods, max(8, max_new_tokens // 16), paths[2])
    return paths
