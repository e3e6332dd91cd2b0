"""``ar``: plain autoregressive decoding (no draft), the baseline every method is compared to."""

from __future__ import annotations

from typing import Any

import numpy as np

from racer_rs._native import DraftTree
from racer_rs.drafters.base import Drafter, Proposal


class AutoregressiveDrafter(Drafter):
    """Proposes only the root, so every step commits exactly one token."""

    name = "ar"
    never_drafts = True

    def __init__(self, model: Any = None) -> None:
        del model  # no state

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """The lone root."""
        return Proposal(DraftTree.chain([next_token]))
