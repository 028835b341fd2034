"""Paired timing: how to compare two ways of doing the same work on a busy machine.

Run A and B as pairs, alternating which goes first (so a slow moment or a warming cache hits
both alike), after a warm-up (first calls pay for allocation, lazy initialisation, page faults),
and summarise the per-pair ratios by their median and spread: one ratio per pair cancels the
load both runs of a pair saw, which a ratio of two separate medians does not.

Before timing anything, :func:`threads_for_timing` gives torch only the cores that other
processes leave idle: pairing cancels a slow moment, not threads that wait for a busy core.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch

from .kv_cache import new_cache, rollback

# torch's own choice at import, so that a later call can give threads back.
DEFAULT_THREADS = torch.get_num_threads()


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles (both the value itself for a single value)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def threads_to_use(cores: int, busy_cores: float, default: int = DEFAULT_THREADS) -> int:
    """torch threads for a machine with ``cores`` of which ``busy_cores`` are used by others:
    one per idle core (rounded), at least one, at most ``default``."""
    if cores < 1 or busy_cores < 0:
        raise ValueError(f"need cores >= 1 and busy_cores >= 0, got {cores} and {busy_cores}")
    return max(1, min(default, int(cores - busy_cores + 0.5)))


def threads_for_timing(sample_seconds: float = 0.5) -> str:
    """Set torch's thread count to the cores other processes leave idle; say what was found.

    torch's threads spin-wait for each other at the end of every parallel operation, so one
    thread that shares its core with a busy process stalls them all: on 2 cores beside one
    busy process, decode steps ran 50-100x slower with 2 threads. With one thread per idle
    core the figures are those of fewer cores, and noisier than on a quiet machine. The
    check sees only the ``sample_seconds`` it samples; call it again to re-check.
    """
    cores = psutil.cpu_count() or 1
    busy = psutil.cpu_percent(interval=sample_seconds) / 100 * cores  # this process sleeps meanwhile
    threads = threads_to_use(cores, busy)
    torch.set_num_threads(threads)
    if busy > 0.5:  # others hold over half a core (threads_to_use gives one up): figures of fewer cores
        fewer = f" instead of {DEFAULT_THREADS}" if threads < DEFAULT_THREADS else ""
        return (f"Other processes keep {busy:.1f} of {cores} cores busy: timing with {threads} torch thread(s)"
                f"{fewer}. Timings below are slower and noisier than on a quiet machine; rerun on an idle "
                f"machine to compare.")
    return f"Machine quiet ({busy:.1f} of {cores} cores busy elsewhere): timing with {threads} torch threads."


def time_paired(fn_a: Callable[[], Any], fn_b: Callable[[], Any], warmup: int = 1, repeats: int = 5,
                clock: Callable[[], float] = time.perf_counter) -> dict:
    """Time ``fn_a`` and ``fn_b`` in ``repeats`` alternating pairs after ``warmup`` untimed pairs.

    Returns seconds per call of each (``seconds_a``, ``seconds_b``, in pair order), the
    per-pair ratios ``seconds_a / seconds_b`` (above 1: B is faster), their median
    (``median_ratio``) and interquartile range (``ratio_spread``), and the median seconds of each.
    ``clock`` is injectable so that the protocol can be tested without real time.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn_a()
        fn_b()
    seconds_a: list[float] = []
    seconds_b: list[float] = []
    for i in range(repeats):
        order = ((fn_a, seconds_a), (fn_b, seconds_b)) if i % 2 == 0 else ((fn_b, seconds_b), (fn_a, seconds_a))
        for fn, seconds in order:
            start = clock()
            fn()
            seconds.append(clock() - start)
    ratios = [a / b for a, b in zip(seconds_a, seconds_b)]
    return {
        "seconds_a": seconds_a,
        "seconds_b": seconds_b,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "ratio_spread": quartiles(ratios),
        "median_seconds_a": statistics.median(seconds_a),
        "median_seconds_b": statistics.median(seconds_b),
    }


def decode_step(model: torch.nn.Module, context: int, seed: int = 0, batch: int = 1):
    """A function that decodes one (seeded random) token per sequence on a ``context``-token
    cache of ``batch`` sequences and rolls the cache back, so that every call does the same work."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, context + 1), generator=generator)
    return last_token_step(model, ids)


def last_token_step(model: torch.nn.Module, ids: torch.LongTensor) -> Callable[[], None]:
    """A function that runs ``model`` on the last token of ``ids`` ([batch, n]) on a cache of the
    others and rolls the cache back, so that every call does the same work."""
    ids = ids.to(model.device)
    context = ids.shape[1] - 1
    cache = new_cache(model)
    model(ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)

    def step() -> None:
        model(ids[:, context:], past_key_values=cache, use_cache=True, logits_to_keep=1)
        rollback(cache, context)
    return step
