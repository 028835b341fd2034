"""Bad requests get a clear error before any model runs, and leave nothing corrupted."""
from __future__ import annotations

import pytest
import torch

from factories import build, prompt
from specdec_ref import Proposal, autoregressive_generate, speculative_generate


@pytest.fixture(scope="module")
def models():
    target = build("llama", 64, 2, seed=0)
    return target, build("llama", 32, 1, seed=2)


def speculative(models, input_ids=None, **kwargs):
    target, draft = models
    input_ids = prompt(6) if input_ids is None else input_ids
    return speculative_generate(target, kwargs.pop("draft", draft), input_ids, **kwargs)


@pytest.mark.parametrize("k", [0, -1, 2.5, None])
def test_bad_k(models, k):
    with pytest.raises(ValueError, match=r"num_draft_tokens \(k\) must be an integer >= 1"):
        speculative(models, num_draft_tokens=k)


@pytest.mark.parametrize("confidence", [0, 1, 1.5, -0.2, "0.4"])
def test_bad_min_draft_confidence(models, confidence):
    with pytest.raises(ValueError, match=r"min_confidence must be a probability in \(0, 1\)"):
        speculative(models, min_draft_confidence=confidence)


def test_min_draft_confidence_is_for_draft_models(models):
    from specdec_ref.ngram import PromptLookupDrafter

    with pytest.raises(ValueError, match="applies to draft models"):
        speculative(models, draft=PromptLookupDrafter(), min_draft_confidence=0.4)


@pytest.mark.parametrize("generate", ["baseline", "speculative"])
def test_negative_max_new_tokens(models, generate):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        if generate == "baseline":
            autoregressive_generate(models[0], prompt(6), max_new_tokens=-1)
        else:
            speculative(models, max_new_tokens=-1)


def test_zero_new_tokens_returns_the_prompt(models):
    ids = prompt(6)
    for out in (speculative(models, ids, max_new_tokens=0), autoregressive_generate(models[0], ids, max_new_tokens=0)):
        assert torch.equal(out.sequences, ids)
        assert out.stats.new_tokens == 0 and out.stats.target_forward_calls == 0


@pytest.mark.parametrize("empty", [torch.empty(1, 0, dtype=torch.long), torch.empty(0, dtype=torch.long)])
def test_empty_prompt(models, empty):
    with pytest.raises(ValueError, match="the prompt is empty"):
        speculative(models, empty)
    with pytest.raises(ValueError, match="the prompt is empty"):
        autoregressive_generate(models[0], empty)


def test_batch_is_refused_with_the_reason(models):
    with pytest.raises(ValueError, match="batch size 2 is not supported: each prompt accepts a different number"):
        speculative(models, torch.cat([prompt(6), prompt(6, seed=1)]))


def test_float_input_ids(models):
    with pytest.raises(TypeError, match="integer torch.Tensor"):
        speculative(models, torch.ones(1, 4))


def test_different_vocabularies_point_to_the_cross_tokenizer_path(models):
    target, _ = models
    other_vocab = build("llama", 32, 1, seed=3, vocab=300)
    with pytest.raises(ValueError, match="vocabularies differ \\(300 vs 384.*target_tokenizer= and draft_tokenizer="):
        speculative_generate(target, other_vocab, prompt(6))


def test_draft_of_the_wrong_type(models):
    with pytest.raises(TypeError, match="draft must be a transformers causal LM or a Drafter"):
        speculative(models, draft="zoo:draft")


@pytest.mark.parametrize("generate", ["baseline", "speculative"])
def test_prompt_longer_than_the_context(models, generate):
    ids = prompt(250)
    with pytest.raises(ValueError, match="prompt \\+ max_new_tokens = 260 tokens exceeds the .*context length of 256"):
        if generate == "baseline":
            autoregressive_generate(models[0], ids, max_new_tokens=10)
        else:
            speculative(models, ids, max_new_tokens=10)


def test_draft_with_a_shorter_context(models):
    target, _ = models
    short_draft = build("llama", 32, 1, seed=2, context=64)
    with pytest.raises(ValueError, match="draft model's context length of 64"):
        speculative_generate(target, short_draft, prompt(60), max_new_tokens=10)


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0),
                                 dict(top_p=1.5)])
def test_bad_sampling_settings(models, bad):
    with pytest.raises(ValueError, match="temperature must be > 0|top_k must be|top_p must be"):
        speculative(models, do_sample=True, **bad)


def test_greedy_ignores_temperature(models):
    """transformers ignores temperature when do_sample=False, with a warning; so do we (same output)."""
    target, draft = models
    ids = prompt(6)
    with pytest.warns(UserWarning, match="temperature=0.0 is ignored when do_sample=False"):
        a = speculative_generate(target, draft, ids, max_new_tokens=10, temperature=0.0)
    assert torch.equal(a.sequences, speculative_generate(target, draft, ids, max_new_tokens=10).sequences)


def test_errors_leave_models_and_inputs_untouched(models):
    target, draft = models
    ids = prompt(6)
    before = speculative_generate(target, draft, ids, max_new_tokens=20).sequences
    ids_copy = ids.clone()
    weights = {name: p.clone() for name, p in target.named_parameters()}
    for bad in (dict(num_draft_tokens=0), dict(max_new_tokens=-3), dict(max_new_tokens=10_000),
                dict(do_sample=True, temperature=0)):
        with pytest.raises(ValueError):
            speculative_generate(target, draft, ids, **({"max_new_tokens": 20} | bad))
    assert torch.equal(ids, ids_copy)
    assert all(torch.equal(p, weights[name]) for name, p in target.named_parameters())
    assert torch.equal(speculative_generate(target, draft, ids, max_new_tokens=20).sequences, before)


class OvershootingDrafter:
    """A drafter that ignores its budget (a bug the loop must catch, not overflow on)."""

    def start(self, prompt, max_new_tokens):
        pass

    def propose(self, tokens, max_tokens, sampler):
        return Proposal(torch.full((max_tokens + 2,), 5))

    def update(self, tokens, num_accepted):
        pass


def test_a_drafter_that_overshoots_its_budget(models):
    with pytest.raises(ValueError, match="OvershootingDrafter.propose returned 6 tokens; it was asked for at most 4"):
        speculative(models, draft=OvershootingDrafter(), num_draft_tokens=4, max_new_tokens=20)
