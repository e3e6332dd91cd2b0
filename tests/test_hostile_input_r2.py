"""Hostile input, second round (issue 28): the classes of mishandled input found on the newer
surfaces (DraftPool, the shared index and its files, the serving integrations without their
engines, the core primitives), each rebuilt from its rule rather than from the reported example.

Every test here failed before its fix. The module needs numpy only (no torch): the core's tests
must pass on ``pip install racer-rs`` alone.
"""

from __future__ import annotations

import array
import contextlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import racer_rs
from racer_rs import InvalidArgumentError, InvalidTypeError, RacerError, _native, build_draft_tree
from racer_rs.drafters.racer import RacerOptions
from racer_rs.integrations.options import ENV_VAR, ServingOptions
from racer_rs.integrations.sglang import RacerCorpus, resolve_server_args

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SIGNED = [np.int8, np.int16, np.int32, np.int64]
UNSIGNED = [np.uint8, np.uint16, np.uint32, np.uint64]


def _ones(rows: int) -> np.ndarray:
    """Top-k rows of the test pool's breadth (8)."""
    return np.ones((rows, 8), np.int32)


def _pool() -> racer_rs.DraftPool:
    pool = racer_rs.DraftPool(100)
    pool.add("a", [1, 2, 3, 1, 2])
    return pool


def _tree() -> racer_rs.DraftTree:
    return racer_rs.DraftTree([1, 2, 3], [-1, 0, 0])


def _table() -> racer_rs.LogitsTable:
    return racer_rs.LogitsTable(100, 2)


def _automaton() -> racer_rs.Automaton:
    automaton = racer_rs.Automaton(ngram=4, max_nodes=100)
    automaton.extend([1, 2, 3, 1, 2])
    return automaton


#: Every native entry point that takes a sequence of token ids: (name, the argument's name, a call
#: with ``ids`` in that argument). Each must refuse a negative id and a bool among the ids.
ID_ENTRY_POINTS: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("Automaton.extend", "tokens", lambda ids: _automaton().extend(ids)),
    ("Automaton.count", "pattern", lambda ids: _automaton().count(ids)),
    ("Automaton.retrieve", "context", lambda ids: _automaton().retrieve(1, 4, context=ids)),
    ("prompt_lookup", "context", lambda ids: racer_rs.prompt_lookup(ids)),
    ("DraftTree", "tokens", lambda ids: racer_rs.DraftTree(ids, [-1] + [0] * (len(ids) - 1))),
    ("DraftTree.chain", "tokens", lambda ids: racer_rs.DraftTree.chain(ids)),
    ("DraftTree.greedy_accept", "predicted", lambda ids: _tree().greedy_accept(ids)),
    ("LogitsTable.update", "tokens", lambda ids: _table().update(ids, np.ones((len(ids), 2), np.int32))),
    ("build_draft_tree", "draft_chain", lambda ids: build_draft_tree(_automaton(), _table(), 1, draft_chain=ids)),
    ("DraftPool.add", "prompt_ids", lambda ids: _pool().add("b", ids)),
    ("DraftPool.extend", "tokens", lambda ids: _pool().extend(["a"], [ids])),
    ("DraftPool.extend(lengths=)", "tokens", lambda ids: _pool().extend(["a"], ids, lengths=[len(ids)])),
    ("DraftPool.update_topk", "tokens", lambda ids: _pool().update_topk("a", ids, np.ones((len(ids), 8), np.int32))),
    ("DraftPool.update_topk_many", "tokens", lambda t: _pool().update_topk_many(["a"], t, _ones(len(t)), [len(t)])),
    ("DraftPool.propose", "last_tokens", lambda ids: _pool().propose(["a"] * len(ids), ids, 4)),
]  # fmt: skip


def _ids_with(draw: st.DrawFn, bad: Any) -> list[Any]:
    """A short list of valid ids with ``bad`` at a drawn position (``propose`` takes one id per
    request: a single element keeps its ids list ``["a"]`` valid)."""
    ids: list[Any] = draw(st.lists(st.integers(0, 99), min_size=0, max_size=5))
    ids.insert(draw(st.integers(0, len(ids))), bad)
    return ids


