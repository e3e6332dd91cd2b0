"""``--draft-model`` values that name a self-draft, built from the already-loaded target.

* ``self:K``: the target's first K decoder layers, undistilled (:func:`racer_rs.selfdraft.model.self_draft`);
* a folder written by ``racer distill-draft``: the distilled self-draft it holds
  (:func:`racer_rs.selfdraft.checkpoint.load_self_draft`), checked against the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from racer_rs.cli.errors import CLIError
from racer_rs.errors import error_context

SELF_PREFIX = "self:"


def is_self_draft(spec: str | None) -> bool:
    """True when ``spec`` names a self-draft (``self:K``, or a distill-draft folder).

    Raises:
        CLIError: ``self:`` is followed by something other than a positive integer.
    """
    if spec is None:
        return False
    if spec.startswith(SELF_PREFIX):
        self_layers(spec)
        return True
    folder = Path(spec)
    return folder.is_dir() and ((folder / "manifest.json").is_file() or (folder / "work" / "plan.json").is_file())


def self_layers(spec: str) -> int:
    """K of a ``self:K`` spec."""
    text = spec[len(SELF_PREFIX) :]
    if not text.isdigit() or int(text) < 1:
        raise CLIError(f"--draft-model {spec!r}: expected self:K with K >= 1 decoder layers of the target")
    return int(text)


def build_self_draft(spec: str, target: Any) -> Any:
    """The self-draft ``spec`` names, built on ``target``.

    Raises:
        CLIError: the layer count does not fit the target, the checkpoint is missing, incomplete,
            corrupt or made for another target, or the target is not a Llama-style model.
    """
    from racer_rs.selfdraft.checkpoint import load_self_draft
    from racer_rs.selfdraft.model import self_draft

    with error_context(f"--draft-model {spec}"):
        if spec.startswith(SELF_PREFIX):
            return self_draft(target, self_layers(spec))
        return load_self_draft(target, spec)
