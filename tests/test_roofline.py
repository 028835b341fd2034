"""The roofline and speedup model against hand-computed values."""
from __future__ import annotations

import pytest

from factories import build
from specdec_ref import roofline


def test_weight_bytes_of_named_sizes_and_models():
    assert roofline.weight_bytes(70e9, "bfloat16") == 140e9
    assert roofline.weight_bytes(6.7e9, "float16") == pytest.approx(13.4e9)
    assert roofline.weight_bytes(8e9, "int4") == 4e9
    model = build("llama", 64, 2, seed=0)
    params = sum(p.numel() for p in model.parameters())
    assert roofline.weight_bytes(model) == 4 * params  # float32 as loaded
    assert roofline.weight_bytes(model, "bfloat16") == 2 * params
    with pytest.raises(ValueError, match="unknown dtype"):
        roofline.weight_bytes(1e9, "float13")
    with pytest.raises(ValueError, match="give the dtype"):
        roofline.weight_bytes(1e9)


def test_bandwidth_bound_per_token():
    h100 = roofline.ACCELERATORS["H100 SXM"]
    assert h100.memory_bandwidth == 3.35e12
    assert roofline.seconds_per_token_bound(140e9, h100.memory_bandwidth) == pytest.approx(0.041791, rel=1e-4)
    assert roofline.ACCELERATORS["H200"].memory_bandwidth == 4.8e12
    assert all(a.source for a in roofline.ACCELERATORS.values())
    assert roofline.bandwidth_achieved(100e6, 50, 2.0) == 2.5e9


@pytest.mark.parametrize("a,k,expected", [(0.8, 4, 3.3616), (0.7, 5, 2.941170), (0.0, 5, 1.0), (1.0, 5, 6.0),
                                          (0.5, 1, 1.5)])
def test_expected_tokens_per_pass(a, k, expected):
    assert roofline.expected_tokens_per_pass(a, k) == pytest.approx(expected, rel=1e-5)


def test_the_seed_formula_overstates_tokens_per_pass():
    # The source text's 1 + p*k gives 4.5 for p = 0.7, k = 5; the correct expectation is 2.94.
    seed_claim = 1 + 0.7 * 5
    assert roofline.expected_tokens_per_pass(0.7, 5) == pytest.approx(seed_claim - 1.5588, rel=1e-4)


def test_expected_speedup_and_optimal_k():
    assert roofline.expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert roofline.expected_speedup(0.8, 4, 0.05, verify_cost=1.4) == pytest.approx(3.3616 / 1.6)
    assert roofline.optimal_k(0.8, 0.05) == 8  # hand-tabulated: k=7 3.082, k=8 3.092, k=9 3.078
    # A costly CPU verify pass pushes the optimum down and can make speculation a loss.
    cpu_verify = {1: 1.3, 2: 1.45, 3: 1.6, 4: 1.75, 6: 2.2, 8: 2.7}
    assert roofline.optimal_k(0.6, 0.15, cpu_verify) == 2
    assert roofline.expected_speedup(0.3, 4, 0.15, cpu_verify[4]) < 1
    with pytest.raises(ValueError, match="acceptance must be in"):
        roofline.expected_tokens_per_pass(1.2, 3)


def test_machine_measurements_return_sane_values():
    bandwidth = roofline.measure_memory_bandwidth(8 * 2**20, repeats=2)
    assert bandwidth["copy"] > 1e8 and bandwidth["triad"] > 1e8  # > 0.1 GB/s on anything real
    llc = roofline.last_level_cache_bytes()
    assert llc is None or llc >= 2**20
    model = build("llama", 64, 2, seed=0)
    assert 0 < roofline.measure_forward_seconds(model, context=16, new_tokens=3, repeats=2) < 5
