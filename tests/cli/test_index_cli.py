"""``racer index build`` / ``racer index info`` and ``--index`` on ``racer generate`` and ``racer bench``.

A tiny random Llama model with a byte-level tokenizer is written to a temporary folder (as in
``test_cli.py``); commands run in-process through :func:`racer_rs.cli.main`. Every error path is
one line on stderr with exit code 2, and the checks that can fail run before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs  # noqa: E402
import racer_rs.loading.models  # noqa: E402
from racer_rs import Automaton  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from racer_rs.drafters.index import forget_indexes  # noqa: E402
from tests.helpers import write_tiny_model  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
ROWS = [
    {"question_id": 1, "category": "code", "turns": ["def mul(a, b):\n    return a * b\n", "and div?"]},
    {"question_id": 2, "category": "qa", "turns": ["What is two plus two?"]},
]
PROMPT = "def add(a, b):\n    return a"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path, Path]:
    text = tmp_path / "code.py"
    text.write_text(TEXT, encoding="utf-8")
    rows = tmp_path / "questions.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"text": "hello world\n"}) + "\n\n" + json.dumps({"text": "hello there\n"}) + "\n")
    return text, rows, texts


@pytest.fixture(autouse=True)
def _fresh_indexes():
    forget_indexes()
    yield
    forget_indexes()


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("racer: error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def build(capsys, model, out, *files, extra=()) -> tuple[int, str, str]:
    return run_cli(capsys, "index", "build", *files, "--model", model, "--out", out, "--no-progress", *extra)


# --- racer index build --------------------------------------------------------------------


def test_build_indexes_every_document_as_one_sequence(tiny_model, tokenizer, corpus, tmp_path, capsys):
    out = tmp_path / "corpus.idx"
    code, stdout, err = build(capsys, tiny_model, out, *corpus, extra=("--ngram", "6", "--max-nodes", "20000"))
    assert code == 0, err
    assert f"wrote {out}: 6 documents" in stdout and "ngram 6" in stdout
    index = Automaton.load(out)
    assert (index.ngram, index.max_nodes, index.min_depth) == (6, 20_000, 2)
    # The same as indexing by hand: the file, each turn of each row, each row's text.
    documents = [TEXT, *ROWS[0]["turns"], *ROWS[1]["turns"], "hello world\n", "hello there\n"]
    expected = Automaton(ngram=6, max_nodes=20_000)
    for document in documents:
        expected.extend(np.asarray(tokenizer(document, add_special_tokens=False)["input_ids"], dtype=np.int32))
        expected.new_sequence()
    assert index.to_bytes() == expected.to_bytes()
    code, stdout, _ = run_cli(capsys, "index", "info", out)
    assert code == 0 and f"{len(index)} nodes (budget 20000), ngram 6, min_depth 2" in stdout


def test_build_loads_only_the_tokenizer(tiny_model, corpus, tmp_path, capsys, monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("racer index build loaded the model's weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    monkeypatch.setattr(racer_rs.loading.models, "load_model", no_weights)
    code, _, err = build(capsys, tiny_model, tmp_path / "a.idx", corpus[0])
    assert code == 0, err


def test_field_selects_what_a_jsonl_row_holds(tiny_model, tmp_path, capsys):
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps({"turns": ["aaaa bbbb"], "text": "cccc dddd"}) + "\n")
    for field, present, absent in (("turns", "aaaa", "cccc"), ("text", "cccc", "aaaa")):
        out = tmp_path / f"{field}.idx"
        code, _, err = build(capsys, tiny_model, out, both, extra=("--field", field))
        assert code == 0, err
        index = Automaton.load(out)
        tokens = transformers.AutoTokenizer.from_pretrained(tiny_model)
        assert index.count(tokens(present, add_special_tokens=False)["input_ids"][:4]) == 1
        assert index.count(tokens(absent, add_special_tokens=False)["input_ids"][:4]) == 0


def test_a_full_budget_is_a_warning(tiny_model, corpus, tmp_path, capsys):
    code, _, err = build(
        capsys, tiny_model, tmp_path / "small.idx", corpus[0], extra=("--ngram", "4", "--max-nodes", "10")
    )
    assert code == 0
    assert "filled its node budget (10)" in err and "--max-nodes" in err


def test_the_index_replaces_an_existing_file_atomically(tiny_model, corpus, tmp_path, capsys):
    out = tmp_path / "a.idx"
    out.write_bytes(b"old")
    code, _, err = build(capsys, tiny_model, out, corpus[0])
    assert code == 0, err
    Automaton.load(out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".a.idx")] == []  # no temporary left


# --- index build errors: one line, exit 2, checked before any work -------------------------


@pytest.fixture
def no_tokenizer(monkeypatch):
    """Fail the test if the tokenizer is loaded (an error must come before any work)."""

    def fail(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded before the error")

    monkeypatch.setattr(racer_rs.loading.models, "load_tokenizer", fail)


@pytest.mark.parametrize(
    ("lines", "fragment"),
    [
        (["{bad json"], "bad.jsonl:1: invalid JSON"),
        ([json.dumps({"turns": ["ok"]}), "[1, 2]"], "bad.jsonl:2: expected a JSON object, got list"),
        ([json.dumps({"turns": "not a list"})], "bad.jsonl:1: 'turns' must be a non-empty list of strings"),
        ([json.dumps({"turns": []})], "bad.jsonl:1: 'turns' must be a non-empty list of strings"),
        ([json.dumps({"text": 7})], "bad.jsonl:1: 'text' must be a string, got int"),
        ([json.dumps({"question_id": 1}), ""], "bad.jsonl:1: neither a 'turns' nor a 'text' field"),
        (["", "", json.dumps({"other": "x"})], "bad.jsonl:3:"),
    ],
)
def test_bad_jsonl_rows_name_file_and_line(tiny_model, tmp_path, capsys, no_tokenizer, lines, fragment):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, _, err = build(capsys, tiny_model, tmp_path / "a.idx", bad)
    assert_one_line_error(code, err, fragment)
    assert not (tmp_path / "a.idx").exists()


def test_a_field_a_row_lacks_names_file_and_line(tiny_model, tmp_path, capsys, no_tokenizer):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"text": "x"}) + "\n" + json.dumps({"turns": ["y"]}) + "\n")
    code, _, err = build(capsys, tiny_model, tmp_path / "a.idx", rows, extra=("--field", "text"))
    assert_one_line_error(code, err, "rows.jsonl:2: no 'text' field")


def test_build_error_paths(tiny_model, corpus, tmp_path, capsys, no_tokenizer):
    text = corpus[0]
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    cases = [
        ((text,), tmp_path / "missing" / "a.idx", (), "--out", "the folder", "does not exist"),
        ((text,), a_file / "a.idx", (), "--out", "is not a folder"),
        ((text,), tmp_path, (), "--out", "is a folder"),
        ((text,), text, (), "--out", "is one of the input files"),
        ((tmp_path / "absent.txt",), tmp_path / "a.idx", (), "file not found:", "absent.txt"),
        ((tmp_path,), tmp_path / "a.idx", (), "is a folder, not a text or JSONL file"),
        ((latin,), tmp_path / "a.idx", (), "latin.txt is not UTF-8 text"),
        ((empty,), tmp_path / "a.idx", (), "no text to index"),
        ((text,), tmp_path / "a.idx", ("--ngram", "1"), "index settings", "ngram"),
        ((text,), tmp_path / "a.idx", ("--ngram", "65"), "ngram"),
        ((text,), tmp_path / "a.idx", ("--max-nodes", "3"), "max_nodes"),
        ((text,), tmp_path / "a.idx", ("--max-nodes", "0"), "--max-nodes", "must be >= 1"),
        ((text,), tmp_path / "a.idx", ("--field", "body"), "--field", "invalid choice"),
    ]
    for files, out, extra, *fragments in cases:
        code, _, err = build(capsys, tiny_model, out, *files, extra=extra)
        assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "a.idx").exists()
    code, _, err = build(capsys, tmp_path / "no-model", tmp_path / "a.idx", text)
    assert_one_line_error(code, err, "--model", "model not found")
    code, _, err = run_cli(capsys, "index", "build", text, "--out", tmp_path / "a.idx")
    assert_one_line_error(code, err, "--model")


def test_info_error_paths(tmp_path, capsys):
    code, _, err = run_cli(capsys, "index", "info", tmp_path / "absent.idx")
    assert_one_line_error(code, err, "index file not found")
    code, _, err = run_cli(capsys, "index", "info", tmp_path)
    assert_one_line_error(code, err, "is not a file")
    damaged = tmp_path / "damaged.idx"
    Automaton().save(damaged)
    damaged.write_bytes(damaged.read_bytes()[:-1])
    code, _, err = run_cli(capsys, "index", "info", damaged)
    assert_one_line_error(code, err, "index:", "damaged.idx")
    code, _, err = run_cli(capsys, "index")
    assert_one_line_error(code, err, "ACTION")


# --- racer generate --index ----------------------------------------------------------------


def test_generate_with_a_built_index_prints_the_same_text(tiny_model, corpus, tmp_path, capsys):
    out = tmp_path / "corpus.idx"
    assert build(capsys, tiny_model, out, *corpus)[0] == 0
    common = ("generate", "--model", tiny_model, "--prompt", PROMPT, "--max-new-tokens", "24", "--no-color")
    common += ("--device", "cpu", "--dtype", "float32")
    code, plain, err = run_cli(capsys, *common)
    assert code == 0, err
    for method in ("racer", "racer_scored", "racer_retrieval"):
        code, indexed, err = run_cli(capsys, *common, "--method", method, "--index", out)
        assert code == 0, err
        assert indexed == plain and f"method: {method}" in err
    code, indexed, err = run_cli(capsys, *common, "--index", "memory")
    assert code == 0 and indexed == plain, err


def test_generate_index_error_paths(tiny_model, tmp_path, capsys):
    common = ("generate", "--model", tiny_model, "--prompt", PROMPT, "--max-new-tokens", "4", "--device", "cpu")
    code, _, err = run_cli(capsys, *common, "--index", tmp_path / "absent.idx")
    assert_one_line_error(code, err, "--index: file not found")
    code, _, err = run_cli(capsys, *common, "--index", tmp_path)
    assert_one_line_error(code, err, "--index:", "is a folder")
    code, _, err = run_cli(capsys, *common, "--method", "pld", "--index", "memory")
    assert_one_line_error(code, err, "--index: method 'pld' takes no shared index")
    code, _, err = run_cli(capsys, *common, "--method", "racer_logits", "--index", "memory")
    assert_one_line_error(code, err, "--index: method 'racer_logits' takes no shared index")
    damaged = tmp_path / "damaged.idx"
    Automaton().save(damaged)
    damaged.write_bytes(b"RACERIDX" + damaged.read_bytes()[8:-2])
    code, _, err = run_cli(capsys, *common, "--index", damaged)
    assert_one_line_error(code, err, "method racer", "damaged.idx")
    other = tmp_path / "other-vocabulary.idx"
    index = Automaton(ngram=4, min_depth=1)  # a border may be the root's token alone
    for token in range(300):  # continues every "t" with tokens the tiny model's 257 do not have
        index.extend(np.asarray([token, 400, 401, 402], dtype=np.int32))
        index.new_sequence()
    index.save(other)
    code, _, err = run_cli(capsys, *common, "--index", other, "--max-new-tokens", "8")
    assert_one_line_error(code, err, "outside the model's vocabulary", "another tokenizer")
