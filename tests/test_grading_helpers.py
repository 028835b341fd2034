"""specdec_ref.grading: the helpers the graded notebooks' test cells use."""
from __future__ import annotations

import pytest

from specdec_ref import grading


def test_hidden_case_names_the_case_and_keeps_the_check_message():
    with pytest.raises(AssertionError) as failure:
        with grading.hidden_case("with a one-token prompt"):
            assert 1 == 2, "the output differs from greedy decoding"
    assert str(failure.value) == "hidden case with a one-token prompt: the output differs from greedy decoding"


def test_hidden_case_without_a_message_still_says_which_case():
    with pytest.raises(AssertionError, match=r"^hidden case when k is 1 failed$"):
        with grading.hidden_case("when k is 1"):
            raise AssertionError()


def test_hidden_case_turns_an_answer_error_into_a_short_assertion():
    def answer():
        raise RuntimeError("cannot reshape tensor of 0 elements into shape [1, 0, -1, 32]\nmore detail " + "x" * 500)

    with pytest.raises(AssertionError) as failure:
        with grading.hidden_case("with a one-token prompt"):
            answer()
    message = str(failure.value)
    assert message.startswith("hidden case with a one-token prompt: your code raised RuntimeError: cannot reshape")
    assert "more detail" not in message and len(message) < 250
    assert failure.value.__cause__ is None and failure.value.__suppress_context__


def test_hidden_case_passes_quietly_and_lets_interrupts_through():
    with grading.hidden_case("that passes"):
        value = 1 + 1
    assert value == 2
    with pytest.raises(KeyboardInterrupt):
        with grading.hidden_case("interrupted"):
            raise KeyboardInterrupt
