"""Tests of ``racer bench``: output files and their schema, the greedy mismatch detector, errors.

Every run uses a tiny random Llama model written to a temporary folder, a handful of prompts and
a few new tokens, and calls :func:`racer_rs.cli.main` in-process (so the mismatch test can swap in
a deliberately wrong engine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs.bench.stats  # noqa: E402
import racer_rs.engine.generation  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from tests.helpers import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

ROWS = [
    {
        "question_id": 0,
        "category": "code",
        "mode": "completion",
        "turns": ["def f(x):\n    return x\ndef f(x):\n"],
    },
    {"question_id": 1, "category": "qa", "turns": ["What is two plus two?"]},
    {"question_id": 2, "category": "writing", "turns": ["Write a line.", "Now shorten it."]},
]
RECORD_FIELDS = {
    "setting": str,
    "question_index": int,
    "question_id": int,
    "category": str,
    "source": str,
    "turn": int,
    "method": str,
    "seed": int,
    "prompt_tokens": int,
    "new_tokens": int,
    "steps": int,
    "mat": float,
    "wall_s": float,
    "prefill_s": float,
    "decode_s": float,
    "wall_s_repeats": list,
    "timings": dict,
    "accepted_lengths": list,
    "positions": list,
    "tokens": list,
    "extras": dict,
}
METRIC_FIELDS = (
    "mat",
    "ms_per_token",
    "speedup",
    "speedup_low",
    "speedup_high",
    "requests",
    "disturbed",
    "tokens_per_node",
    "verified_nodes",
    "decode_ms_per_token",
    "new_tokens",
    "steps",
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def bench_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
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


def run_bench(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str, dict[str, Any] | None]:
    code = main(argv)
    captured = capsys.readouterr()
    out = Path(argv[argv.index("--out") + 1])
    report = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else None
    return code, captured.out, captured.err, report


def test_bench_writes_table_json_and_plots(tiny_model, data_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(racer_rs.bench.stats, "DISTURBED_RATIO", float("inf"))  # tiny runs are noisy
    out = tmp_path / "out"
    argv = bench_args(tiny_model, data_file, out, "--methods", "pld,ar", "--temperature", "0.8", "0", "--repeat", "2")
    code, stdout, stderr, report = run_bench(capsys, argv)
    assert code == 0, stderr
    for name in ("speedup.png", "mat.png", "acceptance_vs_position.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert report is not None and report["schema_version"] == 3 and report["ok"] is True
    assert report["mismatches"] == []

    config = report["config"]
    assert config["model"] == str(tiny_model)
    assert config["methods"] == ["ar", "pld"]  # ar first: the baseline
    assert (config["dtype"], config["device"], config["state"]) == ("float32", "cpu", "per-request")
    assert config["machine"]["torch_threads"] == 1  # conftest's one thread: --threads 0 keeps it
    assert [s["label"] for s in config["settings"]] == ["T=0.8,top_p=0.95", "greedy"]
    assert config["data"] == [str(data_file)] and config["max_new_tokens"] == 8 and config["repeat"] == 2
    assert set(config["method_options"]) == {"ar", "pld"}
    assert {"racer_rs", "torch", "transformers"} <= set(config["versions"])
    assert config["versions"]["torch"] == torch.__version__
    assert config["command"][:2] == ["racer", "bench"]
    assert config["workload"] == "spec_bench" and config["index"] is None and config["samples"] is None
    assert len(config["load_average"]) == 3

    records = report["records"]
    turns = sum(len(row["turns"]) for row in ROWS)
    assert len(records) == 2 * (2 + 1) * turns  # settings x (methods + ar's closing run) x turns
    assert sorted(r["ar_pass"] for r in records if r["method"] == "ar") == [0] * 2 * turns + [1] * 2 * turns
    for record in records:
        for field, kind in RECORD_FIELDS.items():
            assert isinstance(record[field], kind), (field, record[field])
        assert 1 <= record["new_tokens"] <= 8 and len(record["tokens"]) == record["new_tokens"]
        assert sum(record["accepted_lengths"]) == record["new_tokens"]
        assert len(record["positions"]) == record["steps"] == len(record["accepted_lengths"])
        assert len(record["wall_s_repeats"]) == 2
        assert record["wall_s"] == min(record["wall_s_repeats"])  # the (lower) median of two runs
        assert record["prefill_s"] <= record["wall_s"]
        assert record["decode_s"] == pytest.approx(record["wall_s"] - record["prefill_s"])
        if record["method"] == "ar":
            assert set(record["accepted_lengths"]) == {1} and record["mismatch"] is None
        elif record["setting"] == "greedy":
            assert record["mismatch"] is False  # checked against ar, and equal
        else:
            assert record["mismatch"] is None  # sampling: not comparable token by token

    assert {r["category"] for r in records} == {"code", "qa", "multi_turn"}
    for setting in ("greedy", "T=0.8,top_p=0.95"):
        per_category = report["summary"][setting]
        assert set(per_category) == {"code", "qa", "multi_turn", "overall"}
        overall = per_category["overall"]
        assert overall["ar"]["speedup"] == pytest.approx(1.0)
        for method in ("ar", "pld"):
            assert all(field in overall[method] for field in METRIC_FIELDS)
            mine = [r for r in records if r["setting"] == setting and r["method"] == method]
            tokens = sum(r["new_tokens"] for r in mine)
            assert overall[method]["new_tokens"] == tokens
            assert overall[method]["mat"] == pytest.approx(tokens / sum(r["steps"] for r in mine))
            wall = sum(r["wall_s"] for r in mine)
            assert overall[method]["ms_per_token"] == pytest.approx(1000 * wall / tokens)
        # Per question (all its turns): pld's tokens/s over ar's, ar's two runs combined in log
        # space; the overall speedup is their geometric mean.
        rows = [r for r in records if r["setting"] == setting]

        def rate(method: str, question: int, ar_pass: int = 0, rows: list = rows) -> float:
            mine = [r for r in rows if (r["method"], r["question_index"], r["ar_pass"]) == (method, question, ar_pass)]
            return sum(r["new_tokens"] for r in mine) / sum(r["wall_s"] for r in mine)

        questions = sorted({r["question_index"] for r in rows})
        ratios = [rate("pld", q) / np.sqrt(rate("ar", q, 0) * rate("ar", q, 1)) for q in questions]
        assert overall["pld"]["speedup"] == pytest.approx(float(np.exp(np.mean(np.log(ratios)))))
        assert overall["pld"]["speedup_low"] <= overall["pld"]["speedup"] <= overall["pld"]["speedup_high"]
        assert overall["pld"]["tokens_per_node"] == pytest.approx(
            overall["pld"]["new_tokens"] / overall["pld"]["verified_nodes"]
        )

    assert "== spec_bench / greedy ==" in stdout and "== spec_bench / T=0.8,top_p=0.95 ==" in stdout
    for word in ("overall", "multi_turn", "MAT", "ms/tok", "speedup [95% CI]", "tok/node", "pld", "ok"):
        assert word in stdout
    assert "MISMATCH" not in stdout


def test_multi_turn_questions_feed_back_the_models_own_answer(tiny_model, data_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, stderr, report = run_bench(
        capsys, bench_args(tiny_model, data_file, out, "--methods", "ar", "--temperature", "0", "--no-plots")
    )
    assert code == 0, stderr
    assert not (out / "speedup.png").exists()
    first, second = (r for r in report["records"] if r["category"] == "multi_turn" and r["ar_pass"] == 0)
    assert (first["turn"], second["turn"]) == (0, 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    second_turn = len(tokenizer(ROWS[2]["turns"][1])["input_ids"])
    # The second prompt holds the first prompt, the first answer (EOS dropped) and the new turn.
    assert second["prompt_tokens"] >= first["prompt_tokens"] + (first["new_tokens"] - 1) + second_turn


def install_wrong_pld(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swap in a deliberately wrong engine: pld changes its third token."""
    real_generate = racer_rs.engine.generation.generate

    def lossy_generate(*args: Any, **kwargs: Any) -> Any:
        result = real_generate(*args, **kwargs)
        if kwargs.get("method") == "pld" and len(result.tokens) > 2:
            result.tokens[2] = (result.tokens[2] + 1) % 257
        return result

    monkeypatch.setattr(racer_rs.engine.generation, "generate", lossy_generate)


