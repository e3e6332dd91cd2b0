"""How many draft-tree nodes each live row verifies: a fixed capacity, or ``capacity="auto"``.

The engine asks its policy for the drafters' node limit and edge calibration before drafting,
lets it cut the proposals before verifying, and reports each step's outcome back; rows are
admitted to and released from the policy as requests join and leave. A fixed policy does
nothing more than bound the trees.

``capacity="auto"`` spends one node budget per step across the live rows where the expected
accepted tokens per second of the batched forward are highest, down to plain decoding for every
row when no node pays for its share of the forward. With one live row it is exactly the
single-request rule (:meth:`racer_rs.autosize.sizer.TreeSizer.choose`: the tree prefix with the
most expected tokens per second); with more, the step keeps the likeliest nodes over all rows
that the batched forward's price of its nodes and padded size favours
(:func:`racer_rs.autosize.batch_sizer.best_flat_sizes`).
One calibration learns from every row; each batch size keeps its own cost model, corrected
online (the machine's load followed fast, each size bucket's shape learned slowly, within the
process), so a first measurement that is wrong at one shape does not stick, and its own price of
drafting: what its drafted steps cost above a plain step against what the model said
(:class:`racer_rs.autosize.batch_sizer.DraftPrice`), learned fast and used cautiously, so that a
node is verified only where its gain clears what the price is known to miss, and fading back to
its prior in the steps that verify no drafted node, so that a price learned high from a few slow
steps does not stop drafting for good.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from racer_rs.drafters.base import Proposal

if TYPE_CHECKING:
    from racer_rs.autosize.batch_sizer import DraftPrice
    from racer_rs.autosize.sizer import SizeChoice, TreeSizer


@dataclass(frozen=True)
class StepReport:
    """What a verified step tells the policy (lists follow ``rows``).

    Attributes:
        rows: the live rows' keys, in batch order.
        full: the proposals drafted; ``verified`` the ones verified; ``choices`` the policy's.
        paths: accepted node indices of every verified tree; ``bonuses`` the tokens after them.
        randomized: per row, acceptance was randomised (chain speculative sampling).
        committed: tokens every row committed.
        context: the step's prefix columns (the longest row's length).
        padded: nodes per row the forward processed (the step's largest tree).
        forward: seconds of the verify phase: the target's forward and the work that grows with
            its nodes (the acceptors' predictions, the drafters' top-k, the host copy), so that
            the cost curves learn what one more node costs in all of it; ``step`` seconds of the
            whole step.
        drafted: the step drafted (``False``: a plain step chosen by :meth:`AutoCapacity.drafts`,
            with no trees, no top-k and no drafter bookkeeping).
        flat: the forward ran flat (the rows' real nodes only), not padded to ``padded``.
    """

    rows: list[int]
    full: list[Proposal]
    verified: list[Proposal]
    choices: list[Any]
    paths: list[list[int]]
    bonuses: list[int]
    randomized: list[bool]
    committed: list[int]
    context: int
    padded: int
    forward: float
    step: float
    drafted: bool = True
    flat: bool = False


#: Steps per block of one drafting mode at a batch size.
SWITCH_BLOCK = 8
#: Blocks of the faster mode before the slower one runs again, right after a new verdict: the
#: wait doubles each time the slower mode's block leaves the verdict as it was, up to
#: :data:`SWITCH_EXPLORE`.
SWITCH_FIRST_EXPLORE = 2
#: The longest wait, in blocks of the faster mode, before the slower mode runs one block.
SWITCH_EXPLORE = 16
#: Weight of a mode's earlier steps against its newest one (about 2 blocks' memory).
SWITCH_DECAY = 0.94
#: Drafting runs only if its measured rate beats plain steps' by this share.
SWITCH_MARGIN = 0.02
#: A step's seconds count at most this many times its mode's mean step so far.
SWITCH_CLIP = 1.5


def nearest_size(sizes: Iterable[int], batch: int) -> int | None:
    """The size in ``sizes`` nearest ``batch``, of two as near the larger (drafting pays less as
    a batch grows, so the larger one's knowledge is the cautious one); ``None`` if there is none."""
    return min(sizes, key=lambda size: (abs(size - batch), -size), default=None)


class DraftingSwitch:
    """Whether a batched step drafts at all, chosen per batch size by measured tokens per second.

    Drafting costs a batch more than the nodes it verifies: every row's tree, the policy's cut
    and the top-k of every verified node, whether or not any node is kept (at 16 rows of SmolLM2
    on this CPU, 4 to 8 ms of a 95 ms step, against drafts that gain 3% there). Plain steps still
    write their roots' top-k into the drafters' tables (one pass with the greedy argmax on a
    CPU), so that drafting resumes with current tables and its block measures drafting, not a
    table starved by the plain steps before it. The switch runs blocks of :data:`SWITCH_BLOCK`
    steps in one mode, the mode with more committed tokens per second of step so far at that
    batch size, and now and then a block of the other one, so that both rates stay current as
    the load, the contexts and the drafts change: :data:`SWITCH_FIRST_EXPLORE` blocks after a new
    verdict, then after twice as many each time the verdict holds, up to :data:`SWITCH_EXPLORE`.
    A verdict from a call's first steps (short contexts, little to retrieve: on Qwen2.5-Coder at
    4 rows drafting lost 5% in a call's first 8 steps, and drafting every step gained 13% over
    the whole call) is checked again within a few blocks, and a verdict that holds costs ever
    fewer blocks of the slower mode. A mode never measured at a batch size is tried first, except
    at a batch size met for the first time: its first block runs the faster mode of the nearest
    batch size where both modes ran (:meth:`nearest_verdict`), and the other mode the block
    after. A shrinking batch meets a new size every few steps, each for a block or less: on
    Qwen2.5-Coder-0.5B-Instruct at 16 rows, where plain steps were faster, the sizes 13 to 2 met
    as rows finished each began with a drafting block, and two steps of 13 rows verifying 34 and
    44 nodes took 418 and 530 ms for 31 and 41 tokens, where a plain step of 13 rows takes about
    155 ms for 13.
    Drafting must beat plain steps by :data:`SWITCH_MARGIN` to run: when the two are too close
    to tell apart on a noisy machine, speculation does not get the benefit of the doubt. A step
    slower than :data:`SWITCH_CLIP` times its mode's mean so far counts as that long (a cache
    growth or another process, not the mode, made it slow).
    One switch serves every call of a process for the same target, method and decoding mode
    (:func:`drafting_switch`), so a long-running process explores once, not once per call.
    """

    def __init__(self) -> None:
        # Per batch size: per mode (True: drafting) decayed [tokens, seconds, steps].
        self.totals: dict[int, dict[bool, list[float]]] = {}
        self.mode: dict[int, bool] = {}
        self.left: Counter[int] = Counter()
        self.verdict: dict[int, bool] = {}  # the faster mode at the last choice
        self.wait: dict[int, int] = {}  # blocks of the faster mode before the next exploration
        self.waited: Counter[int] = Counter()

    def rate(self, batch: int, drafting: bool) -> float | None:
        """Committed tokens per second of ``drafting``-mode steps at ``batch`` rows so far."""
        tokens, seconds, _ = self.totals.get(batch, {}).get(drafting, (0.0, 0.0, 0.0))
        return tokens / seconds if seconds > 0 else None

    def drafts(self, batch: int) -> bool:
        """The mode of the next step at ``batch`` rows."""
        if self.left[batch] <= 0:
            rates = {mode: self.rate(batch, mode) for mode in (True, False)}
            untried = [mode for mode in (True, False) if rates[mode] is None]
            if len(untried) == 2:
                mode = self.nearest_verdict(batch)
            elif untried:
                mode = untried[0]
            else:
                mode = self._choose(batch, self._faster(batch))
            self.mode[batch] = mode
            self.left[batch] = SWITCH_BLOCK
        self.left[batch] -= 1
        return self.mode[batch]

    def nearest_verdict(self, batch: int) -> bool:
        """The faster mode at the batch size nearest ``batch`` where both modes ran (of two as
        near, the larger one: drafting pays less as a batch grows); drafting where none has."""
        nearest = nearest_size(
            (
                size
                for size in self.totals
                if size != batch and all(self.rate(size, mode) is not None for mode in (True, False))
            ),
            batch,
        )
        return True if nearest is None else self._faster(nearest)

    def _faster(self, batch: int) -> bool:
        """Whether drafting beats plain steps at ``batch`` rows by :data:`SWITCH_MARGIN` (both measured)."""
        drafting, plain = self.rate(batch, True), self.rate(batch, False)
        assert drafting is not None and plain is not None
        return drafting > (1 + SWITCH_MARGIN) * plain

    def _choose(self, batch: int, faster: bool) -> bool:
        """The next block's mode, given the faster one: the other one once the wait is over."""
        if self.verdict.get(batch) != faster:  # a new verdict: check it again soon
            self.verdict[batch] = faster
            self.wait[batch] = SWITCH_FIRST_EXPLORE
            self.waited[batch] = 0
        if self.waited[batch] >= self.wait[batch]:
            self.waited[batch] = 0
            self.wait[batch] = min(2 * self.wait[batch], SWITCH_EXPLORE)
            return not faster
        self.waited[batch] += 1
        return faster

    def observe(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        """Count one step (earlier steps of its mode weigh :data:`SWITCH_DECAY` less each)."""
        if not (np.isfinite(seconds) and seconds > 0):
            return
        totals = self.totals.setdefault(batch, {}).setdefault(drafted, [0.0, 0.0, 0.0])
        if totals[2] >= SWITCH_BLOCK:  # enough steps for a mean to clip against
            seconds = min(seconds, SWITCH_CLIP * totals[1] / totals[2])
        totals[2] = SWITCH_DECAY * totals[2] + 1
        totals[0] = SWITCH_DECAY * totals[0] + tokens
        totals[1] = SWITCH_DECAY * totals[1] + seconds


#: This process's drafting switches, by calibration key (target, method, decoding mode).
_switches: dict[str, DraftingSwitch] = {}


def drafting_switch(key: str) -> DraftingSwitch:
    """The process's switch for calibration key ``key`` (rates measured here, never stored: they
    belong to this machine's load now)."""
    return _switches.setdefault(key, DraftingSwitch())


#: This process's drafted-step prices, by calibration key, then batch size.
_draft_prices: dict[str, dict[int, DraftPrice]] = {}


def draft_prices(key: str) -> dict[int, DraftPrice]:
    """The process's drafted-step prices for calibration key ``key``, per batch size (learned
    here, never stored, as the switch's rates: they include the drafter's own work on this
    machine now)."""
    return _draft_prices.setdefault(key, {})


class FixedCapacity:
    """Every row verifies its drafter's tree, of at most ``limit`` nodes (root included)."""

    #: Trees of different sizes run flat wherever the verifier can.
    step_flat = True

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def admit(self, row: int) -> None:
        """Nothing to set up."""

    def release(self, row: int) -> None:
        """Nothing to free."""

    def edge_calibration(self) -> np.ndarray | None:
        """No calibration: drafters use their raw edge estimates."""
        return None

    def drafts(self, batch: int) -> bool:
        """Every step drafts."""
        return True

    def cut(
        self,
        proposals: list[Proposal],
        rows: Sequence[int],
        context: int,
        flat: bool = False,
        pacing: Sequence[bool] | None = None,
    ) -> tuple[list[Proposal], list[Any]]:
        """The proposals as drafted (a fixed capacity drafts for every row, ``pacing`` or not)."""
        return proposals, [None] * len(proposals)

    def observe(self, report: StepReport) -> None:
        """Nothing to learn."""

    def finish(self, row: int, context: int) -> dict[str, Any]:
        """No statistics."""
        return {}

    def save(self) -> None:
        """Nothing to store."""


class AutoCapacity:
    """``capacity="auto"``: each step verifies, over the live rows, the nodes with the most
    expected tokens per second of the (batched) forward, learning from every row's outcome.

    Args:
        model: the target (its cost models and calibration are keyed by it).
        method: the drafter's name (calibrations are kept per method and decoding mode).
        greedy: whether the call decodes greedily.
        max_capacity: the largest tree per row.
        max_rows: the most rows that will be live at once (the batch sizes whose cost curves
            are measured on first use).
    """

    def __init__(self, model: Any, method: str, greedy: bool, max_capacity: int, max_rows: int) -> None:
        from racer_rs.autosize import batch_sizer, state

        started = time.perf_counter()
        self.limit = max_capacity
        self.key = state.calibration_key(model, method, greedy)
        self.calibration = state.load_calibration(self.key)
        self.costs = batch_sizer.batch_costs(model, max_capacity, max_rows)
        self.sizers: dict[int, TreeSizer] = {}
        self.batch_sizes: dict[int, Counter[int]] = {}
        self.padded_sizes: dict[int, Counter[int]] = {}
        self.switch = drafting_switch(self.key)
        # Per batch size, the last cut's model prices of a step (every row at 1, 2, ... nodes),
        # token shares and flat overheads (for :meth:`_as_uniform`).
        self.last_prices: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # Per batch size, what drafted steps cost beyond their model (this process's, like the switch).
        self.draft_prices = draft_prices(self.key)
        # Whether the last cut's step runs flat (else padded to its largest tree).
        self.step_flat = False
        # The cost curves' measurement on first use (a part of the call's total time).
        self.setup_seconds = time.perf_counter() - started

    def admit(self, row: int) -> None:
        """A sizer for the new row (its ranking and statistics), over the one shared calibration."""
        from racer_rs.autosize.sizer import TreeSizer

        self.sizers[row] = TreeSizer(self.costs.for_batch(1), self.calibration, self.limit)
        self.batch_sizes[row] = Counter()
        self.padded_sizes[row] = Counter()

    def release(self, row: int) -> None:
        """Forget a finished row."""
        self.sizers.pop(row, None)
        self.batch_sizes.pop(row, None)
        self.padded_sizes.pop(row, None)

    def edge_calibration(self) -> np.ndarray | None:
        """The calibrated acceptance probability of every edge cell."""
        return self.calibration.probabilities()

    def drafts(self, batch: int) -> bool:
        """Whether the next step at ``batch`` rows drafts (:class:`DraftingSwitch`; one row always
        does: its sizer already decodes plainly when no node pays)."""
        return batch == 1 or self.switch.drafts(batch)

    def cut(
        self,
        proposals: list[Proposal],
        rows: Sequence[int],
        context: int,
        flat: bool = False,
        pacing: Sequence[bool] | None = None,
    ) -> tuple[list[Proposal], list[SizeChoice]]:
        """Every row's best-first prefix: one row's by the single-request rule, a batch's by the
        most expected tokens per second of the batched forward (``flat``: the verifier can
        compute the real nodes only, and the step runs flat or padded, whichever pays more,
        :func:`racer_rs.autosize.batch_sizer.best_layout_sizes`, its choice left in
        :attr:`step_flat`; else padded to the largest tree, where every row fills the padding).
        ``pacing`` (per row, default every row): the rows whose tokens bring the call's end
        nearer; the others verify their roots alone (:meth:`DecodeEngine.pacing_rows`)."""
        from racer_rs.autosize.batch_sizer import best_flat_sizes, best_layout_sizes

        self.step_flat = False
        if len(rows) == 1:
            choice = self.sizers[rows[0]].choose(proposals[0].tree, context)
            return [restrict(proposals[0], choice.keep)], [choice]
        rankings = [self.sizers[row].rank(p.tree) for row, p in zip(rows, proposals, strict=True)]
        limits = [min(len(p.tree), self.limit) for p in proposals]
        if pacing is not None:
            limits = [n if paces else 1 for n, paces in zip(limits, pacing, strict=True)]
        cost = self.costs.for_batch(len(rows))
        # Per-size corrections are learned from noisy steps; a bigger tree never costs less.
        steps = np.maximum.accumulate(cost.step_seconds(np.arange(1, max(limits) + 1), context))
        # Drafted steps priced above a plain one as they have been measured to cost, cautiously.
        price = self._draft_price(len(rows))
        priced = price.scaled(steps, price.cautious())
        probabilities = [r.corrected[: n - 1] for r, n in zip(rankings, limits, strict=True)]
        if flat:
            token_share = self.costs.token_share(len(rows))
            share = token_share.at(len(steps), context)
            overhead = token_share.overhead_at(len(steps), context)
            sizes, self.step_flat = best_layout_sizes(probabilities, priced, share, overhead)
        else:
            share, overhead = np.zeros(len(steps)), np.zeros(len(steps))
            sizes = best_flat_sizes(probabilities, priced, share)
        choices = [r.prefix(int(size)) for r, size in zip(rankings, sizes, strict=True)]
        self.last_prices[len(rows)] = (steps, share, overhead)
        return [restrict(p, c.keep) for p, c in zip(proposals, choices, strict=True)], choices

    def observe(self, report: StepReport) -> None:
        """Learn every row's acceptance and the forward's cost (at its batch size) from one step."""
        batch = len(report.rows)
        if batch > 1:
            self.switch.observe(batch, report.drafted, sum(report.committed), report.step)
        for index, row in enumerate(report.rows):
            self.batch_sizes[row][batch] += 1
            self.padded_sizes[row][report.padded] += 1
            sizer = self.sizers[row]
            if not report.drafted:
                sizer.count_plain(report.committed[index])
                continue
            arguments = (
                report.full[index].tree,
                report.choices[index],
                report.paths[index],
                report.bonuses[index],
            )
            if batch == 1:
                sizer.observe(
                    *arguments,
                    randomized=report.randomized[index],
                    context=report.context,
                    forward=report.forward,
                    step=report.step,
                    committed=report.committed[index],
                )
            else:
                sizer.learn(*arguments, randomized=report.randomized[index], committed=report.committed[index])
        if batch > 1:
            # A batched step's curve learns the whole step: what it costs beyond the verify phase
            # grows with the padded size too (the cache moves of every row's accepted nodes,
            # rows finishing), and a constant overhead priced a padded size of 2 at 1.10x a plain
            # step when it took 1.16x (SmolLM2, 16 rows). The drafting switch's plain steps are
            # the curve's size 1: the cut prices every node against them, and a cut that rarely
            # keeps nothing never measures size 1 itself. Without them the size-1 price followed
            # the load fitted to padded size 2 and drifted 50% above a plain step, and the padded
            # size 2 (priced at least as size 1) looked free (SmolLM2, 8 rows sampled: verified
            # at 1.13x a plain step's time for 1.10x its tokens).
            # A drafted step does not teach the machine's load: in a block of drafted steps the
            # load (followed fast) took up their price's error within a few steps and gave it back
            # in the plain block after, so the price of drafting was never corrected (SmolLM2,
            # 8 rows greedy: drafted steps took 1.35-1.48x a plain step where the curve said
            # 1.22-1.26x; with the load learning from them the price's factor ended three runs at
            # 0.80-1.37, without it at 1.13-1.27). Plain steps, and drafted ones cut to their
            # roots, measure the load alone.
            self.costs.for_batch(batch).observe(
                report.padded, report.context, self._as_uniform(report), 0.0, teaches_load=report.padded < 2
            )
            if report.padded < 2:  # no drafted node verified: the price cannot be measured
                self._draft_price(batch).forget()

    def _draft_price(self, batch: int) -> DraftPrice:
        """The drafted steps' price at ``batch`` rows; a size met for the first time starts from
        the price learned at the nearest size (of two as near, the larger), the model's error
        there, not from no knowledge: the sizes a shrinking batch passes through live a few steps
        each, too few to learn their own before they draft."""
        from racer_rs.autosize.batch_sizer import DraftPrice

        price = self.draft_prices.get(batch)
        if price is None:
            nearest = nearest_size((size for size, known in self.draft_prices.items() if known.steps), batch)
            price = DraftPrice() if nearest is None else copy.copy(self.draft_prices[nearest])
            self.draft_prices[batch] = price
        return price

    def _as_uniform(self, report: StepReport) -> float:
        """A drafted step's seconds scaled to the step with every row at its padded size, which
        the batch size's cost curve prices. The step's error against the model first teaches the
        drafted steps' price (:class:`racer_rs.autosize.batch_sizer.DraftPrice`), and the curve
        learns what the price's factor leaves of it (the load's share); a flat step's is scaled
        to the uniform step at its padded size, so that the curve learns its error, not the nodes
        left out."""
        from racer_rs.autosize.batch_sizer import flat_step_seconds

        prices = self.last_prices.get(len(report.rows))
        m = report.padded
        if not report.drafted or prices is None or m < 2 or m > len(prices[0]):
            return report.step
        steps, share, overhead = prices
        if report.flat:
            extra = np.full(len(steps), sum(len(p.tree) - 1 for p in report.verified), dtype=np.float64)
            predicted = float(flat_step_seconds(steps, share, extra, len(report.rows), overhead)[m - 1])
        else:
            predicted = float(steps[m - 1])
        plain = float(steps[0])
        price = self._draft_price(len(report.rows))
        corrected = plain + price.factor * (predicted - plain)
        price.observe(predicted, report.step, plain)
        return report.step * float(steps[m - 1]) / corrected if corrected > 0 else report.step

    def finish(self, row: int, context: int) -> dict[str, Any]:
        """Row ``row``'s statistics (``extras["auto_capacity"]``): its chosen sizes and predictions,
        the cost curve of its most frequent batch size, and the batch sizes it ran at."""
        report = self.sizers[row].report(context)
        sizes = self.batch_sizes[row]
        if sizes and max(sizes) > 1:
            usual = sizes.most_common(1)[0][0]
            cost = self.costs.for_batch(usual)
            report["cost_curve_ms"] = cost.curve_ms(context)
            report["overhead_ms"] = round(1000 * cost.overhead, 3)
            report["batch_sizes"] = dict(sorted(sizes.items()))
            report["padded_sizes"] = dict(sorted(self.padded_sizes[row].items()))
            report["cost_model"] = "per batch size (1: the single-request curve; 2, 4, 8, ...: measured batched)"
        return {"auto_capacity": report | {"setup_s": self.setup_seconds}}

    def save(self) -> None:
        """Store the calibration and every batch size's cost model for later calls."""
        from racer_rs.autosize import state

        state.save_calibration(self.key, self.calibration)
        self.costs.save()


def restrict(proposal: Proposal, keep: np.ndarray) -> Proposal:
    """The proposal restricted to the nodes ``keep`` (a connected prefix of the tree)."""
    from racer_rs.autosize.sizer import subtree

    if len(keep) == len(proposal.tree):
        return proposal
    probs = proposal.draft_probs
    # A chain's best-first prefix is its first nodes, so its draft probabilities stay aligned.
    return Proposal(subtree(proposal.tree, keep), None if probs is None else probs[: len(keep) - 1])


CapacityPolicy = FixedCapacity | AutoCapacity
