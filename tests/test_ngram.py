"""Prompt lookup (n-gram) drafting: the lookup rule, and greedy identity through the shared loop."""
from __future__ import annotations

import pytest
import torch

from factories import build, prompt
from specdec_ref import PromptLookupDrafter, Sampler, speculative_generate


def propose(drafter, tokens, k=3):
    return drafter.propose(torch.tensor(tokens), k, Sampler()).tokens.tolist()


def test_most_recent_match_of_the_longest_ngram_wins():
    drafter = PromptLookupDrafter(max_ngram=2)
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 1, 5, 6, 8, 9, 2, 5, 6]
    assert propose(drafter, tokens) == [8, 9, 2]  # "5 6" last seen at 4, followed by 8 9 2


def test_falls_back_to_shorter_ngrams_and_to_nothing():
    drafter = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    assert propose(drafter, [4, 1, 2, 3, 7, 2]) == [3, 7, 2]  # only the unigram "2" recurs
    assert propose(drafter, [1, 2, 3, 4]) == []  # no earlier occurrence of anything
    assert propose(PromptLookupDrafter(max_ngram=3, min_ngram=2), [4, 1, 2, 3, 7, 2]) == []
    assert propose(drafter, [9]) == []  # a one-token context has nothing earlier


def test_bad_ngram_bounds():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="1 <= min_ngram"):
        PromptLookupDrafter(max_ngram=2, min_ngram=0)


@pytest.mark.parametrize("k", [1, 4, 10])
def test_greedy_identity_and_real_acceptance_on_repetitive_text(k):
    # On a 16-token vocabulary n-grams recur constantly, so lookups are often right.
    target = build("llama", 64, 2, seed=0, vocab=16)
    ids = prompt(24, vocab=16)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=80, do_sample=False,
                               pad_token_id=0, eos_token_id=[])
    out = speculative_generate(target, PromptLookupDrafter(), ids, max_new_tokens=80, num_draft_tokens=k,
                               eos_token_id=[])
    assert torch.equal(out.sequences, expected)
    assert out.stats.accepted_tokens > 0
    assert out.stats.draft_forward_calls == 0
