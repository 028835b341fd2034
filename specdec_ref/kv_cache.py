"""KV caches are rolled back, never rebuilt: rejected draft positions are cut off the end."""
from __future__ import annotations

import torch
from transformers import Cache, DynamicCache


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty dynamic cache for ``model`` (layers are filled on the first forward)."""
    return DynamicCache(config=model.config)


def rollback(cache: Cache, length: int) -> None:
    """Keep only the first ``length`` positions of ``cache`` (a no-op when it is not longer)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        # A negative argument means "remove this many" in every transformers 4.x/5.x release.
        cache.crop(-excess)
