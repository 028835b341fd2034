"""specdec_ref.timing: the paired protocol and the thread check the lessons run first."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from specdec_ref import timing


def test_time_paired_alternates_order_and_reports_per_pair_ratios():
    calls: list[str] = []
    now = [0.0]

    def clock() -> float:
        return now[0]

    def work(name: str, seconds: float):
        def run():
            calls.append(name)
            now[0] += seconds
        return run

    result = timing.time_paired(work("a", 2.0), work("b", 1.0), warmup=1, repeats=4, clock=clock)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert result["ratios"] == [2.0] * 4
    assert result["median_ratio"] == 2.0
    assert result["median_seconds_a"] == 2.0 and result["median_seconds_b"] == 1.0
    with pytest.raises(ValueError, match="repeats"):
        timing.time_paired(work("a", 1), work("b", 1), repeats=0)


@pytest.mark.parametrize("cores, busy, default, expected", [
    (2, 0.1, 2, 2),   # quiet: torch's default
    (2, 1.0, 2, 1),   # one busy core of two: one thread
    (2, 2.0, 2, 1),   # all busy: still one
    (8, 1.0, 4, 4),   # enough idle cores for the default
    (8, 5.6, 4, 2),
])
def test_threads_to_use_is_one_per_idle_core_within_the_default(cores, busy, default, expected):
    assert timing.threads_to_use(cores, busy, default) == expected


def test_threads_to_use_rejects_impossible_machines():
    with pytest.raises(ValueError, match="cores"):
        timing.threads_to_use(0, 0.0)
    with pytest.raises(ValueError, match="busy"):
        timing.threads_to_use(2, -1.0)


@pytest.mark.quiet_machine  # scripts/test.sh runs it alone, after the two streams
def test_threads_for_timing_gives_way_to_a_busy_process_and_takes_threads_back():
    cores = timing.psutil.cpu_count()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)
        message = timing.threads_for_timing()
        assert torch.get_num_threads() == 1
        assert "busy" in message and "1 torch thread" in message
    finally:
        for process in busy:
            process.kill()
            process.wait()
    # Quiet again once the busy processes are gone: the default comes back (within a minute: a
    # process that was starting or ending meanwhile may still hold a core).
    for _ in range(12):
        time.sleep(0.5)
        message = timing.threads_for_timing()
        if message.startswith("Machine quiet"):
            break
        time.sleep(4.5)
    assert torch.get_num_threads() == timing.DEFAULT_THREADS, message
    assert message.startswith("Machine quiet")
