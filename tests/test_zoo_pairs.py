"""The shipped zoo through every drafter: greedy identity on held-out prompts, and the
tokenizer report on the zoo's own pairs (identical, chat-template-only, genuinely different)."""
from __future__ import annotations

import pytest
import torch

from specdec_ref import GenerationStats, PromptLookupDrafter, autoregressive_generate, compare_tokenizers, speculative_generate, zoo
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


@pytest.mark.parametrize("drafter, min_confidence", [("draft", None), ("draft", 0.4), ("draft-xtok", None),
                                                     ("draft-xtok", 0.4), ("ngram", None)])
def test_greedy_identity_on_the_zoo(zoo_models, prompts, drafter, min_confidence):
    target, tokenizer, draft, xtok, xtok_tokenizer = zoo_models
    kwargs = {"draft": draft, "draft-xtok": xtok, "ngram": PromptLookupDrafter()}[drafter]
    tokenizers = ({"target_tokenizer": tokenizer, "draft_tokenizer": xtok_tokenizer}
                  if drafter == "draft-xtok" else {})
    runs = []
    for ids in prompts:
        expected = autoregressive_generate(target, ids, max_new_tokens=64).sequences
        out = speculative_generate(target, kwargs, ids, max_new_tokens=64, num_draft_tokens=4,
                                   min_draft_confidence=min_confidence, **tokenizers)
        assert torch.equal(out.sequences, expected)
        runs.append(out.stats)
    total = GenerationStats.combined(runs)
    assert total.accepted_tokens > 0  # the drafts really are used, not just verified away
    if min_confidence is not None:  # unsure drafts stop early: fewer draft passes than k (+1 for UAG)
        assert total.draft_forward_calls < 4 * total.iterations


def test_zoo_tokenizer_reports():
    target, draft, xtok = (zoo.load_tokenizer(f"zoo:{n}") for n in ("target", "draft", "draft-xtok"))
    chat_target, chat_draft = zoo.load_tokenizer("zoo:target-chat"), zoo.load_tokenizer("zoo:draft-chat")
    assert compare_tokenizers(target, draft).differences == []
    chat = compare_tokenizers(chat_target, chat_draft)
    assert chat.native_ok and [d.category for d in chat.differences] == ["chat_template"]
    different = compare_tokenizers(target, xtok)
    assert not different.native_ok and different.vocab_sizes == (len(target), len(xtok))
    assert len(target) != len(xtok)
