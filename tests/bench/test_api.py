"""Tests of ``racer_rs.bench.api``: the run order, the records and summary a run returns, the greedy
check against ``ar`` (and that it fails for a broken engine), per-label configurations, errors.

Every run uses the tiny random Llama model of :func:`tests.helpers.write_tiny_model` (loaded once
per module), a few prompts and a few new tokens, without warm-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import racer_rs.bench.stats  # noqa: E402
import racer_rs.drafters  # noqa: E402
import racer_rs.engine.generation  # noqa: E402
from racer_rs.bench.api import (  # noqa: E402
    GREEDY,
    BenchResult,
    MethodSpec,
    Setting,
    TokenPrompt,
    as_prompt,
    method_runner,
    reproduce_command,
    run_methods,
    timing_totals,
)
from racer_rs.bench.prompts import Question  # noqa: E402
from racer_rs.errors import InvalidArgumentError, RacerError  # noqa: E402
from tests.helpers import REPEATING_PROMPT, plain_greedy, random_prompt, write_tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

SAMPLING = Setting(0.8, top_p=0.95)
TOKENS = 8
#: Token prompts: one whose n-grams recur (pld and racer find drafts) and two random ones.
PROMPTS = [REPEATING_PROMPT, random_prompt(1, vocab=200), random_prompt(2, vocab=200)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


@pytest.fixture(autouse=True)
def no_disturbance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny runs are noisy: no request is left out of the speedups as disturbed."""
    monkeypatch.setattr(racer_rs.bench.stats, "DISTURBED_RATIO", float("inf"))


def run(tiny: tuple[Any, Any], methods: dict[str, MethodSpec | str], prompts: Any = PROMPTS, **kw: Any) -> BenchResult:
    model, tokenizer = tiny
    options: dict[str, Any] = {"max_new_tokens": TOKENS, "capacity": 8, "warmup": 0} | kw
    return run_methods(model, tokenizer, methods, prompts, **options)


def test_every_label_runs_every_prompt_with_ar_first_and_last(tiny):
    labels = ["pld", "racer", "token_recycling"]
    result = run(tiny, {label: label for label in labels}, settings=[GREEDY, SAMPLING])
    assert result.methods == ["ar", *labels]  # ar added first
    assert [s.label for s in result.settings] == ["greedy", "T=0.8,top_p=0.95"]
    orders = []
    for setting in result.settings:
        for index in range(len(PROMPTS)):
            mine = [r for r in result.records if r.setting == setting.label and r.question_index == index]
            order = [(r.method, r.ar_pass) for r in mine]
            assert order[0] == ("ar", 0) and order[-1] == ("ar", 1)
            assert sorted(method for method, _ in order[1:-1]) == sorted(labels)  # each once, in between
            assert all(r.prompt_ids == PROMPTS[index] and r.seed == index for r in mine)
            orders.append([method for method, _ in order[1:-1]])
    assert len({tuple(order) for order in orders}) == len(labels)  # the order rotates from prompt to prompt
    # Records come back in run order: all of the first setting, then the second.
    order = [r.setting for r in result.records]
    assert order == sorted(order, key=[s.label for s in result.settings].index)


def test_of_gives_one_record_per_prompt_and_setting_and_ar_opening_runs_only(tiny):
    result = run(tiny, {"pld": "pld"}, settings=[GREEDY, SAMPLING])
    for setting in (GREEDY, SAMPLING, "greedy", SAMPLING.label):
        for label in ("ar", "pld"):
            mine = result.of(label, setting)
            name = setting if isinstance(setting, str) else setting.label
            assert [r.question_index for r in mine] == [0, 1, 2]
            assert all(r.method == label and r.setting == name and r.ar_pass == 0 for r in mine)
            assert all(1 <= r.new_tokens <= TOKENS for r in mine)
    assert result.of("ar") == result.of("ar", GREEDY)  # greedy is the default
    # The summary is summarise()'s: its token counts are those of the records.
    for label in ("ar", "pld"):
        records = [r for r in result.records if r.method == label and r.setting == "greedy"]
        assert result.metrics(label)["new_tokens"] == sum(r.new_tokens for r in records)
        assert result.metrics(label, SAMPLING)["requests"] == len(PROMPTS)
    assert result.speedup("ar").value == pytest.approx(1.0)
    estimate = result.speedup("pld")
    assert estimate.low <= estimate.value <= estimate.high
    totals = timing_totals(result.of("pld"))
    assert totals["total"] == pytest.approx(sum(r.timings["total"] for r in result.of("pld")))
    assert "pld" in result.table() and result.disturbance_note() is None


