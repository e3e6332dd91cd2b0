"""One rule per kind of argument (counts, numbers, probabilities, flags, seeds, token ids),
shared by every public entry point. The Rust core applies the same rules to its own arguments.

Every rule names the argument and the value it got, raises a :class:`racer_rs.RacerError`
(``InvalidTypeError`` for the wrong type, ``InvalidArgumentError`` for a value outside its
domain), and returns the value in the form the library uses. Token ids are range-checked
before any narrowing to ``int32``, so ``2**32 + 5`` is an error, never token 5.
"""

from __future__ import annotations

import array
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from racer_rs.errors import InvalidArgumentError, InvalidTypeError

#: Token ids live in ``int32`` (the Rust core's type); the largest id any vocabulary can have.
MAX_TOKEN_ID = 2**31 - 1
#: torch's generators take seeds in ``[0, 2**64)``.
MAX_SEED = 2**64 - 1


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An int (numpy integers too, never a bool) within ``[minimum, maximum]``."""
    if not is_int(value):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise InvalidArgumentError(f"{name} must be <= {maximum}, got {number}")
    return number


def real(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> float:
    """A finite real number; ``minimum``/``maximum`` are inclusive bounds, ``above``/``below``
    exclusive ones."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidArgumentError(f"{name} must be finite, got {value}")
    if minimum is not None and number < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum:g}, got {value}")
    if maximum is not None and number > maximum:
        raise InvalidArgumentError(f"{name} must be <= {maximum:g}, got {value}")
    if above is not None and number <= above:
        raise InvalidArgumentError(f"{name} must be > {above:g}, got {value}")
    if below is not None and number >= below:
        raise InvalidArgumentError(f"{name} must be < {below:g}, got {value}")
    return number


def probability(name: str, value: Any, *, zero: bool = True) -> float:
    """A probability in ``[0, 1]`` (``(0, 1]`` when ``zero`` is false)."""
    number = real(name, value)
    if not (0.0 <= number <= 1.0) or (not zero and number == 0.0):
        interval = "[0, 1]" if zero else "(0, 1]"
        raise InvalidArgumentError(f"{name} must be in {interval}, got {value}")
    return number


def flag(name: str, value: Any) -> bool:
    """``True`` or ``False`` (numpy booleans too; never an int)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidTypeError(f"{name} must be True or False, got {type(value).__name__}")
    return bool(value)


def seed(name: str, value: Any) -> int:
    """A random seed: an int in ``[0, 2**64)``."""
    return integer(name, value, minimum=0, maximum=MAX_SEED)


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """One of ``options``."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be one of {', '.join(options)}, got {type(value).__name__}")
    if value not in options:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(options)}, got {value!r}")
    return value


def capacity(name: str, value: Any) -> int | str:
    """A tree capacity: an int >= 1 (or its decimal text, as a command line gives it), or ``"auto"``.

    The one rule for ``capacity`` wherever it is given (``generate``, ``racer bench`` labels
    like ``racer@16``, the ``--capacity`` flag).
    """
    if value == "auto":
        return "auto"
    number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if not is_int(number):
        if isinstance(value, str):
            raise InvalidArgumentError(f"{name} must be an int >= 1 or 'auto', got {value!r}")
        raise InvalidTypeError(f"{name} must be an int >= 1 or 'auto', got {type(value).__name__}")
    if int(number) < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1 or 'auto', got {value!r}")
    return int(number)


def token_id(name: str, value: Any, vocab: int | None = None) -> int:
    """One token id in ``[0, vocab)`` (``[0, 2**31)`` without a vocabulary)."""
    limit = MAX_TOKEN_ID + 1 if vocab is None else vocab
    if not is_int(value):
        raise InvalidTypeError(f"{name} must be a token id (an int), got {type(value).__name__}")
    number = int(value)
    if not 0 <= number < limit:
        raise InvalidArgumentError(f"{name} must be a token id in [0, {limit}), got {number}")
    return number


def token_ids(name: str, value: Any, vocab: int | None = None, *, rows: bool = False) -> np.ndarray:
    """Token ids as ``int32``: a list or tuple of ints, a numpy array of any integer dtype, or
    an integer torch tensor, each id in ``[0, vocab)`` (``[0, 2**31)`` without a vocabulary).

    The range is checked on the ids as given, before narrowing. With ``rows`` a 2-D input is
    accepted as well (one row per sequence); else the ids must be 1-D.
    """
    array = _integer_array(name, value)
    if array.ndim != 1 and not (rows and array.ndim == 2):
        shapes = "[L] or [B, L]" if rows else "[L]"
        raise InvalidArgumentError(f"{name} must have shape {shapes}, got {list(array.shape)}")
    limit = MAX_TOKEN_ID + 1 if vocab is None else vocab
    if array.size:
        low, high = array.min(), array.max()
        if low < 0 or high >= limit:
            bad = low if low < 0 else high
            raise InvalidArgumentError(f"{name} must be token ids in [0, {limit}), got {int(bad)}")
    return array.astype(np.int32)


def id_array(name: str, value: Any) -> np.ndarray:
    """Ids as given, as a 1-D ``int64`` array: the type rule of :func:`token_ids` (ints only,
    never a bool or a float) without its range, for callers that handle an out-of-range id
    themselves (the serving integrations draft nothing for a request holding one)."""
    if isinstance(value, (list, tuple)) and not all(map(is_int, value)):
        raise InvalidTypeError(f"{name} must be a list of ints")
    array = _integer_array(name, value)
    if array.ndim != 1:
        raise InvalidArgumentError(f"{name} must have shape [L], got {list(array.shape)}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise InvalidArgumentError(f"{name} must be ids within int64, got {int(array.max())}")
    return array.astype(np.int64, copy=False)


#: ``array.array`` type codes of integers (SGLang keeps token ids in ``array.array('l')``).
_INTEGER_TYPECODES = frozenset("bBhHiIlLqQ")


def _integer_array(name: str, value: Any) -> np.ndarray:
    """``value`` as an integer numpy array, without any narrowing yet."""
    if isinstance(value, array.array):
        if value.typecode not in _INTEGER_TYPECODES:
            raise InvalidTypeError(f"{name} must hold integers, got array.array of type code {value.typecode!r}")
        return np.asarray(value)
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_ or not np.issubdtype(value.dtype, np.integer):
            raise InvalidTypeError(f"{name} must hold integers, got dtype {value.dtype}")
        return value
    if hasattr(value, "detach") and hasattr(value, "dtype") and type(value).__module__.startswith("torch"):
        if value.is_floating_point() or value.is_complex() or str(value.dtype) == "torch.bool":
            raise InvalidTypeError(f"{name} must hold integers, got dtype {value.dtype}")
        return np.asarray(value.detach().cpu().numpy())
    if isinstance(value, (list, tuple)):
        if not all(is_int(item) or (isinstance(item, (list, tuple)) and all(map(is_int, item))) for item in value):
            raise InvalidTypeError(f"{name} must be a list of ints")
        try:
            return np.asarray(value, dtype=np.int64)
        except OverflowError:  # an id beyond int64: certainly out of range
            raise InvalidArgumentError(
                f"{name} must be token ids in [0, {MAX_TOKEN_ID + 1}), got an id beyond int64"
            ) from None
        except ValueError:  # ragged nested lists
            raise InvalidArgumentError(f"{name}: rows of different lengths") from None
    raise InvalidTypeError(f"{name} must be a list of ints or an integer array/tensor, got {type(value).__name__}")