@st.composite
def negative_ids(draw: st.DrawFn) -> Any:
    """Ids with one negative: a list, a tuple, or an array of any signed integer dtype."""
    dtype = draw(st.sampled_from(SIGNED))
    low = int(np.iinfo(dtype).min)
    ids = _ids_with(draw, draw(st.integers(low, -1)))
    container = draw(st.sampled_from(["list", "tuple", "array", "strided"]))
    if container == "list":
        return ids
    if container == "tuple":
        return tuple(ids)
    values = np.array(ids, dtype=dtype)
    return values if container == "array" else np.repeat(values, 2)[::2]  # non-contiguous


@st.composite
def ids_with_a_bool(draw: st.DrawFn) -> Any:
    ids = _ids_with(draw, draw(st.booleans()))
    return ids if draw(st.booleans()) else tuple(ids)


# --- B. negative token ids ------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "argument", "call"), ID_ENTRY_POINTS, ids=[e[0] for e in ID_ENTRY_POINTS])
@FUZZ
@given(ids=negative_ids())
def test_negative_token_ids_are_refused(where: str, argument: str, call: Callable[[Any], Any], ids: Any) -> None:
    if where == "DraftPool.propose":
        ids = ids[:1] if len(ids) == 1 or (int(np.min(ids)) < 0 and int(ids[0]) < 0) else [int(np.min(ids))]
    with pytest.raises(InvalidArgumentError, match=argument):
        call(ids)


def test_the_reported_negative_ids() -> None:
    with pytest.raises(InvalidArgumentError, match="context"):
        racer_rs.prompt_lookup(np.array([5, -1, 7, 5, -1], np.int32))
    with pytest.raises(InvalidArgumentError, match="predicted"):
        racer_rs.DraftTree([1, 2, 3], [-1, 0, 0]).greedy_accept(np.array([-1, 5, 5], np.int32))


@FUZZ
@given(dtype=st.sampled_from(UNSIGNED + SIGNED), values=st.lists(st.integers(0, 127), min_size=1, max_size=6))
def test_non_negative_ids_of_every_integer_dtype_still_work(dtype: Any, values: list[int]) -> None:
    ids = np.array(values, dtype=dtype)
    assert racer_rs.prompt_lookup(ids).tolist() == racer_rs.prompt_lookup(values).tolist()
    assert racer_rs.DraftTree.chain(ids).tokens.tolist() == values


def test_parents_cells_and_ranks_keep_their_minus_one() -> None:
    # Not token ids: -1 is the root's parent and cell (the int rule without the id rule).
    tree = racer_rs.DraftTree(np.array([1, 2, 3], np.int64), (-1, 0, 0), [-1, 0, 1])
    assert tree.parents.tolist() == [-1, 0, 0]
    table = racer_rs.LogitsTable(10, 2)
    table.update([1], np.array([[2, 3]], np.int32))
    assert len(table.expand_static(1, [-1, 0], [0, 0])) == 2


# --- C. Python bools among ids ------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "argument", "call"), ID_ENTRY_POINTS, ids=[e[0] for e in ID_ENTRY_POINTS])
@FUZZ
@given(ids=ids_with_a_bool())
def test_bools_among_ids_are_refused(where: str, argument: str, call: Callable[[Any], Any], ids: Any) -> None:
    if where == "DraftPool.propose":
        ids = [value for value in ids if isinstance(value, bool)][:1]
    with pytest.raises(InvalidTypeError, match=argument):
        call(ids)


@pytest.mark.parametrize("bad", [True, 2.0, 2.5, np.float32(3), "7", None, [1]])
@pytest.mark.parametrize("container", [list, tuple, np.array])
def test_the_serving_corpus_takes_ints_only(bad: Any, container: Any) -> None:
    corpus = RacerCorpus(4, 100, ServingOptions())
    tail = [1, 2, 3]
    tail.insert(1, bad)
    if container is np.array:
        if isinstance(bad, (list, str)) or bad is None:
            return  # numpy makes an object or string array: the list cases cover these
        tail = np.array(tail)  # floats (or a bool upcast to int: then valid ints)
        if tail.dtype.kind in "iu":
            return
    with pytest.raises(InvalidTypeError, match="batch_tokens"):
        corpus.batch_get(["r"], [container(tail)], [3])
    with pytest.raises(InvalidTypeError, match="total_lens"):
        corpus.batch_get(["r"], [[1, 2, 3]], [3.0])


