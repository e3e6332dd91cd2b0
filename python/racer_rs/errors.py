"""The errors racer_rs raises on bad input or a bad state: one hierarchy under :class:`RacerError`.

Every class also derives from the builtin a caller would catch without knowing racer_rs
(``ValueError``, ``TypeError``, ``RuntimeError``, ``ImportError``, ``NotImplementedError``), so
``except ValueError`` keeps working, while ``except racer_rs.RacerError`` catches exactly what the
library reports about its input. The Rust core raises the same classes (through the bindings'
one error map). Anything else that escapes the library is a bug, not a usage error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "CorruptFileError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "MissingDependencyError",
    "ModelLoadError",
    "ModelSpecError",
    "OutOfMemoryError",
    "RacerError",
    "StateError",
    "UnsupportedError",
    "error_context",
]


class RacerError(Exception):
    """Base class of every error racer_rs raises on bad input or a bad state."""


class InvalidArgumentError(RacerError, ValueError):
    """An argument's value is outside its domain; the message names the argument and the value."""


class InvalidTypeError(RacerError, TypeError):
    """An argument has the wrong type; the message names the argument and the type it got."""


class UnsupportedError(RacerError, NotImplementedError):
    """A valid request that racer_rs does not support (a model architecture, a method at batch > 1)."""


class StateError(RacerError, RuntimeError):
    """An object is in a state that does not allow the call (e.g. a drafter serving another thread)."""


class OutOfMemoryError(RacerError, MemoryError):
    """A buffer a call needs is larger than the system can provide (the message names its size)."""


class MissingDependencyError(RacerError, ImportError):
    """An optional dependency is not installed; the message names the extra or package to install."""


class ModelSpecError(InvalidArgumentError):
    """A model spec names nothing loadable (a missing path, a file that is not a model, an unknown name)."""


class ModelLoadError(ModelSpecError):
    """A model spec points at files that cannot be loaded (an interrupted download or copy, a
    config whose shapes do not match the weights)."""


class CorruptFileError(InvalidArgumentError):
    """A file racer_rs wrote or reads is truncated, damaged or of another format version."""


@contextmanager
def error_context(prefix: str) -> Iterator[None]:
    """Prefix the message of a :class:`RacerError` raised in the block with ``prefix: ``.

    The error keeps its class and traceback; any other exception passes through unchanged.
    """
    try:
        yield
    except RacerError as exc:
        message = f"{prefix}: {exc.args[0]}" if exc.args else prefix
        exc.args = (message, *exc.args[1:])
        if isinstance(exc, ImportError):
            exc.msg = message  # ImportError prints .msg, not args
        raise
