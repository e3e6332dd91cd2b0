"""Logits processing and lossless acceptance sampling.

The processed target distribution is the one a plain sampler draws from: logits divided by the
temperature, then the top-k filter, then the top-p (nucleus) filter, as in transformers'
``TemperatureLogitsWarper``/``TopKLogitsWarper``/``TopPLogitsWarper``.
:func:`process_logits` is that definition (it sorts the vocabulary).

Verification needs one sample per tree node from that distribution. Sorting every node's row
is far slower than the model forward of a small model, so :func:`sample_nodes` draws one
candidate per node from the temperature distribution and checks, without sorting, whether it
survives the filters. A candidate that does not is flagged; the engine redraws it with
:func:`sample_position` only if the acceptance walk visits that node. Rejection sampling with
an exact fallback keeps the filtered distribution exactly.

Samples are keyed by generation position (:func:`draw_uniforms`): the token sampled at
position ``t`` depends only on the target's distribution there and on row ``t`` of the
request's uniforms, so every drafting method yields the same text for a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from racer_rs import _native
from racer_rs import _validate as rules


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax id of every row of ``[..., V]`` logits (the first one on ties, as ``argmax``).

    ``max(dim=-1)`` gives the same ids as ``argmax(dim=-1)`` several times faster on the CPU in
    half precision (bfloat16 ``argmax`` is not vectorised: 15 ms against 2 ms for ``[8, 7, 49152]``).
    """
    return logits.max(dim=-1).indices


#: The scales (inverse temperatures) the Rust kernel takes: positive and finite in float32 (a
#: temperature above ~1e38 gives a scale that rounds to 0 there; torch's ops take it).
_MIN_NATIVE_SCALE = float(torch.finfo(torch.float32).tiny)
_MAX_NATIVE_SCALE = float(torch.finfo(torch.float32).max)


def topk_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The ``int64[..., k]`` ids of the k largest logits of every row, largest first: on the CPU
    (bfloat16 or float32) the Rust kernel's pass without the exponentials of
    :func:`logits_summary` (equal logits ordered by id), elsewhere ``torch.topk``."""
    if logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float32) and logits.dim() >= 1:
        lead = logits.shape[:-1]
        rows = logits.detach().reshape(-1, logits.shape[-1]).contiguous()
        array = rows.view(torch.int16).numpy() if rows.dtype == torch.bfloat16 else rows.numpy()
        return torch.from_numpy(_native.logits_topk(array, k)).view(*lead, k)
    return torch.topk(logits, k, dim=-1).indices


def logits_summary(logits: torch.Tensor, k: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-k ids of every row of ``[..., V]`` logits, their probabilities under
    ``softmax(logits / T)`` and the row's argmax, as a decode step needs them.

    On the CPU (bfloat16 or float32 logits) one pass of the Rust kernel per row
    (``racer_rs._native.logits_summary``, the GIL released) does what ``torch.topk``,
    ``torch.logsumexp`` and ``max`` do in three; elsewhere (a GPU, float16) those torch ops.

    Args:
        logits: raw logits, ``V >= k``.
        k: ids per row, ``>= 1``.
        temperature: the sampling temperature (0, greedy, counts as 1).

    Returns:
        ``(ids, probs, greedy)``: ``int64[..., k]`` ids by logit, largest first (the kernel orders
        equal logits by id; ``torch.topk``'s order of ties is its own), ``float32[..., k]`` their
        probabilities, ``int64[...]`` the argmax, the first index of the largest logit exactly
        as :func:`greedy_ids` (NaN ranks above every number, as in torch). A row holding a NaN has
        NaN probabilities, as torch's ``logsumexp`` gives them.
    """
    scale = 1.0 / temperature if temperature > 0 else 1.0
    lead = logits.shape[:-1]
    if (
        logits.device.type == "cpu"
        and logits.dtype in (torch.bfloat16, torch.float32)
        and _MIN_NATIVE_SCALE <= scale <= _MAX_NATIVE_SCALE
        and logits.dim() >= 1
    ):
        rows = logits.detach().reshape(-1, logits.shape[-1]).contiguous()
        array = rows.view(torch.int16).numpy() if rows.dtype == torch.bfloat16 else rows.numpy()
        ids, probs, greedy = _native.logits_summary(array, k, scale)
        return (
            torch.from_numpy(ids).view(*lead, k),
            torch.from_numpy(probs).view(*lead, k),
            torch.from_numpy(greedy).view(lead),
        )
    values, top = torch.topk(logits, k, dim=-1)
    rows = logits.reshape(-1, logits.shape[-1])
    # Blocks of rows whose float copy stays in the cache: one float copy of a whole step's
    # [B * n, V] logits runs several times slower on the CPU. Each row's sum is its own.
    norms = [
        torch.logsumexp(block.float() * scale if scale != 1.0 else block.float(), dim=-1) for block in rows.split(8)
    ]
    log_norm = (torch.cat(norms) if norms else rows.new_zeros(0, dtype=torch.float32)).view(*lead, 1)
    return top, (values.float() * scale - log_norm).exp(), greedy_ids(logits)


