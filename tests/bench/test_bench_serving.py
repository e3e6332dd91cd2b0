"""``racer bench --concurrency``: the serving benchmark's report, its statistics, its call order,
its greedy check and its errors.

A tiny random Llama model in a temporary folder, a few prompts, a few new tokens; the CLI runs
in-process (so that tests can swap in a deliberately wrong ``generate_batch``). No timing asserts:
the statistics are checked on records with made-up times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import racer_rs.engine.generation  # noqa: E402
from racer_rs.bench.api import run_serving  # noqa: E402
from racer_rs.bench.runner import Setting  # noqa: E402
from racer_rs.bench.serving import ServingBenchmark, ServingRecord, format_table, round_order, summarise  # noqa: E402
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


def serving_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--model", str(model), "--data", str(data), "--max-new-tokens", "8", "--warmup", "0",
        "--device", "cpu", "--dtype", "float32", "--out", str(out), "--no-progress",
        *extra,
    ]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str, dict[str, Any] | None]:
    code = main(argv)
    captured = capsys.readouterr()
    path = Path(argv[argv.index("--out") + 1]) / "bench_serving.json"
    return code, captured.out, captured.err, json.loads(path.read_text()) if path.exists() else None


def test_serving_bench_reports_throughput_latency_and_speedups(tiny_model, data_file, tmp_path, capsys):
    extra = ("--concurrency", "1", "2", "--methods", "racer@4,pld", "--temperature", "0", "0.8", "--repeat", "2")
    code, stdout, stderr, report = run(capsys, serving_args(tiny_model, data_file, tmp_path / "out", *extra))
    assert code == 0, stderr
    assert report is not None
    assert report["methods"] == ["ar", "racer@4", "pld"]  # ar added first: the baseline
    assert report["concurrency"] == [1, 2] and report["requests"] == 3
    assert report["question_ids"] == [0, 1, 2]  # categories interleaved, first turns only
    assert report["command"].startswith("racer bench --model")
    # Two settings x two concurrencies x two rounds, each ar, racer@4, pld, ar.
    assert len(report["records"]) == 2 * 2 * 2 * 4
    summary = {(r["setting"], r["concurrency"], r["method"]): r for r in report["summary"]}
    assert len(summary) == 2 * 2 * 3
    for (setting, _, method), row in summary.items():
        assert row["rounds"] == 2 and row["requests"] == 2 * 3 and row["new_tokens"] == 2 * 3 * 8
        assert row["tokens_per_s"] > 0 and row["tpot_ms_p50"] > 0 and row["ttft_ms_p50"] >= 0
        assert 0 < row["latency_s_p50"] <= row["latency_s_p90"] <= row["latency_s_p99"]
        if row["requests"] - row["disturbed"] >= 2:  # an interval needs two undisturbed requests
            assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["checked"] == (2 * 3 if setting == "greedy" else 0) and row["mismatches"] == 0
        if method == "ar":
            assert row["vs_ar_tokens_per_s"] == pytest.approx(1.0)
    for record in report["records"]:
        for admitted, first, total in zip(
            record["admitted_s"], record["first_token_s"], record["total_s"], strict=True
        ):
            assert 0 <= admitted <= first <= total <= record["wall_s"]
    sampled = [r for r in report["records"] if r["setting"] != "greedy"]
    assert len({json.dumps(r["tokens"]) for r in sampled}) == 1  # request i samples with seed + i everywhere
    assert "per-request vs ar" in stdout and "p99 s" in stdout
    assert "command: racer bench --model" in stdout


def test_a_wrong_served_request_is_a_mismatch(tiny_model, data_file, tmp_path, capsys, monkeypatch):
    real = racer_rs.engine.generation.generate_batch

    def wrong(*args: Any, **kwargs: Any) -> Any:
        results = real(*args, **kwargs)
        if kwargs.get("method") == "pld" and kwargs.get("max_batch_size") == 2:
            results[1].tokens[3] = (results[1].tokens[3] + 1) % 64
        return results

    monkeypatch.setattr(racer_rs.engine.generation, "generate_batch", wrong)
    extra = ("--concurrency", "1", "2", "--methods", "pld", "--temperature", "0")
    code, _, stderr, report = run(capsys, serving_args(tiny_model, data_file, tmp_path / "out", *extra))
    assert code == 1
    assert "racer: MISMATCH: pld C=2 round 1 request 1 differs from ar at token 3" in stderr
    assert report is not None
    assert [(r["method"], r["concurrency"]) for r in report["summary"] if r["mismatches"]] == [("pld", 2)]


@pytest.mark.parametrize("ignore", [False, True])
def test_ignore_eos_generates_every_budget_in_full(tiny_model, data_file, tmp_path, capsys, monkeypatch, ignore):
    """Every token is an EOS here: requests end at their first token, unless --ignore-eos."""
    import racer_rs.loading.models

    monkeypatch.setattr(racer_rs.loading.models, "eos_token_ids", lambda model, _: list(range(model.config.vocab_size)))
    extra = ("--concurrency", "2", "--methods", "pld", "--temperature", "0", *(["--ignore-eos"] if ignore else []))
    code, _, stderr, report = run(capsys, serving_args(tiny_model, data_file, tmp_path / "out", *extra))
    assert code == 0, stderr
    assert report is not None and report["ignore_eos"] is ignore
    assert {len(tokens) for r in report["records"] for tokens in r["tokens"]} == ({8} if ignore else {1})


def test_an_index_label_learns_within_each_call_and_starts_every_call_empty(
    tiny_model, data_file, tmp_path, capsys, monkeypatch
):
    real = racer_rs.engine.generation.generate_batch
    calls: list[tuple[str, dict[str, Any], list[int]]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        results = real(*args, **kwargs)
        calls.append((kwargs["method"], kwargs, [r.extras.get("index_nodes", 0) for r in results]))
        return results

    monkeypatch.setattr(racer_rs.engine.generation, "generate_batch", recording)
    extra = ("--concurrency", "1", "--methods", "racer@4,racer+index@4", "--temperature", "0", "--repeat", "2")
    code, stdout, stderr, report = run(capsys, serving_args(tiny_model, data_file, tmp_path / "out", *extra))
    assert code == 0, stderr
    assert report is not None and report["methods"] == ["ar", "racer@4", "racer+index@4"]
    indexed = [c for c in calls if c[1].get("index") is not None]
    assert len(indexed) == 2 and all(c[0] == "racer" and c[1]["capacity"] == 4 for c in indexed)
    assert all(c[1]["index"] == "memory" and c[1]["index_scope"] == "drafter" and c[1]["learn"] for c in indexed)
    # Requests one at a time: each learns the ones before it, and each call starts from nothing.
    for _, _, nodes in indexed:
        assert 0 < nodes[0] < nodes[-1]
    assert indexed[0][2] == indexed[1][2]
    assert {r["method"] for r in report["summary"]} == {"ar", "racer@4", "racer+index@4"}
    assert "racer+index@4" in stdout


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--concurrency", "2", "--methods", "pld+index"], "method 'pld' takes no shared index"),
        (["--concurrency", "2", "--methods", "racer@4+index"], "write METHOD+index@CAPACITY"),
        (["--concurrency", "0"], "--concurrency: must be >= 1"),
        (["--concurrency", "2", "--batch-size", "2"], "--concurrency and --batch-size do not go together"),
        (["--requests", "2"], "--requests: only the serving benchmark (--concurrency) takes it"),
        (["--concurrency", "2", "--methods", "hf"], "transformers' peers are not served by generate_batch"),
        (["--concurrency", "2", "--methods", "racer@0"], "capacity must be an int >= 1"),
        (["--concurrency", "2", "--workload", "best_of_n"], "--concurrency runs the spec_bench workload"),
    ],
)
def test_bad_serving_input_is_a_one_line_error(tiny_model, data_file, tmp_path, capsys, extra, fragment):
    assert main(serving_args(tiny_model, data_file, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_rounds_put_ar_first_and_last_and_rotate_the_others():
    methods = ["ar", "a", "b", "c"]
    assert [round_order(methods, i) for i in range(4)] == [
        [("ar", 0), ("a", 0), ("b", 0), ("c", 0), ("ar", 1)],
        [("ar", 0), ("b", 0), ("c", 0), ("a", 0), ("ar", 1)],
        [("ar", 0), ("c", 0), ("a", 0), ("b", 0), ("ar", 1)],
        [("ar", 0), ("a", 0), ("b", 0), ("c", 0), ("ar", 1)],
    ]
    assert round_order(["a", "b"], 1) == [("b", 0), ("a", 0)]  # without ar: rotation only


def test_the_benchmark_calls_generate_batch_in_round_order(tiny_model):
    """Every concurrency gets one call per method per round, with max_batch_size = C, in
    :func:`round_order`, the round index running on across concurrencies (no timing involved)."""
    from racer_rs.loading.models import load_model

    calls: list[tuple[str, Any, int, int]] = []

    def fake(model: Any, prompts: Any, *, method: str, capacity: Any, max_batch_size: int, **_: Any) -> Any:
        calls.append((method, capacity, max_batch_size, len(prompts)))
        extras: dict[str, Any] = {"admitted_s": 0.0, "first_token_s": 0.1}
        if method == "racer":  # capacity=auto's cost-curve measurement inside the call
            extras["auto_capacity"] = {"setup_s": 0.5}
        return [SimpleNamespace(tokens=[1, 2], steps=2, timings={"total": 0.2}, extras=extras) for _ in prompts]

    model, _ = load_model(str(tiny_model), device="cpu", dtype="float32")
    bench = ServingBenchmark(
        model, ["ar", "racer@4", "pld"], capacity=8, max_capacity=8, max_new_tokens=4,
        eos_token_id=None, warmup=2, repeat=2, seed=0,
    )  # fmt: skip
    bench._engine = SimpleNamespace(generate_batch=fake)
    bench.run([[1, 2, 3]] * 3, [1, 4], [Setting(0.0)])
    warm = [("ar", 8), ("racer", 4), ("pld", 8)]
    rounds = [
        [("ar", 8), ("racer", 4), ("pld", 8), ("ar", 8)],
        [("ar", 8), ("pld", 8), ("racer", 4), ("ar", 8)],
    ]
    expected = []
    for size in (1, 4):
        expected.append(("ar", 8, size, 3))  # every request's shapes met once, untimed
        # Two warm-up passes on the first C prompts; ar's first is its call over every request.
        expected += [(m, c, size, min(size, 3)) for m, c in warm[1:] + warm]
        expected += [(m, c, size, 3) for r in rounds for m, c in r]
    assert calls == expected
    assert {r.method: r.setup_s for r in bench.records} == {"ar": 0.0, "racer@4": 0.5, "pld": 0.0}
    rows = summarise(bench.records, bench.methods)
    assert [r["setup_s"] for r in rows if r["concurrency"] == 4] == [0.0, 1.0, 0.0]  # two rounds


def test_every_timed_call_starts_from_a_trimmed_heap(tiny_model, monkeypatch):
    """The C heap's free memory goes back to the system before each call, outside its timing."""
    from racer_rs.bench import serving
    from racer_rs.loading.models import load_model

    events: list[str] = []

    def fake(model: Any, prompts: Any, *, method: str, **_: Any) -> Any:
        events.append(method)
        extras: dict[str, Any] = {"admitted_s": 0.0, "first_token_s": 0.1}
        return [SimpleNamespace(tokens=[1, 2], steps=2, timings={"total": 0.2}, extras=extras) for _ in prompts]

    monkeypatch.setattr(serving, "release_free_heap", lambda: events.append("trim"))
    model, _ = load_model(str(tiny_model), device="cpu", dtype="float32")
    bench = ServingBenchmark(
        model, ["ar", "pld"], capacity=8, max_capacity=8, max_new_tokens=4,
        eos_token_id=None, warmup=0, repeat=1, seed=0,
    )  # fmt: skip
    bench._engine = SimpleNamespace(generate_batch=fake)
    bench.run([[1, 2, 3]] * 2, [2], [Setting(0.0)])
    assert events == ["trim", "ar", "trim", "pld", "trim", "ar"]


