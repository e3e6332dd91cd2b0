"""Locating the shipped reference models and prompt files.

The repository ships ``models/pycode-target-7m``, ``models/pycode-draft-1m`` and the prompt files
under ``data/`` so that ``racer bench`` runs a real benchmark with no arguments and no network. A
default is looked up relative to the current directory first, then relative to the repository
root (found from this file's location, which works for an editable install).
"""

from __future__ import annotations

from pathlib import Path

from racer_rs.cli.errors import CLIError

DEFAULT_TARGET_MODEL = "models/pycode-target-7m"
DEFAULT_DRAFT_MODEL = "models/pycode-draft-1m"
DEFAULT_BENCH_DATA = ("data/code_completion.jsonl",)


def repository_root() -> Path | None:
    """Return the repository root when the package runs from a source checkout, else None."""
    # python/racer_rs/cli/resources.py -> the checkout root is three folders above the package.
    candidate = Path(__file__).resolve().parents[3]
    if (candidate / "pyproject.toml").is_file() and (candidate / "python" / "racer_rs").is_dir():
        return candidate
    return None


def resolve_shipped(relative: str, what: str) -> str:
    """Resolve a shipped default resource (model folder or data file) to an existing path.

    Args:
        relative: Path relative to the repository root, e.g. ``"models/pycode-target-7m"``.
        what: What the path is for, used in the error message (e.g. ``"--model"``).

    Returns:
        The first existing candidate: relative to the current directory, then to the repository.

    Raises:
        CLIError: Neither candidate exists.
    """
    candidates = [Path.cwd() / relative]
    root = repository_root()
    if root is not None:
        candidates.append(root / relative)
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    tried = ", ".join(str(c) for c in candidates)
    raise CLIError(f"default {what} {relative!r} not found (looked in {tried}); pass {what} explicitly")
