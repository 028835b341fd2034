"""Speculative sampling must produce exactly the target's distribution (chi-square tests).

On a tiny vocabulary we enumerate the target's exact joint distribution of the first two
new tokens, draw thousands of generations and compare. The same samples must *reject*
the draft's distribution, which shows the test has the power to fail.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from factories import build
from specdec_ref import Proposal, Sampler, autoregressive_generate, speculative_generate

VOCAB = 8
RUNS = 2000
PROMPT = torch.tensor([[3, 5, 1, 6]])


@pytest.fixture(scope="module")
def tiny_pair():
    return build("llama", 32, 1, seed=10, vocab=VOCAB), build("llama", 32, 1, seed=11, vocab=VOCAB)


@torch.inference_mode()
def exact_joint(model, sampler: Sampler) -> torch.Tensor:
    """P(x1, x2 | prompt) under ``sampler``'s warping, as a [V, V] table."""
    first = sampler.probs(model(PROMPT).logits[0, -1])
    joint = torch.zeros(VOCAB, VOCAB)
    for x1 in range(VOCAB):
        second = sampler.probs(model(torch.cat([PROMPT, torch.tensor([[x1]])], dim=1)).logits[0, -1])
        joint[x1] = first[x1] * second
    return joint


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square over the cells, pooling cells expected below 5 counts into one bin."""
    expected_probs = expected_probs.flatten().double()
    expected = expected_probs / expected_probs.sum() * counts.sum()
    observed = counts.flatten().double()
    small = expected < 5
    if small.any():
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
        observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    # Any observed count in a cell of probability 0 is an outright failure.
    if (expected == 0).any() and observed[expected == 0].sum() > 0:
        return 0.0
    keep = expected > 0
    return float(chisquare(observed[keep].numpy(), expected[keep].numpy()).pvalue)


def sample_counts(generate) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(VOCAB, VOCAB)
    for _ in range(RUNS):
        out = generate(generator)
        x1, x2 = out.sequences[0, PROMPT.shape[1] : PROMPT.shape[1] + 2].tolist()
        counts[x1, x2] += 1
    return counts


class FixedDrafter:
    """Always proposes the same tokens: a deterministic proposal, verified with a one-hot q."""

    def __init__(self, proposal: list[int]) -> None:
        self.proposal = torch.tensor(proposal)

    def start(self, prompt, max_new_tokens):
        pass

    def propose(self, tokens, max_tokens, sampler):
        return Proposal(self.proposal[:max_tokens])

    def update(self, tokens, num_accepted):
        pass


WARPS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5, top_p=0.9)]


@pytest.mark.parametrize("warp", WARPS, ids=["plain", "t0.7-topk5-topp0.9"])
def test_speculative_sampling_matches_target_distribution(tiny_pair, warp):
    target, draft = tiny_pair
    sampler = Sampler(do_sample=True, **warp)
    counts = sample_counts(
        lambda g: speculative_generate(target, draft, PROMPT, max_new_tokens=3, num_draft_tokens=2,
                                       do_sample=True, generator=g, eos_token_id=[], **warp)
    )
    assert chi_square_pvalue(counts, exact_joint(target, sampler)) > 1e-3
    # Power: the same samples are clearly not from the draft's distribution.
    assert chi_square_pvalue(counts, exact_joint(draft, sampler)) < 1e-6


def test_deterministic_proposal_is_exact_too(tiny_pair):
    target, _ = tiny_pair
    sampler = Sampler(do_sample=True)
    joint = exact_joint(target, sampler)
    likely = divmod(int(joint.argmax()), VOCAB)  # a proposal that is often, not always, accepted
    counts = sample_counts(
        lambda g: speculative_generate(target, FixedDrafter(list(likely)), PROMPT, max_new_tokens=3,
                                       num_draft_tokens=2, do_sample=True, generator=g, eos_token_id=[])
    )
    assert chi_square_pvalue(counts, joint) > 1e-3
    assert 0 < counts[likely] < RUNS


def test_baseline_sampling_matches_target_distribution(tiny_pair):
    target, draft = tiny_pair
    warp = WARPS[1]
    counts = sample_counts(
        lambda g: autoregressive_generate(target, PROMPT, max_new_tokens=2, do_sample=True, generator=g,
                                          eos_token_id=[], **warp)
    )
    assert chi_square_pvalue(counts, exact_joint(target, Sampler(do_sample=True, **warp))) > 1e-3


def test_seeded_runs_are_reproducible(tiny_pair):
    target, draft = tiny_pair
    runs = [
        speculative_generate(target, draft, PROMPT, max_new_tokens=20, num_draft_tokens=3, do_sample=True,
                             generator=torch.Generator().manual_seed(7), eos_token_id=[]).sequences
        for _ in range(2)
    ]
    assert torch.equal(*runs)


@pytest.mark.parametrize(
    "temperature,top_k,top_p", list(itertools.product([0.5, 1.0, 1.7], [None, 1, 3, 50], [None, 0.3, 0.8, 1.0]))
)
def test_warping_matches_transformers(temperature, top_k, top_p):
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p))
    expected = logits
    for warper in warpers:
        expected = warper(None, expected)
    ours = Sampler(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p).probs(logits)
    torch.testing.assert_close(ours, expected.softmax(-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("probs, top_p", [([0.2, 0.4, 0.2, 0.2], 0.5), ([0.25] * 4, 0.5), ([0.1] * 10, 0.35),
                                           ([0.3, 0.3, 0.1, 0.3], 0.6)])
def test_top_p_ties_keep_the_higher_ids_as_transformers_does(probs, top_p):
    """Tokens tied at the top-p boundary: the higher ids are kept, the rule Sampler.probs states."""
    logits = torch.tensor([probs]).log()
    expected = TopPLogitsWarper(top_p)(None, logits.clone()).softmax(-1)
    ours = Sampler(do_sample=True, top_p=top_p).probs(logits)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)
    kept = set(ours[0].nonzero().flatten().tolist())
    boundary = min(probs[i] for i in kept)
    tied = [i for i, p in enumerate(probs) if p == boundary]
    kept_tied = [i for i in tied if i in kept]
    assert len(kept_tied) < len(tied) and kept_tied == tied[len(tied) - len(kept_tied):], \
        "of the tokens tied at the boundary, the highest ids are kept"


def test_dynamic_draft_length_is_exact(tiny_pair):
    """A draft that stops early on a token it is unsure of (min_draft_confidence) keeps
    sampling exact: whether to go on depends only on the drafted prefix, never on the target."""
    target, draft = tiny_pair
    sampler = Sampler(do_sample=True)
    with torch.inference_mode():
        q = sampler.probs(draft(PROMPT).logits[0, -1]).sort().values
    # Between the two likeliest first drafts: one goes on to a second draft, the others stop.
    threshold = float(q[-1] + q[-2]) / 2
    counts = sample_counts(
        lambda g: speculative_generate(target, draft, PROMPT, max_new_tokens=3, num_draft_tokens=2, do_sample=True,
                                       generator=g, eos_token_id=[], min_draft_confidence=threshold)
    )
    assert chi_square_pvalue(counts, exact_joint(target, sampler)) > 1e-3
    assert chi_square_pvalue(counts, exact_joint(draft, sampler)) < 1e-6
