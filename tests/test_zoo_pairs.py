"""The shipped zoo through every drafter: greedy identity on held-out prompts, and the
tokenizer report on the zoo's own pairs (identical, chat-template-only, genuinely different)."""
from __future__ import annotations

import pytest
import torch

from specdec_ref import PromptLookupDrafter, autoregressive_generate, compare_tokenizers, speculative_generate, zoo
from specdec_ref.zoo.corpus import heldout_prompts


@pytest.fixture(scope="module")
def zoo_models():
    target, tokenizer = zoo.load("zoo:target")
    draft, _ = zoo.load("zoo:draft")
    xtok, xtok_tokenizer = zoo.load("zoo:draft-xtok")
    return target, tokenizer, draft, xtok, xtok_tokenizer


@pytest.fixture(scope="module")
def prompts(zoo_models):
    tokenizer = zoo_models[1]
    return [tokenizer(p, return_tensors="pt").input_ids for p in heldout_prompts(3)]


@pytest.mark.parametrize("drafter", ["draft", "draft-xtok", "ngram"])
def test_greedy_identity_on_the_zoo(zoo_models, prompts, drafter):
    target, tokenizer, draft, xtok, xtok_tokenizer = zoo_models
    kwargs = {"draft": draft, "draft-xtok": xtok, "ngram": PromptLookupDrafter()}[drafter]
    tokenizers = ({"target_tokenizer": tokenizer, "draft_tokenizer": xtok_tokenizer}
                  if drafter == "draft-xtok" else {})
    accepted = 0
    for ids in prompts:
        expected = autoregressive_generate(target, ids, max_new_tokens=64).sequences
        out = speculative_generate(target, kwargs, ids, max_new_tokens=64, num_draft_tokens=4, **tokenizers)
        assert torch.equal(out.sequences, expected)
        accepted += out.stats.accepted_tokens
    assert accepted > 0  # the drafts really are used, not just verified away


def test_zoo_tokenizer_reports():
    target, draft, xtok = (zoo.load_tokenizer(f"zoo:{n}") for n in ("target", "draft", "draft-xtok"))
    chat_target, chat_draft = zoo.load_tokenizer("zoo:target-chat"), zoo.load_tokenizer("zoo:draft-chat")
    assert compare_tokenizers(target, draft).differences == []
    chat = compare_tokenizers(chat_target, chat_draft)
    assert chat.native_ok and [d.category for d in chat.differences] == ["chat_template"]
    different = compare_tokenizers(target, xtok)
    assert not different.native_ok and different.vocab_sizes == (len(target), len(xtok))
    assert len(target) != len(xtok)
