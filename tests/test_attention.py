"""specdec_ref.kernels.attention: the few-query attention kernel against PyTorch's, each query row
computed as if alone, and SmolLM2's fast path giving a verification pass what one-token steps give.

Speed is measured by ``python -m specdec_ref bench --fast``, never asserted here.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from factories import build
from specdec_ref import zoo
from specdec_ref.kernels import attention, build as kernel_build, fast
from specdec_ref.kv_cache import new_cache, rollback

needs_kernel = pytest.mark.skipif(not kernel_build.has_vector_units(kernel_build.cpu_flags()),
                                  reason="the kernel is AVX2 code; this CPU has no AVX2 with FMA")
pytestmark = needs_kernel


@pytest.fixture(scope="module", autouse=True)
def built():
    ok, reason = attention.available()
    assert ok, reason


def qkv(heads: int, kv_heads: int, rows: int, keys: int, size: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, rows, size, generator=generator),
            torch.randn(1, kv_heads, keys, size, generator=generator),
            torch.randn(1, kv_heads, keys, size, generator=generator))


def cached_causal(rows: int, keys: int) -> torch.Tensor:
    """[rows, keys] booleans: the last ``rows`` of ``keys`` positions, each reading itself and earlier."""
    return torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)


@pytest.mark.parametrize("heads,kv_heads,size", [(9, 3, 64), (4, 4, 32), (2, 1, 16)])
@pytest.mark.parametrize("rows,keys", [(1, 1), (1, 37), (3, 7), (8, 33), (16, 200)])
def test_matches_pytorch_attention_with_a_mask_of_either_kind_or_causal(heads, kv_heads, size, rows, keys):
    q, k, v = qkv(heads, kv_heads, rows, keys, size)
    scale = size ** -0.5
    reads = cached_causal(rows, keys)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=reads, scale=scale, enable_gqa=True).transpose(1, 2)
    added = torch.zeros(rows, keys).masked_fill(~reads, torch.finfo(torch.float32).min)
    outputs = {"causal": attention.few_query_attention(q, k, v, None, scale, rows > 1),
               "boolean mask": attention.few_query_attention(q, k, v, reads[None, None], scale, False),
               "additive mask": attention.few_query_attention(q, k, v, added[None, None], scale, False)}
    for name, out in outputs.items():
        assert out.shape == (1, rows, heads, size), name
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, msg=name)
    # The three ways of saying which keys a row reads give the same bits.
    assert torch.equal(outputs["causal"], outputs["boolean mask"])
    assert torch.equal(outputs["causal"], outputs["additive mask"])


@pytest.mark.parametrize("rows,keys", [(4, 9), (16, 61)])
def test_each_row_is_computed_as_if_it_were_alone(rows, keys):
    """A verification pass's row t gives, bit for bit, what a one-token step at its position gives:
    the same keys, read in the same order."""
    q, k, v = qkv(9, 3, rows, keys, 64, seed=1)
    together = attention.few_query_attention(q, k, v, None, 0.125, True)
    for row in range(rows):
        known = keys - rows + row + 1
        alone = attention.few_query_attention(q[:, :, row:row + 1], k[:, :, :known], v[:, :, :known], None, 0.125, False)
        assert torch.equal(together[:, row], alone[:, 0]), f"row {row} of {rows}"


def test_a_tree_mask_reads_only_ancestors_and_grouped_heads_in_place():
    """A tree's nodes read the cache, the last token and their own branch; keys read in place from
    a view of a longer buffer (a preallocated cache) give what a contiguous copy gives."""
    parents = [-1, -1, 0, 2]
    rows, cached = len(parents) + 1, 20
    from specdec_ref.speculative import tree_verification_inputs
    mask = tree_verification_inputs(parents, cached, torch.float32, torch.device("cpu"))["attention_mask"]
    q, k_buffer, v_buffer = qkv(9, 3, rows, cached + rows + 11, 64, seed=2)
    k, v = k_buffer[:, :, :cached + rows], v_buffer[:, :, :cached + rows]
    out = attention.few_query_attention(q, k, v, mask, 0.125, False)
    expected = F.scaled_dot_product_attention(q, k.contiguous(), v.contiguous(), attn_mask=mask, scale=0.125,
                                              enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # Node 1 (row 2) is a sibling of node 0: changing node 0's key and value leaves it alone.
    k2, v2 = k.clone(), v.clone()
    k2[:, :, cached + 1] += 5.0
    v2[:, :, cached + 1] -= 3.0
    moved = attention.few_query_attention(q, k2, v2, mask, 0.125, False)
    assert torch.equal(moved[:, 2], out[:, 2]) and not torch.equal(moved[:, 3], out[:, 3])


def test_a_row_that_reads_no_key_is_zero_and_bad_calls_say_what_is_wrong():
    q, k, v = qkv(2, 1, 2, 5, 16)
    reads = torch.ones(1, 1, 2, 5, dtype=torch.bool)
    reads[..., 1, :] = False
    out = attention.few_query_attention(q, k, v, reads, 0.25, False)
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1])) and bool(out[:, 0].abs().sum() > 0)
    with pytest.raises(RuntimeError, match="1 to 16 query rows"):
        attention.few_query_attention(*qkv(2, 1, 17, 20, 16), None, 0.25, True)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        attention.few_query_attention(*qkv(2, 1, 1, 4, 12), None, 0.25, False)
    with pytest.raises(RuntimeError, match="float32"):
        attention.few_query_attention(q.double(), k.double(), v.double(), None, 0.25, False)
    with pytest.raises(RuntimeError, match="a mask or causal"):
        attention.few_query_attention(q, k, v, reads, 0.25, True)
    # serves() keeps such calls on PyTorch's kernel in a model.
    assert not attention.serves(*qkv(2, 1, 17, 20, 16)[:2], None)
    assert not attention.serves(q.double(), k.double(), None)
    assert attention.serves(q, k, reads) and attention.serves(q, k, None)


def test_the_fast_path_uses_it_for_steps_and_passes_and_pytorch_for_a_prefill(monkeypatch):
    model = build("llama", 64, 2, seed=4)
    quick = fast.prepare(model)
    calls = []
    kernel = attention.few_query_attention
    monkeypatch.setattr(attention, "few_query_attention", lambda q, *rest: calls.append(q.shape[2]) or kernel(q, *rest))
    ids = torch.randint(0, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = new_cache(quick)
        quick(ids[:, :20], past_key_values=cache, use_cache=True)
        quick(ids[:, 20:21], past_key_values=cache, use_cache=True)
        quick(ids[:, 21:25], past_key_values=cache, use_cache=True)
    layers = model.config.num_hidden_layers
    assert calls == [1] * layers + [4] * layers  # the 20-token prefill stayed on PyTorch's kernel


@pytest.fixture(scope="module")
def smollm2():
    return zoo.load("zoo:smollm2")


def test_smollm2_fast_verification_pass_gives_each_position_its_one_token_step_bit_for_bit(smollm2):
    """With the GGUF-code kernel and this one, every row of a pass is computed as if alone: a
    verification pass's logits are exactly the one-token steps' logits, so greedy speculative
    decoding on the fast path is its own plain decoding by construction, not only up to ties."""
    model, tokenizer = smollm2
    quick = fast.prepare(model)
    ids = tokenizer("The river bank was quiet in the morning, and the boats", return_tensors="pt").input_ids
    start = ids.shape[1] - 5
    with torch.inference_mode():
        cache = new_cache(quick)
        quick(ids[:, :start], past_key_values=cache, use_cache=True)
        wide = quick(ids[:, start:], past_key_values=cache, use_cache=True).logits[0]
        rollback(cache, start)
        steps = [quick(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0, 0] for i in range(start, ids.shape[1])]
    for i, step in enumerate(steps):
        assert torch.equal(wide[i], step), f"position {i} of the pass"
