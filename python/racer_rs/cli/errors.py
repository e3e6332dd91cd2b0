"""Errors the ``racer`` command reports as one line on stderr.

Every user mistake (a missing file, a bad data row, an unknown method or option) is raised as a
:class:`CLIError` deep inside the command and turned into ``racer: error: <message>`` and exit code
2 by :func:`racer_rs.cli.main`, so the user never sees a traceback for their own input.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from racer_rs.errors import RacerError

#: Exit code for bad input (the same code argparse uses).
EXIT_USAGE = 2
#: Exit code when a greedy benchmark finds a method whose tokens differ from ``ar``.
EXIT_MISMATCH = 1


class CLIError(RacerError):
    """A user-facing error: printed as one line, exit code :data:`EXIT_USAGE`."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors become :class:`CLIError` (one line, no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{self.prog}: {message}")


def one_line(message: object) -> str:
    """Collapse a message to a single line (exception texts can span several)."""
    text = " ".join(str(message).split())
    return text or "unknown error"