#: Temperatures below this decode greedily (vLLM's own threshold, ``_SAMPLING_EPS``).
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings of one request.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it. A temperature
            below :data:`MIN_TEMPERATURE` is greedy decoding too (as in vLLM): dividing by it
            overflows the logits, and its distribution is the argmax's to float precision.
        top_p: nucleus threshold in (0, 1]; 1 disables the filter.
        top_k: keep the k most probable tokens (ties with the k-th kept); 0 disables it.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        temperature = rules.real("temperature", self.temperature, minimum=0.0)
        object.__setattr__(self, "temperature", 0.0 if temperature < MIN_TEMPERATURE else temperature)
        object.__setattr__(self, "top_p", rules.probability("top_p", self.top_p, zero=False))
        object.__setattr__(self, "top_k", rules.integer("top_k", self.top_k, minimum=0))

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax."""
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """True when a top-k or top-p filter removes tokens."""
        return self.top_p < 1.0 or self.top_k > 0


def process_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The processed logits a plain sampler draws from (float32, filtered entries ``-inf``).

    Args:
        logits: ``[..., V]`` raw target logits.
        config: the sampling settings; greedy settings return the logits unchanged.

    Returns:
        ``[..., V]`` float32 logits; ``softmax`` of them is the target distribution.
    """
    if config.greedy:
        return logits
    scores = logits.float() / config.temperature
    vocab = scores.shape[-1]
    if 0 < config.top_k < vocab:
        kth = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if config.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        tail_mass = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = tail_mass <= 1.0 - config.top_p
        remove_sorted[..., -1] = False  # always keep the most probable token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, -math.inf)
    return scores


CANDIDATES = 4
"""Uniforms per generated position: candidates tried before an exact sorted draw (see
:func:`sample_position`); all four miss a top-p 0.95 nucleus with probability below 1e-5."""


