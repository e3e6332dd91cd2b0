"""RacerProposer with a per-step trace, for profiling inside a real vLLM server.

Use as the ``custom_class`` ``benches.serving.traced_proposer.TracedProposer`` (the repository root
on ``PYTHONPATH``) with ``RACER_TRACE=FILE``: one JSON line per ``propose`` call with the interval
since the previous call's start (``interval_ms``), the rows, the tokens the step verified (one per
row plus the drafts of the previous call), the tokens it sampled, the drafts it returns, the
proposer's own and the logits wrapper's milliseconds, and the fitted ``a`` and ``b``.
``RACER_TRACE_DRAFT=none`` returns no drafts at all (the speculative path's cost without drafts).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from racer_rs.integrations.vllm import RacerProposer


class TracedProposer(RacerProposer):
    def __init__(self, vllm_config: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, **kwargs)
        self._trace = open(os.environ.get("RACER_TRACE", "/tmp/racer_trace.jsonl"), "a")  # noqa: SIM115
        self._no_draft = os.environ.get("RACER_TRACE_DRAFT") == "none"
        self._previous_start: float | None = None
        self._previous_drafts = 0

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        start = time.perf_counter()
        logits_before = self.seconds["logits"]
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings, **kwargs)
        if self._no_draft:
            out = [[] for _ in out]
            for request in self._rows.values():
                request.chain = []
        end = time.perf_counter()
        rows = sum(1 for s in sampled_token_ids if s)
        a, b = self.step_cost.coefficients()
        record = {
            "interval_ms": None if self._previous_start is None else 1e3 * (start - self._previous_start),
            "rows": rows,
            "verified": rows + self._previous_drafts,
            "sampled": sum(len(s) for s in sampled_token_ids),
            "drafts": [len(d) for d in out if sampled_token_ids],
            "propose_ms": 1e3 * (end - start),
            "logits_ms": 1e3 * (self.seconds["logits"] - logits_before),
            "a_ms": 1e3 * a,
            "b_ms": 1e3 * b,
        }
        self._trace.write(json.dumps(record) + "\n")
        self._trace.flush()
        self._previous_start, self._previous_drafts = start, sum(len(d) for d in out)
        return out


class UnsharedProposer(RacerProposer):
    """RacerProposer without the automaton shared across requests (each request's own tree)."""

    shared_nodes = 0


class FinishedOnlyProposer(RacerProposer):
    """RacerProposer sharing only finished requests' outputs (not the running ones')."""

    shared_running = False