def test_the_serving_corpus_still_takes_engine_containers() -> None:
    corpus = RacerCorpus(4, 100, ServingOptions())
    for tail in (array.array("l", [1, 2, 3]), [1, 2, 3], np.array([1, 2, 3], np.int32), (1, 2, 3)):
        tokens, mask = corpus.batch_get(["r"], [tail], [3])
        assert tokens.shape == (4,) and mask.shape == (16,)
    with pytest.raises(InvalidTypeError, match="batch_tokens"):
        corpus.batch_get(["r"], [array.array("d", [1.0, 2.0])], [2])


# --- D. RACER_RS_OPTIONS at start-up ----------------------------------------------------------------

#: Values each RACER key refuses alone, or together with the others' defaults (ngram 10,
#: max_nodes 10,000, min_depth 2, breadth 8).
BAD_OPTIONS = {
    "ngram": [65, 100, 2**31, 2**40, 1],
    "max_nodes": [2**40, 2**32, 2**64, 54, 0],
    "min_depth": [11, 64, 0],
    "breadth": [0, 1025, 2**31],
    "exempt_depth": [-1, 2**40],
    "min_score": [1.5, -0.1, float("nan")],
    "threads": [0, 2000],
    "capacity": [0, 2**21],
    "vocab_size": [0, 2**31],
    "tree": ["best", 3],
    "use_logits": [1, "no"],
    "log_every": [-1],
}
#: Combinations where each value alone is fine.
BAD_COMBINATIONS = [
    {"ngram": 64, "max_nodes": 2079},  # one window's substrings need 64 * 65 / 2 = 2080 nodes
    {"ngram": 4, "min_depth": 5},
    {"use_retrieval": False, "use_logits": False},
    {"vocab_size": 2**30, "breadth": 1024},  # a copy-logit table beyond the core's 2**28 cells
]


