"""Hostile but realistic input: each class of mishandled case, tried as a careless user would.

Every test here failed before its fix (a killed interpreter, a silent wrap, a traceback, lost
results, a misleading message); the argument rules themselves are fuzzed in
``tests/test_argument_rules.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import racer_rs
from racer_rs import InvalidArgumentError, InvalidTypeError, ModelLoadError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from racer_rs.cli import main  # noqa: E402
from tests.helpers import (  # noqa: E402
    REPEATING_PROMPT,
    tiny_llama,
    tiny_model,
    write_tiny_model,
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code: int, err: str, *fragments: str) -> None:
    lines = [line for line in err.strip().splitlines() if not line.startswith("racer: converting")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("racer: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-cli-model"))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "questions.jsonl"
    rows = [
        {
            "question_id": 0,
            "category": "code",
            "turns": ["def add(a, b):\n    return a + b\n" * 3],
            "mode": "completion",
        },
        {"question_id": 1, "category": "qa", "turns": ["Say hello, hello, hello."]},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def bench(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench", "--model", str(model), "--data", str(data), "--max-new-tokens", "6", "--warmup", "0",
        "--device", "cpu", "--dtype", "float32", "--out", str(out), "--no-plots", "--no-progress",
        "--temperature", "0", *extra,
    ]  # fmt: skip


# --- the process dies on a big tree -------------------------------------------------------------


def test_a_huge_tree_mask_is_an_error_naming_its_size_not_an_abort():
    script = textwrap.dedent(
        """
        import numpy as np, racer_rs
        for make in (lambda: racer_rs.DraftTree.chain(np.arange(200_000, dtype=np.int32)),):
            try:
                make().attention_mask()
            except racer_rs.InvalidArgumentError as exc:
                print("error:", exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # an abort would be -6 (SIGABRT)
    assert "200000 x 200000" in done.stdout and "40000000000 elements" in done.stdout


def test_leaf_paths_of_a_broom_tree_are_bounded_too():
    n = 40_000  # a chain of n/2 with n/2 leaves at its end: leaves x depth = 4e8 > 2**28
    parents = [-1, *range(n // 2 - 1), *([n // 2 - 1] * (n // 2))]
    tokens = list(range(n))
    tree = racer_rs.DraftTree(tokens, parents)
    with pytest.raises(InvalidArgumentError, match=r"leaf paths .* at most 268435456"):
        tree.leaf_paths()


# --- token ids wrap modulo 2**32 silently ---------------------------------------------------------


@pytest.mark.parametrize("shift", [2**32, -(2**32), 2**31, 2**64])
def test_token_ids_out_of_range_are_errors_before_any_narrowing(shift):
    model = tiny_model("llama")
    ids = [i + shift for i in [1, 2, 3]]
    with pytest.raises(InvalidArgumentError, match="input_ids must be token ids"):
        racer_rs.generate(model, ids, max_new_tokens=2)
    if -(2**63) <= ids[0] < 2**63:
        with pytest.raises(InvalidArgumentError, match="input_ids must be token ids"):
            racer_rs.generate(model, torch.tensor([ids]), max_new_tokens=2)
        with pytest.raises(InvalidArgumentError, match="input_ids must be token ids"):
            racer_rs.generate(model, np.asarray(ids, dtype=np.int64), max_new_tokens=2)
    with pytest.raises(InvalidArgumentError, match="does not fit in int32"):
        racer_rs.Automaton().extend(ids)


def test_every_integer_dtype_reaches_the_rust_core_range_checked():
    tree = racer_rs.DraftTree.chain(np.array([1, 2, 3], dtype=np.uint8))
    assert tree.tokens.tolist() == [1, 2, 3]
    with pytest.raises(InvalidArgumentError, match="4294967301 does not fit"):
        racer_rs.DraftTree.chain(np.array([2**32 + 5], dtype=np.uint64))
    with pytest.raises(InvalidTypeError, match="expected an integer array"):
        racer_rs.DraftTree.chain(np.array([1.0]))


# --- a diverged or NaN draft kills sampling requests ----------------------------------------------


def nan_draft(seed: int = 1) -> Any:
    draft = tiny_llama(seed)
    with torch.no_grad():
        for parameter in draft.model.layers[0].parameters():
            parameter.fill_(float("nan"))
    return draft


@pytest.mark.parametrize("method", ["draft_model", "tts", "racer_tts"])
def test_a_draft_with_nan_weights_costs_acceptance_not_the_request(method):
    target = tiny_llama(0)
    options: dict[str, Any] = {"draft_model": nan_draft(), "canvas": 3}
    if method != "draft_model":
        options |= {"update_every": 1, "asynchronous": False}
    for temperature in (0.8, 0.0):
        result = racer_rs.generate(
            target, REPEATING_PROMPT, method=method, max_new_tokens=12, temperature=temperature, seed=0, **options
        )
        assert len(result.tokens) == 12
        assert result.extras["draft_nonfinite_steps"] > 0


def test_a_diverging_tts_update_is_undone_and_reported(monkeypatch):
    from racer_rs.drafters import tts

    real_step = tts.distill_step

    def diverging(model, optimizer, canvas, config, reference=None):  # type: ignore[no-untyped-def]
        loss = real_step(model, optimizer, canvas, config, reference=reference)
        with torch.no_grad():
            next(p for p in model.parameters() if p.requires_grad).fill_(float("inf"))
        return loss

    monkeypatch.setattr(tts, "distill_step", diverging)
    target = tiny_llama(0)
    result = racer_rs.generate(
        target, REPEATING_PROMPT, method="tts", draft_model=tiny_llama(1), canvas=3, update_every=1,
        max_new_tokens=16, temperature=0.8, seed=0, asynchronous=False,
    )  # fmt: skip
    assert len(result.tokens) == 16
    assert result.extras["tts_diverged_updates"] > 0
    assert result.extras["draft_nonfinite_steps"] == 0  # the serving draft never saw the bad weights


@pytest.mark.parametrize("lr", [10.0, 0.0, -1.0, float("nan")])
def test_the_learning_rate_is_range_checked(lr):
    with pytest.raises(InvalidArgumentError, match="lr must be"):
        racer_rs.generate(
            tiny_llama(0), REPEATING_PROMPT, method="tts", draft_model=tiny_llama(1), lr=lr, max_new_tokens=2
        )


# --- a draft with a smaller vocabulary than the target ----------------------------------------------


def test_a_draft_of_a_smaller_vocabulary_is_refused_before_generation():
    target = tiny_model("llama", vocab=96)
    draft = tiny_model("llama", vocab=40)
    for method in ("draft_model", "tts", "racer_tts"):
        with pytest.raises(InvalidArgumentError, match=r"vocabulary of 40 tokens, the target 96"):
            racer_rs.generate(target, [1, 2, 3], method=method, draft_model=draft, max_new_tokens=4)


def test_the_cli_reports_a_draft_of_another_vocabulary_in_one_line(cli_model, tmp_path, capsys):
    small = tmp_path / "small"
    small.mkdir()
    tiny_model("llama", vocab=40).save_pretrained(small)
    (small / "tokenizer.json").write_text((cli_model / "tokenizer.json").read_text())
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (cli_model / name).exists():
            (small / name).write_text((cli_model / name).read_text())
    capsys.readouterr()  # save_pretrained's own progress bar
    code, _, err = run_cli(
        capsys, "generate", "--model", str(cli_model), "--draft-model", str(small), "--method", "draft_model",
        "--prompt", "hello", "--max-new-tokens", "4", "--device", "cpu", "--dtype", "float32",
    )  # fmt: skip
    one_line_error(code, err, "vocabulary of 40 tokens")


# --- an unwritable --out is found only after the whole run ---------------------------------------


def test_an_unwritable_bench_out_fails_before_any_work(cli_model, data_file, tmp_path, capsys, monkeypatch):
    from racer_rs.cli import common

    def no_loading(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("models were loaded before --out was checked")

    monkeypatch.setattr(common, "LoadedModels", no_loading)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run_cli(capsys, *bench(cli_model, data_file, blocker / "out"))
    one_line_error(code, err, "--out", "cannot write there")
    code, _, err = run_cli(capsys, *bench(cli_model, data_file, blocker))
    one_line_error(code, err, "exists and is not a folder")


def test_an_unwritable_distill_out_fails_before_any_work(cli_model, data_file, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run_cli(
        capsys, "distill-draft", "--model", str(cli_model), "--data", str(data_file), "--layers", "1",
        "--minutes", "0.1", "--out", str(blocker / "draft"), "--device", "cpu",
    )  # fmt: skip
    one_line_error(code, err, "--out", "cannot write there")


def test_a_report_that_cannot_be_written_at_the_end_is_kept_elsewhere(
    cli_model, data_file, tmp_path, capsys, monkeypatch
):
    from racer_rs import _io

    real = _io.write_text_atomically

    def full_disk(path: Path, text: str) -> None:
        if path.name == "bench.json":
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(_io, "write_text_atomically", full_disk)
    code, _, err = run_cli(capsys, *bench(cli_model, data_file, tmp_path / "out", "--methods", "pld"))
    assert code == 2
    line = next(line for line in err.splitlines() if "could not write" in line)
    saved = Path(line.rsplit("the report is in ", 1)[1])
    report = json.loads(saved.read_text())
    assert report["records"] and "No space left" in line
    saved.unlink()


# --- a damaged checkpoint folder ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate", "zero_fill", "shape_mismatch"])
def test_a_damaged_checkpoint_is_one_clear_error(cli_model, tmp_path, capsys, damage):
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(cli_model, folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 3])
    elif damage == "zero_fill":
        weights.write_bytes(bytes(len(data)))
    else:
        config = json.loads((folder / "config.json").read_text())
        config["hidden_size"] = 48
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"cannot load model"):
        racer_rs.load_model(str(folder))
    code, _, err = run_cli(
        capsys, "generate", "--model", str(folder), "--prompt", "hi", "--device", "cpu", "--dtype", "float32"
    )
    one_line_error(code, err, "cannot load model")


# --- an unscoped --option in bench -------------------------------------------------------------------


def test_an_unscoped_option_goes_to_the_methods_that_take_it(cli_model, data_file, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_cli(
        capsys, *bench(cli_model, data_file, out, "--methods", "racer,racer_scored", "--option", "ngram=4")
    )
    assert code == 0, err
    config = json.loads((out / "bench.json").read_text())["config"]
    assert config["method_options"]["racer"] == {"ngram": 4} and config["method_options"]["ar"] == {}
    code, _, err = run_cli(capsys, *bench(cli_model, data_file, out, "--methods", "racer", "--option", "nonsense=1"))
    one_line_error(code, err, "--option nonsense", "none of the listed methods")


# --- a bench prompt that outgrows the window -----------------------------------------------------------


def test_a_question_that_outgrows_the_window_is_skipped_and_the_rest_reported(cli_model, tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    rows = [
        {"question_id": "short", "category": "qa", "turns": ["Say hi."]},
        {"question_id": "huge", "category": "qa", "turns": ["word " * 2000]},
        {"question_id": "also-short", "category": "qa", "turns": ["Say bye."]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, *bench(cli_model, data, out, "--methods", "pld", "--all"))
    assert code == 0, err
    report = json.loads((out / "bench.json").read_text())
    assert {r["question_id"] for r in report["records"]} == {"short", "also-short"}
    assert [s["question_id"] for s in report["skipped"]] == ["huge"]
    assert "skipped question huge" in err and "window" in err


def test_a_run_stopped_midway_keeps_its_finished_questions(cli_model, data_file, tmp_path, capsys, monkeypatch):
    from racer_rs.engine import generation

    real = generation.generate
    calls = {"n": 0}

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 3:  # the first question (ar, pld, ar) finished
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate", interrupted)
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, *bench(cli_model, data_file, out, "--methods", "pld"))
    assert code == 130
    partial = json.loads((out / "bench.partial.json").read_text())
    assert partial["partial"] is True and "KeyboardInterrupt" in partial["stopped_by"]
    assert {r["question_index"] for r in partial["records"]} == {0}
    assert "finished record(s) are saved" in err


# --- a mistyped local folder goes to the hub ---------------------------------------------------------------


def test_a_mistyped_draft_model_folder_is_an_unknown_name_at_once(cli_model, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    code, _, err = run_cli(
        capsys, "generate", "--model", str(cli_model), "--draft-model", "dd_okk", "--method", "draft_model",
        "--prompt", "hi", "--device", "cpu",
    )  # fmt: skip
    one_line_error(code, err, "unknown model name 'dd_okk'")
    assert time.perf_counter() - start < 10  # no network retries


# --- streamer errors mask each other ----------------------------------------------------------------------


class FailingStreamer:
    def __init__(self, put_error: Exception | None, end_error: Exception | None) -> None:
        self.put_error, self.end_error = put_error, end_error

    def put(self, tokens: list[int], drafted: list[bool]) -> None:
        if self.put_error is not None:
            raise self.put_error

    def end(self) -> None:
        if self.end_error is not None:
            raise self.end_error


def test_the_first_streamer_error_is_the_one_that_surfaces():
    model = tiny_model("llama")
    with pytest.raises(ZeroDivisionError, match="put failed"):
        racer_rs.generate(
            model, [1, 2, 3], max_new_tokens=4,
            streamer=FailingStreamer(ZeroDivisionError("put failed"), LookupError("end failed")),
        )  # fmt: skip
    with pytest.raises(LookupError, match="end failed"):  # end's own error, when nothing failed before
        racer_rs.generate(model, [1, 2, 3], max_new_tokens=4, streamer=FailingStreamer(None, LookupError("end failed")))


# --- messages that name the wrong thing -----------------------------------------------------------------------


def test_messages_name_the_argument_and_the_value_as_given():
    model = tiny_model("llama")
    with pytest.raises(InvalidArgumentError, match=r"^max_nodes must be >= 1, got 0$"):
        racer_rs.generate(model, [1, 2, 3], method="racer", max_nodes=0, max_new_tokens=2)
    with pytest.raises(InvalidArgumentError, match=r"max_nodes: must be >= ngram \* \(ngram \+ 1\) / 2 = 55"):
        racer_rs.generate(model, [1, 2, 3], method="racer", max_nodes=5, max_new_tokens=2)
    with pytest.raises(InvalidArgumentError, match="18446744073709551616"):
        racer_rs.Automaton(capacity=2**64)
    with pytest.raises(InvalidArgumentError, match=r"^capacity: must be >= "):
        racer_rs.Automaton(capacity=3)  # the alias is named as the caller spelled it
    with pytest.raises(InvalidArgumentError, match=r"eos_token_id must be a token id in \[0, 96\), got 1000000"):
        racer_rs.generate(model, [1, 2, 3], eos_token_id=10**6, max_new_tokens=2)


def test_a_reduced_vocabulary_that_holds_only_the_kept_tokens_is_refused(cli_model, data_file, tmp_path, capsys):
    code, _, err = run_cli(
        capsys, "distill-draft", "--model", str(cli_model), "--data", str(data_file), "--layers", "1",
        "--minutes", "0.1", "--vocab", "1", "--out", str(tmp_path / "draft"), "--device", "cpu",
    )  # fmt: skip
    one_line_error(code, err, "vocab must be >", "always keeps")
