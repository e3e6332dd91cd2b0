"""The benchmark loop: every method on every question, interleaved, with per-turn records.

For each sampling setting, every question is run by every method before the next question starts
(the method order rotates per question), so machine noise hits all methods alike. Each turn of a
question is one :func:`racer_rs.generate` call timed end to end (prefill included); multi-turn
questions feed each method its own previous answer. A method label stands for a
:class:`MethodSpec` (method, options, capacity); :mod:`racer_rs.bench.api` is the entry point
from Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from racer_rs._validate import capacity as capacity_rule
from racer_rs.bench.heap import release_free_heap
from racer_rs.bench.hf_peers import PEERS
from racer_rs.bench.prompting import encode_conversation, encode_text
from racer_rs.bench.prompts import Question, TokenPrompt
from racer_rs.errors import InvalidArgumentError, error_context

#: The method every other is compared with (and checked against when greedy).
BASELINE = "ar"
#: New-token cap of a warm-up run.
WARMUP_TOKENS = 32
#: ``state_by_method`` of a method whose state outlives each request without ``--persistent``
#: (a drafter may name its own state in ``learning_state``, as a racer method's shared index does).
LEARNS_ACROSS_REQUESTS = "global tree: learns across requests"
#: A label's variant: ``racer+index`` is ``racer`` drafting from a shared index too (its options
#: say which; ``racer bench --index``).
INDEX_VARIANT = "+index"


@dataclass(frozen=True)
class Setting:
    """One decoding setting of a benchmark run.

    Attributes:
        temperature: 0 for greedy.
        top_p: Nucleus threshold (ignored when greedy).
        top_k: Top-k filter, 0 for none (ignored when greedy).
    """

    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        """True for greedy decoding."""
        return self.temperature == 0.0

    @property
    def label(self) -> str:
        """Short name used in tables, JSON keys and plots."""
        if self.greedy:
            return "greedy"
        label = f"T={self.temperature:g},top_p={self.top_p:g}"
        return label + (f",top_k={self.top_k}" if self.top_k else "")


@dataclass(frozen=True)
class MethodSpec:
    """What one method label of a run stands for.

    Attributes:
        method: A racer_rs method or one of transformers' peers (``hf``, ``hf_pld``, ``hf_assisted``).
        options: The keyword options its drafter is built with (a draft model among them).
        capacity: Its own tree capacity (an int or ``"auto"``); None for the run's.
    """

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)
    capacity: int | str | None = None


@dataclass
class BenchConfig:
    """What the runner needs besides the models and questions.

    Attributes:
        methods: Method labels, ``"ar"`` first (the speedup and equality baseline); a label is a
            method name, optionally with its own tree capacity: ``racer@16``, ``racer@auto``,
            or a key of ``specs``.
        method_options: Per method, the keyword options its drafter is built with.
        settings: Decoding settings, run one after the other.
        max_new_tokens: Token budget per turn.
        capacity: Draft tree capacity (nodes, root included) or ``"auto"``, for labels without one.
        warmup: Untimed runs of the first question per method and setting (at most
            :data:`WARMUP_TOKENS` new tokens each: enough to warm threads and allocators).
        repeat: Timed runs per turn (the run with the median wall time is reported).
        seed: Base seed; question ``i`` uses ``seed + i``.
        persistent: Keep drafter state across requests instead of starting fresh each request.
        eos_token_id: End-of-sequence id(s).
        draft_model: The draft model of ``hf_assisted`` (None when not run).
        max_capacity: The largest tree a ``"auto"`` capacity may verify.
        specs: Labels that stand for a configuration of their own (any name: ``tts_S5``), with
            its method, options and capacity (``method_options`` does not apply to them).
    """

    methods: list[str]
    method_options: dict[str, dict[str, Any]]
    settings: list[Setting]
    max_new_tokens: int
    capacity: int | str
    warmup: int
    repeat: int
    seed: int
    persistent: bool
    eos_token_id: list[int] | None
    draft_model: Any = None
    max_capacity: int = 64
    specs: dict[str, MethodSpec] = field(default_factory=dict)

    def spec(self, label: str) -> MethodSpec:
        """The method, options and capacity of ``label``."""
        if label in self.specs:
            return self.specs[label]
        method, capacity = split_label(label)
        return MethodSpec(method, self.method_options.get(label, {}), parse_capacity(capacity) if capacity else None)


def split_label(label: str) -> tuple[str, str | None]:
    """``"racer@16"`` -> ``("racer", "16")``; a label without ``@`` has no capacity of its own;
    ``"racer+index@16"`` -> ``("racer", "16")`` too (see :func:`uses_index`)."""
    method, at, capacity = label.partition("@")
    return method.removesuffix(INDEX_VARIANT), (capacity if at else None)


def uses_index(label: str) -> bool:
    """Whether ``label`` is a method's shared-index variant (``racer+index``, ``racer+index@16``)."""
    return label.partition("@")[0].endswith(INDEX_VARIANT)


