"""specdec_ref.kernels.gguf: codes recovered exactly or not at all, the layout, the kernel against
PyTorch's, and zoo:smollm2 (de-quantised from Q4_1 and Q8_0) on it, with its EAGLE head.

Speed is measured by ``python -m specdec_ref bench --fast``, never asserted here.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

from factories import assert_passes_on_the_avx2_build, build
from specdec_ref import autoregressive_generate, speculative_generate, zoo
from specdec_ref.kernels import bf16 as bf16_weights, build as kernel_build, fast, gguf as gguf_weights
from specdec_ref.eagle import EagleDrafter
from specdec_ref.kv_cache import new_cache
from specdec_ref.roofline import streamed_weight_bytes, weight_bytes
from test_bf16_weights import rounding_bound

VECTOR_UNITS = kernel_build.has_vector_units(kernel_build.cpu_flags())
needs_kernel = pytest.mark.skipif(not VECTOR_UNITS, reason="the kernel is AVX2 code; this CPU has no AVX2 with FMA")


def coded(bits: int, out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 weight de-quantised as gguf does it ((d * q) + m with float16 d and m), and its codes."""
    generator = torch.Generator().manual_seed(seed)
    groups = (out_features, in_features // 32)
    scale = (torch.rand(groups, generator=generator) * 0.01 + 1e-4).half().float()
    if bits == 4:
        codes = torch.randint(0, 16, (out_features, in_features), generator=generator)
        codes.view(*groups, 32)[..., 0], codes.view(*groups, 32)[..., 1] = 0, 15  # quantising puts min at 0, max at 15
        offset = (torch.randn(groups, generator=generator) * 0.05).half().float()
    else:
        codes = torch.randint(-127, 128, (out_features, in_features), generator=generator)
        codes.view(*groups, 32)[..., 0] = 127  # the largest magnitude is coded as 127
        offset = torch.zeros(groups)
    weight = scale.repeat_interleave(32, 1) * codes.float() + offset.repeat_interleave(32, 1)
    return weight, codes


@pytest.mark.parametrize("bits", [4, 8])
def test_block_code_recovers_the_code_a_weight_was_dequantised_from(bits):
    weight, codes = coded(bits, 8, 64)
    code = gguf_weights.block_code(weight)
    assert code is not None and code.bits == bits
    assert torch.equal(code.codes.long(), codes)
    rebuilt = code.scale.repeat_interleave(32, 1) * code.codes.float() + code.offset.repeat_interleave(32, 1)
    assert torch.equal(rebuilt, weight)


def test_block_code_refuses_what_no_code_rebuilds_exactly():
    generator = torch.Generator().manual_seed(0)
    assert gguf_weights.block_code(torch.randn(8, 64, generator=generator)) is None
    assert gguf_weights.block_code(torch.randn(8, 64, generator=generator).to(torch.bfloat16).float()) is None
    weight, _ = coded(4, 8, 64)
    nudged = weight.clone()
    nudged[3, 17] = torch.nextafter(nudged[3, 17], torch.tensor(1.0))  # one weight off by one ulp
    assert gguf_weights.block_code(nudged) is None
    assert gguf_weights.block_code(weight.double()) is None
    assert gguf_weights.block_code(weight[:, :48]) is None and gguf_weights.block_code(weight[:6]) is None
    broken = weight.clone()
    broken[0, 0] = float("nan")
    assert gguf_weights.block_code(broken) is None


def test_pack_layout():
    """Block b, group g: its 4 rows' (scale, offset) floats, then each row's codes for the group;
    at 4 bits byte j of row r holds columns c = NIBBLE_ORDER[j] (low half) and c + 16 (high half)."""
    assert sorted(gguf_weights.NIBBLE_ORDER) == list(range(16))
    weight, codes = coded(4, 8, 64)
    code = gguf_weights.block_code(weight)
    packed = gguf_weights.pack(code)
    group_bytes = 32 + 64
    assert packed.dtype == torch.uint8 and packed.numel() == 2 * 2 * group_bytes
    for b in range(2):
        for g in range(2):
            start = (b * 2 + g) * group_bytes
            scales = packed[start:start + 32].view(torch.float32).view(4, 2)
            assert torch.equal(scales[:, 0], code.scale[4 * b:4 * b + 4, g])
            assert torch.equal(scales[:, 1], code.offset[4 * b:4 * b + 4, g])
            for r in range(4):
                row = packed[start + 32 + r * 16:][:16].long()
                columns = codes[4 * b + r, 32 * g:][:32]
                order = torch.tensor(gguf_weights.NIBBLE_ORDER)
                assert torch.equal(row & 15, columns[order]) and torch.equal(row >> 4, columns[order + 16])
    weight8, codes8 = coded(8, 4, 32)
    code8 = gguf_weights.block_code(weight8)
    packed8 = gguf_weights.pack(code8)  # a Q8_0 group: its 4 rows' scales, no offsets (they are 0), then codes
    assert packed8.numel() == 16 + 4 * 32 and torch.equal(packed8[:16].view(torch.float32), code8.scale[:, 0])
    assert torch.equal(packed8[16 + 32:16 + 64].view(torch.int8).long(), codes8[1, :32])  # row 1
    with pytest.raises(ValueError, match="no offset"):
        gguf_weights.pack(gguf_weights.BlockCode(8, code8.codes, code8.scale, code8.scale))


KERNEL_CASES = [(4, 4, 32), (4, 64, 96), (4, 1536, 576), (4, 576, 1536), (8, 4, 32), (8, 1024, 576)]


@needs_kernel
@pytest.mark.parametrize("bits, out_features, in_features", KERNEL_CASES)
def test_kernel_matches_fp32_linear_and_each_token_is_computed_as_alone(bits, out_features, in_features):
    assert_kernel_matches_fp32_linear(bits, out_features, in_features)


def assert_kernel_matches_fp32_linear(bits: int, out_features: int, in_features: int) -> None:
    """Every row count the kernel serves, and longer passes (PyTorch's kernel): within fp32
    rounding of PyTorch's linear; and row i of a pass bit for bit what a one-row pass gives it."""
    assert gguf_weights.available()[0]
    weight, _ = coded(bits, out_features, in_features)
    layer = gguf_weights.GgufWeightLinear.from_layer(torch.nn.Linear(in_features, out_features, bias=False))
    assert layer is None  # random fp32 weights are no code
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = weight
    layer = gguf_weights.GgufWeightLinear.from_layer(linear)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for rows in (*range(1, gguf_weights.MAX_ROWS + 1), gguf_weights.MAX_ROWS + 1, 40):
            x = torch.randn(1, rows, in_features, generator=generator)
            got, want = layer(x), linear(x)
            assert got.shape == want.shape == (1, rows, out_features)
            assert bool(((got - want).abs() <= rounding_bound(x, weight)).all()), rows
            if rows <= gguf_weights.MAX_ROWS:
                alone = torch.cat([layer(x[:, i:i + 1]) for i in range(rows)], 1)
                assert torch.equal(got, alone), rows


@needs_kernel
def test_the_avx2_variant_matches_fp32_linear_too():
    assert_passes_on_the_avx2_build("import test_gguf_weights as t\n"
                                    "ok, reason = t.gguf_weights.available(); print(reason); assert ok\n"
                                    "for case in t.KERNEL_CASES: t.assert_kernel_matches_fp32_linear(*case)\n",
                                    "GGUF-code kernel")


@needs_kernel
def test_a_layer_keeps_its_parameters_and_adds_its_bias():
    weight, _ = coded(4, 64, 96)
    linear = torch.nn.Linear(96, 64)
    linear.weight.data = weight
    layer = gguf_weights.GgufWeightLinear.from_layer(linear)
    x = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(layer(x), linear(x), atol=1e-5)
    assert layer.weight is linear.weight and layer.bias is linear.bias and "packed" not in layer.state_dict()
    assert "code=Q4_1" in repr(layer)


def coded_layer(bits: int, out_features: int, in_features: int, seed: int) -> gguf_weights.GgufWeightLinear:
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = coded(bits, out_features, in_features, seed)[0]
    return gguf_weights.GgufWeightLinear.from_layer(linear)


@needs_kernel
def test_stacked_layers_give_each_layer_its_own_output_in_one_call():
    layers = [coded_layer(4, rows, 96, seed) for seed, rows in enumerate((64, 32, 32))]
    alone = [layer.packed.clone() for layer in layers]
    stacked = gguf_weights.StackedCodes(layers)
    # Each layer now reads its part of the one stream, unchanged.
    assert all(torch.equal(layer.packed, copy) for layer, copy in zip(layers, alone))
    assert layers[1].packed.data_ptr() == stacked.packed.data_ptr() + alone[0].numel()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for rows in (1, 3, gguf_weights.MAX_ROWS, gguf_weights.MAX_ROWS + 1, 40):  # the last two: PyTorch's kernel
            x = torch.randn(1, rows, 96, generator=generator)
            outputs = stacked(x)
            assert [tuple(out.shape) for out in outputs] == [(1, rows, 64), (1, rows, 32), (1, rows, 32)]
            assert all(torch.equal(out, layer(x)) for out, layer in zip(outputs, layers)), rows
    with pytest.raises(ValueError, match="one code"):
        gguf_weights.StackedCodes([coded_layer(4, 32, 96, 0), coded_layer(8, 32, 96, 1)])
    # The operator serves passes up to MAX_ROWS rows; the layers give longer ones to PyTorch's kernel.
    with pytest.raises(RuntimeError, match="1 to 16 input rows"):
        torch.ops.specdec.gguf_weights_linear(torch.randn(gguf_weights.MAX_ROWS + 1, 96), stacked.packed, 128, 4)
    with pytest.raises(RuntimeError, match="a packed weight of a shape the kernel covers"):
        torch.ops.specdec.gguf_weights_linear(torch.randn(2, 96), stacked.packed, 96, 4)


@pytest.fixture(scope="module")
def smollm2():
    target, tokenizer = zoo.load("zoo:smollm2")
    return target, tokenizer, fast.prepare(target)


@needs_kernel
def test_prepare_reads_smollm2_as_its_gguf_codes(smollm2):
    target, _, quick = smollm2
    assert fast.path_name(quick) == ("Q4_1-coded weights (210 of 211 linear layers) + "
                                     "Q8_0-coded weights (1 of 211 linear layers) + a pass of a few tokens in one C++ call")
    layers = [m for m in quick.modules() if isinstance(m, gguf_weights.GgufWeightLinear)]
    assert all(a is b for a, b in zip(quick.parameters(), target.parameters()))
    fp32_bytes = sum(m.weight.numel() * 4 for m in layers)
    # per 32 weights: the codes (4 or 8 bits each) and float32 (scale, offset) at 4 bits, the scale alone at 8
    assert all(m.packed.numel() == m.weight.numel() // 32 * (4 * m.bits + 4 * (2 if m.bits == 4 else 1)) for m in layers)
    assert streamed_weight_bytes(quick) == weight_bytes(target) - fp32_bytes + sum(m.packed.numel() for m in layers)
    assert streamed_weight_bytes(quick) < weight_bytes(target) / 4


@needs_kernel
def test_smollm2_reads_q_k_v_and_gate_up_in_one_call_each_with_the_same_logits(smollm2, monkeypatch):
    target, tokenizer, quick = smollm2
    stacked = [m for m in quick.modules() if isinstance(m, gguf_weights.StackedCodes)]
    assert len(stacked) == 2 * target.config.num_hidden_layers
    monkeypatch.setattr(gguf_weights, "stack_projections", lambda model: 0)
    unstacked = fast.prepare(target)
    assert not any(isinstance(m, gguf_weights.StackedCodes) for m in unstacked.modules())
    ids = tokenizer("The tide rises twice a day because", return_tensors="pt").input_ids

    @torch.no_grad()
    def passes(model, forward):  # the prompt, then a one-token step and a pass of four
        cache = new_cache(model)
        return [forward(part, past_key_values=cache, use_cache=True).logits
                for part in (ids[:, :-5], ids[:, -5:-4], ids[:, -4:])]

    # Layer by layer both (the one-call pass sums its norms in another order: tests/test_llama_pass.py).
    assert all(torch.equal(a, b) for a, b in zip(passes(quick, quick.forward.forward), passes(unstacked, unstacked)))


@needs_kernel
def test_the_kernel_benchmark_times_every_coded_call_of_a_step(smollm2, monkeypatch):
    """benchmarks/gguf_kernel.py's layer kinds are every kernel call a decode step makes, once."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gguf_kernel.py"
    spec = importlib.util.spec_from_file_location("gguf_kernel", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    target, tokenizer, quick = smollm2
    kinds = benchmark.layer_kinds(quick)
    timed = [id(layer.packed) for layers in kinds.values() for layer in layers]
    called = []
    kernel = torch.ops.specdec.gguf_weights_linear

    def counting(x, packed, out_features, bits):
        called.append(id(packed))
        return kernel(x, packed, out_features, bits)

    monkeypatch.setattr(torch.ops.specdec, "gguf_weights_linear", counting)
    ids = tokenizer("The tide rises", return_tensors="pt").input_ids
    with torch.no_grad():
        cache = new_cache(quick)
        quick(ids[:, :-1], past_key_values=cache, use_cache=True)
        called.clear()
        # The layer-by-layer forward: the one-call pass makes the same calls from C++, out of the patch's sight.
        quick.forward.forward(ids[:, -1:], past_key_values=cache, use_cache=True)
    assert sorted(called) == sorted(timed) and len(set(timed)) == len(timed)
    with pytest.raises(argparse.ArgumentTypeError, match="rows between 1 and 16"):
        benchmark.row_counts("0,4")
    assert benchmark.row_counts("16,4") == [1, 4, 16]


@needs_kernel
def test_smollm2_on_its_codes_decodes_as_the_eager_model_and_its_eagle_head_drafts_on_them(smollm2):
    target, tokenizer, quick = smollm2
    head, vocab = zoo.load_eagle("zoo:smollm2-eagle")
    drafter = EagleDrafter(head, target, vocab).for_target(quick)
    assert isinstance(drafter.lm_head, gguf_weights.GgufWeightLinear) and drafter.lm_head.bits == 8
    assert fast.path_name(drafter.head) == "bf16-stored weights (8 of 8 linear layers)"  # fc, q k v o, gate up down
    assert drafter.weight_bytes < EagleDrafter(head, target, vocab).weight_bytes / 2
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Why is the sea salty?"}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    expected = autoregressive_generate(target, ids, 32, eos_token_id=[]).sequences
    assert torch.equal(autoregressive_generate(quick, ids, 32, eos_token_id=[]).sequences, expected)
    out = speculative_generate(quick, drafter, ids, 32, 3, eos_token_id=[])
    assert torch.equal(out.sequences, expected) and out.stats.tokens_per_target_pass > 1.2


def test_prepare_without_the_kernel_packs_smollm2_instead(monkeypatch, smollm2):
    target, _, _ = smollm2
    monkeypatch.setattr(gguf_weights, "available", lambda: (False, "no kernel here"))
    assert fast.path_name(fast.prepare(target)) == "prepacked oneDNN weights"


def test_fast_layers_of_a_module_without_linear_layers_warns_and_returns_it():
    norm = torch.nn.LayerNorm(8)
    with pytest.warns(fast.FastPathWarning, match="no torch.nn.Linear"):
        assert fast.fast_layers(norm) is norm
    model = build("llama", 64, 2, seed=0)
    quick = fast.fast_layers(model.model.layers[0])
    assert fast.is_fast(quick) and not fast.is_fast(model.model.layers[0])
