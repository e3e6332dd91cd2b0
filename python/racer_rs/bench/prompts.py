"""Loading prompt files in the Spec-Bench question format.

Each line of a ``.jsonl`` file is one question::

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second user turn"]}

Rows with ``"mode": "completion"`` hold raw text to continue without a chat template (for base
models). Multi-turn questions feed the model's own answer back before the next turn; following
Spec-Bench's reporting, every question with more than one turn is pooled into the group
``"multi_turn"`` (the eight MT-Bench categories), and every other category is a group of its own.
A benchmark takes the first questions of each group, alternating between the categories pooled in
it, so that a few multi-turn questions still span writing, roleplay, reasoning and so on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from racer_rs.errors import InvalidArgumentError

MULTI_TURN_CATEGORY = "multi_turn"
MODES = ("chat", "completion")


@dataclass(frozen=True)
class Question:
    """One benchmark question.

    Attributes:
        question_id: The row's ``question_id`` (an int or a string).
        category: Reporting group (``multi_turn`` for every multi-turn question, else the row's
            category).
        turns: User turns, in order; a completion row has exactly one.
        mode: ``"chat"`` (apply the chat template when there is one) or ``"completion"``.
        source: File the question came from.
        line: 1-based line number in ``source``.
        subcategory: The row's own ``category``.
    """

    question_id: int | str
    category: str
    turns: tuple[str, ...]
    mode: str
    source: str
    line: int
    subcategory: str = ""


@dataclass(frozen=True)
class TokenPrompt:
    """A one-turn prompt given as token ids (encoded, and perhaps cut, by the caller), for
    benchmarks whose prompts are not questions to encode: raw text without special handling,
    the last tokens of a long file, a chat turn cut to a budget.

    Attributes:
        ids: The prompt's token ids.
        question_id: Its name in records and reports.
        category: Reporting group.
        source: Where it came from (in messages and records).
        line: 1-based line in ``source`` (0 when it has none).
    """

    ids: tuple[int, ...]
    question_id: int | str = 0
    category: str = "default"
    source: str = "<token ids>"
    line: int = 0

    @property
    def turns(self) -> tuple[str, ...]:
        """One turn, already encoded (its text is not needed)."""
        return ("",)


def _parse_row(row: Any, where: str) -> tuple[int | str, str, tuple[str, ...], str]:
    """Validate one decoded JSON row; raise InvalidArgumentError naming ``where`` (file:line) on a bad row."""
    if not isinstance(row, dict):
        raise InvalidArgumentError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [key for key in ("question_id", "turns") if key not in row]
    if missing:
        raise InvalidArgumentError(f"{where}: missing field {missing[0]!r}")
    qid = row["question_id"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise InvalidArgumentError(f"{where}: 'question_id' must be an int or a string")
    turns = row["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(turn, str) and turn for turn in turns):
        raise InvalidArgumentError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    category = row.get("category", "default")
    if not isinstance(category, str) or not category:
        raise InvalidArgumentError(f"{where}: 'category' must be a non-empty string")
    mode = row.get("mode", "chat")
    if mode not in MODES:
        raise InvalidArgumentError(f"{where}: 'mode' must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "completion" and len(turns) != 1:
        raise InvalidArgumentError(f"{where}: a completion row must have exactly one turn")
    return qid, category, tuple(turns), mode


def load_questions(path: str | Path) -> list[Question]:
    """Load every question of one jsonl file.

    Args:
        path: The ``.jsonl`` file. Blank lines are skipped.

    Returns:
        The questions in file order.

    Raises:
        InvalidArgumentError: The file is missing or unreadable, or a row is malformed (the message names the
            file and the 1-based line).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgumentError(f"data file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"cannot read data file {path}: {exc}") from None
    questions = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{where}: invalid JSON ({exc.msg})") from None
        qid, category, turns, mode = _parse_row(row, where)
        group = MULTI_TURN_CATEGORY if len(turns) > 1 else category
        questions.append(Question(qid, group, turns, mode, str(path), number, category))
    if not questions:
        raise InvalidArgumentError(f"data file {path} has no questions")
    return questions


def select_per_group(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """The first ``limit`` questions of every group, alternating between the categories pooled
    in a group; groups in order of first appearance, questions in file order within a category.

    Args:
        questions: The questions of one file.
        limit: Questions per group; None for all.
    """
    if limit is None:
        return list(questions)
    groups: dict[str, dict[str, list[Question]]] = {}
    for question in questions:
        groups.setdefault(question.category, {}).setdefault(question.subcategory, []).append(question)
    selected: list[Question] = []
    for by_category in groups.values():
        queues = list(by_category.values())
        taken: list[Question] = []
        for rank in range(max(len(queue) for queue in queues)):
            taken += [queue[rank] for queue in queues if rank < len(queue)]
        selected += taken[:limit]
    return selected


def load_benchmark(paths: Sequence[str | Path], limit: int | None) -> list[Question]:
    """Load several files, keeping at most ``limit`` questions of every group of each file.

    Args:
        paths: The jsonl files, in order.
        limit: Questions per group and file (see :func:`select_per_group`); None for all.

    Returns:
        The selected questions, file by file, group by group.
    """
    questions: list[Question] = []
    for path in paths:
        questions.extend(select_per_group(load_questions(path), limit))
    return questions
