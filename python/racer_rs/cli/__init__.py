"""The ``racer`` command line: ``racer generate``, ``racer bench``, ``racer index`` and ``racer distill-draft``.

Entry point :func:`main` (also ``python -m racer_rs``). Bad input gives a one-line
``racer: error: ...`` on stderr and exit code 2; a greedy benchmark whose methods disagree with
plain decoding exits with code 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from racer_rs.cli.errors import EXIT_USAGE, ArgumentParser, one_line
from racer_rs.errors import RacerError

__all__ = ["build_parser", "main"]


def build_parser() -> ArgumentParser:
    """Build the ``racer`` argument parser with its subcommands."""
    from racer_rs.cli import bench, distill, generate, index

    parser = ArgumentParser(
        prog="racer",
        description="Fast, lossless, training-free speculative decoding (racer_rs).",
    )
    from racer_rs import __version__

    parser.add_argument("--version", action="version", version=f"racer (racer_rs) {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    generate.add_parser(subparsers)
    bench.add_parser(subparsers)
    index.add_parser(subparsers)
    distill.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``racer`` command.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv[1:]``.

    Returns:
        The exit code: 0 on success, 1 when a greedy benchmark found a mismatch, 2 on bad input,
        130 when interrupted, 141 when stdout was closed early (a broken pipe).
    """
    try:
        arguments = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(arguments)
        args.argv = arguments  # recorded in the benchmark report
        return int(args.run(args))
    except RacerError as exc:  # bad input or state: one line; anything else is a bug (traceback)
        print(f"racer: error: {one_line(exc)}", file=sys.stderr)
        return int(getattr(exc, "exit_code", EXIT_USAGE))
    except KeyboardInterrupt:
        print("racer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`racer generate ... | head`): stop quietly, as cat does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except SystemExit as exc:  # --help / --version from argparse
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
