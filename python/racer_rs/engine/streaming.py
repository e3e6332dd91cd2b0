"""Streaming committed tokens to a user's streamer as each step commits them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from racer_rs.errors import InvalidTypeError


def is_streamer(value: Any) -> bool:
    """Whether ``value`` has the streamer interface: ``put()`` and ``end()`` methods."""
    return callable(getattr(value, "put", None)) and callable(getattr(value, "end", None))


class StreamAdapter:
    """Adapts a user streamer: ``put(tokens, drafted)`` objects or HF ``BaseStreamer``s."""

    def __init__(self, streamer: Any, prompt_ids: np.ndarray) -> None:
        if not is_streamer(streamer):
            raise InvalidTypeError("streamer must have put() and end() methods")
        self._target = streamer
        self._hf = _is_hf_streamer(streamer)
        if self._hf:
            # HF streamers expect the prompt first (TextStreamer(skip_prompt=True) drops it).
            streamer.put(torch.from_numpy(prompt_ids.astype(np.int64)).unsqueeze(0))

    def put(self, committed: np.ndarray) -> None:
        """Stream one step's tokens; the first is the target's own, the rest were drafted."""
        if self._hf:
            self._target.put(torch.from_numpy(committed.astype(np.int64)))
            return
        drafted = [True] * len(committed)
        drafted[0] = False
        self._target.put(committed.tolist(), drafted)

    def end(self) -> None:
        """Tell the streamer the request is over."""
        self._target.end()


def _is_hf_streamer(streamer: Any) -> bool:
    try:
        from transformers.generation.streamers import BaseStreamer
    except ImportError:  # pragma: no cover - very old transformers
        return False
    return isinstance(streamer, BaseStreamer)
