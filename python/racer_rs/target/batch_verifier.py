"""Batched tree verification: every live request's draft tree scored in ONE target forward.

The KV cache holds ragged rows. Every layer keeps ``[B, H, P, D]`` keys and values, ``P`` (the
*physical* length) being the longest row's committed length; row ``b``'s committed tokens fill
columns ``0 .. lengths[b] - 1`` (its positions ``0 .. lengths[b] - 1``, left-aligned), and the
columns ``lengths[b] .. P - 1`` are *holes*: a shorter prompt's tail, or rows a finished tree
left behind. Holes hold finite values (zeros or stale keys) and are never attended: the additive
mask blocks them.

A step appends ``n_max`` columns, ``n_max`` being the step's largest tree: row ``b``'s ``n_b``
nodes at columns ``P .. P + n_b - 1``, then ``n_max - n_b`` padding nodes (the root's token again).
Node ``i`` of row ``b`` sits at position ``lengths[b] + depth(i)`` and attends to the row's valid
prefix and to its own ancestors (and itself), through a 4D additive mask
``[B, 1, n_max, P + n_max]``; a padding node attends only to itself, and nothing attends to it.

After acceptance, each row's accepted nodes' K/V rows are gathered to the row's own offset
(columns ``lengths[b] ..``), rows that finished are dropped from the batch dimension, and the
cache is cropped to the new longest row: rows accept different lengths and never wait for each
other. The holes a short row carries cost attention work (masked columns are still computed), at
most the spread of the rows' lengths.

Prompts are prefilled one by one (:meth:`racer_rs.target.verifier.TreeVerifier.prefill`, exactly
what :func:`racer_rs.generate` computes, the drafters' prompt top-k included) and their caches
copied into the batch as new rows, at the start or between any two forwards (requests join a
running batch as others leave it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from racer_rs._native import DraftTree
from racer_rs.target.attention import (
    FlatLayout,
    FlatLayoutUnsupported,
    current_flat_layout,
    flat_layout,
    gqa_attention,
)
from racer_rs.target.verifier import GrowableLayer, PrefillOutput, TreeVerifier, check_model


class BatchLayer(GrowableLayer):
    """A :class:`GrowableLayer` whose batch rows can be added or dropped.

    Its buffers hold spare rows as well as spare columns (both grown geometrically), and
    ``keys``/``values`` are views of the live rows' committed columns: a request joining the
    batch writes its own row, rows leave by moving only the rows whose place changes
    (:meth:`select_rows`), and neither copies the whole cache (at 16 rows that copy cost tens
    of milliseconds per admission).
    """

    rows = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a forward's keys and values: padded ``[B, H, n, D]`` as one block of columns, or
        flat ``[1, H, K, D]`` (inside :func:`racer_rs.target.attention.flat_layout`) each node
        into its row's tree column; a row's columns past its own tree keep what they held (finite,
        and masked)."""
        layout = current_flat_layout()
        if layout is None:
            return super().update(key_states, value_states, *args, **kwargs)
        start = self.get_seq_length()
        self.reserve(start + layout.width)
        columns = layout.nodes + start
        self._key_buffer[layout.rows, :, columns] = key_states[0].transpose(0, 1)
        self._value_buffer[layout.rows, :, columns] = value_states[0].transpose(0, 1)
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, rows: int) -> None:
        """Start from an empty batch shaped like ``keys``/``values`` ``[1, H, L, D]`` with room
        for ``rows`` rows (the rows are added by :meth:`append_rows`)."""
        self.lazy_initialization(keys, values)
        self._key_buffer = keys.new_zeros((rows, keys.shape[1], 0, keys.shape[3]))
        self._value_buffer = values.new_zeros((rows, values.shape[1], 0, values.shape[3]))
        self.rows = 0
        self._view(0)

    def _view(self, columns: int) -> None:
        """Point ``keys``/``values`` at the live rows' first ``columns`` columns."""
        self.keys = self._key_buffer[: self.rows, :, :columns]
        self.values = self._value_buffer[: self.rows, :, :columns]

    def clear(self) -> None:
        """Drop every row, keeping the buffers for the rows added next."""
        self.rows = 0
        self._view(0)

    @staticmethod
    def _grown(buffer: torch.Tensor, used: int, needed: int) -> torch.Tensor:
        # Zeros, not garbage: a spare row's columns become a new row's holes.
        grown = buffer.new_zeros((*buffer.shape[:-2], max(2 * needed, 256), buffer.shape[-1]))
        grown[..., :used, :] = buffer[..., :used, :]
        return grown

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` columns (zeros where nothing was written)."""
        used = self.get_seq_length()
        if columns > self._key_buffer.shape[-2]:
            self._key_buffer = self._grown(self._key_buffer, used, columns)
            self._value_buffer = self._grown(self._value_buffer, used, columns)
        self._view(max(used, columns))

    def _reserve_rows(self, rows: int) -> None:
        if rows > self._key_buffer.shape[0]:
            spare = max(2 * rows, 4)
            for name in ("_key_buffer", "_value_buffer"):
                buffer = getattr(self, name)
                grown = buffer.new_zeros((spare, *buffer.shape[1:]))
                grown[: self.rows] = buffer[: self.rows]
                setattr(self, name, grown)

    def append_rows(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """Add one row per ``[1, H, L, D]`` cache after the existing rows (between forwards: the
        layer holds committed columns only); the physical length grows to the longest row."""
        used = self.get_seq_length()
        width = max(used, *(k.shape[-2] for k in keys))
        self.reserve(width)
        first = self.rows
        self._reserve_rows(first + len(keys))
        self.rows = first + len(keys)
        for row, (k, v) in enumerate(zip(keys, values, strict=True), start=first):
            length = k.shape[-2]
            self._key_buffer[row, :, :length] = k[0]
            self._value_buffer[row, :, :length] = v[0]
            # A reused row's columns past the prompt hold an earlier request's keys: holes
            # must be finite (they are masked), and zeros are.
            self._key_buffer[row, :, length:width] = 0
            self._value_buffer[row, :, length:width] = 0
        self._view(width)

    @torch.inference_mode()
    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows ``index`` (in that order): only the rows whose place changes are
        copied, in place (a repeated row too, the buffer growing for it)."""
        end = self.get_seq_length()
        keep = index.tolist()
        self._reserve_rows(len(keep))
        moved = [place for place, row in enumerate(keep) if row != place]
        if moved:
            target = torch.as_tensor(moved, dtype=torch.long, device=index.device)
            source = index[target]
            self._key_buffer[target, :, :end] = self._key_buffer[source, :, :end]
            self._value_buffer[target, :, :end] = self._value_buffer[source, :, :end]
        self.rows = len(keep)
        self._view(end)


class BatchVerifier:
    """Owns a batch's ragged KV cache and scores every row's draft tree in one forward.

    Attributes:
        model: the target.
        device: where its parameters live; ``dtype`` their dtype (the mask's too).
        lengths: ``int64[B]`` committed tokens of every live row (its valid prefix).
        cache: the batch's KV cache (``None`` before :meth:`prefill`).
        model_seconds: wall time inside the target's forward calls of decode steps.
        padded_tokens: tree tokens of the steps' padded layout (``B x n_max`` per step).
        tree_tokens: real tree nodes among them (what a flat forward processes).
        flat: trees of different sizes are verified flat (``flat_forwards`` and SDPA attention;
            turned off for good if the model's attention turns out not to support it).
        last_flat: the last :meth:`forward_trees` ran flat.
    """

    def __init__(self, model: PreTrainedModel, flat_forwards: bool = True) -> None:
        check_model(model)
        self.model = model
        parameter = next(model.parameters())
        self.device = parameter.device
        self.dtype = parameter.dtype
        self._mask_min = torch.finfo(self.dtype).min
        self.lengths = np.zeros(0, dtype=np.int64)
        self.cache: DynamicCache | None = None
        self.model_seconds = 0.0
        self.padded_tokens = 0
        self.tree_tokens = 0
        # Flat forwards need this module's attention (SDPA switched by gqa_attention).
        self.flat = flat_forwards and getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.last_flat = False

    @property
    def batch(self) -> int:
        """Number of live rows."""
        return len(self.lengths)

    @property
    def physical(self) -> int:
        """Committed columns of the cache: the longest live row's length."""
        return int(self.lengths.max()) if len(self.lengths) else 0

    def _layers(self) -> list[BatchLayer]:
        assert self.cache is not None, "prefill() must be called first"
        layers = self.cache.layers
        assert all(isinstance(layer, BatchLayer) for layer in layers)
        return layers  # type: ignore[return-value]  # checked just above

    @torch.inference_mode()
    def prefill(
        self,
        prompts: Sequence[np.ndarray],
        topk: int = 0,
        probs_temperature: float | None = None,
        timings: list[float] | None = None,
    ) -> list[PrefillOutput]:
        """Start a new batch of ``prompts`` (see :meth:`add_rows`)."""
        self.cache = None
        self.lengths = np.zeros(0, dtype=np.int64)
        return self.add_rows(prompts, topk, probs_temperature, timings)

    @torch.inference_mode()
    def add_rows(
        self,
        prompts: Sequence[np.ndarray],
        topk: int = 0,
        probs_temperature: float | None = None,
        timings: list[float] | None = None,
    ) -> list[PrefillOutput]:
        """Run every prompt through the target (one by one, as :func:`racer_rs.generate` does)
        and add their caches as new rows after the live ones (between forwards).

        Args:
            prompts: ``int32[L_b]`` prompts, ``L_b >= 1``.
            topk: top ids per prompt position for the drafters (see ``TreeVerifier.prefill``).
            probs_temperature: also return the top-k ids' probabilities under this temperature.
            timings: if given, receives every prompt's prefill seconds.

        Returns:
            Every prompt's :class:`PrefillOutput`, in order.
        """
        single = TreeVerifier(self.model)
        outputs = []
        caches: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        for prompt in prompts:
            started = time.perf_counter()
            outputs.append(single.prefill(prompt, topk=topk, probs_temperature=probs_temperature))
            layers = []
            for layer in single.cache.layers:
                assert isinstance(layer, GrowableLayer) and layer.keys is not None and layer.values is not None
                layers.append((layer.keys, layer.values))
            caches.append(layers)
            if timings is not None:
                timings.append(time.perf_counter() - started)
        if not caches:
            return outputs
        if self.cache is None:
            batch_layers: list[BatchLayer] = []
            for keys, values in caches[0]:
                layer = BatchLayer()  # type: ignore[no-untyped-call]  # transformers' __init__
                layer.adopt(keys, values, 0)
                batch_layers.append(layer)
            cache = DynamicCache(config=self.model.config)
            cache.layers = list(batch_layers)
            self.cache = cache
        for index, layer in enumerate(self._layers()):
            layer.append_rows([c[index][0] for c in caches], [c[index][1] for c in caches])
        self.lengths = np.concatenate([self.lengths, np.asarray([len(p) for p in prompts], dtype=np.int64)])
        return outputs

    def tree_mask(self, ancestors: np.ndarray) -> torch.Tensor:
        """The additive 4D mask ``[B, 1, n, P + n]``: 0 where attention is allowed.

        Row ``b`` may attend to its valid prefix (columns ``0 .. lengths[b] - 1``) and, inside
        the tree block, where ``ancestors[b]`` allows.

        Args:
            ancestors: ``bool[B, n, n]``, ``[b, i, j]`` true iff node ``j`` of row ``b`` is node
                ``i`` or one of its ancestors (a padding node: itself only).
        """
        batch, n = ancestors.shape[:2]
        physical = self.physical
        mask = torch.zeros((batch, 1, n, physical + n), dtype=self.dtype, device=self.device)
        if physical and int(self.lengths.min()) < physical:  # holes: shorter rows' columns past their end
            columns = torch.arange(physical, device=self.device)
            lengths = torch.from_numpy(self.lengths).to(self.device)
            holes = columns.unsqueeze(0) >= lengths.unsqueeze(1)  # [B, P]
            mask[:, 0, :, :physical].masked_fill_(holes.unsqueeze(1), self._mask_min)
        blocked = torch.from_numpy(~ancestors).to(self.device)
        mask[:, 0, :, physical:].masked_fill_(blocked, self._mask_min)
        return mask

    def tree_inputs(self, trees: Sequence[DraftTree], flat: bool = False) -> dict[str, Any]:
        """The forward's inputs for one tree per live row: padded to the largest tree (``[B,
        n_max]``), or ``flat`` (``[1, K]``, the rows' nodes one after another, with the
        :class:`FlatLayout` under ``"layout"``); the 4D mask is the padded layout's in both."""
        batch = len(trees)
        if batch != self.batch:
            raise ValueError(f"expected one tree per live row ({self.batch}), got {batch}")
        sizes = np.fromiter((len(tree) for tree in trees), dtype=np.int64, count=batch)
        n_max = int(sizes.max())
        ids = np.empty((batch, n_max), dtype=np.int64)
        positions = np.empty((batch, n_max), dtype=np.int64)
        ancestors = np.zeros((batch, n_max, n_max), dtype=bool)
        padding = np.arange(n_max)
        for row, tree in enumerate(trees):
            n = len(tree)
            ids[row, :n] = tree.tokens
            ids[row, n:] = tree.tokens[0]  # a padding node: any valid token, attended by nobody
            positions[row, :n] = tree.depths.astype(np.int64) + self.lengths[row]
            positions[row, n:] = self.lengths[row]
            ancestors[row, :n, :n] = tree.attention_mask() if n > 1 else True
            ancestors[row, padding[n:], padding[n:]] = True
        if flat:
            real = padding[None, :] < sizes[:, None]  # [B, n_max], row-major: rows one after another
            rows, nodes = np.nonzero(real)
            return {
                "input_ids": torch.from_numpy(ids[real][None]).to(self.device),
                "position_ids": torch.from_numpy(positions[real][None]).to(self.device),
                "attention_mask": self.tree_mask(ancestors),
                "layout": FlatLayout(
                    torch.from_numpy(rows).to(self.device), torch.from_numpy(nodes).to(self.device), batch, n_max
                ),
            }
        input_ids = torch.from_numpy(ids).to(self.device)
        if batch == 1 and n_max == 1:
            # A lone root of a lone row is plain decoding (no holes at batch 1): as TreeVerifier.
            return {"input_ids": input_ids}
        return {
            "input_ids": input_ids,
            "position_ids": torch.from_numpy(positions).to(self.device),
            "attention_mask": self.tree_mask(ancestors),
        }

    @torch.inference_mode()
    def forward_trees(self, trees: Sequence[DraftTree], flat: bool = True) -> torch.Tensor:
        """Score every live row's tree in one forward pass.

        Trees of different sizes run flat (:attr:`flat`, see
        :mod:`racer_rs.target.attention`) unless ``flat`` is false: the forward computes the real
        nodes only; trees of one size (a plain step, one row) run padded, which is then the same
        forward. :attr:`last_flat` says which one ran. Appends ``n_max`` columns to the cache
        (they stay until :meth:`commit`).

        Args:
            trees: one tree per live row, in row order.
            flat: whether trees of different sizes may run flat (``False``: padded to the
                largest tree, as a caller that priced the step padded wants).

        Returns:
            ``[K, V]`` raw logits of the ``K`` nodes, the rows' trees one after another: row
            ``b``'s node ``i`` at ``offsets[b] + i`` (``offsets`` the trees' cumulative sizes,
            :func:`tree_offsets`); each predicts the token after its node.
        """
        sizes = [len(tree) for tree in trees]
        self.tree_tokens += sum(sizes)
        self.padded_tokens += len(sizes) * max(sizes)
        uniform = len(set(sizes)) == 1
        self.last_flat = self.flat and flat and not uniform
        if self.last_flat:
            try:
                return self._forward(trees, flat=True)
            except FlatLayoutUnsupported:
                # Some layer's attention is not one this layout covers: this model verifies
                # padded from now on. The layers before it hold the flat step's columns.
                for layer in self._layers():
                    if layer.get_seq_length() > self.physical:
                        layer.crop(self.physical - layer.get_seq_length())
                self.flat = self.last_flat = False
        logits = self._forward(trees, flat=False)
        if uniform:
            return logits.reshape(-1, logits.shape[-1])
        real = torch.from_numpy(np.arange(logits.shape[1])[None, :] < np.asarray(sizes)[:, None]).to(logits.device)
        return logits[real]

    def _forward(self, trees: Sequence[DraftTree], flat: bool) -> torch.Tensor:
        inputs = self.tree_inputs(trees, flat=flat)
        layout = inputs.pop("layout", None)
        start = time.perf_counter()
        with gqa_attention(self.model), flat_layout(layout) if layout is not None else contextlib.nullcontext():
            logits: torch.Tensor = self.model(**inputs, cache=self.cache, use_cache=True).logits
        self.model_seconds += time.perf_counter() - start
        if layout is not None:
            if layout.calls != len(self._layers()):
                # A layer attended without the flat layout: its output is not this step's.
                raise FlatLayoutUnsupported(f"{layout.calls} flat attention calls for {len(self._layers())} layers")
            return logits[0]
        return logits

    @torch.inference_mode()
    def commit(self, paths: Sequence[np.ndarray | None]) -> None:
        """Keep every continuing row's accepted nodes after its prefix; drop finished rows.

        Args:
            paths: per live row, its accepted node indices (ascending, root first), or ``None``
                for a row that finished (it leaves the batch).
        """
        if len(paths) != self.batch:
            raise ValueError(f"expected one path per live row ({self.batch}), got {len(paths)}")
        physical = self.physical
        keep = [row for row, path in enumerate(paths) if path is not None]
        self._select(keep)
        if not keep:
            return
        accepted = [np.asarray(paths[row], dtype=np.int64) for row in keep]
        moves = [
            (row, path)
            for row, path in enumerate(accepted)
            if not (self.lengths[row] == physical and int(path[-1]) == len(path) - 1)
        ]
        if moves:
            width = max(len(path) for _, path in moves)
            rows = np.empty((len(moves), width), dtype=np.int64)
            source = np.empty_like(rows)
            target = np.empty_like(rows)
            for index, (row, path) in enumerate(moves):
                # Shorter paths repeat their last move: the same value written twice.
                padded = np.pad(path, (0, width - len(path)), mode="edge")
                steps = np.minimum(np.arange(width), len(path) - 1)
                rows[index] = row
                source[index] = physical + padded
                target[index] = self.lengths[row] + steps
            index_rows, index_source, index_target = (
                torch.from_numpy(a).to(self.device) for a in (rows, source, target)
            )
            for layer in self._layers():
                assert layer.keys is not None and layer.values is not None
                layer.keys[index_rows, :, index_target] = layer.keys[index_rows, :, index_source]
                layer.values[index_rows, :, index_target] = layer.values[index_rows, :, index_source]
        self.lengths = self.lengths + np.asarray([len(path) for path in accepted], dtype=np.int64)
        self.discard_uncommitted()

    def keep_rows(self, keep: Sequence[int]) -> None:
        """Drop every row not in ``keep`` (between forwards: nothing uncommitted in the cache)."""
        self._select(list(keep))
        if len(keep):
            self.discard_uncommitted()

    def _select(self, keep: list[int]) -> None:
        if len(keep) == self.batch:
            return
        self.lengths = self.lengths[keep]
        if not keep:
            # The buffers stay for the next rows: at one live row every admission would
            # otherwise allocate (and fault in) a new cache, 0.1 s a request on SmolLM2.
            for layer in self._layers():
                layer.clear()
            return
        index = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        for layer in self._layers():
            layer.select_rows(index)

    def discard_uncommitted(self) -> None:
        """Crop the cache to the longest row (drops uncommitted tree columns)."""
        assert self.cache is not None
        surplus = self.cache.get_seq_length() - self.physical
        if surplus > 0:
            self.cache.crop(-surplus)


def tree_offsets(sizes: Sequence[int]) -> np.ndarray:
    """Where each tree's nodes start in :meth:`BatchVerifier.forward_trees`'s flat logits."""
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))[:-1]]).astype(np.int64)
