"""Greedy speculative decoding must reproduce the target's own greedy decoding, token for token."""
from __future__ import annotations

import pytest
import torch

from factories import prompt
from specdec_ref import autoregressive_generate, speculative_generate


def reference(target, input_ids, max_new_tokens, eos_token_id=None):
    kwargs = {} if eos_token_id is None else {"eos_token_id": eos_token_id}
    return target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                           do_sample=False, pad_token_id=0, **kwargs)


@pytest.mark.parametrize("prompt_len", [1, 9, 30])
def test_baseline_matches_generate(family_pair, prompt_len):
    _, target, _, _ = family_pair
    ids = prompt(prompt_len, seed=prompt_len)
    out = autoregressive_generate(target, ids, max_new_tokens=40)
    assert torch.equal(out.sequences, reference(target, ids, 40))
    assert out.stats.new_tokens == out.sequences.shape[1] - prompt_len
    assert out.stats.target_forward_calls == out.stats.new_tokens


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("prompt_len", [1, 9, 30])
def test_speculative_matches_generate(family_pair, k, prompt_len):
    _, target, noisy_draft, small_draft = family_pair
    ids = prompt(prompt_len, seed=prompt_len)
    expected = reference(target, ids, 48)
    for draft in (noisy_draft, small_draft):
        out = speculative_generate(target, draft, ids, max_new_tokens=48, num_draft_tokens=k)
        assert torch.equal(out.sequences, expected), f"k={k} draft differs"
        stats = out.stats
        assert stats.new_tokens == expected.shape[1] - prompt_len
        # Only the final iteration may draft nothing (one slot left, for the target's own token).
        assert stats.iterations - 1 <= sum(stats.accepted_histogram) <= stats.iterations
        assert stats.accepted_tokens == sum(j * n for j, n in enumerate(stats.accepted_histogram))
        assert stats.drafted_tokens >= stats.accepted_tokens
        assert stats.iterations + (prompt_len > 1) == stats.target_forward_calls


@pytest.mark.parametrize("min_confidence", [0.3, 0.99])
def test_dynamic_draft_length_keeps_greedy_identity(family_pair, min_confidence):
    _, target, noisy_draft, small_draft = family_pair
    ids = prompt(9, seed=3)
    expected = reference(target, ids, 48)
    for draft in (noisy_draft, small_draft):
        out = speculative_generate(target, draft, ids, max_new_tokens=48, num_draft_tokens=4,
                                   min_draft_confidence=min_confidence)
        assert torch.equal(out.sequences, expected)
        stats = out.stats
        assert stats.draft_forward_calls == stats.drafted_tokens  # passes stop with the draft
        if min_confidence == 0.99:  # almost every draft is unsure of its first token
            assert stats.drafted_tokens < 2 * stats.iterations


def test_noisy_draft_exercises_every_acceptance_length(family_pair):
    """The identity tests above are only convincing if partial acceptance really happens."""
    _, target, noisy_draft, _ = family_pair
    histogram = [0] * 5
    for seed in range(4):
        out = speculative_generate(target, noisy_draft, prompt(12, seed=seed), max_new_tokens=64, num_draft_tokens=4)
        histogram = [a + b for a, b in zip(histogram, out.stats.accepted_histogram)]
    assert all(count > 0 for count in histogram), histogram


def test_self_draft_accepts_everything(family_pair):
    _, target, _, _ = family_pair
    ids = prompt(10)
    out = speculative_generate(target, target, ids, max_new_tokens=41, num_draft_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, 41, eos_token_id=[]))
    assert out.stats.acceptance_rate == 1.0
    # 41 tokens = 8 full iterations of 4 drafts + bonus, then one with the single slot left.
    assert out.stats.iterations == 9
    assert out.stats.tokens_per_target_pass == pytest.approx(41 / 9)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_eos_stops_exactly_like_generate(family_pair, k):
    _, target, noisy_draft, _ = family_pair
    ids = prompt(8, seed=3)
    free_run = reference(target, ids, 40)[0, 8:]
    # Pick tokens that first appear at several depths, so EOS lands on accepted drafts,
    # on corrections and on bonus tokens across the parametrisation.
    for position in (0, 5, 17, 30):
        eos = int(free_run[position])
        expected = reference(target, ids, 40, eos_token_id=eos)
        out = speculative_generate(target, noisy_draft, ids, max_new_tokens=40, num_draft_tokens=k, eos_token_id=eos)
        assert torch.equal(out.sequences, expected)
        assert out.sequences[0, -1] == eos
        assert (out.sequences[0, 8:-1] != eos).all()
        base = autoregressive_generate(target, ids, max_new_tokens=40, eos_token_id=eos)
        assert torch.equal(base.sequences, expected)


def test_eos_list_and_generation_config_default(family_pair):
    _, target, noisy_draft, _ = family_pair
    ids = prompt(8, seed=3)
    free_run = reference(target, ids, 40, eos_token_id=[])[0, 8:]
    eos_pair = [int(free_run[20]), int(free_run[11])]
    out = speculative_generate(target, noisy_draft, ids, max_new_tokens=40, eos_token_id=eos_pair)
    assert torch.equal(out.sequences, reference(target, ids, 40, eos_token_id=eos_pair))
    # None means "as generate would": the model's generation_config.eos_token_id.
    out = speculative_generate(target, noisy_draft, ids, max_new_tokens=40)
    assert torch.equal(out.sequences, reference(target, ids, 40))


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 3, 7])
def test_max_new_tokens_is_exact(family_pair, max_new_tokens):
    _, target, noisy_draft, _ = family_pair
    ids = prompt(5)
    out = speculative_generate(target, target, ids, max_new_tokens=max_new_tokens, num_draft_tokens=5, eos_token_id=[])
    assert out.sequences.shape == (1, 5 + max_new_tokens)
    assert torch.equal(out.sequences, reference(target, ids, max_new_tokens, eos_token_id=[]) if max_new_tokens else ids)
    assert out.stats.new_tokens == max_new_tokens


def test_context_can_be_filled_exactly(family_pair):
    """prompt + max_new_tokens == context length is allowed: drafting never runs past the budget."""
    _, target, noisy_draft, _ = family_pair
    ids = prompt(200)
    out = speculative_generate(target, noisy_draft, ids, max_new_tokens=56, num_draft_tokens=8, eos_token_id=[])
    assert out.sequences.shape[1] == 256
    assert torch.equal(out.sequences, reference(target, ids, 56, eos_token_id=[]))
