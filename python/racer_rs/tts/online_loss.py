"""The TTS distillation loss over one verified canvas, and one optimiser step on it.

A canvas is what one speculation round drafted and the target verified: the root token ``x_0``
followed by the drafted tokens ``y_1..y_C``. Row ``i`` of the target's verification logits and row
``i`` of the draft's logits on the same canvas both predict the token after canvas input ``i``, so
the rows line up one to one (shifting them by one position is the classic off-by-one of this
loss). The loss is

    L = sum_i w_i m_i KL(p_i || q_i) / sum_i w_i m_i  +  lam * sum_i w_i m_i KL(q_ref_i || q_i) / sum_i w_i m_i

with ``p`` the target, ``q`` the draft being trained, ``q_ref`` the ORIGINAL draft (a reference
equal to the current weights would have zero gradient, so it would not regularise), ``w`` position weights
and ``m`` the validity mask (``full_canvas`` keeps every row; ``on_trajectory`` keeps rows whose
prefix was accepted, i.e. ``i <= n_accepted``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from racer_rs import _validate as rules
from racer_rs.errors import InvalidArgumentError

MASK_MODES = ("full_canvas", "on_trajectory")
WEIGHT_SCHEMES = ("exp", "uniform")

KVPrefix = tuple[tuple[torch.Tensor, torch.Tensor], ...]


#: The largest learning rate accepted for online distillation.
MAX_LR = 1.0


@dataclass(frozen=True)
class DistillConfig:
    """Hyper-parameters of the online distillation.

    Attributes:
        lr: Adam learning rate.
        lam: weight of the ``KL(q_ref || q)`` regulariser towards the original draft (0 disables).
        position_weights: ``"exp"`` (``w_i = exp(-i / gamma)``), ``"uniform"``, or explicit
            per-row weights (rows beyond the sequence reuse its last value).
        gamma: decay length of the ``"exp"`` weights, in rows.
        mask: ``"full_canvas"`` or ``"on_trajectory"``.
        betas: Adam betas.
        eps: Adam epsilon.
    """

    lr: float = 1e-3
    lam: float = 0.0
    position_weights: str | tuple[float, ...] = "exp"
    gamma: float = 4.0
    mask: str = "full_canvas"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        # An Adam step above 1 sends a small draft's weights to inf/NaN within a few updates.
        object.__setattr__(self, "lr", rules.real("lr", self.lr, above=0.0, maximum=MAX_LR))
        object.__setattr__(self, "lam", rules.real("lam", self.lam, minimum=0.0))
        if isinstance(self.position_weights, str):
            if self.position_weights not in WEIGHT_SCHEMES:
                raise InvalidArgumentError(
                    f"position_weights must be one of {WEIGHT_SCHEMES} or a sequence of floats, "
                    f"got {self.position_weights!r}"
                )
        else:
            values = tuple(float(v) for v in self.position_weights)
            if not values or any(not math.isfinite(v) or v < 0 for v in values) or not any(values):
                raise InvalidArgumentError("position_weights must be non-negative finite floats, not all zero")
            object.__setattr__(self, "position_weights", values)
        object.__setattr__(self, "gamma", rules.real("gamma", self.gamma, above=0.0))
        rules.choice("mask", self.mask, MASK_MODES)


@dataclass
class Canvas:
    """One verified canvas: the training example of one update.

    Attributes:
        prefix: the draft's KV cache of the committed context before the canvas, one
            ``(keys, values)`` pair of ``[1, heads, P, head_dim]`` per layer (treated as constants).
        input_ids: ``[n]`` canvas tokens, root first.
        teacher_logits: ``[n, V]`` processed target logits; row ``i`` predicts the token after
            ``input_ids[i]``. May contain ``-inf`` (top-k / top-p truncation).
        n_accepted: drafted tokens the target accepted in this round.
        temperature: the draft's logits are divided by it (1.0 for greedy decoding).
    """

    prefix: KVPrefix
    input_ids: torch.Tensor
    teacher_logits: torch.Tensor
    n_accepted: int
    temperature: float = 1.0


def position_weights(n_rows: int, config: DistillConfig, device: torch.device | None = None) -> torch.Tensor:
    """Per-row weights ``w_i`` for ``i = 0..n_rows-1`` (float32)."""
    rows = torch.arange(n_rows, dtype=torch.float32, device=device)
    if config.position_weights == "exp":
        return torch.exp(-rows / config.gamma)
    if config.position_weights == "uniform":
        return torch.ones(n_rows, dtype=torch.float32, device=device)
    values = list(config.position_weights)
    values += [values[-1]] * max(0, n_rows - len(values))
    return torch.tensor(values[:n_rows], dtype=torch.float32, device=device)


def canvas_mask(n_rows: int, n_accepted: int, mode: str, device: torch.device | None = None) -> torch.Tensor:
    """Validity mask ``m_i``: every row, or the rows whose whole prefix was accepted."""
    if mode == "full_canvas":
        return torch.ones(n_rows, dtype=torch.float32, device=device)
    if mode == "on_trajectory":
        return (torch.arange(n_rows, device=device) <= n_accepted).to(torch.float32)
    raise InvalidArgumentError(f"mask must be one of {MASK_MODES}, got {mode!r}")


def row_weights(canvas: Canvas, config: DistillConfig) -> torch.Tensor:
    """``w_i * m_i`` for every row of ``canvas``."""
    n_rows = canvas.input_ids.shape[0]
    device = canvas.teacher_logits.device
    weights = position_weights(n_rows, config, device)
    return weights * canvas_mask(n_rows, canvas.n_accepted, config.mask, device)


def _as_autograd_tensor(tensor: torch.Tensor) -> torch.Tensor:
    # Tensors made under torch.inference_mode() cannot be saved for backward: clone them first.
    return tensor.clone() if tensor.is_inference() else tensor.detach()


def canvas_logits(model: nn.Module, canvas: Canvas) -> torch.Tensor:
    """The draft's temperature-scaled logits ``[n, V]`` (float32) on the canvas given its KV prefix.

    Differentiable with respect to ``model``'s parameters when grad mode is on; the prefix is a
    constant (the cached history is not recomputed with the new weights).
    """
    from transformers import DynamicCache

    input_ids = canvas.input_ids.reshape(1, -1).to(torch.long)
    n_prefix = canvas.prefix[0][0].shape[-2] if canvas.prefix else 0
    cache = DynamicCache()
    for layer, (keys, values) in enumerate(canvas.prefix):
        cache.update(_as_autograd_tensor(keys), _as_autograd_tensor(values), layer)
    positions = torch.arange(n_prefix, n_prefix + input_ids.shape[1], device=input_ids.device)
    out = model(
        input_ids=_as_autograd_tensor(input_ids),
        cache=cache,
        position_ids=positions.unsqueeze(0),
        use_cache=True,
    )
    logits: torch.Tensor = out.logits[0].float() / canvas.temperature
    return logits


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    weights: torch.Tensor,
    lam: float = 0.0,
    reference_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weighted canvas loss (see the module docstring).

    Args:
        student_logits: ``[n, V]`` draft logits (full width; ``-inf`` outside a reduced draft
            vocabulary, over which the teacher is then renormalised).
        teacher_logits: ``[n, V]`` target logits (may hold ``-inf``), detached.
        weights: ``[n]`` ``w_i * m_i``.
        lam: regulariser weight.
        reference_logits: ``[n, V]`` original-draft logits, required when ``lam > 0``.

    Returns:
        The scalar loss (float32).
    """
    if student_logits.shape != teacher_logits.shape:
        raise InvalidArgumentError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits "
            f"{tuple(teacher_logits.shape)} must have the same shape"
        )
    log_q = torch.log_softmax(student_logits.float(), dim=-1)
    teacher, weights = restrict_to_support(teacher_logits.detach().float(), student_logits, weights)
    norm = weights.sum().clamp_min(1e-12)
    p = torch.softmax(teacher, dim=-1)
    # xlogy: rows with p_v = 0 (truncated teacher) contribute nothing instead of 0 * -inf.
    kl = (torch.xlogy(p, p) - _plogq(p, log_q)).sum(-1)
    loss = (weights * kl).sum() / norm
    if lam > 0:
        if reference_logits is None:
            raise InvalidArgumentError("reference_logits is required when lam > 0")
        log_r = torch.log_softmax(reference_logits.detach().float(), dim=-1)
        r = log_r.exp()
        kl_ref = (torch.xlogy(r, r) - _plogq(r, log_q)).sum(-1)
        loss = loss + lam * (weights * kl_ref).sum() / norm
    return loss