def _record(
    method: str, latency: list[float], tokens: int = 5, ar_pass: int = 0, round_index: int = 0
) -> ServingRecord:
    return ServingRecord(
        setting="greedy", concurrency=2, round=round_index, repeat=round_index, method=method, ar_pass=ar_pass,
        wall_s=sum(latency), tokens=[[7] * tokens for _ in latency], admitted_s=[1.0] * len(latency),
        first_token_s=[1.5] * len(latency), total_s=[1.0 + s for s in latency], steps=[tokens] * len(latency),
        first_mismatch=[None] * len(latency), near_tie=[False] * len(latency),
    )  # fmt: skip


def test_summary_statistics_from_made_up_times():
    records = [
        _record("ar", [2.0, 4.0, 2.0]),
        _record("racer", [1.0, 1.0, 1.0]),
        _record("ar", [2.2, 4.0, 8.0], ar_pass=1),  # request 2's ar runs differ 4x: disturbed
    ]
    rows = {r["method"]: r for r in summarise(records, ["ar", "racer"])}
    racer = rows["racer"]
    # Per request tokens/s over ar's two runs' (geometric mean): request 0's 5 over ar's 2.5
    # and 5 / 2.2, request 1's 4x; the disturbed third is left out.
    first = 5.0 / math.sqrt(2.5 * 5.0 / 2.2)
    assert racer["speedup"] == pytest.approx(math.sqrt(first * 4.0))
    assert racer["disturbed"] == 1 and racer["requests"] == 3
    assert racer["speedup_low"] == pytest.approx(first) and racer["speedup_high"] == pytest.approx(4.0)
    assert racer["tokens_per_s"] == pytest.approx(15 / 3.0)
    # Over ar's tokens/s pooled over both of its runs (the opening 8 s and the closing 14.2 s).
    assert rows["ar"]["tokens_per_s"] == pytest.approx(30 / 22.2)
    assert rows["ar"]["vs_ar_tokens_per_s"] == pytest.approx(1.0)
    assert racer["vs_ar_tokens_per_s"] == pytest.approx((15 / 3.0) / (30 / 22.2))
    # Its range runs over each of them.
    assert racer["vs_ar_low"] == pytest.approx((15 / 3.0) / (15 / 8.0))
    assert racer["vs_ar_high"] == pytest.approx((15 / 3.0) / (15 / 14.2))
    assert "3.70x [2.67, 4.73]" in format_table(list(rows.values()))
    assert racer["tpot_ms_p50"] == pytest.approx(1000.0 * (2.0 - 1.5) / 4)  # (total - first) / (tokens - 1)
    assert racer["ttft_ms_p50"] == pytest.approx(500.0)
    assert rows["ar"]["latency_s_p50"] == pytest.approx(2.0)  # ar's opening run only
    assert rows["ar"]["latency_s_p90"] == pytest.approx(3.6) and rows["ar"]["latency_s_p99"] == pytest.approx(3.96)


def test_run_serving_from_python(tiny_model):
    from racer_rs.loading.models import load_model

    model, _ = load_model(str(tiny_model), device="cpu", dtype="float32")
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    result = run_serving(model, ["racer@4", "pld"], prompts, concurrency=[2], max_new_tokens=6, warmup=0)
    assert result.methods == ["ar", "racer@4", "pld"] and result.concurrencies == [2]
    assert result.mismatches() == 0
    assert result.row("pld", 2)["new_tokens"] == 18
    assert result.speedup("racer@4", 2).requests + result.row("racer@4", 2)["disturbed"] == 3
    assert "racer@4" in result.table()
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        run_serving(model, ["pld"], prompts, concurrency=[0])
