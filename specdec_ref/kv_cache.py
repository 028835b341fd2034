"""KV caches are rolled back, never rebuilt: rejected draft positions are cut off the end."""
from __future__ import annotations

import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import DynamicLayer

# The attribute a model from ``fast.prepare`` carries: the positions its cache layers preallocate.
CAPACITY_ATTRIBUTE = "_specdec_kv_capacity"


def _filled(buffer_name: str) -> property:
    """The first ``length`` positions of a layer's buffer ``buffer_name``, as a view; written by update() only."""
    def view(layer: PreallocatedLayer) -> torch.Tensor | None:
        buffer = getattr(layer, buffer_name)
        return None if buffer is None else buffer[:, :, : layer.length]

    def refuse(layer: PreallocatedLayer, value) -> None:
        if value is not None:
            raise AttributeError(f"a PreallocatedLayer's {buffer_name} is written by update() only")
    return property(view, refuse)


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers allocated once, filled up to ``length``.

    A ``DynamicLayer`` concatenates every new token onto its tensors, copying the whole cache
    at each step, and a rollback leaves views of longer tensors. Here a step writes only its
    new positions and a rollback only lowers ``length``; ``keys`` and ``values`` are views of
    the first ``length`` positions, whose strides never change (what a compiled forward
    guards on). They are derived, not stored: a compiled graph must not receive a view and
    its buffer as two inputs. The buffers double, with one copy, if a sequence outgrows them.
    """

    keys = _filled("key_buffer")
    values = _filled("value_buffer")

    def __init__(self, capacity: int) -> None:
        self.capacity, self.length = capacity, 0
        self.key_buffer = self.value_buffer = None
        self.is_initialized = False

    def _allocate(self, like: torch.Tensor) -> torch.Tensor:
        # Positions past `length` are never read, so the buffers need no zeroing.
        return like.new_empty(*like.shape[:2], self.capacity, like.shape[-1])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.key_buffer, self.value_buffer = self._allocate(key_states), self._allocate(value_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        self.reserve(end)
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.length = end
        return self.keys, self.values

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` positions (doubling; one copy of the filled ones), so that
        a later update() of up to that length will not grow the buffers."""
        if needed <= self.capacity:
            return
        while self.capacity < needed:
            self.capacity *= 2
        if self.is_initialized:
            keys, values = self.keys, self.values
            self.key_buffer, self.value_buffer = self._allocate(keys), self._allocate(values)
            self.key_buffer[:, :, : self.length] = keys
            self.value_buffer[:, :, : self.length] = values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        # Negative: remove that many; positive: the length to keep (transformers' older meaning).
        keep = self.length + tokens_to_remove if tokens_to_remove <= 0 else min(self.length, tokens_to_remove)
        self.length = max(0, keep)

    def reset(self) -> None:
        self.length = 0


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty dynamic cache for ``model`` (layers are filled on the first forward).

    A model from ``specdec_ref.kernels.fast.prepare`` gets :class:`PreallocatedLayer` s for its
    full-attention layers: no per-step copy of the cache, and a rollback that costs nothing.
    """
    cache = DynamicCache(config=model.config)
    capacity = getattr(model, CAPACITY_ATTRIBUTE, 0)
    if capacity:
        cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                        for layer in cache.layers]
    return cache


def reserve(cache: Cache, new_positions: int) -> None:
    """Grow ``cache``'s preallocated layers now for ``new_positions`` more, and one spare: a
    compiled forward that grew a buffer inside its graph, or filled one exactly (which slices
    it whole), would compile another graph, in the middle of a run."""
    for layer in getattr(cache, "layers", ()):
        if isinstance(layer, PreallocatedLayer):
            layer.reserve(layer.length + new_positions + 1)


def rollback(cache: Cache, length: int) -> None:
    """Keep only the first ``length`` positions of ``cache`` (a no-op when it is not longer)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        # A negative argument means "remove this many" in every transformers 4.x/5.x release.
        cache.crop(-excess)


def keep_positions(cache: Cache, start: int, sources: list[int]) -> None:
    """Move the entries at ``sources`` (increasing, each at or after its destination) to
    ``start``, ``start + 1``, ...: the accepted branch of a tree of drafts made contiguous,
    so that a :func:`rollback` to ``start + len(sources)`` keeps exactly it."""
    if sources == list(range(start, start + len(sources))):
        return
    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, PreallocatedLayer):
            raise TypeError(f"tree drafts need full-attention cache layers; this cache has a {type(layer).__name__}")
        src = torch.tensor(sources, device=layer.keys.device)
        # advanced indexing reads a copy first, so an entry moved earlier is never read after it is overwritten
        layer.keys[:, :, start : start + len(sources)] = layer.keys[:, :, src]
        layer.values[:, :, start : start + len(sources)] = layer.values[:, :, src]
