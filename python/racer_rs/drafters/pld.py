"""``pld``: prompt lookup decoding (apoorvumang/prompt-lookup-decoding), a chain draft.

The longest suffix n-gram of the context (``max_ngram`` down to ``min_ngram`` tokens, next
token included) is looked up in the earlier context; up to ``num_pred`` tokens that followed
its most recent earlier occurrence form the chain.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from racer_rs._native import DraftTree, prompt_lookup
from racer_rs.drafters.base import Drafter, Proposal
from racer_rs.errors import InvalidArgumentError


class PromptLookupDrafter(Drafter):
    """Prompt lookup with the reference defaults (3-gram down to 1-gram, 10 tokens).

    Args:
        model: unused.
        max_ngram: longest suffix n-gram tried.
        min_ngram: shortest suffix n-gram tried.
        num_pred: most drafted tokens per step.
    """

    name = "pld"

    def __init__(self, model: Any = None, max_ngram: int = 3, min_ngram: int = 1, num_pred: int = 10) -> None:
        del model
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidArgumentError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if num_pred < 1:
            raise InvalidArgumentError(f"num_pred must be >= 1, got {num_pred}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_pred = num_pred

    def propose(self, context: np.ndarray, next_token: int, capacity: int) -> Proposal:
        """A chain: ``next_token`` then the continuation found by the lookup."""
        if capacity < 2:
            return Proposal(DraftTree.chain([next_token]))
        sequence = np.append(context, np.int32(next_token))
        found = prompt_lookup(
            sequence, max_ngram=self.max_ngram, min_ngram=self.min_ngram, num_pred=min(self.num_pred, capacity - 1)
        )
        return Proposal(DraftTree.chain(np.append(np.int32(next_token), found[: capacity - 1])))
