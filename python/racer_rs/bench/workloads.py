"""The workloads of ``racer bench``: which questions run, in which order, with which defaults.

The runner runs questions in order, every method on one question before the next (interleaved,
``ar`` first and last), seeding question ``i`` with ``seed + i``. A drafter's per-request state
is reset for every request; only state built to outlive a request carries over from question to
question: a racer method's shared index (``racer+index``, learning each finished response) and
SuffixDecoding's global tree of responses. A workload is therefore a question list shaped so that
such state is (or is not) worth carrying:

- ``spec_bench``: independent single requests, the first ``--limit`` questions of each
  Spec-Bench group (``data/spec_bench.jsonl``); multi-turn questions answered turn by turn.
  Cross-request state should not pay here; the goal is that it costs nothing.
- ``best_of_n``: the same prompt sampled ``--samples`` times in a row (``data/best_of_n.jsonl``,
  the first ``--limit`` prompts), each sample with its own seed (its own question index), as a
  best-of-n or self-consistency client does. A sampling workload: greedy repeats would be the
  same text, so greedy settings are refused. The samples of a prompt are reported as two
  groups, ``first sample`` (nothing to recall yet) and ``repeat samples`` (the prompt's earlier
  samples are in the shared index).
- ``multi_request``: streams of related requests, each stream in order: a coding agent resending
  the same file with one more edit each time (``data/agent_edits.jsonl``, one group per
  session) and HumanEval problems answered one after the other (``data/human_eval.jsonl``);
  the first ``--limit`` requests of each stream. Every request is a new conversation (as an
  agent's tool calls are), so only cross-request state can recall an earlier answer.

``--data`` replaces a workload's files and keeps its shaping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from racer_rs.bench.prompts import Question, load_benchmark, load_questions
from racer_rs.errors import InvalidArgumentError

#: ``best_of_n``'s group of each prompt's first sample, and of its later ones.
FIRST_SAMPLE = "first sample"
REPEAT_SAMPLES = "repeat samples"


@dataclass(frozen=True)
class Workload:
    """One workload's files and defaults.

    Attributes:
        name: its ``--workload`` name.
        data: the shipped prompt files it reads (relative to the repository).
        limit: default ``--limit``: questions per group (``spec_bench``), prompts
            (``best_of_n``) or requests per stream (``multi_request``).
        temperatures: default ``--temperature`` settings.
        sampling_only: greedy settings are refused.
        summary: one line for ``--help`` and the report.
    """

    name: str
    data: tuple[str, ...]
    limit: int
    temperatures: tuple[float, ...]
    sampling_only: bool
    summary: str


WORKLOADS: dict[str, Workload] = {
    "spec_bench": Workload(
        "spec_bench",
        ("data/spec_bench.jsonl",),
        1,
        (0.8, 0.0),
        False,
        "independent single requests: the first --limit questions of each Spec-Bench group",
    ),
    "best_of_n": Workload(
        "best_of_n",
        ("data/best_of_n.jsonl",),
        4,
        (0.8,),
        True,
        "each of the first --limit prompts sampled --samples times in a row, one seed per sample",
    ),
    "multi_request": Workload(
        "multi_request",
        ("data/agent_edits.jsonl", "data/human_eval.jsonl"),
        6,
        (0.0,),
        False,
        "streams of related requests in order: an agent's file edits, HumanEval problems one after another",
    ),
}
#: ``--samples`` default of ``best_of_n``.
DEFAULT_SAMPLES = 4


def workload(name: str) -> Workload:
    """The workload called ``name``.

    Raises:
        InvalidArgumentError: an unknown name.
    """
    if name not in WORKLOADS:
        raise InvalidArgumentError(f"unknown workload {name!r} (available: {', '.join(WORKLOADS)})")
    return WORKLOADS[name]


def shape_questions(
    name: str, paths: Sequence[str], limit: int | None, samples: int = DEFAULT_SAMPLES
) -> list[Question]:
    """The questions workload ``name`` runs, in run order.

    Args:
        name: a key of :data:`WORKLOADS`.
        paths: its prompt files (the workload's own or ``--data``).
        limit: see :attr:`Workload.limit` (``None``: every question).
        samples: ``best_of_n`` only: samples per prompt.

    Raises:
        InvalidArgumentError: an unknown workload, a bad file or row, ``samples < 1``, or a
            ``best_of_n`` prompt with more than one turn.
    """
    spec = workload(name)
    if spec.name != "best_of_n":
        # spec_bench: per group; multi_request: the same selection keeps each stream (a group,
        # in file order) in order, streams one after the other.
        return load_benchmark(paths, limit)
    if samples < 1:
        raise InvalidArgumentError(f"samples must be >= 1, got {samples}")
    prompts: list[Question] = []
    for path in paths:
        prompts.extend(load_questions(path)[:limit])
    shaped = []
    for prompt in prompts:
        if len(prompt.turns) != 1:
            raise InvalidArgumentError(
                f"{prompt.source}:{prompt.line}: best_of_n samples single-turn prompts (this one has "
                f"{len(prompt.turns)} turns)"
            )
        for sample in range(samples):
            shaped.append(
                replace(
                    prompt,
                    question_id=f"{prompt.question_id}#{sample + 1}",
                    category=FIRST_SAMPLE if sample == 0 else REPEAT_SAMPLES,
                )
            )
    return shaped
