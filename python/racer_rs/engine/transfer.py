"""The step's single device-to-host copy: named device tensors packed into one buffer.

A decode step needs a few small results on the host (one prediction per node, validity flags,
top-k ids and probabilities). Each ``.cpu()`` is a synchronisation point on an accelerator, so the
step adds its tensors here and fetches them with one copy.
"""

from __future__ import annotations

import numpy as np
import torch


class HostTransfer:
    """Collects device tensors by name and copies them to the host at once.

    Integer tensors travel as int64; when any tensor is floating point, everything travels as
    float64, which holds every token id exactly.
    """

    def __init__(self) -> None:
        self._parts: dict[str, torch.Tensor] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue ``tensor`` for the copy under ``name``."""
        self._parts[name] = tensor

    def fetch(self) -> dict[str, np.ndarray]:
        """Copy every queued tensor in one transfer; integer parts come back as ``int64``,
        floating-point parts as ``float64``, each in its own shape."""
        if not self._parts:
            return {}
        wide = torch.float64 if any(t.is_floating_point() for t in self._parts.values()) else torch.int64
        flat = torch.cat([t.reshape(-1).to(wide) for t in self._parts.values()]).cpu().numpy()
        host: dict[str, np.ndarray] = {}
        offset = 0
        for name, tensor in self._parts.items():
            part = flat[offset : offset + tensor.numel()].reshape(tuple(tensor.shape))
            host[name] = part if tensor.is_floating_point() else part.astype(np.int64)
            offset += tensor.numel()
        return host
