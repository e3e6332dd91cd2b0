"""The argument rules of every public entry point, fuzzed: the Rust bindings, the Python API and
the CLI. Whatever a careless or hostile caller passes for one argument (None, bools, ints far
beyond any range, NaN and infinities, strings, lists, numpy scalars of odd dtypes), the call
either works or raises a RacerError that names that argument; nothing else escapes (no bare
TypeError or OverflowError, no Rust panic, no crash), and the CLI answers with exit code 0 or
one line and exit code 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import racer_rs
from racer_rs import RacerError

#: Ints at and around every boundary the rules draw (0, 1, int32, int64, uint64) and far past them.
BOUNDARY_INTS = [-(2**70), -(2**63), -1, 0, 1, 2, 3, 8, 64, 65, 2**31 - 1, 2**31, 2**32 + 5, 2**63, 2**64, 2**70]
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(BOUNDARY_INTS),
    st.integers(-50, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(-3, 3), max_size=3),
    st.sampled_from([np.int64(3), np.int8(-1), np.uint64(2**63), np.float32(1.5), np.bool_(True), np.float64("nan")]),
)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    # capsys is read (and so reset) after every example.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: Sizes that are valid but would allocate gigabytes (a copy-logit table of 2**24 rows, say).
HUGE_BUT_VALID = range(2**20, 2**31)


def check(call: Callable[[], Any], argument: str) -> None:
    """``call()`` works, or raises a RacerError naming ``argument``."""
    try:
        call()
    except RacerError as exc:
        message = str(exc)
    else:
        return
    # Anything else (TypeError, OverflowError, pyo3_runtime.PanicException, ...) fails the test.
    assert argument in message, (argument, message)


def affordable(value: Any) -> bool:
    return not (isinstance(value, (int, np.integer)) and int(value) in HUGE_BUT_VALID)


# --- the Rust bindings ------------------------------------------------------------------------------

AUTOMATON_ARGS = ["ngram", "max_nodes", "min_depth", "capacity"]


@FUZZ
@given(st.sampled_from(AUTOMATON_ARGS), HOSTILE)
def test_automaton_arguments(argument, value):
    if affordable(value):
        check(lambda: racer_rs.Automaton(**{argument: value}), argument)


@FUZZ
@given(st.sampled_from(["vocab_size", "top_k"]), HOSTILE)
def test_logits_table_arguments(argument, value):
    kwargs = {"vocab_size": 50, "top_k": 4} | {argument: value}
    if affordable(value):
        check(lambda: racer_rs.LogitsTable(**kwargs), argument)


@FUZZ
@given(st.sampled_from(["tokens", "parents"]), HOSTILE)
def test_draft_tree_arguments(argument, value):
    kwargs = {"tokens": [1, 2], "parents": [-1, 0]} | {argument: value}
    check(lambda: racer_rs.DraftTree(**kwargs), argument)
    check(lambda: racer_rs.DraftTree.chain(value), "tokens")


BUILD_ARGS = ["next_token", "capacity", "use_retrieval", "use_logits", "exempt_depth", "scored", "min_score",
              "calibration", "draft_chain", "shared", "automaton", "table"]  # fmt: skip


@FUZZ
@given(st.sampled_from(BUILD_ARGS), HOSTILE)
def test_build_draft_tree_arguments(argument, value):
    automaton = racer_rs.Automaton(ngram=4, max_nodes=100)
    automaton.extend([1, 2, 3, 1, 2])
    table = racer_rs.LogitsTable(10, 2)
    kwargs: dict[str, Any] = {"automaton": automaton, "table": table, "next_token": 3, "capacity": 8}
    kwargs[argument] = value
    check(lambda: racer_rs.build_draft_tree(**kwargs), argument)


@FUZZ
@given(st.sampled_from(["context", "max_ngram", "min_ngram", "num_pred"]), HOSTILE)
def test_prompt_lookup_arguments(argument, value):
    kwargs: dict[str, Any] = {"context": [1, 2, 1]} | {argument: value}
    check(lambda: racer_rs.prompt_lookup(**kwargs), argument)


POOL_ARGS = ["vocab_size", "ngram", "max_nodes", "breadth", "min_depth", "exempt_depth", "tree", "min_score",
             "use_retrieval", "use_logits", "threads"]  # fmt: skip


@FUZZ
@given(st.sampled_from(POOL_ARGS), HOSTILE)
def test_draft_pool_arguments(argument, value):
    kwargs: dict[str, Any] = {"vocab_size": 50} | {argument: value}
    if affordable(value) or argument != "vocab_size":
        check(lambda: racer_rs.DraftPool(**kwargs), argument)


@FUZZ
@given(st.sampled_from(["id", "prompt_ids", "ids", "last_tokens", "capacity"]), HOSTILE)
def test_draft_pool_call_arguments(argument, value):
    pool = racer_rs.DraftPool(50)
    pool.add("a", [1, 2, 3])
    if argument in ("id", "prompt_ids"):
        kwargs: dict[str, Any] = {"id": "b", "prompt_ids": [1, 2]} | {argument: value}
        check(lambda: pool.add(kwargs["id"], kwargs["prompt_ids"]), argument)
    else:
        kwargs = {"ids": ["a"], "last_tokens": [3], "capacity": 4} | {argument: value}
        check(lambda: pool.propose(kwargs["ids"], kwargs["last_tokens"], kwargs["capacity"]), argument)


# --- the Python API ------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

GENERATE_ARGS = ["input_ids", "method", "max_new_tokens", "temperature", "top_p", "top_k", "eos_token_id",
                 "capacity", "max_capacity", "seed", "drafter", "streamer"]  # fmt: skip


@pytest.fixture(scope="module")
def model() -> Any:
    from tests.helpers import tiny_model

    return tiny_model("llama")


@FUZZ
@given(argument=st.sampled_from(GENERATE_ARGS), value=HOSTILE)
def test_generate_arguments(model, argument, value):
    kwargs: dict[str, Any] = {"input_ids": [1, 2, 3], "max_new_tokens": 3} | {argument: value}
    if argument == "max_new_tokens" and isinstance(value, (int, np.integer)) and int(value) > 50:
        return  # a long but valid generation (the window check is fuzzed through input_ids)
    check(lambda: racer_rs.generate(model, **kwargs), argument)


RACER_OPTIONS = ["ngram", "max_nodes", "breadth", "min_depth", "exempt_depth", "persistent"]


@FUZZ
@given(argument=st.sampled_from(RACER_OPTIONS), value=HOSTILE)
def test_method_options(model, argument, value):
    if affordable(value) or argument in ("persistent", "exempt_depth", "ngram", "min_depth"):
        check(
            lambda: racer_rs.generate(model, [1, 2, 3], method="racer", max_new_tokens=2, **{argument: value}), argument
        )


@FUZZ
@given(value=HOSTILE)
def test_load_model_dtype(value):
    check(lambda: racer_rs.load_model("/no/such/model", dtype=value), "dtype")


# --- the CLI --------------------------------------------------------------------------------------------

FLAGS = ["--max-new-tokens", "--temperature", "--top-p", "--top-k", "--capacity", "--max-capacity", "--seed",
         "--threads", "--method", "--dtype", "--device", "--color"]  # fmt: skip


@FUZZ
@given(
    flag=st.sampled_from(FLAGS), text=st.one_of(st.sampled_from([str(v) for v in BOUNDARY_INTS]), st.text(max_size=6))
)
@example(flag="--max-new-tokens", text="²")  # a digit to str.isdigit, not to int(): one clear error
def test_cli_flags(cli_model_folder, capsys, flag, text):
    from racer_rs.cli import main

    if text.startswith("-") or (flag == "--max-new-tokens" and text.isdecimal() and int(text) > 50):
        return  # an option-like value is argparse's own business; a long generation is valid
    argv = ["generate", "--model", str(cli_model_folder), "--prompt", "hi", "--max-new-tokens", "2",
            "--device", "cpu", "--dtype", "float32", flag, text]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        assert [line for line in err.strip().splitlines() if line.startswith("racer: error: ")], err
        assert "Traceback" not in err


@pytest.fixture(scope="module")
def cli_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.helpers import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("rules-cli-model"))
