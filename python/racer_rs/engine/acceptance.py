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
    uniform_rows,
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
    (:func:`sample_position`) only if the walk visits its node. On a CPU the engine draws only
    the roots with the step (:meth:`racer_rs.engine.decode_engine.DecodeEngine.verify`) and the
    walk draws each node it reaches: a draw costs passes over the vocabulary, and a walk reaches
    about as many nodes as it accepts, not the whole tree.
    """

    def predict(self, step: StepInputs, transfer: HostTransfer) -> None:
        assert step.uniforms is not None
        rows = uniform_rows(step.generated, step.proposal.tree.depths, len(step.uniforms))
        uniforms = step.uniforms[torch.from_numpy(rows).to(step.uniforms.device), 0]
        predicted, valid = sample_nodes(step.logits, self.sampling, uniforms)
        transfer.add("predicted", predicted)
        if valid is not None:
            transfer.add("valid", valid.long())

    def accept(self, step: StepInputs, host: dict[str, np.ndarray]) -> Acceptance:
        """The walk over the nodes' samples. A node whose sample ``predict`` did not draw (it
        reads the vocabulary size or more) is drawn here when the walk reaches it, from the same
        uniform: the path and bonus are the ones drawing every node gives."""
        tree: DraftTree = step.proposal.tree
        uniforms = step.uniforms
        assert uniforms is not None
        predicted = host["predicted"].copy()
        # Without a filter every candidate is valid.
        valid = host["valid"].astype(bool) if "valid" in host else np.ones(len(predicted), dtype=bool)
        # A draw is below the vocabulary size; the nodes not drawn get an id no node carries.
        not_drawn = max(step.logits.shape[-1], int(tree.tokens.max()) + 1)
        predicted[predicted >= step.logits.shape[-1]] = not_drawn
        resampled = 0
        while True:
            path, bonus = tree.greedy_accept(predicted)
            if bonus == not_drawn:  # the walk's last node: drawn now
                node = path[-1]
                position = self._position(step, len(path) - 1)
                token, ok = sample_nodes(step.logits[node : node + 1], self.sampling, uniforms[position, :1])
                predicted[node] = int(token[0])
                valid[node] = ok is None or bool(ok[0])
                continue
            invalid = np.flatnonzero(~valid[path])
            if invalid.size == 0:
                return Acceptance(path, bonus, resampled)
            node = path[int(invalid[0])]
            position = self._position(step, int(invalid[0]))  # path index = depth
            predicted[node] = sample_position(step.logits[node], self.sampling, uniforms[position], step.generator)
            valid[node] = True
            resampled += 1

    @staticmethod
    def _position(step: StepInputs, depth: int) -> int:
        """The uniforms' row of a node at ``depth`` (:func:`uniform_rows`)."""
        assert step.uniforms is not None
        return int(uniform_rows(step.generated, np.asarray([depth]), len(step.uniforms))[0])


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
