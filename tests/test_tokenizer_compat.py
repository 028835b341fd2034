"""The tokenizer compatibility report: identical, chat-template-only and genuinely different pairs."""
from __future__ import annotations

import copy

import pytest

from specdec_ref import compare_tokenizers

TEMPLATE_A = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
TEMPLATE_B = "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"


def test_identical_tokenizers(tokenizer_a):
    report = compare_tokenizers(tokenizer_a, copy.deepcopy(tokenizer_a))
    assert report.native_ok and report.differences == []
    assert "native path safe" in str(report) and "no differences found" in str(report)


def test_chat_template_only_difference_keeps_the_native_path(tokenizer_a):
    chat_a, chat_b = copy.deepcopy(tokenizer_a), copy.deepcopy(tokenizer_a)
    chat_a.chat_template, chat_b.chat_template = TEMPLATE_A, TEMPLATE_B
    report = compare_tokenizers(chat_a, chat_b)
    assert report.native_ok
    assert [d.category for d in report.differences] == ["chat_template"]
    effect = report.differences[0].effect
    assert "native path stays safe" in effect and "never from the chat template" in effect
    messages = [{"role": "user", "content": "hi"}]
    # What it does affect: the rendered prompt text, hence the prompt ids.
    assert chat_a.apply_chat_template(messages, tokenize=False) != chat_b.apply_chat_template(messages, tokenize=False)


def test_genuinely_different_tokenizers(tokenizer_a, tokenizer_b):
    report = compare_tokenizers(tokenizer_a, tokenizer_b)
    assert not report.native_ok
    categories = {d.category for d in report.differences}
    assert {"vocabulary", "model", "pre_tokenizer"} <= categories
    vocabulary = next(d for d in report.differences if d.category == "vocabulary")
    assert vocabulary.detail.startswith("384 vs 320 entries")
    assert "use the cross-tokenizer (UAG) path" in vocabulary.effect
    assert report.vocab_sizes == (384, 320)
    assert "NOT safe" in str(report)


def test_special_token_difference_is_named(tokenizer_a):
    other = copy.deepcopy(tokenizer_a)
    other.eos_token = "<pad>"
    report = compare_tokenizers(tokenizer_a, other)
    assert report.native_ok
    special = next(d for d in report.differences if d.category == "special_tokens")
    assert "eos_token: ('</s>', 2) vs ('<pad>', 0)" in special.detail


def test_html_rendering(tokenizer_a, tokenizer_b):
    html = compare_tokenizers(tokenizer_a, tokenizer_b)._repr_html_()
    assert html.startswith("<div>") and "<table>" in html and "vocabulary" in html and "NOT safe" in html


@pytest.mark.parametrize("bad", ["gpt2", None, object()])
def test_unknown_objects_are_refused(tokenizer_a, bad):
    with pytest.raises(TypeError, match="must be a transformers tokenizer"):
        compare_tokenizers(tokenizer_a, bad)