def draw_uniforms(
    positions: int, generator: torch.Generator | None, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The uniforms a request samples with: ``CANDIDATES`` per generated position.

    Tree nodes at the same depth share their position's uniforms, so the token sampled for
    generation position ``t`` is a fixed function of the target's distribution there and of
    row ``t``, whatever the draft: every method (and plain decoding with the same rows)
    produces the same sampled text for a seed.

    Args:
        positions: number of generation positions to cover.
        generator: random generator (``None``: torch's global one).
        device: where the uniforms live.

    Returns:
        ``float32[positions, CANDIDATES]`` in ``[0, 1)``.
    """
    return torch.rand((positions, CANDIDATES), generator=generator, device=device)


def uniform_rows(generated: int, depths: np.ndarray, positions: int) -> np.ndarray:
    """The rows of :func:`draw_uniforms`' ``[positions, CANDIDATES]`` that tree nodes at
    ``depths`` sample with, after ``generated`` tokens: the root predicts position
    ``generated + 1``; a node past the last row reads the last one (it cannot be committed)."""
    rows: np.ndarray = np.minimum(generated + 1 + np.asarray(depths, dtype=np.int64), positions - 1)
    return rows


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row proportional to non-negative ``weights`` ``[n, V]``; ``int64[n]``."""
    cdf = weights.cumsum(dim=-1)
    # right=True never lands on a zero-weight token: its cdf equals its predecessor's.
    drawn = torch.searchsorted(cdf, uniforms.view(-1, 1).to(cdf.dtype) * cdf[:, -1:], right=True)
    return drawn.clamp_(max=weights.shape[-1] - 1).squeeze(-1)


def sample_nodes(
    logits: torch.Tensor, config: SamplingConfig, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One candidate sample per node, without sorting the vocabulary.

    Each node draws a candidate from the temperature distribution by inverse CDF (in
    vocabulary order) at its uniform. When a filter is active, a candidate is valid iff it
    survives it: fewer than ``top_k`` tokens are strictly more probable, and their mass is
    below ``top_p`` times the mass kept by top-k. A valid candidate is distributed exactly
    as a draw from the filtered distribution; an invalid one must be replaced by
    :func:`sample_position` before it is used (rejection sampling).

    Args:
        logits: ``[n, V]`` raw logits.
        config: non-greedy sampling settings.
        uniforms: ``[n]`` uniforms in ``[0, 1)``, one per node.

    Returns:
        ``(tokens int64[n], valid bool[n] or None)``; ``None`` when no filter is active.
    """
    return sample_weights(temperature_weights(logits, config), config, uniforms)


def temperature_weights(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """``softmax(logits / T)`` in float32, ``[n, V]``: what :func:`sample_nodes` draws from
    (before the filters), and the probabilities :func:`logits_summary` gives its top-k ids."""
    return torch.softmax(logits.float() / config.temperature, dim=-1)


def sample_weights(
    weights: torch.Tensor, config: SamplingConfig, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`sample_nodes` from its :func:`temperature_weights` (a caller that reads them too
    computes them once)."""
    tokens = _inverse_cdf(weights, uniforms)
    if not config.filtered:
        return tokens, None
    above = weights > weights.gather(1, tokens.unsqueeze(1))
    valid = torch.ones_like(tokens, dtype=torch.bool)
    if 0 < config.top_k < weights.shape[-1]:
        valid &= above.sum(dim=-1) < config.top_k
        kept_mass = torch.topk(weights, config.top_k, dim=-1).values.sum(dim=-1)
    else:
        kept_mass = weights.sum(dim=-1)
    if config.top_p < 1.0:
        valid &= (weights * above).sum(dim=-1) < config.top_p * kept_mass
    return tokens, valid


def sample_position(
    logits: torch.Tensor, config: SamplingConfig, uniforms: torch.Tensor, generator: torch.Generator | None = None
) -> int:
    """The token sampled at one generation position: the first valid candidate.

    Candidates are drawn as in :func:`sample_nodes` with ``uniforms[0]``, ``uniforms[1]``,
    ...; if none survives the filters, an exact draw from the sorted filtered distribution
    (with ``generator``) is taken. Each step of this rejection sampling is exact, so the
    result follows the processed distribution exactly.

    Args:
        logits: ``[V]`` raw logits at the position.
        config: non-greedy sampling settings.
        uniforms: ``[CANDIDATES]`` the position's uniforms.
        generator: random generator for the exact fallback.

    Returns:
        The sampled token id.
    """
    rows = logits.unsqueeze(0)
    for uniform in uniforms.view(-1, 1):
        token, valid = sample_nodes(rows, config, uniform)
        if valid is None or bool(valid[0]):
            return int(token[0])
    return resample_node(logits, config, generator)


def resample_node(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None) -> int:
    """An exact draw from the processed distribution of one node (sorts the vocabulary).

    Args:
        logits: ``[V]`` raw logits of the node.
        config: non-greedy sampling settings.
        generator: random generator.

    Returns:
        The sampled token id.
    """
    probs = process_logits(logits.unsqueeze(0), config).softmax(dim=-1)
    uniform = torch.rand(1, generator=generator, device=probs.device)
    return int(_inverse_cdf(probs, uniform)[0])


def chain_speculative_sample(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Standard speculative sampling over a chain of drafted tokens.

    Draft token ``i`` (drawn from ``q_i``) is accepted with probability
    ``min(1, p_i(x) / q_i(x))``; at the first rejection the output token is drawn from the
    residual ``max(0, p_i - q_i)`` (normalised); if every draft is accepted it is drawn from
    the last node's ``p``. The output is distributed exactly as plain sampling.

    Args:
        target_logits: ``[n, V]`` raw target logits of the chain's nodes (root first).
        draft_probs: ``[n - 1, V]`` draft distributions of nodes ``1..n-1``.
        draft_tokens: ``int64[n - 1]`` tokens of nodes ``1..n-1``.
        config: non-greedy sampling settings.
        generator: random generator.

    Returns:
        ``int64[2]`` on the logits' device: number of accepted drafts, then the next token.
    """
    p = process_logits(target_logits, config).softmax(dim=-1)
    q = draft_probs.to(device=p.device, dtype=p.dtype)
    index = draft_tokens.view(-1, 1)
    p_drafted = p[:-1].gather(1, index).squeeze(1)
    q_drafted = q.gather(1, index).squeeze(1)
    u = torch.rand(p_drafted.shape, generator=generator, device=p.device, dtype=p.dtype)
    accepted = (u * q_drafted < p_drafted).long().cumprod(dim=0).sum().reshape(1)
    residual = (p[:-1] - q).clamp_(min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p[:-1], residual)  # only reachable through rounding
    rows = torch.cat([residual, p[-1:]])
    candidates = _inverse_cdf(rows, torch.rand(rows.shape[0], generator=generator, device=rows.device))
    return torch.cat([accepted, candidates.gather(0, accepted)])