def test_greedy_mismatch_is_flagged_and_exits_non_zero(tiny_model, tmp_path, capsys, monkeypatch):
    install_wrong_pld(monkeypatch)
    out = tmp_path / "out"
    data_file = tmp_path / "one.jsonl"
    data_file.write_text(json.dumps(ROWS[0]) + "\n", encoding="utf-8")
    code, stdout, stderr, report = run_bench(
        capsys,
        bench_args(tiny_model, data_file, out, "--methods", "ar,pld", "--temperature", "0", "--no-plots"),
    )
    assert code == 1
    assert report is not None and report["ok"] is False
    assert report["mismatches"] == [
        {
            "setting": "greedy",
            "question_id": 0,
            "source": str(data_file),
            "turn": 0,
            "method": "pld",
            "first_mismatch": 2,
        }
    ]
    assert report["summary"]["greedy"]["overall"]["pld"]["mismatches"] == 1
    assert "MISMATCH 1/1" in stdout
    assert "racer: MISMATCH: pld differs from ar at token 2" in stderr


def test_sampling_runs_are_not_compared_token_by_token(tiny_model, data_file, tmp_path, capsys, monkeypatch):
    install_wrong_pld(monkeypatch)
    out = tmp_path / "out"
    code, _, stderr, report = run_bench(
        capsys,
        bench_args(
            tiny_model,
            data_file,
            out,
            "--methods",
            "pld",
            "--temperature",
            "0.7",
            "--no-plots",
            "--limit",
            "1",
        ),
    )
    assert code == 0, stderr
    assert report["ok"] is True and all(r["mismatch"] is None for r in report["records"])


