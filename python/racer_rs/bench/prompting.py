"""Turning question turns into token ids.

Chat rows use the tokenizer's chat template (system message "You are a helpful assistant.", as in
the RACER evaluation) with the whole conversation re-encoded each turn, the model's own earlier
answers inserted as assistant turns. A tokenizer without a chat template (a base model) gets the
turns and answers joined by blank lines. Completion rows are encoded as raw text. Benchmarks that
run one turn per question take it as token ids (:func:`first_turn`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from racer_rs.bench.prompts import Question, TokenPrompt
from racer_rs.errors import InvalidArgumentError

SYSTEM_MESSAGE = "You are a helpful assistant."


def has_chat_template(tokenizer: Any) -> bool:
    """Return True when the tokenizer defines a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Encode raw text (a completion prompt) to token ids, with the tokenizer's special tokens."""
    return list(tokenizer(text)["input_ids"])


def encode_conversation(tokenizer: Any, user_turns: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Encode a conversation that ends with a user turn awaiting the assistant's answer.

    Args:
        tokenizer: A transformers tokenizer.
        user_turns: The user turns so far (the last one is the one to answer).
        answers: The assistant's answers to all but the last user turn.

    Returns:
        The prompt token ids.
    """
    if len(answers) != len(user_turns) - 1:
        raise InvalidArgumentError("answers must hold one answer per user turn except the last")
    if not has_chat_template(tokenizer):
        parts: list[str] = []
        for index, turn in enumerate(user_turns):
            parts.append(turn)
            if index < len(answers):
                parts.append(answers[index])
        return encode_text(tokenizer, "\n\n".join(parts) + "\n\n")
    messages = [{"role": "system", "content": SYSTEM_MESSAGE}]
    for index, turn in enumerate(user_turns):
        messages.append({"role": "user", "content": turn})
        if index < len(answers):
            messages.append({"role": "assistant", "content": answers[index]})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 returns a BatchEncoding here; older versions return a plain list.
    if hasattr(ids, "keys") and "input_ids" in ids:
        ids = ids["input_ids"]
    return [int(token) for token in ids]


def first_turn(
    tokenizer: Any, question: Question, *, raw: bool = False, keep_last: int | None = None, category: str | None = None
) -> TokenPrompt:
    """A question's first turn as a one-turn prompt of token ids, whatever the row's mode.

    Args:
        tokenizer: A transformers tokenizer.
        question: The question; only its first turn is used.
        raw: Encode the turn as plain text (:func:`encode_text`) instead of a one-turn
            conversation (:func:`encode_conversation`).
        keep_last: Keep only the prompt's last ``keep_last`` tokens.
        category: Report it under this category instead of the question's.
    """
    text = question.turns[0]
    ids = encode_text(tokenizer, text) if raw else encode_conversation(tokenizer, [text], [])
    if keep_last is not None:
        ids = ids[-keep_last:]
    group = question.category if category is None else category
    return TokenPrompt(tuple(ids), question.question_id, group, question.source, question.line)
