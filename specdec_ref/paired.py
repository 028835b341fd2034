"""Comparisons a lesson prints: several methods timed in one rotation, paired ratios, and the words
that follow from a ratio and its spread (never from one run's numbers written into the prose).

:func:`time_rotated` extends :func:`specdec_ref.timing.time_paired` to more than two methods: every
round runs each method once, in an order that rotates from round to round, so any two methods
can be compared by their per-round ratios. :func:`speed_verdict` turns such a ratio into words
("faster", "slower" or "no measurable difference" when the spread straddles 1);
:func:`beyond_same_work` is stricter, naming a side only when the ratio is also further from 1
than a same-work (A/A) check's, two runs of the same work timed against each other.
:func:`in_run_costs` reads the draft cost ratio c and the verification cost v off the timings
that generation runs recorded, for comparison with the isolated passes of
:func:`specdec_ref.costs.measure_costs`.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .stats import GenerationStats
from .timing import quartiles


def time_rotated(fns: Mapping[str, Callable[[], Any]], warmup: int = 1, repeats: int = 3,
                 clock: Callable[[], float] = time.perf_counter, first_round: int = 0) -> dict[str, list[float]]:
    """Seconds of each call of every function in ``fns``, ``repeats`` rounds after ``warmup``
    untimed ones. Round i starts with the i-th method (cyclically) and runs the others in order,
    so each method goes first as often as the others; ``result[name][i]`` is round i's time.
    ``first_round``: the number of the first round, for a caller that runs one round at a time."""
    if repeats < 1 or warmup < 0 or not fns:
        raise ValueError(f"need repeats >= 1, warmup >= 0 and at least one function (got {repeats}, {warmup})")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(first_round, first_round + repeats):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock()
            fns[name]()
            seconds[name].append(clock() - start)
    return seconds


def paired_ratio(seconds_a: Iterable[float], seconds_b: Iterable[float]) -> tuple[float, tuple[float, float]]:
    """Median and interquartile range of the per-round ratios ``a / b`` (above 1: B is faster)."""
    ratios = [a / b for a, b in zip(seconds_a, seconds_b, strict=True)]
    if not ratios:
        raise ValueError("no rounds to compare")
    return statistics.median(ratios), quartiles(ratios)


def speed_verdict(ratio: float, spread: tuple[float, float]) -> str:
    """"faster", "slower" or "no measurable difference" for a speed ratio (above 1: faster) whose
    interquartile range is ``spread``: a side is named only when the whole range lies on it."""
    low, high = spread
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    return "no measurable difference"


def gap_from_one(ratio: float) -> float:
    """How far a ratio lies from 1, as printed (both rounded to two decimals first): 0.88 and
    1.12 are both 0.12 from 1, so a verdict drawn from gaps agrees with the figures shown."""
    return abs(round(float(f"{ratio:.2f}") * 100) - 100) / 100


def beyond_same_work(ratio: float, spread: tuple[float, float], same_work: float) -> str:
    """:func:`speed_verdict`, stricter: "faster" or "slower" only when, besides the whole spread
    lying on that side, the ratio's :func:`gap_from_one` exceeds that of ``same_work``, a ratio of
    a same-work (A/A) check (two runs of the same work timed against each other; pass its median
    or quartile farthest from 1, which shows how far the timing itself can be off); "within the same-work check" when it
    does not; "no measurable difference" when the spread straddles 1."""
    verdict = speed_verdict(ratio, spread)
    if verdict != "no measurable difference" and gap_from_one(ratio) <= gap_from_one(same_work):
        return "within the same-work check"
    return verdict


def speed_phrase(ratio: float, spread: tuple[float, float], reference: str, same_work: float | None = None) -> str:
    """A predicate for a speed ratio against ``reference`` (above 1: faster), with the figures that
    decide it, to follow a subject: e.g. "ran 1.32x as fast as the baseline (IQR 1.29-1.33, above 1)"
    or "showed no measurable difference from the baseline (median 1.05x, IQR 0.98-1.13 straddles 1)".
    With ``same_work`` (an A/A check's ratio, as :func:`beyond_same_work` takes it) the verdict is :func:`beyond_same_work`'s, and
    the phrase prints both gaps from 1 that decide it."""
    low, high = spread
    verdict = speed_verdict(ratio, spread) if same_work is None else beyond_same_work(ratio, spread, same_work)
    against = ("" if same_work is None else f"; {gap_from_one(ratio):.2f} from 1, more than the same-work check's "
               f"{gap_from_one(same_work):.2f}")
    if verdict == "faster":
        return f"ran {ratio:.2f}x as fast as {reference} (IQR {low:.2f}-{high:.2f}, above 1{against})"
    if verdict == "slower":
        return f"ran slower than {reference}, at {ratio:.2f}x its speed (IQR {low:.2f}-{high:.2f}, below 1{against})"
    if verdict == "within the same-work check":
        return (f"ran at {ratio:.2f}x the speed of {reference} (IQR {low:.2f}-{high:.2f}; {gap_from_one(ratio):.2f} "
                f"from 1, no more than the same-work check's {gap_from_one(same_work):.2f} at {same_work:.2f}x), "
                "not distinguishable from that check")
    return (f"showed no measurable difference from {reference} "
            f"(median {ratio:.2f}x, IQR {low:.2f}-{high:.2f} straddles 1)")


def side_of(spread: tuple[float, float], band: tuple[float, float]) -> str:
    """Where a measured interquartile range lies against a predicted range: "above", "below", or
    "overlapping" when the two ranges share any value."""
    if spread[0] > band[1]:
        return "above"
    if spread[1] < band[0]:
        return "below"
    return "overlapping"


def in_run_costs(baseline: Iterable[GenerationStats], speculative: Iterable[GenerationStats]) -> tuple[float, float]:
    """(c, v) as generation runs paid them, in units of the baseline runs' own decode step (their
    target passes after the prefill): c = draft seconds per draft pass, v = verification seconds
    per verification pass, each a ratio of totals over the runs given (one stats per run). The
    draft seconds include the drafter's own bookkeeping around its passes."""
    baseline, speculative = list(baseline), list(speculative)
    steps = sum(s.target_forward_calls - (1 if s.prefill_seconds else 0) for s in baseline)
    decode_seconds = sum(s.verify_seconds for s in baseline)
    spec = GenerationStats.combined(speculative)
    if steps < 1 or decode_seconds <= 0 or not spec.iterations:
        raise ValueError("need baseline runs with decode steps and speculative runs with iterations")
    step = decode_seconds / steps
    c = spec.draft_seconds / spec.draft_forward_calls / step if spec.draft_forward_calls else 0.0
    return c, spec.verify_seconds / spec.iterations / step


def recording(fn: Callable[[], Iterable[Any]], into: list[GenerationStats]) -> Callable[[], list[Any]]:
    """``fn`` (which returns generation outputs) wrapped to append each output's stats to ``into``
    at every call, so the statistics of timed calls can be read afterwards."""
    def run() -> list[Any]:
        outputs = list(fn())
        into.extend(out.stats for out in outputs)
        return outputs
    return run