def test_persistent_mode_is_recorded(tiny_model, data_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, stderr, report = run_bench(
        capsys,
        bench_args(
            tiny_model,
            data_file,
            out,
            "--methods",
            "ar,racer",
            "--temperature",
            "0",
            "--no-plots",
            "--persistent",
            "--limit",
            "1",
        ),
    )
    assert code == 0, stderr
    assert report["config"]["state"] == "persistent"
    states = report["config"]["state_by_method"]
    assert states["racer"] == "persistent; shared index: learns across requests"
    assert states["ar"] in ("stateless", "persistent")  # ar has no state worth keeping
    assert all(r["mismatch"] in (None, False) for r in report["records"])


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("racer: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_malformed_data_row_is_a_one_line_error_with_file_and_line(tiny_model, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + '{"question_id": 7, "turns": "not a list"}\n', encoding="utf-8")
    code, _, err, _ = run_bench(capsys, bench_args(tiny_model, bad, tmp_path / "out"))
    assert_one_line_error(code, err, f"{bad}:2:", "'turns'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--methods", "ar,warp_drive"], ["unknown method 'warp_drive'", "token_recycling"]),
        (["--methods", "pld,pld"], ["listed more than once"]),
        (["--methods", "pld", "--option", "pld.no_such_knob=1"], ["no_such_knob"]),
        (["--methods", "pld", "--option", "racer.max_depth=1"], ["'racer' is not among --methods"]),
        (["--methods", "pld", "--option", "pld.capacity=4"], ["use the dedicated flag"]),
        (["--limit", "0"], ["--limit", "must be >= 1"]),
        (["--repeat", "0"], ["--repeat"]),
        (["--temperature", "-1"], ["--temperature"]),
        (["--dtype", "int3"], ["--dtype"]),
    ],
)
def test_bad_bench_input_is_a_one_line_error(tiny_model, data_file, tmp_path, capsys, extra, fragments):
    code, _, err, report = run_bench(capsys, bench_args(tiny_model, data_file, tmp_path / "out", *extra))
    assert_one_line_error(code, err, *fragments)
    assert report is None


