"""``racer bench --workload``: the question lists each workload runs, and the shared-index methods.

The shaping is checked on the shipped files and on small ones; the benchmark itself runs a tiny
random Llama model (a byte-level tokenizer, so prompts stay short) in-process.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs.bench.stats  # noqa: E402
from racer_rs import Automaton  # noqa: E402
from racer_rs.bench.prompts import load_benchmark, load_questions  # noqa: E402
from racer_rs.bench.runner import INDEX_VARIANT, split_label, uses_index  # noqa: E402
from racer_rs.bench.workloads import FIRST_SAMPLE, REPEAT_SAMPLES, WORKLOADS, shape_questions  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from racer_rs.errors import InvalidArgumentError  # noqa: E402
from tests.helpers import write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"


# --- shaping -------------------------------------------------------------------------------


def test_best_of_n_samples_each_prompt_in_a_row_with_its_own_seed():
    questions = shape_questions("best_of_n", [str(DATA / "best_of_n.jsonl")], limit=3, samples=4)
    prompts = load_questions(DATA / "best_of_n.jsonl")[:3]
    assert len(questions) == 12
    for k, question in enumerate(questions):
        prompt = prompts[k // 4]
        assert question.turns == prompt.turns and question.line == prompt.line
        assert question.question_id == f"{prompt.question_id}#{k % 4 + 1}"
        assert question.category == (FIRST_SAMPLE if k % 4 == 0 else REPEAT_SAMPLES)
    # The runner seeds question i with seed + i: every sample of a prompt has its own seed.
    assert len({(q.turns, i) for i, q in enumerate(questions)}) == 12
    everything = shape_questions("best_of_n", [str(DATA / "best_of_n.jsonl")], limit=None, samples=1)
    assert [q.turns for q in everything] == [p.turns for p in load_questions(DATA / "best_of_n.jsonl")]


def test_best_of_n_refuses_multi_turn_prompts_and_no_samples(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question_id": 1, "turns": ["a", "b"]}) + "\n")
    with pytest.raises(InvalidArgumentError, match=r"rows.jsonl:1: best_of_n samples single-turn prompts"):
        shape_questions("best_of_n", [str(rows)], limit=None)
    with pytest.raises(InvalidArgumentError, match="samples must be >= 1"):
        shape_questions("best_of_n", [str(DATA / "best_of_n.jsonl")], limit=1, samples=0)
    with pytest.raises(InvalidArgumentError, match="unknown workload 'nope'"):
        shape_questions("nope", [], limit=1)


def test_multi_request_keeps_each_stream_in_order():
    files = [str(DATA / name.removeprefix("data/")) for name in WORKLOADS["multi_request"].data]
    questions = shape_questions("multi_request", files, limit=4)
    streams = [q.category for q in questions]
    assert streams == ["agent-inventory"] * 4 + ["agent-textstats"] * 4 + ["coding"] * 4
    for stream in dict.fromkeys(streams):
        lines = [q.line for q in questions if q.category == stream]
        assert lines == sorted(lines) and len(set(lines)) == 4
    assert [q.question_id for q in questions if q.category == "coding"] == [0, 1, 2, 3]  # HumanEval in order
    assert shape_questions("spec_bench", [str(DATA / "spec_bench.jsonl")], 2) == load_benchmark(
        [DATA / "spec_bench.jsonl"], 2
    )


def test_agent_edits_resend_the_file_with_one_more_edit_each_turn():
    questions = load_questions(DATA / "agent_edits.jsonl")
    rows = [json.loads(line) for line in (DATA / "agent_edits.jsonl").read_text().splitlines()]
    assert len(questions) == 12 and {q.category for q in questions} == {"agent-inventory", "agent-textstats"}
    assert all(len(q.turns) == 1 and q.mode == "chat" for q in questions)
    for session in ("inventory", "textstats"):
        turns = [r for r in rows if r["category"] == f"agent-{session}"]
        assert [r["edit"] for r in turns] == list(range(1, 7))
        files = [r["turns"][0].split("```python\n")[1].split("```")[0] for r in turns]
        assert all(later != earlier for earlier, later in itertools.pairwise(files))
        # Consecutive requests resend mostly the same file.
        for earlier, later in itertools.pairwise(files):
            shared = set(earlier.splitlines()) & set(later.splitlines())
            assert len(shared) >= 0.6 * len(set(earlier.splitlines()))
    # The generator reproduces the committed file exactly.
    sys.path.insert(0, str(DATA))
    try:
        import make_agent_edits  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(DATA))
    expected = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in make_agent_edits.rows())
    assert (DATA / "agent_edits.jsonl").read_text(encoding="utf-8") == expected


def test_best_of_n_file_rows_are_copies_of_the_shipped_sets():
    for row in map(json.loads, (DATA / "best_of_n.jsonl").read_text().splitlines()):
        name, line = row["origin"].split(":")
        original = json.loads((DATA / name).read_text(encoding="utf-8").splitlines()[int(line) - 1])
        assert row["turns"] == original["turns"][:1]


def test_labels_with_the_index_variant():
    assert split_label("racer+index") == ("racer", None) and uses_index("racer+index")
    assert split_label("racer_scored+index@8") == ("racer_scored", "8") and uses_index("racer_scored+index@8")
    assert split_label("racer@8") == ("racer", "8") and not uses_index("racer@8")
    assert INDEX_VARIANT == "+index"


# --- racer bench --workload ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [
        {"question_id": 0, "category": "s1", "turns": ["def add(a, b):\n    return a + b\n"]},
        {"question_id": 1, "category": "s1", "turns": ["def add(a, b):\n    return a + b\ndef sub"]},
        {"question_id": 2, "category": "s2", "turns": ["Write a line."]},
        {"question_id": 3, "category": "s2", "turns": ["Write two lines."]},
    ]
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def bench(capsys, model: Path, data: Path, out: Path, *extra: str) -> tuple[int, str, str, dict[str, Any] | None]:
    argv = ["bench", "--model", str(model), "--data", str(data), "--max-new-tokens", "12", "--warmup", "0"]
    argv += ["--device", "cpu", "--dtype", "float32", "--out", str(out), "--no-progress", "--no-plots", *extra]
    code = main(argv)
    captured = capsys.readouterr()
    report = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else None
    return code, captured.out, captured.err, report


@pytest.fixture(autouse=True)
def _calm(monkeypatch):
    monkeypatch.setattr(racer_rs.bench.stats, "DISTURBED_RATIO", float("inf"))  # tiny runs are noisy


def test_best_of_n_runs_samples_in_a_row_and_the_index_learns(tiny_model, prompts, tmp_path, capsys):
    code, out, err, report = bench(
        capsys, tiny_model, prompts, tmp_path / "o", "--workload", "best_of_n", "--limit", "2", "--samples", "3",
        "--methods", "racer,racer+index", "--option", "racer.index=null",
    )  # fmt: skip
    assert code == 0, err
    config = report["config"]
    assert config["workload"] == "best_of_n" and config["samples"] == 3 and config["index"] == "memory"
    assert [s["label"] for s in config["settings"]] == ["T=0.8,top_p=0.95"]  # a sampling workload
    assert config["state_by_method"] == {"racer+index": "shared index: learns across requests"}
    assert len(config["load_average"]) == 3
    assert "== best_of_n / T=0.8,top_p=0.95 ==" in out and "note: racer+index: shared index" in out
    records = [r for r in report["records"] if r["method"] == "racer+index"]
    assert [r["question_id"] for r in records] == ["0#1", "0#2", "0#3", "1#1", "1#2", "1#3"]
    assert [r["seed"] for r in records] == list(range(6))
    assert [r["category"] for r in records] == [FIRST_SAMPLE, REPEAT_SAMPLES, REPEAT_SAMPLES] * 2
    nodes = [r["extras"]["index_nodes"] for r in records]
    assert nodes == sorted(nodes) and nodes[0] > 0
    assert all("index_nodes" not in r["extras"] for r in report["records"] if r["method"] == "racer")
    assert set(report["summary"]["T=0.8,top_p=0.95"]) == {FIRST_SAMPLE, REPEAT_SAMPLES, "overall"}


def test_the_index_of_a_bench_starts_empty_at_each_setting_and_after_the_warm_up(tiny_model, prompts, tmp_path, capsys):
    nodes: dict[tuple[str, str], list[int]] = {}
    for run, extra in (
        ("both", ["--temperature", "0", "0.5", "--warmup", "0"]),
        ("alone", ["--temperature", "0.5", "--warmup", "1"]),
    ):
        code, _, err, report = bench(
            capsys, tiny_model, prompts, tmp_path / run, "--workload", "multi_request", "--methods", "racer+index",
            "--limit", "2", *extra,
        )  # fmt: skip
        assert code == 0, err
        for record in report["records"]:
            if record["method"] == "racer+index":
                nodes.setdefault((run, record["setting"]), []).append(record["extras"]["index_nodes"])
                assert record["mismatch"] in (None, False)
    greedy = nodes[("both", "greedy")]
    assert greedy == sorted(greedy) and greedy[0] > 0
    # The sampled setting after the greedy one starts from an empty index, as it does alone after
    # a warm-up (which learned into a throwaway index): the same requests learn the same nodes.
    assert nodes[("both", "T=0.5,top_p=0.95")] == nodes[("alone", "T=0.5,top_p=0.95")]


def test_multi_request_is_greedy_by_default_and_checked_against_ar(tiny_model, prompts, tmp_path, capsys):
    code, out, err, report = bench(capsys, tiny_model, prompts, tmp_path / "o", "--workload", "multi_request")
    assert code == 0, err
    config = report["config"]
    assert config["workload"] == "multi_request" and config["samples"] is None
    assert [s["label"] for s in config["settings"]] == ["greedy"]
    methods = config["methods"]
    assert methods[0] == "ar" and {"racer", "racer+index"} <= set(methods)
    assert "== multi_request / greedy ==" in out
    assert [r["question_id"] for r in report["records"] if r["method"] == "racer+index"] == [0, 1, 2, 3]
    assert all(r["mismatch"] is False for r in report["records"] if r["method"] != "ar")


def test_bench_uses_an_index_file_read_only(tiny_model, prompts, tmp_path, capsys):
    index = tmp_path / "corpus.idx"
    assert main(["index", "build", str(prompts), "--model", str(tiny_model), "--out", str(index), "--no-progress"]) == 0
    before = index.read_bytes()
    code, _, err, report = bench(
        capsys, tiny_model, prompts, tmp_path / "o", "--methods", "racer,racer+index,racer_scored+index",
        "--index", str(index), "--no-learn", "--temperature", "0",
    )  # fmt: skip
    assert code == 0, err
    assert report["config"]["workload"] == "spec_bench" and report["config"]["index"] == str(index)
    assert report["config"]["index_learns"] is False
    # Only the plain label's own default index (in memory) learns; the file is read only.
    assert report["config"]["state_by_method"] == {"racer": "shared index: learns across requests"}
    records = [r for r in report["records"] if uses_index(r["method"])]
    assert records and all(r["extras"]["index"] == str(index) and r["extras"]["index_learns"] is False for r in records)
    assert len({r["extras"]["index_nodes"] for r in records}) == 1  # read only
    assert all(r["mismatch"] is False for r in report["records"] if r["method"] != "ar")
    assert index.read_bytes() == before
    assert len(Automaton.load(index)) == records[0]["extras"]["index_nodes"]


def test_index_alone_adds_racer_index_to_the_default_methods(tiny_model, prompts, tmp_path, capsys):
    code, _, err, report = bench(capsys, tiny_model, prompts, tmp_path / "o", "--index", "memory", "--temperature", "0")
    assert code == 0, err
    methods = report["config"]["methods"]
    assert methods.index("racer+index") == methods.index("racer") + 1


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("racer: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--workload", "best_of_n", "--temperature", "0"], ["best_of_n is a sampling workload", "--temperature"]),
        (["--workload", "best_of_n", "--temperature", "0.8", "0"], ["sampling workload"]),
        (["--workload", "nope"], ["--workload", "invalid choice"]),
        (["--samples", "2"], ["--samples: only --workload best_of_n"]),
        (["--workload", "best_of_n", "--samples", "0"], ["--samples", "must be >= 1"]),
        (["--methods", "racer", "--index", "memory"], ["--index: no METHOD+index among --methods"]),
        (["--methods", "racer", "--no-learn"], ["--no-learn: no METHOD+index among --methods"]),
        (["--methods", "pld+index"], ["method 'pld' takes no shared index", "racer"]),
        (["--methods", "racer_logits+index"], ["method 'racer_logits' takes no shared index"]),
        (["--methods", "hf+index"], ["method 'hf' takes no shared index"]),
        (["--methods", "racer@4+index"], ["write METHOD+index@CAPACITY"]),
        (["--methods", "racer+index", "--index", "/no/such.idx"], ["--index: file not found: /no/such.idx"]),
        (["--methods", "racer+index,racer+index"], ["listed more than once"]),
        (["--methods", "racer+index", "--option", "racer+index.index_scope=thread"], ["index_scope"]),
    ],
)
def test_bad_workload_and_index_arguments_are_one_line_errors(tiny_model, prompts, tmp_path, capsys, extra, fragments):
    code, _, err, report = bench(capsys, tiny_model, prompts, tmp_path / "o", *extra)
    assert_one_line_error(code, err, *fragments)
    assert report is None


def test_a_damaged_index_file_is_a_one_line_error(tiny_model, prompts, tmp_path, capsys):
    damaged = tmp_path / "damaged.idx"
    Automaton().save(damaged)
    damaged.write_bytes(damaged.read_bytes()[:-4])
    code, _, err, _ = bench(
        capsys, tiny_model, prompts, tmp_path / "o", "--methods", "racer+index", "--index", str(damaged)
    )
    assert_one_line_error(code, err, "method racer+index", "damaged.idx")
