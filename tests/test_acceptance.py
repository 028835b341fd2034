"""Acceptance rate vs acceptance probability, and the break-even point, against hand values
and a simulation of independent acceptances."""
from __future__ import annotations

import random

import pytest

from specdec_ref import GenerationStats, roofline
from specdec_ref.acceptance import (acceptance_probability_from_rate, break_even_acceptance,
                                    expected_acceptance_rate)


@pytest.mark.parametrize("a,k,expected", [(0.7, 4, (0.7 + 0.49 + 0.343 + 0.2401) / 4), (0.5, 1, 0.5),
                                          (0.0, 6, 0.0), (1.0, 6, 1.0), (0.9, 2, (0.9 + 0.81) / 2)])
def test_expected_acceptance_rate_by_hand(a, k, expected):
    assert expected_acceptance_rate(a, k) == pytest.approx(expected)


@pytest.mark.parametrize("a", [0.05, 0.3, 0.674, 0.856, 0.99])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_rate_and_probability_invert_each_other(a, k):
    assert acceptance_probability_from_rate(expected_acceptance_rate(a, k), k) == pytest.approx(a, abs=1e-9)


def simulate(a: float, k: int, iterations: int, seed: int) -> GenerationStats:
    """Iterations of k drafts, each judged draft accepted with probability a, independently."""
    rng = random.Random(seed)
    stats = GenerationStats(num_draft_tokens=k, accepted_histogram=[0] * (k + 1))
    for _ in range(iterations):
        accepted = next((j for j in range(k) if rng.random() >= a), k)
        stats.iterations += 1
        stats.drafted_tokens += k
        stats.accepted_tokens += accepted
        stats.rejections += accepted < k
        stats.new_tokens += accepted + 1
        stats.accepted_histogram[accepted] += 1
    return stats


@pytest.mark.parametrize("a,k", [(0.8, 4), (0.6, 6), (0.9, 2)])
def test_the_relation_holds_for_independent_acceptances(a, k):
    stats = simulate(a, k, iterations=20_000, seed=1)
    assert stats.acceptance_probability == pytest.approx(a, abs=0.01)
    assert stats.acceptance_rate == pytest.approx(expected_acceptance_rate(a, k), abs=0.01)
    assert acceptance_probability_from_rate(stats.acceptance_rate, k) == pytest.approx(a, abs=0.015)
    assert stats.tokens_per_target_pass == pytest.approx(roofline.expected_tokens_per_pass(a, k), rel=0.02)
    # The mistake the lesson shows: the rate in tau's formula understates tau.
    assert roofline.expected_tokens_per_pass(stats.acceptance_rate, k) < 0.97 * stats.tokens_per_target_pass


@pytest.mark.parametrize("k,c,v,expected", [(1, 0.5, 1.0, 0.5), (2, 0.0, 1.75, 0.5)])
def test_break_even_by_hand(k, c, v, expected):
    # k=1: (1 + a) / 1.5 = 1 at a = 0.5; k=2: 1 + a + a^2 = 1.75 at a = 0.5
    assert break_even_acceptance(k, c, v) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("k,c,v", [(4, 0.1, 2.0), (8, 0.06, 1.3), (3, 0.3, 1.0)])
def test_break_even_is_where_the_speedup_crosses_one(k, c, v):
    a = break_even_acceptance(k, c, v)
    assert 0 < a < 1
    assert roofline.expected_speedup(a, k, c, v) == pytest.approx(1.0, abs=1e-9)
    assert roofline.expected_speedup(a - 0.01, k, c, v) < 1 < roofline.expected_speedup(a + 0.01, k, c, v)


def test_break_even_edge_cases():
    assert break_even_acceptance(4, 0.0, 1.0) == 0.0  # free drafts, free verification: never slower
    assert break_even_acceptance(4, 0.5, 4.0) is None  # 6 step-costs for at most 5 tokens: always slower


@pytest.mark.parametrize("call,match", [
    (lambda: expected_acceptance_rate(1.5, 4), "acceptance_probability must be in"),
    (lambda: expected_acceptance_rate(0.5, 0), "k must be an integer"),
    (lambda: acceptance_probability_from_rate(-0.1, 4), "acceptance_rate must be in"),
    (lambda: break_even_acceptance(4, -0.1, 1.0), "need cost_ratio >= 0"),
    (lambda: break_even_acceptance(2.5, 0.1, 1.0), "k must be an integer"),
])
def test_bad_input_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