def test_missing_model_and_data_are_one_line_errors(data_file, tmp_path, capsys):
    code, _, err, _ = run_bench(capsys, bench_args(tmp_path / "absent", data_file, tmp_path / "out"))
    assert_one_line_error(code, err, "--model: model not found")
    code, _, err, _ = run_bench(capsys, bench_args(tmp_path, tmp_path / "absent.jsonl", tmp_path / "out"))
    assert_one_line_error(code, err, "data file not found")


def test_draft_model_methods_get_the_draft_model(tiny_model, data_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = bench_args(tiny_model, data_file, out, "--methods", "draft_model,tts", "--temperature", "0")
    # The tiny target doubles as its own draft (same tokenizer); greedy output must still equal ar's.
    code, _, stderr, report = run_bench(capsys, [*argv, "--draft-model", str(tiny_model), "--no-plots"])
    assert code == 0, stderr
    assert report["config"]["draft_model"] == str(tiny_model)
    drafted = [r for r in report["records"] if r["method"] in ("draft_model", "tts")]
    assert drafted and all(r["mismatch"] is False for r in drafted)
    assert max(r["new_tokens"] / r["steps"] for r in drafted) > 1.0  # the draft's tokens were accepted


def test_missing_draft_model_is_a_one_line_error(tiny_model, data_file, tmp_path, capsys):
    argv = bench_args(tiny_model, data_file, tmp_path / "out", "--methods", "tts")
    code, _, err, _ = run_bench(capsys, [*argv, "--draft-model", str(tmp_path / "no-draft")])
    assert_one_line_error(code, err, "--draft-model: model not found")


def test_the_default_capacity_is_auto_on_every_device(tiny_model: Path, data_file: Path, tmp_path: Path) -> None:
    from racer_rs.cli.bench import default_capacity

    assert (default_capacity("cpu"), default_capacity("cuda:0")) == ("auto", "auto")
    argv = bench_args(tiny_model, data_file, tmp_path / "out", "--methods", "pld")
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert report["config"]["capacity"] == "auto"


def test_transformers_peers_run_in_the_same_benchmark(tiny_model, data_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(racer_rs.bench.stats, "DISTURBED_RATIO", float("inf"))  # tiny runs are noisy
    out = tmp_path / "out"
    argv = bench_args(tiny_model, data_file, out, "--methods", "hf,hf_pld,hf_assisted,pld", "--no-plots")
    code, stdout, stderr, report = run_bench(capsys, [*argv, "--draft-model", str(tiny_model)])
    assert code == 0, stderr
    assert report["config"]["methods"] == ["ar", "hf", "hf_pld", "hf_assisted", "pld"]
    records = report["records"]
    for record in records:
        assert 1 <= record["new_tokens"] <= 8
        if record["setting"] == "greedy" and record["method"] != "ar":
            assert record["mismatch"] is False, record["method"]  # transformers' greedy == ours
        if record["method"] in ("hf", "hf_pld"):  # read from the target's cache at each forward
            assert sum(record["accepted_lengths"]) == record["new_tokens"] == len(record["tokens"])
            assert record["steps"] == len(record["accepted_lengths"])
            assert 0 < record["prefill_s"] <= record["wall_s"]
        if record["method"] == "hf":
            assert set(record["accepted_lengths"]) == {1}
    for setting in ("greedy", "T=0.8,top_p=0.95"):
        overall = report["summary"][setting]["overall"]
        assert overall["hf"]["speedup_vs_hf"] == pytest.approx(1.0)
        # Per request (question, all turns) the ratio of tokens/s; their geometric mean.
        rows = [r for r in records if r["setting"] == setting]

        def rate(method: str, question: int, rows: list = rows) -> float:
            mine = [r for r in rows if r["method"] == method and r["question_index"] == question]
            return sum(r["new_tokens"] for r in mine) / sum(r["wall_s"] for r in mine)

        ratios = [rate("pld", q) / rate("hf", q) for q in sorted({r["question_index"] for r in rows})]
        assert overall["pld"]["speedup_vs_hf"] == pytest.approx(float(np.exp(np.mean(np.log(ratios)))))
        assert (
            overall["pld"]["speedup_vs_hf_low"]
            <= overall["pld"]["speedup_vs_hf"]
            <= overall["pld"]["speedup_vs_hf_high"]
        )
    # The repeating completion prompt gives prompt lookup drafts that the target accepts.
    pld_greedy = [r for r in records if r["method"] == "hf_pld" and r["setting"] == "greedy"]
    assert max(r["mat"] for r in pld_greedy) > 1.0
    assert "vs hf" in stdout


def test_peer_step_lengths_come_from_the_cache_length_at_each_forward():
    from racer_rs.bench.hf_peers import accepted_lengths

    # Prompt of 5, plain decoding of 4 tokens: prefill, then 3 decode forwards, then the last token.
    assert accepted_lengths([0, 5, 6, 7], prompt_length=5, new_tokens=4) == [1, 1, 1, 1]
    # Prompt lookup: the second decode forward accepted 3 drafts (cache jumps from 6 to 10).
    assert accepted_lengths([0, 5, 6, 10], prompt_length=5, new_tokens=8) == [1, 4, 2, 1]
    assert accepted_lengths([0], prompt_length=5, new_tokens=1) == [1]  # the prefill's token only
    assert accepted_lengths([0, -1, -1], prompt_length=5, new_tokens=3) == []  # no cache to read
    assert accepted_lengths([0, 5, 5], prompt_length=5, new_tokens=3) == []  # inconsistent: not guessed


def test_peers_reject_method_options_and_need_a_draft_for_assisted(tiny_model, data_file, tmp_path, capsys):
    argv = bench_args(tiny_model, data_file, tmp_path / "out", "--methods", "hf_assisted")
    code, _, err, _ = run_bench(capsys, argv)
    assert_one_line_error(code, err, "hf_assisted", "need a draft model", "--draft-model")
    argv = bench_args(tiny_model, data_file, tmp_path / "out", "--methods", "hf", "--option", "hf.breadth=4")
    code, _, err, _ = run_bench(capsys, argv)
    assert_one_line_error(code, err, "hf", "takes no options")


def _record(method: str, tokens: list[int], prompt: list[int], turn: int = 0) -> Any:
    from racer_rs.bench.runner import Record

    return Record(
        setting="greedy",
        question_index=0,
        question_id=0,
        category="c",
        source="s",
        turn=turn,
        method=method,
        seed=0,
        prompt_tokens=len(prompt),
        new_tokens=len(tokens),
        steps=len(tokens),
        mat=1.0,
        wall_s=1.0,
        prefill_s=0.0,
        decode_s=1.0,
        wall_s_repeats=[1.0],
        timings={},
        accepted_lengths=[1] * len(tokens),
        positions=list(range(len(tokens))),
        tokens=tokens,
        prompt_ids=prompt,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_mismatches_are_near_ties_only_within_rounding(dtype):
    from racer_rs.bench.report import mismatched_records
    from racer_rs.bench.runner import _check_against_ar
    from tests.helpers import plain_greedy, tiny_model

    model = tiny_model("llama", seed=3)
    prompt = [5, 9, 33, 2]
    top = plain_greedy(model, prompt, 3)[2]
    twin = 9 if top != 9 else 10
    with torch.no_grad():  # the twin gets exactly the logit of a token that is on top somewhere
        model.lm_head.weight[twin] = model.lm_head.weight[top]
    model = model.to(dtype)
    ar = plain_greedy(model, prompt, 4)
    index = next(i for i, token in enumerate(ar) if token in (top, twin))
    tied, wrong = list(ar), list(ar)
    tied[index] = top if ar[index] == twin else twin  # the other half of an exact tie
    wrong[index] = min(set(range(20)) - {top, twin, ar[index]})  # far below the top, surely
    records = [_record("ar", ar, prompt), _record("tied", tied, prompt), _record("wrong", wrong, prompt)]
    _check_against_ar(records, model)
    by_method = {r.method: r for r in records}
    assert by_method["tied"].mismatch and by_method["tied"].near_tie and by_method["tied"].tie_gap == 0.0
    assert by_method["wrong"].mismatch and by_method["wrong"].near_tie is False
    assert by_method["wrong"].tie_gap > by_method["wrong"].tie_tolerance > 0
    assert mismatched_records(records) == [by_method["wrong"]]
    # In float32 no mismatch is excused: outputs must agree exactly.
    for record in records:
        record.near_tie = None
    _check_against_ar(records, model.float())
    assert by_method["tied"].mismatch and by_method["tied"].near_tie is None
    assert len(mismatched_records(records)) == 2


def test_a_later_turn_after_a_differing_answer_is_not_compared():
    from racer_rs.bench.runner import _check_against_ar
    from tests.helpers import tiny_model

    model = tiny_model("llama")
    records = [
        _record("ar", [1, 2], [3, 4], turn=0),
        _record("ar", [5, 6], [3, 4, 1, 2, 8], turn=1),
        _record("pld", [1, 9], [3, 4], turn=0),
        _record("pld", [5, 6], [3, 4, 1, 9, 8], turn=1),  # its own answer fed back: another prompt
    ]
    _check_against_ar(records, model)
    assert [(r.method, r.turn, r.mismatch) for r in records] == [
        ("ar", 0, None),
        ("ar", 1, None),
        ("pld", 0, True),
        ("pld", 1, None),
    ]


def test_methods_may_carry_their_own_capacity_including_auto(tiny_model, data_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = bench_args(
        tiny_model, data_file, out, "--methods", "racer@2,racer@auto,pld", "--no-plots", "--temperature", "0"
    )
    code, stdout, stderr, report = run_bench(capsys, [*argv, "--max-capacity", "8"])
    assert code == 0, stderr
    assert report["config"]["methods"] == ["ar", "racer@2", "racer@auto", "pld"]
    assert report["config"]["max_capacity"] == 8
    by_label = {}
    for record in report["records"]:
        by_label.setdefault(record["method"], []).append(record)
        if record["method"] != "ar":
            assert record["mismatch"] is False
    assert all(r["extras"]["mean_tree_size"] <= 2 for r in by_label["racer@2"])
    auto = [r["extras"]["auto_capacity"] for r in by_label["racer@auto"]]
    assert all(max(int(size) for size in a["chosen_sizes"]) <= 8 for a in auto)
    assert all("auto_capacity" not in r["extras"] for r in by_label["racer@2"])
    assert "racer@auto" in stdout


@pytest.mark.parametrize(
    ("methods", "fragment"),
    [
        ("racer@0", "capacity must be an int >= 1 or 'auto'"),
        ("hf@4", "peers take no capacity"),
        ("nope@4", "unknown method"),
    ],
)
def test_bad_method_capacities_are_one_line_errors(tiny_model, data_file, tmp_path, capsys, methods, fragment):
    code, _, err, _ = run_bench(capsys, bench_args(tiny_model, data_file, tmp_path / "out", "--methods", methods))
    assert_one_line_error(code, err, fragment)


def test_suffix_is_reported_as_learning_across_requests(arctic, tiny_model, data_file, tmp_path, capsys):
    """SuffixDecoding's global tree is kept between questions (unlike the other methods' state
    without --persistent): the config says so, a note line says so, and its warm-up runs on a
    throwaway drafter, so the first timed question does not draft from the warm-up's answer."""
    from racer_rs.bench.runner import LEARNS_ACROSS_REQUESTS

    code, out, stderr, report = run_bench(
        capsys,
        bench_args(
            tiny_model,
            data_file,
            tmp_path / "out",
            "--methods",
            "ar,racer,suffix",
            "--temperature",
            "0",
            "--no-plots",
            "--limit",
            "1",
            "--warmup",
            "1",
        ),
    )
    assert code == 0, stderr
    states = report["config"]["state_by_method"]
    assert states == {"suffix": LEARNS_ACROSS_REQUESTS, "racer": "shared index: learns across requests"}
    assert "note: suffix: global tree of past responses learns across requests" in out
    assert "note: racer: shared index of past responses learns across requests (kept between" in out
    records = [r for r in report["records"] if r["method"] == "suffix"]
    assert [r["extras"]["cached_requests"] for r in records] == list(range(1, len(records) + 1))
    assert all(r["extras"]["global_tree"] is True and r["extras"]["mode"] == "tree" for r in records)
    assert all(r["mismatch"] is False for r in records)
