"""The error hierarchy: every error racer_rs raises on bad input is a RacerError that is also the
builtin a caller would catch, from the Python layer and from the Rust core alike; the CLI prints
exactly those as one line and lets anything else surface as the bug it is."""

from __future__ import annotations

import numpy as np
import pytest

import racer_rs
from racer_rs import errors

BUILTIN_OF = {
    errors.InvalidArgumentError: ValueError,
    errors.InvalidTypeError: TypeError,
    errors.UnsupportedError: NotImplementedError,
    errors.StateError: RuntimeError,
    errors.MissingDependencyError: ImportError,
    errors.OutOfMemoryError: MemoryError,
    errors.ModelSpecError: ValueError,
    errors.ModelLoadError: ValueError,
    errors.CorruptFileError: ValueError,
}


@pytest.mark.parametrize("cls", list(BUILTIN_OF), ids=lambda c: c.__name__)
def test_every_error_is_a_racer_error_and_its_builtin(cls):
    assert issubclass(cls, errors.RacerError)
    assert issubclass(cls, BUILTIN_OF[cls])
    assert getattr(racer_rs, cls.__name__) is cls  # importable from the package itself


def test_every_public_error_class_is_covered():
    public = {getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)}
    assert public == set(BUILTIN_OF) | {errors.RacerError}


@pytest.mark.parametrize(
    ("call", "cls"),
    [
        (lambda: racer_rs.Automaton(ngram=1), errors.InvalidArgumentError),
        (lambda: racer_rs.LogitsTable(0), errors.InvalidArgumentError),
        (lambda: racer_rs.DraftTree([1, 2], [-1, 5]), errors.InvalidArgumentError),
        (lambda: racer_rs.DraftTree.chain("abc"), errors.InvalidTypeError),
        (lambda: racer_rs.DraftTree.chain(np.zeros(3, dtype=np.float32)), errors.InvalidTypeError),
        (lambda: racer_rs.prompt_lookup([1, 2], max_ngram=0), errors.InvalidArgumentError),
    ],
)
def test_the_rust_core_raises_the_same_hierarchy(call, cls):
    with pytest.raises(cls) as info:
        call()
    assert type(info.value) is cls
    assert isinstance(info.value, errors.RacerError)


def test_error_context_prefixes_racer_errors_and_keeps_their_class():
    with pytest.raises(errors.InvalidArgumentError, match=r"^--model: bad value$"), errors.error_context("--model"):
        raise errors.InvalidArgumentError("bad value")
    with pytest.raises(errors.MissingDependencyError) as info, errors.error_context("--model"):
        raise errors.MissingDependencyError("needs x")
    assert str(info.value) == "--model: needs x"  # ImportError prints .msg


def test_error_context_lets_other_exceptions_through_unchanged():
    with pytest.raises(ValueError, match=r"^plain$"), errors.error_context("--model"):
        raise ValueError("plain")


def test_a_broken_counterpart_that_maps_builtins_would_fail_these_checks():
    # A builtin ValueError is not a RacerError: the CLI would (rightly) print a traceback for it.
    assert not isinstance(ValueError("x"), errors.RacerError)


torch = pytest.importorskip("torch")


def test_python_layer_errors_are_racer_errors():
    from tests.helpers import tiny_model

    model = tiny_model("llama")
    with pytest.raises(errors.InvalidArgumentError, match="max_new_tokens"):
        racer_rs.generate(model, [1, 2, 3], max_new_tokens=0)
    with pytest.raises(errors.InvalidTypeError, match="input_ids"):
        racer_rs.generate(model, "hello")
    with pytest.raises(errors.InvalidArgumentError, match="unknown method"):
        racer_rs.generate(model, [1, 2, 3], method="nope")
    with pytest.raises(errors.ModelSpecError):
        racer_rs.load_model("/no/such/folder")


def test_the_cli_prints_a_racer_error_as_one_line_and_exit_2(capsys):
    from racer_rs.cli import main

    code = main(["generate", "--prompt", "hi", "--model", "/no/such/folder"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("racer: error: --model: ") and len(err.strip().splitlines()) == 1


def test_the_cli_lets_a_bug_surface_as_a_traceback(monkeypatch):
    from racer_rs.cli import loading, main

    def broken(*args, **kwargs):
        raise ValueError("an engine bug, not a usage error")

    monkeypatch.setattr(loading, "check_model", broken)
    with pytest.raises(ValueError, match="an engine bug"):
        main(["generate", "--prompt", "hi", "--model", "pycode-target-7m"])