def parse_capacity(text: str) -> int | str:
    """A tree capacity: an int >= 1, or ``"auto"`` (the one rule: :func:`racer_rs._validate.capacity`)."""
    return capacity_rule("capacity", text)


@dataclass
class Record:
    """One timed generate call: (setting, question, turn, method)."""

    setting: str
    question_index: int
    question_id: int | str
    category: str
    source: str
    turn: int
    method: str
    seed: int
    prompt_tokens: int
    new_tokens: int
    steps: int
    mat: float
    wall_s: float
    prefill_s: float
    decode_s: float
    wall_s_repeats: list[float]
    timings: dict[str, float]
    accepted_lengths: list[int]
    positions: list[int]
    tokens: list[int]
    extras: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    #: Draft-tree nodes the target verified (the root included): what a method's steps cost.
    verified_nodes: int = 0
    #: ``ar`` runs twice per question, first and last; its closing run has pass 1.
    ar_pass: int = 0
    # None: not checked (sampling, ar itself, or an earlier turn gave this method another prompt).
    mismatch: bool | None = None
    first_mismatch: int | None = None
    # Half precision only: a mismatch at two tokens whose top-2 gap is within the dtype's rounding
    # (see racer_rs.bench.precision), with that gap (ar's token minus this method's) and the tolerance.
    near_tie: bool | None = None
    tie_gap: float | None = None
    tie_tolerance: float | None = None

    @property
    def real_mismatch(self) -> bool:
        """A greedy mismatch that rounding does not explain."""
        return bool(self.mismatch) and not self.near_tie


