"""specdec_ref.kernels.bf16: the kernel against PyTorch's, its layout, when it applies, and the fast path built on it.

Speed is measured by ``python -m specdec_ref bench --fast``, never asserted here.
"""
from __future__ import annotations

import pytest
import torch

from factories import assert_passes_on_the_avx2_build, build, noisy_copy, prompt
from specdec_ref import autoregressive_generate, speculative_generate, zoo
from specdec_ref.kernels import bf16 as bf16_weights, build as kernel_build, fast
from specdec_ref.roofline import streamed_weight_bytes, weight_bytes

CPU_FLAGS = kernel_build.cpu_flags()
VECTOR_UNITS = kernel_build.has_vector_units(CPU_FLAGS)
# Without AVX-512 or AVX2 the kernel cannot be built or run: there, the tests of the fallback
# (availability's reason, prepare packing instead) are what applies.
needs_kernel = pytest.mark.skipif(not VECTOR_UNITS, reason="the kernel is AVX-512 or AVX2 code; this CPU has neither")


def rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Worst-case fp32 rounding of each dot product, in any summation order."""
    return x.shape[-1] * torch.finfo(torch.float32).eps * (x.abs() @ weight.abs().t())


def bf16_valued(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=generator).to(torch.bfloat16).float()


def test_available_exactly_where_the_cpu_has_the_vector_units():
    ok, reason = bf16_weights.available()
    assert ok == VECTOR_UNITS, reason
    isa = "AVX-512" if "avx512f" in CPU_FLAGS else "AVX2"
    assert (f"kernel is built ({isa}, " in reason) if ok else ("AVX2" in reason)


def test_vector_units():
    assert kernel_build.has_vector_units({"avx512f"}) and kernel_build.has_vector_units({"avx2", "fma", "sse2"})
    assert not kernel_build.has_vector_units({"avx2"}) and not kernel_build.has_vector_units({"avx", "fma"})


def test_unavailable_without_vector_units_or_a_compiler_or_with_an_unknown_variant_says_why(monkeypatch):
    build_uncached = bf16_weights._operator.__wrapped__
    monkeypatch.setattr(kernel_build, "cpu_flags", lambda: {"sse2", "avx"})
    assert build_uncached() == (False, "this CPU has neither AVX-512 nor AVX2 with FMA, which the kernel is written for")
    monkeypatch.setattr(kernel_build, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setenv("SPECDEC_BF16_KERNEL", "avx10")
    ok, reason = build_uncached()
    assert not ok and "SPECDEC_BF16_KERNEL='avx10' is not a kernel variant (choose from native, avx2)" in reason
    monkeypatch.delenv("SPECDEC_BF16_KERNEL")
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    ok, reason = build_uncached()
    assert not ok and "no C++ compiler" in reason


@needs_kernel
def test_a_failed_build_reports_the_compiler_error(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(bf16_weights, "SOURCE", broken)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    ok, reason = bf16_weights._operator.__wrapped__()
    assert not ok and "building the kernel with" in reason and "error" in reason
    assert not list((tmp_path / "cache" / "kernels").glob("*.so"))  # nothing half-built left behind


def test_is_bf16_exact():
    assert bf16_weights.is_bf16_exact(bf16_valued(8, 16))
    assert not bf16_weights.is_bf16_exact(torch.randn(8, 16, generator=torch.Generator().manual_seed(0)))
    assert not bf16_weights.is_bf16_exact(bf16_valued(8, 16).to(torch.float64))
    target, _ = zoo.load("zoo:target")  # stored as bfloat16, upcast by the loader
    assert all(bf16_weights.is_bf16_exact(p) for p in target.parameters())


def test_fits():
    assert bf16_weights.fits(1376, 512) and bf16_weights.fits(4, 16)
    assert not bf16_weights.fits(6, 16) and not bf16_weights.fits(8, 24)


def test_pack_layout():
    """Block b, tile t, row r, column c holds w[4b + r, 16t + c]."""
    weight = bf16_valued(8, 32)
    packed = bf16_weights.pack(weight)
    bits = weight.to(torch.bfloat16).view(torch.int16)
    assert packed.dtype == torch.int16 and packed.numel() == weight.numel()
    for b in range(2):
        for t in range(2):
            for r in range(4):
                start = ((b * 2 + t) * 4 + r) * 16
                assert torch.equal(packed[start:start + 16], bits[4 * b + r, 16 * t:16 * t + 16])


KERNEL_SHAPES = [(4, 16), (64, 48), (1376, 512), (512, 1376)]


def assert_kernel_matches_fp32_linear(shape: tuple[int, int]) -> None:
    """The loaded kernel against PyTorch's fp32 linear, for every row count it serves and longer passes."""
    weight = bf16_valued(*shape)
    packed = bf16_weights.pack(weight)
    generator = torch.Generator().manual_seed(1)
    for rows in (*range(1, bf16_weights.MAX_ROWS + 1), bf16_weights.MAX_ROWS + 1, 40):
        x = torch.randn(1, rows, shape[1], generator=generator)
        got = torch.ops.specdec.bf16_weights_linear(x, packed, weight)
        want = torch.nn.functional.linear(x, weight)
        assert got.shape == want.shape == (1, rows, shape[0])
        assert bool(((got - want).abs() <= rounding_bound(x, weight)).all()), (shape, rows)
        # A wrong layout or a skipped row would be off by far more than rounding.
        assert not torch.equal(got, torch.zeros_like(got))


