"""Helpers for the graded notebooks' test cells (and anyone testing a decoder).

A correct answer must never lose points to a warning or progress bar on stderr (nbgrader
scores a cell with any stderr output as 0), and a looping answer must cost its own test cell,
not the whole class's time. Tests also need to see *how* an answer works, not only what it
returns: a decoder that never calls its draft produces the right tokens too.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch


def under_autograder() -> bool:
    """True inside ``autograder/grade.py`` (it sets ``SPECDEC_GRADING=1``): ungraded
    benchmark cells skip themselves there, so a slow or looping answer is not run again."""
    return os.environ.get("SPECDEC_GRADING") == "1"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings, library logging and anything printed to stderr inside the block."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def time_limit(seconds: float, what: str = "this call") -> Iterator[None]:
    """Raise ``TimeoutError`` if the block runs longer than ``seconds`` (main thread, Unix)."""
    def expire(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds:g} s (an infinite loop?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def hidden_case(case: str) -> Iterator[None]:
    """Name a hidden test case in its failure, in words, never by its inputs.

    ``case`` describes the case, e.g. ``"with a one-token prompt"``. A failing assertion inside
    the block is raised again as ``AssertionError("hidden case <case>: <its message>")`` (so the
    messages of checks run in hidden cases must not quote their inputs); any other exception, for
    example one the answer raises, becomes an ``AssertionError`` naming the case and the error's
    type and first line (shortened): the feedback shows what failed without the hidden test.
    """
    try:
        yield
    except AssertionError as error:
        message = _first_line(error, limit=400)
        raise AssertionError(f"hidden case {case}: {message}" if message else f"hidden case {case} failed") from None
    except Exception as error:  # noqa: BLE001 (any error of the answer is reported the same way)
        detail = _first_line(error)
        raise AssertionError(f"hidden case {case}: your code raised {type(error).__name__}"
                             + (f": {detail}" if detail else "")) from None


class TickingClock:
    """What ``ticking_clock`` yields: ``readings`` counts the clock readings the block took."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.readings = 0

    def seconds(self) -> float:
        self.readings += 1
        return self.readings * self.step


@contextlib.contextmanager
def ticking_clock(step: float) -> Iterator[TickingClock]:
    """Inside the block, ``time``'s clocks read by this thread advance exactly ``step`` seconds
    per reading, whatever the code between two readings costs.

    A timing answer then gives one exact figure: a bandwidth test can check the bytes an answer
    counts without the noise of a shared machine (a triad that counts one array of three is 3x
    off, and machines vary by more than that between runs). ``perf_counter``, ``monotonic``,
    ``time`` and their ``_ns`` twins all read the one ticking clock; other threads (the kernel's
    own) keep the real clocks, so they cannot advance it.
    """
    clock = TickingClock(step)
    reader = threading.get_ident()
    names = ("perf_counter", "monotonic", "time")
    real = {name: getattr(time, name) for name in names} | {f"{n}_ns": getattr(time, f"{n}_ns") for n in names}

    def seconds_or_real(name: str):
        return lambda: clock.seconds() if threading.get_ident() == reader else real[name]()

    def nanoseconds_or_real(name: str):
        return lambda: round(clock.seconds() * 1e9) if threading.get_ident() == reader else real[name]()

    for name in names:
        setattr(time, name, seconds_or_real(name))
        setattr(time, f"{name}_ns", nanoseconds_or_real(f"{name}_ns"))
    try:
        yield clock
    finally:
        for name, function in real.items():
            setattr(time, name, function)


class CountingModel:
    """Wrap a model and record every forward call: how many, and how many new positions each
    fed (``input_lengths``) on top of how long a cache (``cache_lengths``, None without one).

    Everything else (``config``, ``device``, ...) is the wrapped model's, so an answer can use
    the wrapper wherever it would use the model.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.input_lengths: list[int] = []
        self.cache_lengths: list[int | None] = []

    @property
    def calls(self) -> int:
        return len(self.input_lengths)

    def reset(self) -> None:
        self.input_lengths.clear()
        self.cache_lengths.clear()

    def __call__(self, input_ids: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        ids = input_ids if input_ids is not None else kwargs.get("input_ids")
        self.input_lengths.append(int(ids.shape[-1]) if ids is not None else 0)
        cache = kwargs.get("past_key_values")
        self.cache_lengths.append(int(cache.get_seq_length()) if cache is not None else None)
        return self.model(input_ids, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper does not define.
        return getattr(self.model, name)