def test_greedy_outputs_of_correct_methods_match_ar(tiny):
    model, _ = tiny
    result = run(tiny, {"pld": "pld", "racer": "racer", "racer_scored": "racer_scored"}, settings=[GREEDY, SAMPLING])
    assert result.mismatches() == {"ar": 0, "pld": 0, "racer": 0, "racer_scored": 0}
    assert result.near_ties() == dict.fromkeys(result.methods, 0)
    for record in result.records:
        if record.method == "ar":
            assert record.mismatch is None  # the reference itself
        elif record.setting == "greedy":
            assert record.mismatch is False  # compared with ar's output, and equal
        else:
            assert record.mismatch is None  # sampling: not compared token by token
    # ar itself is plain greedy decoding.
    for index, prompt in enumerate(PROMPTS):
        assert result.of("ar")[index].tokens == plain_greedy(model, prompt, TOKENS)
    assert sum(r.steps for r in result.of("pld")) < sum(r.new_tokens for r in result.of("pld"))  # it did draft


@pytest.fixture
def broken_pld(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately wrong engine: pld's third token is changed."""
    real_generate = racer_rs.engine.generation.generate

    def lossy_generate(*args: Any, **kwargs: Any) -> Any:
        result = real_generate(*args, **kwargs)
        if kwargs.get("method") == "pld" and len(result.tokens) > 2:
            result.tokens[2] = (result.tokens[2] + 1) % 257
        return result

    monkeypatch.setattr(racer_rs.engine.generation, "generate", lossy_generate)


def test_a_broken_method_is_reported_as_a_mismatch(tiny, broken_pld):
    result = run(tiny, {"pld": "pld", "racer": "racer"}, settings=[GREEDY, SAMPLING])
    assert result.mismatches() == {"ar": 0, "pld": len(PROMPTS), "racer": 0}
    assert all(r.mismatch and r.first_mismatch == 2 and r.real_mismatch for r in result.of("pld"))
    assert result.near_ties() == {"ar": 0, "pld": 0, "racer": 0}  # float32: no near-tie excuses it
    assert result.metrics("pld")["mismatches"] == len(PROMPTS)
    assert result.mismatches(SAMPLING) == {"ar": 0, "pld": 0, "racer": 0}  # sampling is not compared


def test_specs_get_their_own_options_and_capacity(tiny, monkeypatch):
    built: list[tuple[str, dict[str, Any]]] = []
    capacities: dict[str, set[Any]] = {}
    real_make, real_generate = racer_rs.drafters.make_drafter, racer_rs.engine.generation.generate

    def spy_make(method: str, model: Any, **options: Any) -> Any:
        built.append((method, options))
        return real_make(method, model, **options)

    def spy_generate(*args: Any, **kwargs: Any) -> Any:
        capacities.setdefault(kwargs["method"], set()).add(kwargs["capacity"])
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(racer_rs.drafters, "make_drafter", spy_make)
    monkeypatch.setattr(racer_rs.engine.generation, "generate", spy_generate)
    methods = {
        "pld_one": MethodSpec("pld", capacity=1),  # the root alone: nothing drafted
        "racer_narrow": MethodSpec("racer", {"breadth": 1}, capacity=4),
        "racer_auto": MethodSpec("racer", capacity="auto"),
        "token_recycling": "token_recycling",  # the run's capacity
    }
    result = run(tiny, methods, capacity=6, max_capacity=16)
    assert result.methods == ["ar", *methods]
    # One drafter per label, in label order, for the up-front check and again for the setting.
    expected = [("ar", {}), ("pld", {}), ("racer", {"breadth": 1}), ("racer", {}), ("token_recycling", {})]
    assert built == expected * 2
    assert capacities == {"ar": {6}, "pld": {1}, "racer": {4, "auto"}, "token_recycling": {6}}
    for record in result.of("pld_one"):
        assert record.steps == record.new_tokens and set(record.accepted_lengths) == {1}
    assert all("auto_capacity" in r.extras for r in result.of("racer_auto"))
    assert not any("auto_capacity" in r.extras for r in result.of("racer_narrow"))
    assert result.mismatches() == dict.fromkeys(result.methods, 0)


def test_prompts_may_be_questions_token_prompts_or_id_lists(tiny):
    questions = [
        Question(7, "qa", ("What is two plus two?",), "chat", "mine.jsonl", 3),
        Question(8, "multi_turn", ("Write a line.", "Now shorten it."), "chat", "mine.jsonl", 4),
    ]
    token_prompt = TokenPrompt(tuple(REPEATING_PROMPT), question_id="rep", category="code")
    result = run(tiny, {"pld": "pld"}, [*questions, token_prompt, PROMPTS[1]])
    ar = result.of("ar")
    assert [(r.question_id, r.turn) for r in ar] == [(7, 0), (8, 0), (8, 1), ("rep", 0), (3, 0)]
    assert ar[0].source == "mine.jsonl" and ar[3].category == "code" and ar[3].prompt_ids == REPEATING_PROMPT
    assert ar[2].prompt_tokens > ar[1].prompt_tokens  # the second turn holds the first and its answer
    assert set(result.summary["greedy"]) >= {"qa", "code", "overall"}
    assert result.metrics("pld", category="code")["requests"] == 1
    assert as_prompt(token_prompt, 5) is token_prompt
    assert as_prompt([1, 2], 5) == TokenPrompt((1, 2), question_id=5)


def test_method_runner_drives_prompts_one_at_a_time(tiny):
    model, tokenizer = tiny
    runner = method_runner(model, tokenizer, {"pld": "pld"}, max_new_tokens=TOKENS, capacity=8, warmup=0)
    drafters = runner.build_drafters()
    for index, prompt in enumerate(PROMPTS[:2]):
        records = runner.run_question(index, as_prompt(prompt, index), GREEDY, drafters)
        assert [r.method for r in records] == (["ar", "pld", "ar"])
    result = BenchResult.from_runner(runner)
    assert len(result.records) == 6 and result.mismatches() == {"ar": 0, "pld": 0}
    assert result.metrics("pld")["requests"] == 2


def test_without_ar_only_the_given_labels_run(tiny):
    result = run(tiny, {"racer": "racer"}, PROMPTS[:1], with_ar=False)
    assert result.methods == ["racer"] and {r.method for r in result.records} == {"racer"}
    assert len(result.records) == 1 and result.disturbance_note() is None


@pytest.mark.parametrize(
    ("methods", "prompts", "fragment"),
    [
        ({"pld": "pld"}, [], "no prompt"),
        ({"nosuch": "nosuch"}, PROMPTS, "unknown method 'nosuch'"),
        ({"racer": MethodSpec("racer", {"bogus": 1})}, PROMPTS, "bogus"),
        ({"ar": "pld"}, PROMPTS, "baseline"),
        ({}, PROMPTS, "no method"),
        ({"pld": MethodSpec("pld", capacity=0)}, PROMPTS, "capacity"),
    ],
)
def test_bad_input_is_a_racer_error_before_anything_is_timed(tiny, monkeypatch, methods, prompts, fragment):
    calls: list[Any] = []
    real_generate = racer_rs.engine.generation.generate
    monkeypatch.setattr(
        racer_rs.engine.generation, "generate", lambda *a, **k: calls.append(k) or real_generate(*a, **k)
    )
    with_ar = bool(methods)
    with pytest.raises(RacerError, match=fragment):
        run(tiny, methods, prompts, with_ar=with_ar)
    assert calls == []


def test_asking_a_result_for_an_unknown_label_or_setting_is_an_error(tiny):
    result = run(tiny, {"pld": "pld"}, PROMPTS[:1])
    for ask in (
        lambda: result.of("racer"),
        lambda: result.metrics("racer"),
        lambda: result.speedup("pld@8"),
        lambda: result.of("pld", SAMPLING),  # the run was greedy only
        lambda: result.mismatches("T=0.7"),
        lambda: result.near_ties(SAMPLING),
        lambda: result.metrics("pld", category="nosuch"),
    ):
        with pytest.raises(InvalidArgumentError):
            ask()


def test_reproduce_command_replaces_or_adds_options(monkeypatch):
    monkeypatch.setattr("sys.argv", [str(Path("benches/bench_x.py")), "--limit", "2", "--temperatures", "0", "0.8"])
    assert reproduce_command() == "python benches/bench_x.py --limit 2 --temperatures 0 0.8"
    assert reproduce_command(temperatures="0") == "python benches/bench_x.py --limit 2 --temperatures 0"
    assert reproduce_command(["--limit", "2"], max_new_tokens="16") == (
        "python benches/bench_x.py --limit 2 --max-new-tokens 16"
    )
