"""Printing committed tokens as they arrive, with drafted tokens highlighted.

The engine calls ``put(tokens, drafted)`` once per verification step with the tokens it committed
and, per token, whether it came from an accepted draft. Byte-level BPE splits a multi-byte
character over several tokens, so text is decoded incrementally: the pending tokens are decoded
together, and a trailing partial character (U+FFFD) is held back until its last byte arrives.
A character is coloured as drafted when the token that completes it was drafted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TextIO

from racer_rs.errors import InvalidArgumentError

#: ANSI colour for tokens that came from an accepted draft (green), and the reset code.
DRAFTED_STYLE = "\x1b[32m"
RESET_STYLE = "\x1b[0m"
_REPLACEMENT_CHAR = "\ufffd"


def use_color(choice: str, stream: TextIO) -> bool:
    """Decide whether to colour output.

    Args:
        choice: ``"always"``, ``"never"`` or ``"auto"`` (colour on a TTY unless ``NO_COLOR`` is set).
        stream: The output stream.
    """
    if choice == "always":
        return True
    if choice == "never":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def _runs(drafted: Sequence[bool]) -> list[tuple[int, int, bool]]:
    """Split per-token flags into maximal runs ``(start, stop, flag)`` of equal flags."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for index in range(1, len(drafted) + 1):
        if index == len(drafted) or drafted[index] != drafted[start]:
            runs.append((start, index, bool(drafted[start])))
            start = index
    return runs


class TerminalStreamer:
    """Streamer for :func:`racer_rs.generate` that writes decoded text to a stream.

    Args:
        tokenizer: Tokenizer used to decode the new tokens.
        stream: Where the text goes (e.g. ``sys.stdout``).
        color: Highlight drafted tokens with ANSI colour.
    """

    def __init__(self, tokenizer: Any, stream: TextIO, color: bool) -> None:
        self._tokenizer = tokenizer
        self._stream = stream
        self._color = color
        self._pending: list[int] = []  # tokens whose text is not fully printed yet
        self._printed = 0  # characters of decode(self._pending) already printed
        self.tokens = 0
        self.drafted_tokens = 0

    def put(self, tokens: Sequence[int], drafted: Sequence[bool] | None = None) -> None:
        """Print newly committed tokens.

        Args:
            tokens: Token ids committed in this step.
            drafted: Per token, whether it came from an accepted draft (default: none did).
        """
        tokens = [int(token) for token in tokens]
        flags = [False] * len(tokens) if drafted is None else [bool(flag) for flag in drafted]
        if len(flags) != len(tokens):
            raise InvalidArgumentError("drafted must have one flag per token")
        self.tokens += len(tokens)
        self.drafted_tokens += sum(flags)
        for start, stop, flag in _runs(flags):
            self._pending.extend(tokens[start:stop])
            self._emit(flag, final=False)
        self._stream.flush()

    def end(self) -> None:
        """Flush whatever is left (including an incomplete character) and end the line."""
        self._emit(False, final=True)
        self._stream.write("\n")
        self._stream.flush()

    def _emit(self, drafted: bool, final: bool) -> None:
        text = self._tokenizer.decode(self._pending, skip_special_tokens=True)
        # A trailing U+FFFD may be the start of a character whose other bytes are still to come:
        # hold it back. Everything before it decodes the same whatever follows.
        stable = text if final else text.rstrip(_REPLACEMENT_CHAR)
        new_text = stable[self._printed :]
        if new_text:
            if self._color and drafted:
                new_text = f"{DRAFTED_STYLE}{new_text}{RESET_STYLE}"
            self._stream.write(new_text)
        if text.endswith("\n"):
            # Restart after a newline so decoding stays cheap on long outputs.
            self._pending = []
            self._printed = 0
        else:
            self._printed = len(stable)
