"""``racer bench --batch-size``: the batch benchmark's report, its greedy check and its errors.

A tiny random Llama model in a temporary folder, three prompts, a few new tokens; the CLI runs
in-process (so the mismatch test can swap in a deliberately wrong ``generate_batch``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs.engine.generation  # noqa: E402
from racer_rs.bench.batch_throughput import interleaved  # noqa: E402
from racer_rs.bench.prompts import Question  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from tests.helpers import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

ROWS = [
    {"question_id": 0, "category": "code", "mode": "completion", "turns": ["def f(x):\n    return x\ndef f(x):\n"]},
    {"question_id": 1, "category": "qa", "turns": ["What is two plus two?"]},
    {"question_id": 2, "category": "writing", "turns": ["Write a line.", "Now shorten it."]},
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def data_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RACER_RS_CACHE", str(tmp_path / "cache"))  # auto's cost curves stay private
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def batch_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--model",
        str(model),
        "--data",
        str(data),
        "--max-new-tokens",
        "8",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str, dict[str, Any] | None]:
    code = main(argv)
    captured = capsys.readouterr()
    path = Path(argv[argv.index("--out") + 1]) / "bench_batch.json"
    return code, captured.out, captured.err, json.loads(path.read_text()) if path.exists() else None


def test_batch_bench_reports_batched_and_sequential_throughput(tiny_model, data_file, tmp_path, capsys):
    argv = batch_args(
        tiny_model, data_file, tmp_path / "out", "--batch-size", "2", "3", "--methods", "racer@4,racer@auto",
        "--temperature", "0", "0.8", "--max-capacity", "8",
    )  # fmt: skip
    code, stdout, stderr, report = run(capsys, argv)
    assert code == 0, stderr
    assert report is not None
    assert report["methods"] == ["ar", "racer@4", "racer@auto"]  # ar added: the baseline
    assert report["batch_sizes"] == [2, 3] and report["questions"] == 3
    assert len(report["machine"]["load_average_before"]) == 3
    # B=2: one batch of two prompts (the third is left out); B=3: one batch. Two settings, 3 x 2 modes.
    assert len(report["records"]) == 2 * (1 + 1) * 3 * 2
    summary = {(r["setting"], r["batch_size"], r["method"], r["mode"]): r for r in report["summary"]}
    assert len(summary) == 2 * 2 * 3 * 2
    for (_, size, method, mode), row in summary.items():
        assert row["tokens_per_s"] > 0 and row["mismatched_rows"] == 0
        if method == "ar" and mode == "batched":
            assert row["vs_batched_ar"] == pytest.approx(1.0)
        if mode == "sequential":
            assert row["vs_own_sequential"] == pytest.approx(1.0)
        assert row["new_tokens"] == 8 * size
    for record in report["records"]:
        if record["setting"] == "greedy":
            assert record["first_mismatch"] == [None] * record["batch_size"]
        else:
            assert record["first_mismatch"] == []  # sampling: not compared token by token
    sampled = [r for r in report["records"] if r["setting"] != "greedy" and r["batch_size"] == 3]
    assert len({json.dumps(r["tokens"]) for r in sampled}) == 1  # row b samples with seed + b in every mode
    assert "vs batched ar" in stdout and "load average" in stdout


def test_a_wrong_batched_row_is_a_mismatch(tiny_model, data_file, tmp_path, capsys, monkeypatch):
    real = racer_rs.engine.generation.generate_batch

    def wrong(*args: Any, **kwargs: Any) -> Any:
        results = real(*args, **kwargs)
        if kwargs.get("method") == "racer":
            results[1].tokens[3] = (results[1].tokens[3] + 1) % 64
        return results

    monkeypatch.setattr(racer_rs.engine.generation, "generate_batch", wrong)
    extra = ("--batch-size", "2", "--methods", "racer", "--temperature", "0")
    argv = batch_args(tiny_model, data_file, tmp_path / "out", *extra)
    code, _, stderr, report = run(capsys, argv)
    assert code == 1
    assert "racer: MISMATCH: racer batched B=2 batch 0 row 1 differs from sequential ar at token 3" in stderr
    assert report is not None
    bad = [r for r in report["summary"] if r["mismatched_rows"]]
    assert [(r["method"], r["mode"]) for r in bad] == [("racer", "batched")]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--batch-size", "4"], "--batch-size 4 needs at least 4 questions"),
        (["--batch-size", "2", "--methods", "racer@0"], "capacity must be an int >= 1"),
        (["--batch-size", "0"], "must be >= 1"),
    ],
)
def test_bad_batch_bench_input_is_a_one_line_error(tiny_model, data_file, tmp_path, capsys, extra, fragment):
    assert main(batch_args(tiny_model, data_file, tmp_path / "out", *extra)) == 2
    assert fragment in capsys.readouterr().err


def test_prompts_are_interleaved_across_categories():
    questions = [Question(i, c, ("t",), "chat", "f", i) for i, c in enumerate("aaabbc")]
    assert [q.category for q in interleaved(questions)] == list("abcaba")
