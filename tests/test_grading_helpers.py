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


def test_ticking_clock_gives_every_interval_one_step_in_every_clock_and_restores_them():
    import statistics
    import threading
    import time

    real_perf_counter = time.perf_counter
    seen_by_another_thread = []
    with grading.ticking_clock(0.001) as clock:
        starts_and_ends = []
        for _ in range(3):
            start = time.perf_counter()
            sum(range(200_000))  # real work between readings does not change the interval
            starts_and_ends.append(time.perf_counter() - start)
        ns = time.perf_counter_ns()
        assert time.perf_counter_ns() - ns == 1_000_000
        assert time.monotonic() < time.time()  # one clock: each reading is one step later
        worker = threading.Thread(target=lambda: seen_by_another_thread.append(time.perf_counter()))
        worker.start()
        worker.join()
    assert statistics.median(starts_and_ends) == pytest.approx(0.001, rel=1e-9)
    assert clock.readings == 10
    # another thread reads the real clock (large: seconds since boot), and did not advance this one
    assert seen_by_another_thread[0] > 1.0 and clock.readings == 10
    assert time.perf_counter is real_perf_counter and time.perf_counter() > 1.0


def test_ticking_clock_restores_the_clocks_when_the_block_raises():
    import time

    real = (time.perf_counter, time.perf_counter_ns, time.monotonic, time.time_ns)
    with pytest.raises(ValueError):
        with grading.ticking_clock(0.5):
            raise ValueError("the answer failed")
    assert (time.perf_counter, time.perf_counter_ns, time.monotonic, time.time_ns) == real