@st.composite
def bad_options(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A JSON object with one bad key (or a bad combination) among valid ones, and a key the
    error must name."""
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(BAD_OPTIONS)))
        values = {key: draw(st.sampled_from(BAD_OPTIONS[key]))}
    else:
        values = dict(draw(st.sampled_from(BAD_COMBINATIONS)))
        key = sorted(values)[0]
    if draw(st.booleans()):
        values.setdefault("threads", 2)
    return values, key


def _named(message: str, values: dict[str, Any]) -> bool:
    return ENV_VAR in message and any(key in message for key in values) and "\n" not in message


@FUZZ
@given(case=bad_options())
def test_racer_rs_options_are_checked_at_start_up(case: tuple[dict[str, Any], str]) -> None:
    values, _ = case
    environ = {ENV_VAR: json.dumps(values)}
    with pytest.raises(InvalidArgumentError) as error:
        ServingOptions.from_env(environ)
    assert _named(str(error.value), values), str(error.value)


@FUZZ
@given(case=bad_options())
def test_sglang_refuses_bad_options_while_resolving_its_arguments(case: tuple[dict[str, Any], str]) -> None:
    values, _ = case
    with mock.patch.dict(os.environ, {ENV_VAR: json.dumps(values)}), pytest.raises(InvalidArgumentError) as error:
        resolve_server_args(_server_args())
    assert _named(str(error.value), values), str(error.value)


def test_a_key_given_twice_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=f"{ENV_VAR}.*ngram"):
        ServingOptions.from_env({ENV_VAR: '{"ngram": 4, "ngram": 65}'})


def test_the_options_against_the_model_vocabulary() -> None:
    options = ServingOptions.from_env({ENV_VAR: '{"breadth": 1024}'})
    options.check(1000)
    with pytest.raises(InvalidArgumentError, match=f"{ENV_VAR}.*vocab"):
        options.check(2**30)


def _server_args() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(disable_overlap_schedule=True, speculative_num_draft_tokens=8, device="cuda")


# --- E. every public constructor and function checks its own arguments ------------------------------

NATIVE_CALLS: dict[str, Callable[..., Any]] = {
    "Automaton": racer_rs.Automaton,
    "DraftPool": lambda **kw: racer_rs.DraftPool(100, **kw),
    "LogitsTable": lambda **kw: racer_rs.LogitsTable(100, **kw),
    "DraftTree": lambda **kw: racer_rs.DraftTree([1], [-1], **kw),
    "prompt_lookup": lambda **kw: racer_rs.prompt_lookup([1, 2, 1], **kw),
    "build_draft_tree": lambda **kw: racer_rs.build_draft_tree(_automaton(), racer_rs.LogitsTable(10, 2), 1, **kw),
}


UNKNOWN_KEYWORDS = ["capacity_", "vocab", "cache", "size", "ngrams", "k", "topk", "seed"]


@FUZZ
@given(
    where=st.sampled_from(sorted(NATIVE_CALLS)),
    names=st.lists(st.sampled_from(UNKNOWN_KEYWORDS), min_size=1, max_size=3, unique=True),
)
def test_unknown_keywords_are_an_invalid_type_error(where: str, names: list[str]) -> None:
    with pytest.raises(InvalidTypeError, match=names[0]) as error:
        NATIVE_CALLS[where](**dict.fromkeys(names, 16))
    assert where in str(error.value)


#: Each native constructor and function with its positional arguments filled, and one more.
TOO_MANY_POSITIONAL: dict[str, Callable[[], Any]] = {
    "Automaton": lambda: racer_rs.Automaton(4, 100, 2, 8),
    "DraftPool": lambda: racer_rs.DraftPool(100, 10),
    "LogitsTable": lambda: racer_rs.LogitsTable(100, 8, 2),
    "DraftTree": lambda: racer_rs.DraftTree([1], [-1], None, [0]),
    "prompt_lookup": lambda: racer_rs.prompt_lookup([1, 2, 1], 3),
    "build_draft_tree": lambda: racer_rs.build_draft_tree(_automaton(), _table(), 1, 8, True),
}


@pytest.mark.parametrize("where", sorted(TOO_MANY_POSITIONAL))
def test_a_positional_argument_too_many_is_an_invalid_type_error(where: str) -> None:
    with pytest.raises(InvalidTypeError, match=f"{where}.*too many"):
        TOO_MANY_POSITIONAL[where]()


def test_the_reported_unknown_keyword() -> None:
    with pytest.raises(InvalidTypeError, match="capacity"):
        racer_rs.DraftPool(100, capacity=16)


CORPUS_BAD = [
    ("draft_token_num", 2.5), ("draft_token_num", "12"), ("draft_token_num", None), ("draft_token_num", True),
    ("draft_token_num", 0), ("draft_token_num", 2**70), ("vocab_size", "1000"), ("vocab_size", 1000.0),
    ("vocab_size", 0), ("vocab_size", 2**40), ("vocab_size", None), ("options", {"ngram": 4}), ("options", "racer"),
]  # fmt: skip


@pytest.mark.parametrize(("argument", "value"), CORPUS_BAD)
def test_the_serving_corpus_checks_its_arguments(argument: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"draft_token_num": 8, "vocab_size": 1000, "options": ServingOptions()}
    kwargs[argument] = value
    with pytest.raises(RacerError, match=argument):
        RacerCorpus(**kwargs)


PYTHON_BAD: list[tuple[str, Callable[[], Any]]] = [
    ("racer", lambda: ServingOptions(racer="ngram=4")),
    ("racer", lambda: ServingOptions(racer=None)),
    ("options", lambda: ServingOptions.from_mapping([("ngram", 4)])),
    ("options", lambda: ServingOptions.from_mapping({1: 4})),
    ("environ", lambda: ServingOptions.from_env("ngram=4")),
    (ENV_VAR, lambda: ServingOptions.from_env({ENV_VAR: 4})),
    ("method", lambda: RacerOptions.for_method("nope", {})),
    ("options", lambda: RacerOptions.for_method("racer", [("ngram", 4)])),
    ("ngram", lambda: RacerOptions(ngram=65)),
    ("max_nodes", lambda: RacerOptions(ngram=20, max_nodes=100)),
]


@pytest.mark.parametrize(("argument", "call"), PYTHON_BAD)
def test_the_python_constructors_check_their_arguments(argument: str, call: Callable[[], Any]) -> None:
    with pytest.raises(RacerError, match=argument):
        call()


# --- E, second part: every public callable of the extension binds its own arguments -----------------
#
# A call that cannot be bound (a required argument missing, a positional one too many, an unknown
# keyword, a value given by position and by keyword) is an InvalidTypeError naming the entry point,
# never PyO3's plain TypeError. The callables are found by introspection, so one added to the
# extension later is swept without editing this file (a new class needs an instance below).

#: A fresh instance of each native class, to call its methods on. A class added to the extension
#: without an entry here fails the sweep of its methods, naming itself.
INSTANCES: dict[str, Callable[[], Any]] = {
    "Automaton": _automaton,
    "BatchDraft": lambda: _pool().propose(["a"], [1], 4),
    "DraftPool": _pool,
    "DraftTree": _tree,
    "LogitsTable": _table,
}


def _native_callables() -> list[str]:
    """Every public function and class (its constructor) of ``racer_rs._native`` and every public
    method of those classes (properties excluded: they take no arguments), by name."""
    names = []
    for name, obj in sorted(vars(_native).items()):
        if name.startswith("_") or not callable(obj):
            continue
        names.append(name)
        if isinstance(obj, type):
            names += [
                f"{name}.{attr}"
                for attr, raw in sorted(vars(obj).items())
                if not attr.startswith("_") and not isinstance(raw, types.GetSetDescriptorType)
            ]
    return names


NATIVE_CALLABLES = _native_callables()
SWEEP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _callable(where: str) -> Callable[..., Any]:
    """The function or class named ``where``, or the method bound to a fresh instance."""
    owner, _, method = where.partition(".")
    native: Callable[..., Any] = getattr(_native, owner)
    if not method:
        return native
    if owner not in INSTANCES:
        pytest.fail(f"no instance to call {where} on: add {owner} to INSTANCES")
    bound: Callable[..., Any] = getattr(INSTANCES[owner](), method)
    return bound


def _parameters(call: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters a caller sees (a bound method's ``self`` excluded), from the text signature."""
    return list(inspect.signature(call).parameters.values())


def _positional(parameters: list[inspect.Parameter]) -> list[inspect.Parameter]:
    return [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _takes_any(parameters: list[inspect.Parameter], kind: inspect._ParameterKind) -> bool:
    return any(p.kind == kind for p in parameters)


def test_the_sweep_finds_every_kind_of_entry_point() -> None:
    # Functions, constructors, methods, class and static methods; no property, no private name.
    for where in [
        "prompt_lookup",
        "build_draft_tree",
        "edge_cell_priors",
        "DraftPool",
        "BatchDraft",
        "DraftPool.propose",
        "Automaton.extend",
        "Automaton.load",
        "DraftTree.chain",
        "BatchDraft.sglang",
    ]:
        assert where in NATIVE_CALLABLES, where
    assert "DraftPool.vocab_size" not in NATIVE_CALLABLES and "EDGE_CELLS" not in NATIVE_CALLABLES
    assert not [w for w in NATIVE_CALLABLES if "._" in w or w.startswith("_")]
    assert sorted(n for n in vars(_native) if isinstance(getattr(_native, n), type)) == sorted(INSTANCES)


@pytest.mark.parametrize("where", NATIVE_CALLABLES)
def test_a_call_without_its_required_arguments_is_an_invalid_type_error(where: str) -> None:
    call = _callable(where)
    parameters = _parameters(call)
    required = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not required:
        with contextlib.suppress(RacerError):  # nothing required: the call binds (it may still refuse)
            call()
        return
    with pytest.raises(InvalidTypeError) as error:
        call()
    message = str(error.value)
    assert f"{where}()" in message and "missing" in message, message
    assert all(f"'{name}'" in message for name in required), message


@pytest.mark.parametrize("where", NATIVE_CALLABLES)
@SWEEP
@given(data=st.data())
def test_an_unknown_keyword_is_an_invalid_type_error(where: str, data: st.DataObject) -> None:
    call = _callable(where)
    parameters = _parameters(call)
    known = {p.name for p in parameters}
    unknown = data.draw(
        st.lists(
            st.text(min_size=1, max_size=12).filter(lambda k: k not in known), min_size=1, max_size=3, unique=True
        ),
        label="unknown keywords",
    )
    # With some positional arguments and known keywords, or none: the unknown one is named all the
    # same, before any argument's value is looked at.
    positional = _positional(parameters)
    args = [0] * data.draw(st.integers(0, len(positional)), label="positional arguments")
    given_by_position = {p.name for p in positional[: len(args)]}
    free = sorted(known - given_by_position)
    keywords = data.draw(st.lists(st.sampled_from(free), unique=True), label="known keywords") if free else []
    kwargs = dict.fromkeys(keywords + unknown, 0)
    with pytest.raises(InvalidTypeError) as error:
        call(*args, **kwargs)
    message = str(error.value)
    assert f"{where}()" in message, message
    if not _takes_any(parameters, inspect.Parameter.VAR_KEYWORD):
        assert "unknown keyword" in message and repr(unknown[0]) in message, message


@pytest.mark.parametrize("where", NATIVE_CALLABLES)
@SWEEP
@given(surplus=st.integers(1, 5), value=st.sampled_from([0, None, "x", [1, 2], np.int32(3)]))
def test_a_positional_argument_too_many_is_an_invalid_type_error_everywhere(
    where: str, surplus: int, value: Any
) -> None:
    call = _callable(where)
    parameters = _parameters(call)
    args = [value] * (len(_positional(parameters)) + surplus)
    with pytest.raises(InvalidTypeError) as error:
        call(*args)
    message = str(error.value)
    assert f"{where}()" in message, message
    if not _takes_any(parameters, inspect.Parameter.VAR_POSITIONAL):
        assert f"{surplus} positional argument(s) too many" in message, message


@pytest.mark.parametrize("where", NATIVE_CALLABLES)
def test_an_argument_given_by_position_and_by_keyword_is_an_invalid_type_error(where: str) -> None:
    call = _callable(where)
    named = [p for p in _parameters(call) if p.kind == p.POSITIONAL_OR_KEYWORD]
    for i, parameter in enumerate(named):
        with pytest.raises(
            InvalidTypeError, match=f"{where}\\(\\) got multiple values for argument '{parameter.name}'"
        ):
            call(*[0] * (i + 1), **{parameter.name: 0})


# --- F. the copy-logit table's accessors ------------------------------------------------------------


@FUZZ
@given(vocab=st.integers(1, 300), past=st.integers(0, 2**31 - 1), accessor=st.sampled_from(["row", "row_probs"]))
def test_a_row_outside_the_table_is_an_error(vocab: int, past: int, accessor: str) -> None:
    table = racer_rs.LogitsTable(vocab, 2)
    token = min(vocab + past, 2**31 - 1)
    with pytest.raises(InvalidArgumentError, match="token"):
        getattr(table, accessor)(token)
    assert getattr(table, accessor)(vocab - 1) is None  # inside, never written: None


# --- F2. automata holding another tokenizer's ids ----------------------------------------------------


@FUZZ
@given(
    vocab=st.integers(20, 300),
    beyond=st.integers(0, 10_000),
    scored=st.booleans(),
    use_logits=st.booleans(),
    where=st.sampled_from(["shared", "automaton", "pool"]),
)
def test_a_draft_never_holds_a_token_beyond_the_vocabulary(
    vocab: int, beyond: int, scored: bool, use_logits: bool, where: str
) -> None:
    """An automaton takes any non-negative id, the table and the pool know the vocabulary: a
    retrieved continuation beyond it (an index built with another tokenizer) is one clear error
    naming where it came from, never an id the model's embedding lacks."""
    foreign = vocab + beyond
    prompt = [3, 4, 5, 6, 7]
    stored = racer_rs.Automaton(ngram=4, max_nodes=1000)
    stored.extend([*prompt, 8, foreign, 9])
    own = racer_rs.Automaton(ngram=4, max_nodes=1000)
    own.extend(prompt[:-1])
    options: dict[str, Any] = {"scored": scored, "use_logits": use_logits}
    if where == "pool":
        pool = racer_rs.DraftPool(vocab)
        pool.add("a", prompt[:-1])
        pool.add("b", [1, 2])
        with pytest.raises(InvalidArgumentError, match=r"shared \('a'\): drafted token \d+ is outside the vocabulary"):
            pool.propose(["b", "a"], [2, prompt[-1]], 8, shared=stored)
        assert pool.propose(["b"], [2], 8, shared=stored).counts.tolist() == [1]  # the other request drafts
        return
    shared = stored if where == "shared" else None
    automaton = own
    if where == "automaton":  # the request's own automaton, its context ending as the prompt's
        automaton = racer_rs.Automaton(ngram=4, max_nodes=1000)
        automaton.extend([*prompt, 8, foreign, 9, *prompt[:-1]])
    message = f"^{where}: drafted token {foreign} is outside the vocabulary 0..{vocab}"
    with pytest.raises(InvalidArgumentError, match=message):
        build_draft_tree(automaton, racer_rs.LogitsTable(vocab, 2), prompt[-1], 8, shared=shared, **options)
    assert build_draft_tree(own, racer_rs.LogitsTable(vocab, 2), prompt[-1], 2, **options).tokens.max() < vocab


# --- G. a replaced index file -----------------------------------------------------------------------


def test_a_replaced_index_file_is_reloaded(tmp_path: Path) -> None:
    from racer_rs.drafters.index import forget_indexes, open_index

    def saved(tokens: list[int], path: Path) -> None:
        automaton = racer_rs.Automaton(ngram=4, max_nodes=100)
        automaton.extend(tokens)
        automaton.save(path)

    def opened() -> racer_rs.Automaton:
        kwargs = {"model": None, "method": "racer", "ngram": 4, "min_depth": 2, "max_nodes": None}
        return open_index(str(path), learn=False, scope="process", **kwargs).automaton

    path = tmp_path / "index.racer"
    saved([1, 2, 3, 4, 5], path)
    try:
        assert opened().count([1, 2]) == 1
        before = path.stat()
        replacement = tmp_path / "new.racer"
        saved([6, 7, 8, 9, 10], replacement)  # the same shape: the same size
        os.replace(replacement, path)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the old mtime restored
        assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
        reloaded = opened()
        assert reloaded.count([1, 2]) == 0 and reloaded.count([6, 7]) == 1
    finally:
        forget_indexes()


# --- A. an allocation that fails is an OutOfMemoryError, never an abort -------------------------------

#: The child: limit its address space to what it uses now plus 768 MiB, then run one case (in the
#: folder argv[2] for the cases that make files).
_CHILD = textwrap.dedent(
    """
    import itertools, os, resource, struct, sys, threading
    import numpy as np
    import racer_rs

    def index_header(live):
        # A valid header (see automaton/persist.rs) for `live` nodes, no free slot, no recent token.
        fields = struct.pack("<4I2Q4I", 1, 0, 4, 2, 2**32 - 2, 0, live + 1, live, 0, 0)
        return b"RACERIDX" + fields

    def vm_bytes():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
        raise SystemExit("no VmSize")

    limit = vm_bytes() + (768 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    case = sys.argv[1]
    kept = []
    try:
        if case == "automata":
            # Each automaton holds what it stores (no up-front reservation): fill them until the
            # address space runs out, in the automata's own growth.
            stream = (np.arange(4096, dtype=np.int32) * 7919) % 50_021
            for _ in range(200_000):
                automaton = racer_rs.Automaton(max_nodes=100_000)
                automaton.extend(stream)
                kept.append(automaton)
        elif case == "tables":
            # Tables hold the rows written (sparse): write every row of table after table.
            ids = np.zeros((4096, 64), np.int32)
            for _ in range(100):
                table = racer_rs.LogitsTable(2**20, 64)
                for start in range(0, 2**20, 4096):
                    table.update(np.arange(start, start + 4096, dtype=np.int32), ids)
                kept.append(table)
        elif case == "pool requests":
            pool = racer_rs.DraftPool(2**20, breadth=64)
            ids = np.zeros((4096, 64), np.int32)
            for i in range(100):
                pool.add(i, [1, 2, 3])
                for start in range(0, 2**20, 4096):
                    pool.update_topk(i, np.arange(start, start + 4096, dtype=np.int32), ids)
        elif case == "a large argument":
            ids = np.zeros(80 << 20, np.int64)  # 640 MiB of the 768: its int32 copy cannot fit
            racer_rs.prompt_lookup(ids)
        elif case == "a large list":
            ids = [0] * (80 << 20)  # 640 MiB of pointers to one int
            racer_rs.Automaton().extend(ids)
        elif case == "a large pool argument":
            ids = np.zeros(80 << 20, np.int64)
            racer_rs.DraftPool(100).add("a", ids)
        elif case == "many requests":
            # Requests until the pool's bookkeeping outgrows the address space (the smallest
            # states: no prompt, no copy-logit table), then with str ids.
            for make_id in (int, "request {}".format):
                pool = racer_rs.DraftPool(100, use_logits=False)
                try:
                    for i in itertools.count():
                        pool.add(make_id(i), ())
                except racer_rs.OutOfMemoryError:
                    if make_id is int:
                        assert pool.ids()[:3] == [0, 1, 2]
                        continue
                    raise
        elif case == "an endless file":
            racer_rs.Automaton.load("/dev/zero")
        elif case == "a short file claiming a huge index":
            path = os.path.join(sys.argv[2], "short.racer")
            with open(path, "wb") as f:
                f.write(index_header(2**32 - 2) + bytes(4))
            racer_rs.Automaton.load(path)
        elif case == "a file claiming a huge index":
            path = os.path.join(sys.argv[2], "sparse.racer")
            live = 40_000_000  # 25 bytes a node: a 1 GB file, sparse on disk
            with open(path, "wb") as f:
                f.write(index_header(live))
                f.truncate(56 + 25 * live + 4)
            racer_rs.Automaton.load(path)
        elif case == "a pipe claiming a huge index":
            path = os.path.join(sys.argv[2], "pipe.racer")
            os.mkfifo(path)

            def write():
                with open(path, "wb") as pipe:
                    pipe.write(index_header(2**32 - 2))
                    try:
                        while True:
                            pipe.write(bytes(1 << 16))
                    except BrokenPipeError:
                        pass

            threading.Thread(target=write, daemon=True).start()
            racer_rs.Automaton.load(path)
        elif case == "a large retrieve context":
            # 600 MiB of int32 ids (read in place): drafting looks at their last ngram - 1 only,
            # so the call needs no copy of them. It fits: "no error" is the outcome here.
            automaton = racer_rs.Automaton(ngram=4)
            automaton.extend([1, 2, 3, 1, 2])
            context = np.zeros(150 << 20, np.int32)
            context[-2:] = [1, 2]
            assert automaton.retrieve(3, 4, context=context).tokens.tolist() == [3, 1, 2]
            print("no error")
            sys.exit(0)
        elif case == "a large bytearray image":
            racer_rs.Automaton.from_bytes(bytearray(600 << 20))  # its copy cannot fit
        else:
            raise SystemExit("unknown case")
    except (racer_rs.OutOfMemoryError, racer_rs.CorruptFileError) as exc:
        assert isinstance(exc, (MemoryError, ValueError))
        print(f"{type(exc).__name__}:", exc)
        sys.exit(0)
    print("no error")
    sys.exit(1)
    """
)

#: Each case and the error it must end in.
MEMORY_CASES = {
    "automata": "OutOfMemoryError",
    "tables": "OutOfMemoryError",
    "pool requests": "OutOfMemoryError",
    "a large argument": "OutOfMemoryError",
    "a large list": "OutOfMemoryError",
    "a large pool argument": "OutOfMemoryError",
    "many requests": "OutOfMemoryError",
    # Index files: the header is checked against the file before the image is allocated, and a
    # file that never ends is read no further than its header describes.
    "an endless file": "CorruptFileError",
    "a short file claiming a huge index": "CorruptFileError",
    "a file claiming a huge index": "OutOfMemoryError",
    "a pipe claiming a huge index": "OutOfMemoryError",
    "a large bytearray image": "OutOfMemoryError",
    "a large retrieve context": "no error",
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
@pytest.mark.parametrize("case", sorted(MEMORY_CASES))
def test_an_allocation_beyond_the_address_space_limit_is_a_memory_error(case: str, tmp_path: Path) -> None:
    env = os.environ | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", _CHILD, case, str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert done.stdout.split(":")[0].strip() == MEMORY_CASES[case], done.stdout
