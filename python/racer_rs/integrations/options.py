"""RACER's settings for the serving-engine integrations, read from ``RACER_RS_OPTIONS``.

SGLang and vLLM have no command-line field for a plug-in's own settings, so both integrations
read one environment variable holding a JSON object, e.g.::

    RACER_RS_OPTIONS='{"breadth": 8, "ngram": 12, "threads": 2}'

Unknown keys and bad values are reported in one line naming the variable, when the engine
starts (SGLang: while it resolves its server arguments; vLLM: when it builds the proposer).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from racer_rs import _validate as rules
from racer_rs._native import DraftPool
from racer_rs.drafters.racer import RacerOptions
from racer_rs.errors import InvalidArgumentError, InvalidTypeError, RacerError

__all__ = ["ENV_VAR", "ServingOptions"]


class _RepeatedKeyError(Exception):
    """A key given twice in the JSON object (json keeps the last one silently)."""


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in pairs:
        if key in values:
            raise _RepeatedKeyError(key)
        values[key] = value
    return values


#: The environment variable both integrations read their settings from.
ENV_VAR = "RACER_RS_OPTIONS"

#: RACER's options a serving integration takes (``persistent`` does not apply: requests
#: always have their own state there).
_RACER_KEYS = ("ngram", "max_nodes", "breadth", "min_depth", "exempt_depth", "min_score")


@dataclass(frozen=True)
class ServingOptions:
    """How the integrations draft.

    Attributes:
        racer: RACER's drafting options (``persistent`` must stay False: every request has its
            own automaton and copy-logit table, freed when it ends).
        tree: ``"halving"`` or ``"scored"`` (as in :class:`racer_rs.DraftPool`).
        use_retrieval: draft from each request's automaton.
        use_logits: draft from each request's copy-logit table, written from the verify
            logits (SGLang: always available; vLLM: when they can be attributed, see
            :class:`racer_rs.integrations.vllm.RacerProposer`). ``None`` (the default): the
            engine's own default (:meth:`logits_on`): on in SGLang, whose trees verify the
            copy-logit branches; off in vLLM unless ``use_retrieval`` is off, since vLLM verifies
            one chain per request, where the copy-logit rows changed the accepted tokens by under
            1% in ``benches/serving/vllm_replay.py`` while their top-k and writes took 0.2-0.4 ms
            of every step.
        threads: most threads one :class:`racer_rs.DraftPool` batch call uses.
        capacity: vLLM only: nodes of the tree whose best chain is drafted (default
            ``max(16, 2 * k + 1)`` for ``k`` speculative tokens). SGLang's trees always have
            ``--speculative-num-draft-tokens`` nodes.
        vocab_size: the token id range, when the engine's model config does not give it.
        adaptive: vLLM only: draft, across the batch, only the tokens whose calibrated acceptance
            pays for their share of the batched forward, with the step cost learned from the
            engine's own step times (:mod:`racer_rs.integrations._payoff`); off: every request's
            whole best chain.
        log_every: drafting calls between two statistics lines in the engine's log (0: none).
    """

    racer: RacerOptions = field(default_factory=RacerOptions)
    tree: str = "halving"
    use_retrieval: bool = True
    use_logits: bool | None = None
    threads: int = 1
    capacity: int | None = None
    vocab_size: int | None = None
    adaptive: bool = True
    log_every: int = 2000

    def __post_init__(self) -> None:
        if not isinstance(self.racer, RacerOptions):
            raise InvalidTypeError(f"racer must be a RacerOptions, got {type(self.racer).__name__}")
        if self.racer.persistent:
            raise InvalidArgumentError("racer.persistent is not supported in a serving engine (per-request state)")
        rules.choice("tree", self.tree, ("halving", "scored"))
        rules.flag("use_retrieval", self.use_retrieval)
        if self.use_logits is not None:
            rules.flag("use_logits", self.use_logits)
        if self.use_retrieval is False and self.use_logits is False:
            raise InvalidArgumentError("use_retrieval and use_logits cannot both be False")
        rules.integer("threads", self.threads, minimum=1, maximum=1024)
        if self.capacity is not None:
            rules.integer("capacity", self.capacity, minimum=1, maximum=2**20)
        if self.vocab_size is not None:
            rules.integer("vocab_size", self.vocab_size, minimum=1, maximum=rules.MAX_TOKEN_ID)
        rules.flag("adaptive", self.adaptive)
        rules.integer("log_every", self.log_every, minimum=0)
        # Every combination of values, checked as the engine will use them (the token id range
        # of the model is known later: 1 stands for it, unless vocab_size is set).
        self.pool(self.vocab_size or 1)

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, racer_defaults: Mapping[str, Any] | None = None
    ) -> ServingOptions:
        """The options from a flat mapping (RACER's options and this record's fields by name);
        RACER's options it does not name take ``racer_defaults`` (an engine's own defaults),
        then :class:`~racer_rs.drafters.racer.RacerOptions`'."""
        if not isinstance(values, Mapping) or not all(isinstance(key, str) for key in values):
            raise InvalidTypeError(f"the options must be a mapping of option names, got {type(values).__name__}")
        own = {f.name for f in dataclasses.fields(cls)} - {"racer"}
        unknown = sorted(set(values) - own - set(_RACER_KEYS))
        if unknown:
            accepted = ", ".join(sorted(own | set(_RACER_KEYS)))
            raise InvalidArgumentError(f"unknown option(s) {', '.join(unknown)}; accepted: {accepted}")
        racer = {**(racer_defaults or {}), **{k: v for k, v in values.items() if k in _RACER_KEYS}}
        return cls(racer=RacerOptions(**racer), **{k: v for k, v in values.items() if k in own})

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, racer_defaults: Mapping[str, Any] | None = None
    ) -> ServingOptions:
        """The options in ``$RACER_RS_OPTIONS`` (the defaults when it is unset or empty;
        ``racer_defaults`` as in :meth:`from_mapping`).

        Raises:
            InvalidArgumentError: one line naming the variable, if it is not a JSON object of
                known options with valid values.
        """
        if environ is not None and not isinstance(environ, Mapping):
            raise InvalidTypeError(f"environ must be a mapping (like os.environ), got {type(environ).__name__}")
        text = (os.environ if environ is None else environ).get(ENV_VAR, "")
        if not isinstance(text, str):
            raise InvalidTypeError(f"{ENV_VAR} must be a str, got {type(text).__name__}")
        text = text.strip()
        if not text:
            text = "{}"
        try:
            values = json.loads(text, object_pairs_hook=_no_repeated_keys)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{ENV_VAR} must be a JSON object: {exc}") from None
        except _RepeatedKeyError as exc:
            raise InvalidArgumentError(f"{ENV_VAR}: option {exc} is given twice") from None
        if not isinstance(values, dict):
            raise InvalidArgumentError(f"{ENV_VAR} must be a JSON object, got {type(values).__name__}")
        try:
            return cls.from_mapping(values, racer_defaults=racer_defaults)
        except (RacerError, TypeError) as exc:
            raise InvalidArgumentError(f"{ENV_VAR}: {exc}") from None

    def check(self, vocab_size: int) -> None:
        """Check these options against the model's token id range ``vocab_size`` (the engine's
        start-up hook, once the model config is known).

        Raises:
            InvalidArgumentError: one line naming ``RACER_RS_OPTIONS`` and the key at fault.
        """
        try:
            self.pool(vocab_size)
        except RacerError as exc:
            raise InvalidArgumentError(f"{ENV_VAR} (for a vocabulary of {vocab_size} ids): {exc}") from None

    def logits_on(self, engine_default: bool) -> bool:
        """Whether to draft from the copy-logit tables: :attr:`use_logits` where given, else
        ``engine_default``, or on anyway where retrieval is off (the only source left)."""
        if self.use_logits is not None:
            return self.use_logits
        return engine_default or not self.use_retrieval

    def pool(self, vocab_size: int, *, use_logits: bool | None = None) -> DraftPool:
        """An empty :class:`racer_rs.DraftPool` drafting with these options.

        Args:
            vocab_size: the token id range (``vocab_size`` here, when set, wins).
            use_logits: overrides :attr:`use_logits` (e.g. off where no logits arrive); ``None``:
                :meth:`logits_on` with the copy-logit tables on by default.
        """
        o = self.racer
        logits = self.logits_on(True) if use_logits is None else use_logits
        return DraftPool(
            self.vocab_size or vocab_size,
            ngram=o.ngram,
            max_nodes=o.max_nodes,
            breadth=o.breadth,
            min_depth=o.min_depth,
            exempt_depth=o.exempt_depth,
            tree=self.tree,
            min_score=o.min_score,
            use_retrieval=self.use_retrieval or not logits,
            use_logits=logits,
            threads=self.threads,
        )