@needs_kernel
@pytest.mark.parametrize("shape", KERNEL_SHAPES)
def test_kernel_matches_fp32_linear_for_every_row_count(shape):
    assert_kernel_matches_fp32_linear(shape)


@needs_kernel
def test_the_avx2_variant_matches_fp32_linear_too():
    assert_passes_on_the_avx2_build("import test_bf16_weights as t\n"
                                    "ok, reason = t.bf16_weights.available(); print(reason); assert ok\n"
                                    "for shape in t.KERNEL_SHAPES: t.assert_kernel_matches_fp32_linear(shape)\n",
                                    "bf16-weight kernel")


@needs_kernel
def test_kernel_refuses_a_packing_it_does_not_cover():
    weight = bf16_valued(8, 32)
    with pytest.raises(RuntimeError, match="a packed weight of a shape the kernel covers"):
        torch.ops.specdec.bf16_weights_linear(torch.randn(1, 32), bf16_weights.pack(weight)[:-16], weight)


@needs_kernel
def test_layer_with_bias_and_non_contiguous_input():
    linear = torch.nn.Linear(64, 40)
    with torch.no_grad():
        linear.weight.copy_(bf16_valued(40, 64))
    layer = bf16_weights.Bf16WeightLinear(linear.weight, linear.bias)
    x = torch.randn(3, 64, 2).transpose(1, 2)  # [3, 2, 64], not contiguous
    with torch.no_grad():
        want = linear(x)
        assert torch.allclose(layer(x), want, atol=1e-5)
    assert layer.weight is linear.weight and "packed" not in layer.state_dict()


@needs_kernel
def test_prepare_reads_zoo_weights_as_bf16_and_counts_half_the_bytes():
    target, _ = zoo.load("zoo:target")
    quick = fast.prepare(target)
    halved = [m for m in quick.modules() if isinstance(m, bf16_weights.Bf16WeightLinear)]
    assert len(halved) == 50 and fast.is_fast(quick)
    assert fast.path_name(quick) == "bf16-stored weights (50 of 50 linear layers)"
    assert all(a is b for a, b in zip(quick.parameters(), target.parameters()))
    linear_bytes = sum(m.weight.numel() * 4 for m in halved)
    assert streamed_weight_bytes(quick) == weight_bytes(target) - linear_bytes / 2
    assert streamed_weight_bytes(target) == weight_bytes(target)
    packed = fast.prepare(target, bf16_weights=False)
    assert fast.path_name(packed) == "prepacked oneDNN weights"
    assert streamed_weight_bytes(packed) == weight_bytes(target)


def test_prepare_packs_random_fp32_weights_instead():
    model = build("llama", 64, 2, seed=0)  # fp32 random values: not bf16-exact
    quick = fast.prepare(model)
    assert fast.path_name(quick) == "prepacked oneDNN weights"
    assert not any(isinstance(m, bf16_weights.Bf16WeightLinear) for m in quick.modules())


def test_prepare_without_the_kernel_packs_instead(monkeypatch):
    monkeypatch.setattr(bf16_weights, "available", lambda: (False, "no kernel here"))
    target, _ = zoo.load("zoo:draft")
    quick = fast.prepare(target)
    assert fast.path_name(quick) == "prepacked oneDNN weights"


def bf16_rounded(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
    return model


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_bf16_valued_random_families_decode_exactly(family):
    """Any family whose weights are bf16 values: greedy output identical, baseline and speculative.
    (Qwen2's projections have biases; GPT-2's blocks are Conv1D, packed, with a bf16 lm_head.)"""
    target = bf16_rounded(build(family, 64, 2, seed=0))
    draft = bf16_rounded(noisy_copy(target, 0.05, seed=1))
    quick, quick_draft = fast.prepare(target), fast.prepare(draft)
    assert fast.path_name(quick).startswith("bf16-stored weights")
    for seed in range(3):
        ids = prompt(12, seed=seed)
        expected = autoregressive_generate(target, ids, 24, eos_token_id=[]).sequences
        assert torch.equal(autoregressive_generate(quick, ids, 24, eos_token_id=[]).sequences, expected)
        out = speculative_generate(quick, quick_draft, ids, 24, 3, eos_token_id=[])
        assert torch.equal(out.sequences, expected), (family, seed)
        assert out.stats.accepted_tokens > 0
