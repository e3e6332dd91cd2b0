"""Tests of the ``racer`` command line: ``racer generate``, prompt files, paths and errors.

A tiny random Llama model and a byte-level tokenizer are written to a temporary folder; commands
run in-process through :func:`racer_rs.cli.main` except two subprocess tests of
``python -m racer_rs`` (real exit code, and plain output when stdout is a pipe).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs  # noqa: E402
from racer_rs.bench.prompting import encode_conversation  # noqa: E402
from racer_rs.bench.prompts import MULTI_TURN_CATEGORY, load_benchmark, load_questions  # noqa: E402
from racer_rs.cli import main  # noqa: E402
from racer_rs.cli.errors import CLIError  # noqa: E402
from racer_rs.cli.resources import resolve_shipped  # noqa: E402
from racer_rs.cli.streaming import DRAFTED_STYLE, RESET_STYLE, TerminalStreamer  # noqa: E402
from tests.helpers import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

# Repeats, so that prompt lookup finds drafts the target accepts.
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
ANSI = "\x1b["


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model)


def plain_greedy(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Reference: greedy decoding by re-running the full sequence each step (no cache), stopping at EOS 0."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = list(prompt_ids)
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            new.append(token)
            if token == 0:
                break
    return new


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("racer: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# --- racer generate -----------------------------------------------------------------------


def generate_args(model: Path, *extra: str) -> list[str]:
    return [
        "generate",
        "--model",
        str(model),
        "--prompt",
        PROMPT,
        "--method",
        "pld",
        "--max-new-tokens",
        "24",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        *extra,
    ]


def test_generate_prints_the_greedy_text_and_a_stats_line(tiny_model, tokenizer, capsys):
    code, out, err = run_cli(capsys, *generate_args(tiny_model, "--no-color"))
    assert code == 0, err
    expected_tokens = plain_greedy(tiny_model, tokenizer(PROMPT)["input_ids"], 24)
    assert out == tokenizer.decode(expected_tokens, skip_special_tokens=True) + "\n"
    assert ANSI not in out
    stats = err.strip().splitlines()[-1]
    assert f"new tokens: {len(expected_tokens)}" in stats
    for field in ("steps:", "MAT:", "tokens/s:"):
        assert field in stats


def test_generate_highlights_drafted_tokens_with_forced_color(tiny_model, tokenizer, capsys):
    code, out, err = run_cli(capsys, *generate_args(tiny_model, "--color", "always"))
    assert code == 0, err
    drafted = int(err.split("drafted: ")[1].split()[0])
    assert drafted > 0, "the prompt should make pld drafts that the target accepts"
    # The model writes ASCII (one character per token): the coloured characters are the drafted tokens.
    coloured = re.findall(re.escape(DRAFTED_STYLE) + "(.*?)" + re.escape(RESET_STYLE), out, flags=re.S)
    assert sum(len(span) for span in coloured) == drafted
    # Colour codes only wrap text: removing them leaves exactly the plain output.
    plain = out.replace(DRAFTED_STYLE, "").replace(RESET_STYLE, "")
    code, no_color_out, _ = run_cli(capsys, *generate_args(tiny_model, "--no-color"))
    assert plain == no_color_out


def test_generate_auto_color_is_off_when_not_a_tty(tiny_model, capsys):
    code, out, err = run_cli(capsys, *generate_args(tiny_model))  # captured stdout is no TTY
    assert code == 0, err
    assert ANSI not in out


def test_generate_reads_a_prompt_file_and_applies_the_chat_template(tiny_model, tokenizer, tmp_path, capsys):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("hello", encoding="utf-8")
    code, out, err = run_cli(
        capsys,
        "generate",
        "--model",
        str(tiny_model),
        "--prompt-file",
        str(prompt_file),
        "--chat",
        "--method",
        "ar",
        "--max-new-tokens",
        "6",
        "--no-color",
        "--dtype",
        "float32",
    )
    assert code == 0, err
    chat_ids = encode_conversation(tokenizer, ["hello"], [])
    assert tokenizer.decode(chat_ids).endswith("<user>hello\n<assistant>")
    assert out == tokenizer.decode(plain_greedy(tiny_model, chat_ids, 6), skip_special_tokens=True) + "\n"
    assert "MAT: 1.00" in err  # ar commits one token per step
    assert "warning" not in err  # the tiny tokenizer has a chat template


def test_streamer_colours_exactly_the_drafted_tokens(tokenizer):
    import io

    ids = {char: tokenizer(char)["input_ids"] for char in "abcxyé"}
    e_first, e_second = ids["é"]  # two bytes, two tokens
    stream = io.StringIO()
    streamer = TerminalStreamer(tokenizer, stream, color=True)
    streamer.put(ids["a"] + ids["b"] + ids["c"], [False, True, True])
    streamer.put(ids["x"] + [e_first], [False, True])  # é is incomplete: held back
    streamer.put([e_second] + ids["y"], [False, True])  # é completes in an undrafted token
    streamer.end()
    green = lambda text: DRAFTED_STYLE + text + RESET_STYLE  # noqa: E731
    assert stream.getvalue() == "a" + green("bc") + "x" + "é" + green("y") + "\n"
    assert (streamer.tokens, streamer.drafted_tokens) == (7, 4)


def test_streamer_decodes_multibyte_characters_across_tokens(tokenizer):
    import io

    text = "héllo wörld ✓\nnext line ünïcode"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > len(text)  # multi-byte characters span several tokens
    for color in (True, False):
        stream = io.StringIO()
        streamer = TerminalStreamer(tokenizer, stream, color=color)
        for start in range(0, len(ids), 3):  # steps of three tokens: root + two drafted
            chunk = ids[start : start + 3]
            streamer.put(chunk, [False] + [True] * (len(chunk) - 1))
        streamer.end()
        out = stream.getvalue()
        assert "\ufffd" not in out
        assert out.replace(DRAFTED_STYLE, "").replace(RESET_STYLE, "") == text + "\n"
        assert (DRAFTED_STYLE in out) is color


# --- data files ---------------------------------------------------------------------------


def test_every_shared_and_shipped_prompt_file_loads():
    repo = Path(__file__).resolve().parents[2]
    folders = [repo / "data", repo.parent / "shared" / "data"]  # shipped copies, the shared originals
    files = [path for folder in folders if folder.is_dir() for path in sorted(folder.glob("*.jsonl"))]
    assert any(path.name == "code_completion.jsonl" for path in files), "the repo ships data/*.jsonl"
    for path in files:
        questions = load_questions(path)
        assert questions, path
        assert all(q.turns and q.source == str(path) for q in questions)
        if path.name == "code_completion.jsonl":
            assert {q.mode for q in questions} == {"completion"}
        if path.name == "spec_bench.jsonl":
            multi = [q for q in questions if q.category == MULTI_TURN_CATEGORY]
            assert len(multi) == 80 and all(len(q.turns) == 2 for q in multi)
        if path.name == "long_code.jsonl":  # long generations: one chat turn per task
            assert len(questions) >= 12 and {q.category for q in questions} == {"long_code"}
            assert len({q.question_id for q in questions}) == len(questions)
            assert all(len(q.turns) == 1 and q.mode == "chat" for q in questions)


def test_limit_applies_per_group_of_each_file(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (first, second):
        rows = [{"question_id": i, "category": f"{path.stem}{i % 2}", "turns": [f"q{i}"]} for i in range(6)]
        path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n", encoding="utf-8")
    questions = load_benchmark([first, second], limit=2)
    assert [(q.category, q.question_id, q.line) for q in questions] == [
        ("a0", 0, 1),
        ("a0", 2, 3),
        ("a1", 1, 2),
        ("a1", 3, 4),
        ("b0", 0, 1),
        ("b0", 2, 3),
        ("b1", 1, 2),
        ("b1", 3, 4),
    ]
    assert len(load_benchmark([first], limit=None)) == 6


def test_multi_turn_group_alternates_between_its_categories():
    spec_bench = Path(__file__).resolve().parents[2] / "data" / "spec_bench.jsonl"
    questions = load_benchmark([spec_bench], limit=3)
    groups = [q.category for q in questions]
    assert groups == [g for g in dict.fromkeys(groups) for _ in range(3)]
    assert list(dict.fromkeys(groups)) == [
        MULTI_TURN_CATEGORY,
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
    ]
    multi = [q for q in questions if q.category == MULTI_TURN_CATEGORY]
    assert [q.subcategory for q in multi] == ["writing", "roleplay", "reasoning"]
    assert all(len(q.turns) == 2 for q in multi)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"category": "x", "turns": ["a"]}', "missing field 'question_id'"),
        ('{"question_id": 1, "turns": []}', "'turns' must be a non-empty list"),
        ('{"question_id": 1, "turns": ["a"], "mode": "poem"}', "'mode' must be one of"),
        ('{"question_id": 1, "turns": ["a", "b"], "mode": "completion"}', "exactly one turn"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"question_id": 0, "category": "c", "turns": ["hi"]})
    path.write_text(f"{good}\n\n{line}\n", encoding="utf-8")
    with pytest.raises(racer_rs.InvalidArgumentError, match=message) as info:
        load_questions(path)
    assert str(info.value).startswith(f"{path}:3: ")


def test_conversation_without_chat_template_joins_turns_and_answers(tokenizer):
    plain = transformers.AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = None
    ids = encode_conversation(plain, ["first?", "second?"], ["answer"])
    assert plain.decode(ids) == "first?\n\nanswer\n\nsecond?\n\n"
    with_template = encode_conversation(tokenizer, ["first?", "second?"], ["answer"])
    assert tokenizer.decode(with_template) == (
        "<system>You are a helpful assistant.\n<user>first?\n<assistant>answer\n<user>second?\n<assistant>"
    )


# --- default paths ------------------------------------------------------------------------


def test_shipped_defaults_resolve_from_cwd_then_repository(tmp_path, monkeypatch):
    from racer_rs.loading import models as model_loading

    checkout = Path(__file__).resolve().parents[2]
    # An installed wheel has no checkout around it; the tests stand in for an editable install.
    monkeypatch.setattr(model_loading, "repository_root", lambda: checkout)
    monkeypatch.chdir(tmp_path)
    assert resolve_shipped("models/pycode-target-7m", "--model") == str(checkout / "models/pycode-target-7m")
    assert Path(resolve_shipped("data/code_completion.jsonl", "--data")).is_file()
    (tmp_path / "models" / "pycode-target-7m").mkdir(parents=True)
    assert resolve_shipped("models/pycode-target-7m", "--model") == str(tmp_path / "models/pycode-target-7m")
    with pytest.raises(CLIError, match="default --model 'models/nothing-here' not found"):
        resolve_shipped("models/nothing-here", "--model")
    monkeypatch.setattr(model_loading, "repository_root", lambda: None)
    with pytest.raises(CLIError, match=r"default --data 'data/code_completion\.jsonl' not found"):
        resolve_shipped("data/code_completion.jsonl", "--data")


def test_repository_root_is_found_from_an_editable_install():
    from racer_rs.cli import resources

    if "site-packages" in resources.__file__:
        assert resources.repository_root() is None  # an installed wheel has no checkout
    else:
        assert resources.repository_root() == Path(__file__).resolve().parents[2]


# --- errors -------------------------------------------------------------------------------


def test_missing_model_path_is_a_one_line_error(tmp_path, capsys):
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "absent"), "--prompt", "x", "--method", "ar")
    assert_one_line_error(code, err, "--model: model not found", str(tmp_path / "absent"))


def test_unknown_method_is_a_one_line_error(tiny_model, capsys):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_model), "--prompt", "x", "--method", "nope")
    assert_one_line_error(code, err, "unknown method 'nope'", "racer")


def test_unknown_method_option_is_a_one_line_error(tiny_model, capsys):
    code, _, err = run_cli(capsys, *generate_args(tiny_model, "--option", "no_such_option=3", "--no-color"))
    assert_one_line_error(code, err, "no_such_option")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["generate", "--prompt", "x", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["generate", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["generate", "--prompt", "x", "--top-p", "1.5"], "--top-p"),
        (["generate", "--prompt", "x", "--prompt-file", "f"], "not allowed with argument"),
        (["generate", "--prompt", ""], "the prompt is empty"),
        (["generate", "--prompt-file", "/nonexistent/prompt.txt"], "cannot read --prompt-file"),
        (["generate", "--prompt", "x", "--option", "novalue"], "expected KEY=VALUE"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line_errors(capsys, argv, fragment):
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, fragment)


def test_python_dash_m_exits_with_code_2_on_a_missing_model(tmp_path):
    missing = tmp_path / "no-model-here"
    proc = subprocess.run(
        [sys.executable, "-m", "racer_rs", "bench", "--model", str(missing), "--methods", "ar"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"racer: error: --model: model not found: {missing} ")


def test_python_dash_m_generate_prints_plain_text_into_a_pipe(tiny_model):
    proc = subprocess.run(
        [sys.executable, "-m", "racer_rs", *generate_args(tiny_model)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert ANSI not in proc.stdout
    assert "MAT:" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("flag", [[], ["--no-pack-weights"]])
def test_half_precision_models_are_packed_unless_no_pack_weights(tiny_model, monkeypatch, flag):
    import argparse

    from racer_rs.cli.common import LoadedModels, add_model_arguments
    from racer_rs.target import packed_linear

    monkeypatch.setattr(packed_linear, "packing_pays", lambda linear: True)  # whatever this CPU measures
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--model", str(tiny_model), "--dtype", "bfloat16", "--device", "cpu", *flag])
    models = LoadedModels(args, ["pld"])
    linears = sum(1 for m in models.model.modules() if isinstance(m, torch.nn.Linear))
    packs = not flag and packed_linear.dtype_supported(torch.bfloat16)  # an AVX2-only CPU has no kernels
    assert models.packed_layers == packed_linear.packed_layers(models.model) == (linears if packs else 0)
    float32 = LoadedModels(parser.parse_args(["--model", str(tiny_model), "--dtype", "float32"]), ["pld"])
    assert float32.packed_layers == 0  # nothing to pack in float32
