"""specdec_ref.lesson_tools: the helpers lessons 2 and 4 call."""
import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_ref import accept_sampled
from specdec_ref.lesson_tools import (STEP_PARTS, measure_batch_costs, profile_step, rejection_output_distribution,
                                     whole_percentages)
from specdec_ref.sampling import Sampler


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=97, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def test_whole_percentages_add_up_to_100():
    assert whole_percentages([1, 1, 1]) == [34, 33, 33]
    assert whole_percentages([2, 0, 2]) == [50, 0, 50]
    for values in ([0.674, 0.012, 0.061, 0.253], [5.0, 4.0, 3.0, 2.0, 1.0], [1e-9, 1.0]):
        shares = whole_percentages(values)
        assert sum(shares) == 100
        assert all(abs(s - 100 * v / sum(values)) < 1 for s, v in zip(shares, values))
    with pytest.raises(ValueError):
        whole_percentages([0.0, 0.0])


def test_rejection_output_distribution_is_p_when_told_the_truth():
    p, q = torch.tensor([0.6, 0.4]), torch.tensor([0.9, 0.1])
    assert torch.allclose(rejection_output_distribution(p, q), p.double())
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        p, q = torch.rand(7, generator=generator), torch.rand(7, generator=generator)
        p[2], q[5] = 0.0, 0.0
        p, q = p / p.sum(), q / q.sum()
        assert torch.allclose(rejection_output_distribution(p, q), p.double(), atol=1e-12)


def test_rejection_output_distribution_told_the_raw_softmax():
    # The draft samples from its top-2 (renormalised) but the verifier is told the raw softmax.
    raw = torch.tensor([0.4, 0.3, 0.2, 0.1])
    top2 = torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7
    p = torch.tensor([0.25, 0.25, 0.25, 0.25])
    out = rejection_output_distribution(p, top2, raw)
    assert out.sum().item() == pytest.approx(1.0)
    assert out[2:].sum() < p[2:].sum()  # the tokens the draft never proposes come out too rarely
    # and matches a simulation of the library's rule
    sampler = Sampler(do_sample=True, generator=torch.Generator().manual_seed(0))
    counts = torch.zeros(4)
    runs = 4000
    for _ in range(runs):
        draft = sampler.sample(top2).view(1)
        accepted, token = accept_sampled(torch.stack([p, p]), draft, raw.view(1, -1), sampler)
        counts[draft[0] if accepted else token] += 1
    assert torch.allclose(counts / runs, out.float(), atol=0.03)


def test_measure_batch_costs_pairs_each_batch_with_a_one_sequence_step(tiny_llama):
    ticks = itertools.count()
    costs = measure_batch_costs(tiny_llama, context=8, batches=[1, 2, 4], rounds=3, warmup=1,
                                clock=lambda: float(next(ticks)))
    # a fake clock that advances by 1 per reading: every pass takes 1 "second"
    assert costs.cost == {1: 1.0, 2: 1.0, 4: 1.0}
    assert costs.step_seconds == 1.0
    assert costs.tokens_per_second(4) == 4.0
    assert costs.spread[2] == (1.0, 1.0)
    with pytest.raises(ValueError):
        measure_batch_costs(tiny_llama, context=8, batches=[0])


def test_measure_batch_costs_real_clock(tiny_llama):
    costs = measure_batch_costs(tiny_llama, context=8, batches=[1, 3], rounds=2, warmup=0)
    assert costs.cost[1] > 0 and costs.cost[3] > 0 and costs.step_seconds > 0


def test_profile_step_parts_add_up_to_the_total(tiny_llama, capfd):
    parts = profile_step(tiny_llama, context=8, batch=3, repeats=2)
    assert set(parts) == set(STEP_PARTS) | {"total"}
    assert parts["total"] == pytest.approx(sum(parts[p] for p in STEP_PARTS))
    assert parts["weight matmuls"] > 0
    assert capfd.readouterr().err == ""  # the profiler's start/stop lines are silenced
