"""Tests of ``racer distill-draft`` and of ``--draft-model self:K`` / a distilled checkpoint.

A tiny random Llama and byte-level tokenizer (``tests/helpers.py``) are distilled for a few
seconds; the checkpoint then drives ``racer generate`` and ``racer bench`` (greedy output equal
to plain decoding there). Every bad input is one ``racer: error: ...`` line with exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from racer_rs.cli import main  # noqa: E402
from tests.cli.test_cli import assert_one_line_error, run_cli  # noqa: E402
from tests.helpers import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

ROWS = [
    {"question_id": i, "category": "code", "turns": [f"def f{i}(x):\n    return x + {i}\n\nprint(f{i}("]}
    for i in range(6)
] + [{"question_id": 9, "category": "text", "mode": "completion", "turns": ["The quick brown fox "]}]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def distill_args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "distill-draft",
        "--model", str(model),
        "--data", str(data),
        "--out", str(out),
        "--layers", "1",
        "--minutes", "0.02",
        "--batch-size", "2",
        "--new-tokens", "6",
        "--device", "cpu",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tiny_model: Path, data_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("distilled") / "draft"
    assert main(distill_args(tiny_model, data_file, out, "--vocab", "64")) == 0
    return out


def test_distill_draft_writes_a_checkpoint_and_reports_progress(tiny_model, data_file, tmp_path, capsys) -> None:
    out = tmp_path / "draft"
    code, stdout, stderr = run_cli(capsys, *distill_args(tiny_model, data_file, out, "--vocab", "64"))
    assert code == 0, stderr
    assert stdout.strip() == f"{out}  (use: --draft-model {out})"
    lines = stderr.strip().splitlines()
    assert all(line.startswith("racer: distill-draft: ") for line in lines)
    assert "7 prompts from" in lines[0]
    assert any("data: shard 1 (held out" in line and "ETA" in line for line in lines)
    assert "done:" in lines[-1] and "held-out KL" in lines[-1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["layers"] == 1 and manifest["vocab"] == 64 and manifest["target"]["name"] == str(tiny_model)
    # The same command again: already finished, nothing redone.
    code, _, stderr = run_cli(capsys, *distill_args(tiny_model, data_file, out, "--vocab", "64"))
    assert code == 0 and "already finished" in stderr


def generate_args(model: Path, draft: str, method: str = "draft_model") -> list[str]:
    return [
        "generate", "--model", str(model), "--prompt", "def f(x):\n    return", "--method", method,
        "--max-new-tokens", "16", "--device", "cpu", "--dtype", "float32", "--no-color", "--draft-model", draft,
    ]  # fmt: skip


@pytest.mark.parametrize("method", ["draft_model", "tts", "racer_tts"])
def test_generate_with_the_distilled_checkpoint_equals_plain_decoding(tiny_model, checkpoint, capsys, method) -> None:
    code, expected, _ = run_cli(capsys, *generate_args(tiny_model, str(tiny_model), "ar"))
    assert code == 0
    code, stdout, stderr = run_cli(capsys, *generate_args(tiny_model, str(checkpoint), method))
    assert code == 0, stderr
    assert stdout == expected


def test_generate_with_an_undistilled_self_draft(tiny_model, capsys) -> None:
    code, expected, _ = run_cli(capsys, *generate_args(tiny_model, str(tiny_model), "ar"))
    code, stdout, stderr = run_cli(capsys, *generate_args(tiny_model, "self:1"))
    assert code == 0, stderr
    assert stdout == expected


def test_bench_runs_hf_assisted_and_draft_methods_with_a_self_draft(
    tiny_model, checkpoint, data_file, tmp_path, capsys
):
    out = tmp_path / "bench"
    argv = [
        "bench", "--model", str(tiny_model), "--data", str(data_file), "--max-new-tokens", "8", "--warmup", "0",
        "--device", "cpu", "--dtype", "float32", "--out", str(out), "--no-plots",
        "--methods", "draft_model,tts,hf_assisted", "--draft-model", str(checkpoint),
    ]  # fmt: skip
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 0, stderr
    report = json.loads((out / "bench.json").read_text())
    greedy = [r for r in report["records"] if r["setting"] == "greedy" and r["method"] != "ar"]
    assert greedy and not any(r["mismatch"] for r in greedy)


@pytest.mark.parametrize(
    ("draft", "fragment"),
    [
        ("self:0", "expected self:K with K >= 1"),
        ("self:two", "expected self:K with K >= 1"),
        ("self:", "expected self:K with K >= 1"),
        ("self:3", "layers must be in 1..2"),
    ],
)
def test_bad_self_draft_specs_are_one_line_errors(tiny_model, capsys, draft, fragment) -> None:
    code, _, err = run_cli(capsys, *generate_args(tiny_model, draft))
    assert_one_line_error(code, err, "--draft-model", fragment)


def test_broken_checkpoints_are_one_line_errors(tiny_model, checkpoint, tmp_path, capsys) -> None:
    import shutil

    truncated = tmp_path / "truncated"
    shutil.copytree(checkpoint, truncated)
    weights = next(truncated.glob("draft-*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-64])
    code, _, err = run_cli(capsys, *generate_args(tiny_model, str(truncated)))
    assert_one_line_error(code, err, "--draft-model", "truncated or corrupt")

    unfinished = tmp_path / "unfinished"
    shutil.copytree(checkpoint / "work", unfinished / "work")
    code, _, err = run_cli(capsys, *generate_args(tiny_model, str(unfinished)))
    assert_one_line_error(code, err, "--draft-model", "unfinished distillation")

    other = write_tiny_model(tmp_path / "other-model", seed=7)
    code, _, err = run_cli(capsys, *generate_args(other, str(checkpoint)))
    assert_one_line_error(code, err, "--draft-model", "weights differ")


def test_distill_draft_resumes_after_an_interruption(tiny_model, data_file, tmp_path, capsys, monkeypatch) -> None:
    from racer_rs.selfdraft.distillation import run as distill_run

    real = distill_run.save_shard
    calls = {"n": 0}

    def interrupt_the_third(shard, path):  # after writing it, before the state counts it
        real(shard, path)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(distill_run, "save_shard", interrupt_the_third)
    out = tmp_path / "draft"
    code, _, stderr = run_cli(capsys, *distill_args(tiny_model, data_file, out, "--minutes", "0.05"))
    assert code == 130
    assert "interrupted; the work done so far is saved" in stderr and "run the same command to resume" in stderr
    monkeypatch.setattr(distill_run, "save_shard", real)
    code, _, stderr = run_cli(capsys, *distill_args(tiny_model, data_file, out, "--minutes", "0.05"))
    assert code == 0, stderr
    assert "resuming: 2 shard(s)" in stderr
    assert (out / "manifest.json").exists()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--layers", "3"], "layers must be <= 2"),
        (["--vocab", "300"], "vocab must be <= 257"),
        (["--minutes", "0"], "--minutes: must be > 0"),
        (["--minutes", "x"], "--minutes: not a number"),
        (["--data-share", "1"], "--data-share: must be in (0, 1)"),
        (["--batch-size", "4"], "need at least 8 prompts"),
        (["--layers", "0"], "--layers: must be >= 1"),
    ],
)
def test_bad_distill_arguments_are_one_line_errors(tiny_model, data_file, tmp_path, capsys, extra, fragment) -> None:
    code, _, err = run_cli(capsys, *distill_args(tiny_model, data_file, tmp_path / "out", *extra))
    assert_one_line_error(code, err, fragment)


def test_distill_output_and_data_errors_are_one_line_errors(
    tiny_model, data_file, checkpoint, tmp_path, capsys
) -> None:
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(capsys, *distill_args(tiny_model, data_file, tmp_path / "file"))
    assert_one_line_error(code, err, "--out", "not a folder")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, *distill_args(tiny_model, data_file, tmp_path / "busy"))
    assert_one_line_error(code, err, "--out", "not empty")
    code, _, err = run_cli(capsys, *distill_args(tiny_model, tmp_path / "absent.jsonl", tmp_path / "out"))
    assert_one_line_error(code, err, "data file not found")
    code, _, err = run_cli(
        capsys, *distill_args(tiny_model, data_file, tmp_path / "out2", "--model", str(tmp_path / "none"))
    )
    assert_one_line_error(code, err, "--model: model not found")
    # An existing distillation with other settings: refused, not overwritten.
    code, _, err = run_cli(capsys, *distill_args(tiny_model, data_file, checkpoint, "--vocab", "32"))
    assert_one_line_error(code, err, "other settings", "vocab")
