"""The roofline and speedup model against hand-computed values."""
from __future__ import annotations

import pytest
import torch

from factories import VOCAB, build, prompt
from specdec_ref import GenerationStats, Proposal, autoregressive_generate, roofline, speculative_generate


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
    # fed tau as the i.i.d. model gives it, the measured-figures form is the same number
    assert roofline.speedup_from_tokens_per_pass(3.3616, 4, 0.05, 1.4) == pytest.approx(3.3616 / 1.6)
    assert roofline.speedup_from_tokens_per_pass(1.8, 2.5, 0.1) == pytest.approx(1.8 / 1.25)
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
    assert 0 < roofline.measure_forward_seconds(model, context=16, new_tokens=1, repeats=2, batch=4) < 5
    assert roofline.measure_matmul_flops(n=256, repeats=2) > 1e8  # > 0.1 GFLOP/s on anything real


def test_batched_forward_is_timed_on_every_sequence_of_the_batch():
    model = build("llama", 64, 2, seed=0)
    seen = []
    model.register_forward_hook(
        lambda module, args, kwargs, output: seen.append((args[0] if args else kwargs["input_ids"]).shape),
        with_kwargs=True)
    roofline.measure_forward_seconds(model, context=16, new_tokens=1, repeats=2, batch=3)
    # the prefill of the context, then a warm-up and 2 timed passes of one token per sequence
    assert seen == [(3, 16)] + [(3, 1)] * 3


class IIDDrafter:
    """Proposes the target's own greedy tokens, each replaced by a wrong one with probability
    1 - a, independently: the i.i.d. acceptance model made real."""

    def __init__(self, reference: torch.LongTensor, a: float, seed: int) -> None:
        self.reference, self.a = reference, a
        self.generator = torch.Generator().manual_seed(seed)

    def start(self, prompt, max_new_tokens):
        pass

    def propose(self, tokens, max_tokens, sampler):
        right = self.reference[tokens.numel(): tokens.numel() + max_tokens]
        keep = torch.rand(right.numel(), generator=self.generator) < self.a
        return Proposal(torch.where(keep, right, (right + 1) % VOCAB), forward_calls=right.numel())

    def update(self, tokens, num_accepted):
        pass


def test_iid_model_needs_the_acceptance_probability_not_the_rate():
    """With k = 4 and a = 0.7 the acceptance rate (accepted / drafted) is about 0.44, far
    below a; accepted / judged drafts recovers a, and with it the measured tokens per pass."""
    target, a, k = build("llama", 64, 2, seed=0), 0.7, 4
    runs = []
    for seed in range(4):
        ids = prompt(8, seed=seed)
        reference = autoregressive_generate(target, ids, max_new_tokens=200, eos_token_id=[]).sequences[0]
        out = speculative_generate(target, IIDDrafter(reference, a, seed), ids, max_new_tokens=200,
                                   num_draft_tokens=k, eos_token_id=[])
        assert torch.equal(out.sequences[0], reference)
        runs.append(out.stats)
    totals = GenerationStats.combined(runs)
    assert totals.new_tokens == 800 and totals.rejections == sum(s.rejections for s in runs)
    rate_if_iid = a * (1 - a**k) / (1 - a) / k  # E[accepted] / k = 0.44
    assert totals.acceptance_rate == pytest.approx(rate_if_iid, abs=0.05)
    assert totals.acceptance_probability == pytest.approx(a, abs=0.05)
    assert roofline.expected_tokens_per_pass(totals.acceptance_probability, k) == pytest.approx(
        totals.tokens_per_target_pass, rel=0.1)
    assert roofline.expected_tokens_per_pass(totals.acceptance_rate, k) < 0.8 * totals.tokens_per_target_pass


def test_combined_stats_are_ratios_of_totals():
    a = GenerationStats(num_draft_tokens=2, new_tokens=9, iterations=3, drafted_tokens=6, accepted_tokens=6,
                        accepted_histogram=[0, 0, 3], draft_breakdown={"encode": 0.5}, draft_seconds=1.0)
    b = GenerationStats(num_draft_tokens=2, new_tokens=3, iterations=3, drafted_tokens=6, accepted_tokens=0,
                        rejections=3, accepted_histogram=[3, 0, 0], draft_breakdown={"encode": 0.25, "align": 1.0})
    total = GenerationStats.combined([a, b])
    assert (total.new_tokens, total.iterations, total.rejections, total.draft_seconds) == (12, 6, 3, 1.0)
    assert total.accepted_histogram == [3, 0, 3] and total.draft_breakdown == {"encode": 0.75, "align": 1.0}
    assert total.acceptance_rate == 0.5  # 6 of 12, not the mean of 1.0 and 0.0 by accident of equal sizes
    assert total.acceptance_probability == 6 / 9 and total.tokens_per_target_pass == 2.0