def restrict_to_support(
    teacher_logits: torch.Tensor, student_logits: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Restrict the teacher to the tokens the student can propose.

    A draft with a reduced vocabulary gives ``-inf`` logits outside it, so ``KL(p || q)`` over
    the full vocabulary would be infinite; the teacher is renormalised over the student's
    support instead. Rows whose teacher keeps nothing there get weight 0 (and finite logits).
    """
    support = torch.isfinite(student_logits.detach())
    if bool(support.all()):
        return teacher_logits, weights
    teacher = teacher_logits.masked_fill(~support, float("-inf"))
    usable = torch.isfinite(teacher).any(dim=-1)
    # Unusable rows get a uniform teacher over the support: a finite KL, then weight 0.
    teacher = teacher.masked_fill(~usable.unsqueeze(-1) & support, 0.0)
    return teacher, weights * usable.to(weights.dtype)


def _plogq(p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    # p * log q, with 0 where p = 0 (log q may be -inf there: outside a reduced vocabulary).
    return torch.where(p > 0, p * log_q, torch.zeros_like(p))


def make_optimizer(params: Iterable[nn.Parameter], config: DistillConfig) -> torch.optim.Adam:
    """The Adam optimiser of one request (its state lives as long as the request)."""
    return torch.optim.Adam(list(params), lr=config.lr, betas=config.betas, eps=config.eps)


def distill_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    canvas: Canvas,
    config: DistillConfig,
    reference: nn.Module | None = None,
) -> float:
    """One optimiser step of ``model`` on ``canvas``; returns the loss before the step.

    Args:
        model: the draft being trained (its frozen parameters have ``requires_grad=False``).
        optimizer: the optimiser over ``model``'s trainable parameters.
        canvas: the training example.
        config: hyper-parameters.
        reference: the original draft, needed when ``config.lam > 0``.
    """
    with torch.inference_mode(False), torch.enable_grad():
        reference_logits = None
        if config.lam > 0:
            if reference is None:
                raise InvalidArgumentError("reference model is required when lam > 0")
            with torch.no_grad():
                reference_logits = canvas_logits(reference, canvas)
        logits = canvas_logits(model, canvas)
        weights = row_weights(canvas, config)
        loss = distill_loss(logits, canvas.teacher_logits, weights, config.lam, reference_logits)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def trainable_parameter_names(
    model: Any,
    trainable: str | Sequence[str] = "all",
    shared_with: nn.Module | None = None,
) -> list[str]:
    """Names of the draft parameters that TTS may update.

    Args:
        model: the draft (a transformers ``PreTrainedModel``).
        trainable: ``"all"``, ``"no_embeddings"`` (input embeddings and LM head frozen) or a
            sequence of parameter-name prefixes.
        shared_with: the target; any draft parameter that shares storage with one of its
            tensors (embeddings / LM head tied to the target) is always frozen, since updating it
            would change the target and break losslessness.

    Raises:
        ValueError: if ``trainable`` is unknown or selects no parameter.
    """
    shared: set[int] = set()
    if shared_with is not None:
        shared = {t.untyped_storage().data_ptr() for t in shared_with.parameters()}
        shared |= {t.untyped_storage().data_ptr() for t in shared_with.buffers()}
    frozen_ids: set[int] = set()
    if trainable == "no_embeddings":
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            if module is not None:
                frozen_ids |= {id(p) for p in module.parameters()}
    elif isinstance(trainable, str) and trainable != "all":
        raise InvalidArgumentError(
            f"trainable must be 'all', 'no_embeddings' or a sequence of parameter-name prefixes, got {trainable!r}"
        )
    prefixes = None if isinstance(trainable, str) else tuple(trainable)
    names = []
    for name, param in model.named_parameters():
        if id(param) in frozen_ids or param.untyped_storage().data_ptr() in shared:
            continue
        if prefixes is not None and not name.startswith(prefixes):
            continue
        names.append(name)
    if not names:
        raise InvalidArgumentError(f"trainable={trainable!r} selects no trainable parameter of the draft")
    return names
