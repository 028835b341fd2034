"""specdec_ref.kv_cache: the preallocated cache layers a fast model's loops use, against the dynamic ones."""
from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from factories import build, noisy_copy, prompt
from specdec_ref import autoregressive_generate, speculative_generate
from specdec_ref.kernels import fast
from specdec_ref.kv_cache import CAPACITY_ATTRIBUTE, PreallocatedLayer, new_cache, reserve, rollback
from specdec_ref.ngram import PromptLookupDrafter


def states(positions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, positions, 8, generator=generator) for _ in range(2))


def test_updates_and_crops_match_a_dynamic_layer():
    preallocated, dynamic = PreallocatedLayer(capacity=16), DynamicLayer()
    for step, (positions, remove) in enumerate([(5, 0), (3, -2), (1, 0), (4, -4), (2, -1)]):
        new_keys, new_values = states(positions, seed=step)
        got = preallocated.update(new_keys, new_values)
        want = dynamic.update(new_keys, new_values)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), step
        preallocated.crop(remove)
        dynamic.crop(remove)
        assert preallocated.get_seq_length() == dynamic.get_seq_length()
        assert torch.equal(preallocated.keys, dynamic.keys) and torch.equal(preallocated.values, dynamic.values)
        # A rollback changes the length, never the strides a compiled forward guards on.
        assert preallocated.keys.stride() == preallocated.key_buffer.stride()
    assert preallocated.key_buffer.shape[-2] == 16


def test_a_positive_crop_keeps_that_many_positions():
    layer = PreallocatedLayer(capacity=8)
    layer.update(*states(6, seed=0))
    layer.crop(4)
    assert layer.get_seq_length() == 4
    layer.crop(9)
    assert layer.get_seq_length() == 4


def test_outgrowing_the_buffers_doubles_them_and_keeps_the_contents():
    layer, dynamic = PreallocatedLayer(capacity=4), DynamicLayer()
    for step in range(3):
        new = states(3, seed=step)
        layer.update(*new)
        dynamic.update(*new)
    assert layer.capacity == 16 and layer.key_buffer.shape[-2] == 16
    assert torch.equal(layer.keys, dynamic.keys) and torch.equal(layer.values, dynamic.values)


def test_keys_are_written_by_update_only():
    layer = PreallocatedLayer(capacity=4)
    layer.update(*states(2, seed=0))
    with pytest.raises(AttributeError, match="update"):
        layer.keys = torch.zeros(1, 2, 2, 8)
    layer.reset()
    assert layer.get_seq_length() == 0 and layer.keys.shape[-2] == 0


def test_only_fast_models_get_preallocated_caches():
    model = build("llama", hidden=64, layers=2, seed=0, context=256)
    assert all(type(layer) is DynamicLayer for layer in new_cache(model).layers)
    quick = fast.prepare(model)
    layers = new_cache(quick).layers
    assert len(layers) == 2 and all(isinstance(layer, PreallocatedLayer) for layer in layers)
    assert {layer.capacity for layer in layers} == {fast.INITIAL_PREALLOCATED} == {fast.kv_cache_capacity(quick)}
    short = build("llama", hidden=64, layers=2, seed=0, context=64)  # a context shorter than that: all of it
    assert fast.kv_cache_capacity(fast.prepare(short)) == 64
    rollback(new_cache(quick), 0)  # an empty cache rolls back to nothing without error
    cache = new_cache(quick)
    reserve(cache, 300)  # before the first write: the buffers will be allocated that large
    assert all(layer.capacity == 512 for layer in cache.layers)
    quick(prompt(5, seed=0), past_key_values=cache, use_cache=True)
    reserve(cache, 507)  # 5 + 507 = 512 positions, and one spare
    assert all(layer.capacity == 1024 and layer.key_buffer.shape[-2] == 1024 for layer in cache.layers)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_loops_on_caches_that_outgrow_their_buffers_stay_exact(family):
    """Every loop on a fast model whose caches start at 8 positions and double three times
    during the generation (rollbacks across the doublings included) gives the eager tokens."""
    target = build(family, hidden=64, layers=2, seed=0)
    draft = noisy_copy(target, 0.05, seed=1)
    quick, quick_draft = fast.prepare(target), fast.prepare(draft)
    for model in (quick, quick_draft):
        setattr(model, CAPACITY_ATTRIBUTE, 8)
    ids = prompt(12, seed=3)
    expected = autoregressive_generate(target, ids, 40, eos_token_id=[]).sequences
    assert torch.equal(autoregressive_generate(quick, ids, 40, eos_token_id=[]).sequences, expected)
    runs = {name: speculative_generate(quick, drafter, ids, 40, 3, eos_token_id=[])
            for name, drafter in (("draft model", quick_draft), ("prompt lookup", PromptLookupDrafter()))}
    for name, out in runs.items():
        assert torch.equal(out.sequences, expected), name
    stats = runs["draft model"].stats
    assert stats.accepted_tokens > 0 and stats.rejections > 0  # both kinds of rollback ran


@pytest.mark.parametrize("layer_type", [DynamicLayer, PreallocatedLayer])
def test_keep_positions_moves_a_branch_up_and_a_rollback_keeps_it(layer_type):
    """After a tree verification the accepted branch's entries (here 5, 7 and 8, after 4 cached
    positions) are moved to 4, 5, 6, in both kinds of layer; earlier entries are untouched."""
    from transformers import DynamicCache

    from specdec_ref.kv_cache import keep_positions

    cache = DynamicCache()
    cache.layers = [layer_type(16) if layer_type is PreallocatedLayer else layer_type() for _ in range(2)]
    for index, layer in enumerate(cache.layers):
        layer.update(*states(10, seed=index))
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    keep_positions(cache, 4, [5, 7, 8])
    rollback(cache, 7)
    for (keys, values), layer in zip(before, cache.layers):
        assert torch.equal(layer.keys, keys[:, :, [0, 1, 2, 3, 5, 7, 8]])
        assert torch.equal(layer.values, values[:, :, [0, 1, 2, 3, 5, 7, 8]])
    keep_positions(cache, 7, [])  # nothing accepted: nothing moves
    assert cache.get_seq_length() == 7


def test_keep_positions_refuses_a_sliding_window_layer():
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from specdec_ref.kv_cache import keep_positions

    cache = DynamicCache()
    cache.layers = [DynamicSlidingWindowLayer(sliding_window=8)]
    cache.layers[0].update(*states(6, seed=0))
    with pytest.raises(TypeError, match="tree drafts need full-attention cache layers"):
        keep_positions(cache, 2, [3, 5])
