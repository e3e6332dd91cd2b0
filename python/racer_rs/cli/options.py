"""Parsing ``--option KEY=VALUE`` method options from the command line.

Values are read as JSON when they parse (``8`` -> int, ``0.5`` -> float, ``true`` -> bool,
``[1,2]`` -> list) and kept as strings otherwise. In ``racer bench`` an option may be scoped to
one method with ``METHOD.KEY=VALUE``; unscoped options apply to every method that takes them. Whether a method
accepts an option is decided by the drafter registry, which rejects unknown ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from racer_rs.cli.errors import CLIError


def parse_value(text: str) -> Any:
    """Read an option value: JSON when it parses, the raw string otherwise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_options(items: Iterable[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Group ``[METHOD.]KEY=VALUE`` strings into per-method option dicts.

    Args:
        items: The raw ``--option`` values.
        methods: The methods being run; a scoped option must name one of them.

    Returns:
        A dict with one (possibly empty) option dict per method.

    Raises:
        CLIError: An item has no ``=``, an empty key, or names a method that is not being run.
    """
    options: dict[str, dict[str, Any]] = {method: {} for method in methods}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CLIError(f"--option {item!r}: expected KEY=VALUE or METHOD.KEY=VALUE")
        scope, dot, name = key.rpartition(".")
        targets = list(methods)
        if dot:
            if scope not in options:
                raise CLIError(f"--option {item!r}: method {scope!r} is not among --methods")
            targets = [scope]
            key = name
        for method in targets:
            options[method][key] = parse_value(value)
    return options
