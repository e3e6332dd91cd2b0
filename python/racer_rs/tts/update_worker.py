"""The TTS update worker: optimiser steps off the decoding critical path, published at round boundaries.

The worker owns nothing model-specific: ``step(job)`` trains the shadow weights on one job and
``publish()`` copies the shadow weights into the serving draft. The protocol:

* ``submit(job)`` is called at an update boundary (every S rounds). It first waits for the
  previous job and publishes it (the barrier), then starts the new one: on a background thread
  (CPU) or a side CUDA stream driven from that thread (GPU) in async mode, or right away in the
  calling thread (and publishes it at once) in sync mode.
* Only one job is in flight, so the shadow weights are touched by one thread at a time and the
  serving weights only by the caller's thread: every submitted update is published exactly once,
  in order, and only between rounds.
* ``close()`` waits for the job in flight, publishes it unless told to discard it, and stops the
  thread; it is safe to call twice and after an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch

from racer_rs.errors import StateError

Job = TypeVar("Job")

THREAD_NAME_PREFIX = "racer-tts-update"


class UpdateWorker(Generic[Job]):
    """Runs ``step`` on jobs in the background and ``publish``es the result at the next boundary.

    Args:
        step: trains the shadow weights on one job; returns the loss (float).
        publish: copies the shadow weights into the serving weights (called in the caller's thread).
        asynchronous: background updates (default) or synchronous, deterministic ones.
        device: the device of the weights; on CUDA the step runs on a side stream.
    """

    def __init__(
        self,
        step: Callable[[Job], float],
        publish: Callable[[], None],
        *,
        asynchronous: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        self._step = step
        self._publish = publish
        self.asynchronous = bool(asynchronous)
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[tuple[float, float]] | None = None
        self._closed = False
        self.submitted = 0
        self.published = 0
        self.update_time = 0.0
        self.wait_time = 0.0
        self.publish_time = 0.0
        self.losses: list[float] = []

    @property
    def in_flight(self) -> bool:
        """Whether a submitted update has not been published yet."""
        return self._pending is not None

    def submit(self, job: Job) -> None:
        """Publish the update in flight (waiting for it if needed), then start one on ``job``."""
        if self._closed:
            raise StateError("UpdateWorker.submit called after close()")
        self._publish_pending()
        self.submitted += 1
        if not self.asynchronous:
            loss, seconds = self._run(job, None)
            self._record(loss, seconds)
            self._do_publish()
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME_PREFIX)
        ready = None
        if self._stream is not None:
            # The side stream must see the caller's latest writes (the job's tensors, the last publish).
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self._device))
        self._pending = self._executor.submit(self._run, job, ready)

    def close(self, *, discard: bool = False) -> None:
        """Stop the worker.

        Args:
            discard: drop the update in flight instead of publishing it (after an error).

        Raises:
            Exception: the error of the update in flight, unless ``discard``.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if discard:
                pending, self._pending = self._pending, None
                if pending is not None:
                    pending.exception()  # wait; the error, if any, is dropped on purpose
            else:
                self._publish_pending()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def stats(self) -> dict[str, Any]:
        """Counters and times (seconds) of the updates so far.

        ``wait_time`` is what the caller spent blocked at barriers, ``overlapped_time`` the update
        time that ran concurrently with decoding instead.
        """
        overlapped = max(0.0, self.update_time - self.wait_time) if self.asynchronous else 0.0
        return {
            "updates": self.published,
            "submitted": self.submitted,
            "update_time": self.update_time,
            "wait_time": self.wait_time if self.asynchronous else self.update_time,
            "publish_time": self.publish_time,
            "overlapped_time": overlapped,
            "mean_loss": sum(self.losses) / len(self.losses) if self.losses else float("nan"),
        }

    def _run(self, job: Job, ready: Any) -> tuple[float, float]:
        start = time.perf_counter()
        if self._stream is None:
            loss = self._step(job)
        else:
            with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
                self._stream.wait_event(ready)
                loss = self._step(job)
            # Block this thread, not the decoder, until the side stream is done: the job's tensors
            # stay referenced until then and the caller may publish right after the future resolves.
            self._stream.synchronize()
        return loss, time.perf_counter() - start

    def _record(self, loss: float, seconds: float) -> None:
        self.losses.append(loss)
        self.update_time += seconds

    def _publish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start = time.perf_counter()
        try:
            loss, seconds = pending.result()
        finally:
            self.wait_time += time.perf_counter() - start
        self._record(loss, seconds)
        self._do_publish()

    def _do_publish(self) -> None:
        start = time.perf_counter()
        with torch.no_grad():
            self._publish()
        self.publish_time += time.perf_counter() - start
        self.published += 1
