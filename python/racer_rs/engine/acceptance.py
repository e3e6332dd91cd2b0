"""Lossless acceptance: which nodes of a verified draft tree are committed.

An acceptor works in two halves around the step's single device-to-host copy
(:class:`racer_rs.engine.transfer.HostTransfer`): :meth:`Acceptor.predict` queues what it
needs from the target's logits on the device, and :meth:`Acceptor.accept` decides on the host.

- :class:`GreedyWalk`: follow the target's argmax down the tree. Greedy output equals plain
  greedy decoding.
- :class:`SamplingWalk`: one sample per node from the processed target distribution, keyed
  by generation position (:func:`racer_rs.target.sampling.draw_uniforms`); a node's child is
  followed only when it equals the node's own sample, so the output is distributed exactly as
  plain sampling, and a deterministic drafter yields the very text plain sampling does for a seed.
- :class:`ChainSpeculativeSampling`: standard speculative sampling over a chain whose drafter
  reported its draft distributions (``Proposal.draft_probs``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from racer_rs.engine.transfer import HostTransfer
from racer_rs.target.sampling import (
    SamplingConfig,
    chain_speculative_sample,
    greedy_ids,
    sample_nodes,
    sample_position,
)

if TYPE_CHECKING:
    from racer_rs._native import DraftTree
    from racer_rs.drafters.base import Proposal


@dataclass(frozen=True)
class StepInputs:
    """What an acceptor may read about the step.

    Attributes:
        proposal: the verified proposal (tree and optional draft probabilities).
        logits: ``[n, V]`` raw target logits of the tree's nodes (on the device).
        generated: tokens generated before the step (node at depth ``d`` predicts generation
            position ``generated + d + 1``).
        uniforms: the request's ``[positions, CANDIDATES]`` uniforms (sampling only).
        generator: the request's random generator (``None``: torch's global one).
    """

    proposal: Proposal
    logits: torch.Tensor
    generated: int
    uniforms: torch.Tensor | None
    generator: torch.Generator | None


@dataclass(frozen=True)
class Acceptance:
    """An acceptor's decision.

    Attributes:
        path: accepted node indices, root first.
        bonus: the target's token after the accepted path.
        resampled: visited nodes whose fast sample had to be redrawn exactly.
    """

    path: list[int]
    bonus: int
    resampled: int = 0


class Acceptor(ABC):
    """Decides, losslessly, which nodes of a verified tree are accepted."""

    def __init__(self, sampling: SamplingConfig) -> None:
        self.sampling = sampling

    @abstractmethod
    def predict(self, step: StepInputs, transfer: HostTransfer) -> None:
        """Queue the device-side results :meth:`accept` needs (before the step's one copy)."""

    @abstractmethod
    def accept(self, step: StepInputs, host: dict[str, np.ndarray]) -> Acceptance:
        """Decide from the copied results."""


class GreedyWalk(Acceptor):
    """Follow the target's argmax at every node."""

    def predict(self, step: StepInputs, transfer: HostTransfer) -> None:
        transfer.add("predicted", greedy_ids(step.logits))

    def accept(self, step: StepInputs, host: dict[str, np.ndarray]) -> Acceptance:
        path, bonus = step.proposal.tree.greedy_accept(host["predicted"])
        return Acceptance(path, bonus)


class SamplingWalk(Acceptor):
    """Follow each node's own sample from the processed target distribution.

    Every node draws one candidate without sorting the vocabulary (:func:`sample_nodes`); a
    candidate that a top-k/top-p filter would remove is flagged and redrawn exactly
    (:func:`sample_position`) only if the walk visits its node.
    """

    def predict(self, step: StepInputs, transfer: HostTransfer) -> None:
        assert step.uniforms is not None
        depths = step.proposal.tree.depths
        rows = torch.from_numpy(depths.astype(np.int64) + step.generated + 1).to(step.uniforms.device)
        predicted, valid = sample_nodes(step.logits, self.sampling, step.uniforms[rows, 0])
        transfer.add("predicted", predicted)
        if valid is not None:
            transfer.add("valid", valid.long())

    def accept(self, step: StepInputs, host: dict[str, np.ndarray]) -> Acceptance:
        tree: DraftTree = step.proposal.tree
        predicted = host["predicted"].copy()
        path, bonus = tree.greedy_accept(predicted)
        if "valid" not in host:
            return Acceptance(path, bonus)
        valid = host["valid"].astype(bool)
        resampled = 0
        while True:
            invalid = np.flatnonzero(~valid[path])
            if invalid.size == 0:
                return Acceptance(path, bonus, resampled)
            assert step.uniforms is not None
            node = path[int(invalid[0])]
            position = step.generated + int(invalid[0]) + 1  # path index = depth
            predicted[node] = sample_position(step.logits[node], self.sampling, step.uniforms[position], step.generator)
            valid[node] = True
            resampled += 1
            path, bonus = tree.greedy_accept(predicted)


class ChainSpeculativeSampling(Acceptor):
    """Accept draft ``i`` with probability ``min(1, p_i / q_i)``, resample from the residual at
    the first rejection (:func:`chain_speculative_sample`); decided on the device."""

    def predict(self, step: StepInputs, transfer: HostTransfer) -> None:
        tokens = step.proposal.tree.tokens
        drafts = torch.from_numpy(tokens[1:].astype(np.int64)).to(step.logits.device)
        assert step.proposal.draft_probs is not None
        decision = chain_speculative_sample(
            step.logits, step.proposal.draft_probs, drafts, self.sampling, step.generator
        )
        transfer.add("decision", decision)

    def accept(self, step: StepInputs, host: dict[str, np.ndarray]) -> Acceptance:
        accepted, bonus = (int(v) for v in host["decision"])
        return Acceptance(list(range(accepted + 1)), bonus)
