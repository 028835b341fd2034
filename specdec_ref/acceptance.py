"""Acceptance rate, acceptance probability and the break-even point of the speedup model.

Two figures describe how often drafts survive, and they are easy to mix up:

- the acceptance *rate* (``GenerationStats.acceptance_rate``, vLLM's metric) is accepted /
  drafted; drafts after the first rejection are never judged but still count as drafted;
- the acceptance *probability* a (``GenerationStats.acceptance_probability``, the a of
  tau = (1 - a^(k+1)) / (1 - a), Leviathan et al. 2023) is the chance a judged draft is accepted.

If every judged draft is accepted independently with probability a, an iteration of k drafts
accepts a + a^2 + ... + a^k tokens on average, which ties the two together. The functions here
convert between them and find where speculation stops paying (``roofline.expected_speedup`` = 1).
"""
from __future__ import annotations

from .roofline import expected_speedup

_BISECTION_STEPS = 60  # halves [0, 1] to below 1e-18, far under float resolution of any input


def _check(value: float, name: str, k: int) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1] (got {value})")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (got {k!r})")


def expected_acceptance_rate(acceptance_probability: float, k: int) -> float:
    """Accepted / drafted expected at a fixed draft length k when each judged draft is accepted
    independently with probability a: (a + a^2 + ... + a^k) / k, below a for every k > 1."""
    _check(acceptance_probability, "acceptance_probability", k)
    a = acceptance_probability
    return sum(a**j for j in range(1, k + 1)) / k


def acceptance_probability_from_rate(acceptance_rate: float, k: int) -> float:
    """The a whose :func:`expected_acceptance_rate` at draft length k is ``acceptance_rate``
    (the inverse, by bisection: the rate rises monotonically with a)."""
    _check(acceptance_rate, "acceptance_rate", k)
    low, high = 0.0, 1.0
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        if expected_acceptance_rate(middle, k) < acceptance_rate:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def break_even_acceptance(k: int, cost_ratio: float, verify_cost: float = 1.0) -> float | None:
    """The acceptance probability a at which speculation with k drafts is exactly as fast as
    plain decoding (``expected_speedup`` = 1), for draft cost ratio c and verify cost v(k).

    Below it speculation is slower. Returns 0.0 when even a = 0 breaks even (an iteration costs
    at most one plain step), and None when no a does: k drafts plus the verification cost more
    than the k + 1 tokens a fully accepted iteration yields.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (got {k!r})")
    if cost_ratio < 0 or verify_cost <= 0:
        raise ValueError(f"need cost_ratio >= 0 and verify_cost > 0 (got {cost_ratio}, {verify_cost})")
    if expected_speedup(0.0, k, cost_ratio, verify_cost) >= 1:
        return 0.0
    if expected_speedup(1.0, k, cost_ratio, verify_cost) < 1:
        return None
    low, high = 0.0, 1.0  # the speedup rises monotonically with a
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        if expected_speedup(middle, k, cost_ratio, verify_cost) < 1:
            low = middle
        else:
            high = middle
    return (low + high) / 2
