"""Paired measurement of c and v(k), checked with a virtual clock that each forward pass advances."""
from __future__ import annotations

import pytest

from factories import build
from specdec_ref.costs import measure_costs


def virtual_clock(models_and_costs):
    """A clock that only moves when a model runs: by ``fixed + per_token * tokens`` per forward."""
    state = {"now": 0.0, "calls": 0}

    def advance(fixed, per_token):
        def hook(module, args, kwargs):
            ids = args[0] if args else kwargs["input_ids"]
            state["now"] += fixed + per_token * ids.shape[1]
            state["calls"] += 1
        return hook

    handles = [model.register_forward_pre_hook(advance(*costs), with_kwargs=True)
               for model, costs in models_and_costs]
    return (lambda: state["now"]), state, handles


@pytest.fixture
def pair():
    return build("llama", 64, 2, seed=0), build("llama", 32, 1, seed=1)


def test_ratios_are_exact_under_a_virtual_clock(pair):
    target, draft = pair
    # target: 1.0 + 0.25 per token; draft: 0.25 per pass (one token)
    clock, state, handles = virtual_clock([(target, (1.0, 0.25)), (draft, (0.0, 0.25))])
    try:
        costs = measure_costs(target, draft, context=16, ks=[1, 4, 8], rounds=3, warmup=1, clock=clock)
    finally:
        for handle in handles:
            handle.remove()
    assert costs.cost_ratio == pytest.approx(0.25 / 1.25)
    for k in (1, 4, 8):
        assert costs.verify_costs[k] == pytest.approx((1.0 + 0.25 * (k + 1)) / 1.25)
        assert costs.verify_spread[k] == pytest.approx((costs.verify_costs[k],) * 2)
    assert costs.target_forward_seconds == pytest.approx(1.25)
    # 2 prefills, then per round 2 passes for the draft and for each of the 3 ks, 4 rounds in all
    assert state["calls"] == 2 + 4 * 2 * 4


def test_real_clock_gives_positive_costs_and_leaves_no_state(pair):
    target, draft = pair
    costs = measure_costs(target, draft, context=8, ks=range(1, 4), rounds=2)
    assert costs.target_forward_seconds > 0 and costs.cost_ratio > 0
    assert sorted(costs.verify_costs) == [1, 2, 3] and all(v > 0 for v in costs.verify_costs.values())
    low, high = costs.cost_ratio_spread
    assert low <= costs.cost_ratio <= high


@pytest.mark.parametrize("kwargs,match", [
    (dict(ks=[]), "ks must be integers >= 1"),
    (dict(ks=[0, 2]), "ks must be integers >= 1"),
    (dict(ks=[2], rounds=0), "need rounds >= 1"),
    (dict(ks=[2], context=0), "need rounds >= 1, warmup >= 0 and context >= 1"),
    (dict(ks=[2], context=300), "exceeds the target's context length"),
])
def test_bad_input_is_refused(pair, kwargs, match):
    target, draft = pair
    with pytest.raises(ValueError, match=match):
        measure_costs(target, draft, **({"context": 8} | kwargs))