ProgressHook = Callable[[Record], None]
PhaseHook = Callable[[str], None]


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first position where two token lists differ (a length difference counts)."""
    for index, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return index
    if len(tokens) != len(reference):
        return min(len(tokens), len(reference))
    return None


class BenchmarkRunner:
    """Runs the interleaved benchmark.

    Args:
        model: The target model.
        tokenizer: Its tokenizer.
        config: The run configuration.
        generate: The generation function (``racer_rs.engine.generation.generate``).
        make_drafter: The drafter factory (``racer_rs.drafters.make_drafter``).
        peer_generate: Runs the transformers peers (``hf``, ``hf_pld``, ``hf_assisted``); default
            :func:`racer_rs.bench.hf_peers.generate_with_transformers`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: BenchConfig,
        generate: Callable[..., Any],
        make_drafter: Callable[..., Any],
        peer_generate: Callable[..., Any] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self._generate = generate
        self._make_drafter = make_drafter
        self._peer_generate = peer_generate
        self._synchronize = _device_synchronizer(model)
        #: Every finished question's records so far (a run that stops early keeps them).
        self.records: list[Record] = []
        #: Questions left out because a prompt outgrew the model's window, with the reason.
        self.skipped: list[dict[str, Any]] = []
        self._window = _model_window(model)
        #: Per method in persistent mode: "persistent", or "stateless" when it takes no such option;
        #: in either mode, :data:`LEARNS_ACROSS_REQUESTS` (or the drafter's ``learning_state``)
        #: for a method that keeps what it learned from earlier requests (SuffixDecoding's global
        #: tree, the racer methods' index), after "persistent; " in persistent mode.
        self.state_by_method: dict[str, str] = {}

    def build_drafters(self) -> dict[str, Any]:
        """Build one drafter per method; a bad option is an error naming the method."""
        return {label: self._build_drafter(label) for label in self.config.methods}

    def _build_drafter(self, label: str) -> Any:
        spec = self.config.spec(label)
        method = spec.method
        options = dict(spec.options)
        if method in PEERS:
            options.pop("draft_model", None)
            if options:
                raise InvalidArgumentError(f"method {label} takes no options (got {', '.join(sorted(options))})")
            return None  # transformers' generate: no drafter of ours
        drafter = None
        if self.config.persistent:
            try:
                drafter = self._make_drafter(method, self.model, persistent=True, **options)
                self.state_by_method[label] = "persistent"
            except InvalidArgumentError:
                # ar, pld, ...: no state to keep across requests, so no such option.
                self.state_by_method[label] = "stateless"
        if drafter is None:
            with error_context(f"method {label}"):
                drafter = self._make_drafter(method, self.model, **options)
        if getattr(drafter, "learns_across_requests", False):
            learning = getattr(drafter, "learning_state", LEARNS_ACROSS_REQUESTS)
            persistent = self.state_by_method.get(label) == "persistent"
            self.state_by_method[label] = f"persistent; {learning}" if persistent else learning
        return drafter

    def run(
        self,
        questions: Sequence[Question | TokenPrompt],
        progress: ProgressHook | None = None,
        phase: PhaseHook | None = None,
    ) -> list[Record]:
        """Run every setting, question, turn and method; return the records in run order.

        Args:
            questions: The questions (or prompts given as token ids), in order.
            progress: Called with every record as soon as it is measured.
            phase: Called with a short description when a warm-up or a setting starts.
        """
        self.records = []
        for setting in self.config.settings:
            drafters = self.build_drafters()
            if phase is not None and self.config.warmup:
                phase(f"warmup [{setting.label}]")
            self.warm_up(questions[0], setting, drafters)
            if phase is not None:
                phase(f"bench [{setting.label}]")
            for index, question in enumerate(questions):
                self.run_question(index, question, setting, drafters, progress)
        return self.records

    def run_question(
        self,
        index: int,
        question: Question | TokenPrompt,
        setting: Setting,
        drafters: dict[str, Any],
        progress: ProgressHook | None = None,
    ) -> list[Record]:
        """Run every method on one question (:meth:`question_order`), check greedy outputs
        against ar's, and add the records to :attr:`records`.

        Args:
            index: The question's index (its seed offset and its place in the rotation).
            question: The question, or a prompt given as token ids.
            setting: The decoding setting.
            drafters: One drafter per method (:meth:`build_drafters`).
            progress: Called with every record as soon as it is measured.

        Returns:
            The question's records; none when its prompt outgrows the model's window (the
            question is listed in :attr:`skipped` instead).
        """
        question_records: list[Record] = []
        try:
            for method, ar_pass in self.question_order(index):
                for record in self._run_question(index, question, method, setting, drafters[method]):
                    record.ar_pass = ar_pass
                    question_records.append(record)
                    if progress is not None:
                        progress(record)
        except PromptTooLong as skip:
            # The other questions are still measured; this one is reported as skipped.
            self.skipped.append(
                {
                    "setting": setting.label,
                    "question_id": question.question_id,
                    "source": f"{question.source}:{question.line}",
                    "reason": str(skip),
                }
            )
            return []
        if setting.greedy:
            _check_against_ar(question_records, self.model)
        self.records.extend(question_records)
        return question_records

    def question_order(self, index: int) -> list[tuple[str, int]]:
        """The (method, ar pass) runs of question ``index``: ``ar`` first and last (its two runs
        tell whether the machine was disturbed in between, :mod:`racer_rs.bench.stats`), the
        other methods in between in an order that rotates from question to question."""
        others = [m for m in self.config.methods if m != BASELINE]
        shift = index % len(others) if others else 0
        rotated = others[shift:] + others[:shift]
        if BASELINE not in self.config.methods:
            return [(m, 0) for m in rotated]
        return [(BASELINE, 0), *((m, 0) for m in rotated), (BASELINE, 1)]

    def calls(self, questions: Sequence[Question | TokenPrompt]) -> int:
        """How many timed generate calls :meth:`run` makes (for a progress bar)."""
        turns = sum(len(q.turns) for q in questions)
        per_question = len(self.question_order(0))
        return len(self.config.settings) * per_question * turns

    def warm_up(self, question: Question | TokenPrompt, setting: Setting, drafters: dict[str, Any]) -> None:
        """The untimed warm-up runs (:attr:`BenchConfig.warmup` per method) on ``question``."""
        if not self.config.warmup:
            return
        prompt = self._encode(question, 0, [])
        # A drafter that learns across requests warms up on a copy of its own: the timed run of
        # the same question must not draft from the warm-up's answer.
        throwaway = {
            label: self._build_drafter(label)
            for label, drafter in drafters.items()
            if getattr(drafter, "learns_across_requests", False)
        }
        for _ in range(self.config.warmup):
            for method in self.config.methods:
                drafter = throwaway.get(method, drafters[method])
                self._call(prompt, method, setting, drafter, self.config.seed, question, warmup=True)

    def _encode(self, question: Question | TokenPrompt, turn: int, answers: list[str]) -> list[int]:
        if isinstance(question, TokenPrompt):
            ids = list(question.ids)
        elif question.mode == "completion":
            ids = encode_text(self.tokenizer, question.turns[turn])
        else:
            ids = encode_conversation(self.tokenizer, question.turns[: turn + 1], answers)
        if not ids:
            raise InvalidArgumentError(f"{question.source}:{question.line}: the prompt encodes to no tokens")
        return ids

    def _call(
        self,
        prompt: list[int],
        label: str,
        setting: Setting,
        drafter: Any,
        seed: int,
        question: Question | TokenPrompt,
        warmup: bool = False,
    ) -> tuple[Any, float]:
        import torch

        budget = min(self.config.max_new_tokens, WARMUP_TOKENS) if warmup else self.config.max_new_tokens
        common = {
            "max_new_tokens": budget,
            "temperature": setting.temperature,
            "top_p": setting.top_p,
            "top_k": setting.top_k,
            "eos_token_id": self.config.eos_token_id,
            "seed": seed,
        }
        spec = self.config.spec(label)
        method = spec.method
        torch.manual_seed(seed)
        release_free_heap()  # outside the timing: each call starts from a trimmed heap
        self._synchronize()
        start = time.perf_counter()
        with error_context(f"{question.source}:{question.line}: method {label}"):
            if method in PEERS:
                result = self._peer(
                    self.model, prompt, method=method, assistant_model=self.config.draft_model, **common
                )
            else:
                capacity = self.config.capacity if spec.capacity is None else spec.capacity
                result = self._generate(
                    self.model,
                    prompt,
                    method=method,
                    capacity=capacity,
                    max_capacity=self.config.max_capacity,
                    drafter=drafter,
                    **common,
                )
        self._synchronize()
        return result, time.perf_counter() - start

    def _peer(self, *args: Any, **kwargs: Any) -> Any:
        if self._peer_generate is None:
            from racer_rs.bench.hf_peers import generate_with_transformers

            self._peer_generate = generate_with_transformers
        return self._peer_generate(*args, **kwargs)

    def _run_question(
        self, index: int, question: Question | TokenPrompt, method: str, setting: Setting, drafter: Any
    ) -> list[Record]:
        seed = self.config.seed + index
        answers: list[str] = []
        records = []
        for turn in range(len(question.turns)):
            prompt = self._encode(question, turn, answers)
            if self._window is not None and len(prompt) + self.config.max_new_tokens > self._window:
                raise PromptTooLong(
                    f"turn {turn + 1} of {question.source}:{question.line} ({method}) has {len(prompt)} prompt tokens; "
                    f"with {self.config.max_new_tokens} new tokens that exceeds the model's window of {self._window}"
                )
            runs = [self._call(prompt, method, setting, drafter, seed, question) for _ in range(self.config.repeat)]
            walls = [wall for _, wall in runs]
            # Report the run with the median wall time (the lower one for an even count), so
            # that its prefill and decode split belong to the same run.
            result, wall = sorted(runs, key=lambda run: run[1])[(len(runs) - 1) // 2]
            prefill = float(result.timings.get("prefill", 0.0))
            records.append(
                Record(
                    setting=setting.label,
                    question_index=index,
                    question_id=question.question_id,
                    category=question.category,
                    source=question.source,
                    turn=turn,
                    method=method,
                    seed=seed,
                    prompt_tokens=len(prompt),
                    new_tokens=len(result.tokens),
                    steps=int(result.steps),
                    mat=float(result.mat),
                    wall_s=wall,
                    prefill_s=prefill,
                    decode_s=max(wall - prefill, 0.0),
                    wall_s_repeats=walls,
                    timings={key: float(value) for key, value in result.timings.items()},
                    accepted_lengths=[int(n) for n in result.accepted_lengths],
                    positions=[int(p) for p in result.positions],
                    tokens=[int(t) for t in result.tokens],
                    extras=dict(result.extras),
                    prompt_ids=list(prompt),
                    verified_nodes=_verified_nodes(result),
                )
            )
            answers.append(self.tokenizer.decode(result.tokens, skip_special_tokens=True))
        return records


def _check_against_ar(records: list[Record], model: Any) -> None:
    """Mark every record of one question whose tokens differ from ar's for the same turn.

    A turn is compared only when the method got ar's prompt (a later turn of a method whose
    earlier answer differed has another conversation). In half precision a mismatch is
    classified as a near-tie or not (:func:`racer_rs.bench.precision.divergence_gap`).
    """
    import torch

    half = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    reference = {r.turn: r for r in records if r.method == BASELINE and r.ar_pass == 0}
    for record in records:
        ar = reference.get(record.turn)
        if record.method == BASELINE or ar is None or record.prompt_ids != ar.prompt_ids:
            continue
        record.first_mismatch = first_difference(record.tokens, ar.tokens)
        record.mismatch = record.first_mismatch is not None
        index = record.first_mismatch
        if half and index is not None and index < min(len(record.tokens), len(ar.tokens)):
            from racer_rs.bench.precision import divergence_gap

            prefix = ar.prompt_ids + ar.tokens[:index]
            gap, tolerance = divergence_gap(model, prefix, ar.tokens[index], record.tokens[index])
            record.near_tie, record.tie_gap, record.tie_tolerance = abs(gap) <= tolerance, gap, tolerance


class PromptTooLong(Exception):
    """A question's prompt (plus the token budget) does not fit the model's window."""


def _model_window(model: Any) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "max_position_embeddings", None)
    return int(window) if isinstance(window, int) and window > 0 else None


def _verified_nodes(result: Any) -> int:
    """Nodes the target verified over a call: ``extras["verified_nodes"]`` (transformers' peers
    count their forward tokens), else the engine's mean tree size times its steps."""
    extras = result.extras
    if "verified_nodes" in extras:
        return int(extras["verified_nodes"])
    return round(float(extras.get("mean_tree_size", 1.0)) * int(result.steps))


def _device_synchronizer(model: Any) -> Callable[[], None]:
    """Return a function that waits for queued GPU work (a no-op on the CPU)."""
    device = getattr(model, "device", None)
    if getattr(device, "type", "cpu") != "cuda":
        return lambda: None  # the CPU, or no model: nothing to wait for, and no torch needed
    import torch

    return lambda: torch.cuda.synchronize(device)
