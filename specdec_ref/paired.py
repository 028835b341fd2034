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
:func:`specdec_ref.costs.measure_costs`. :func:`check_speed` is the check every printed verdict
on a speedup passes first: enough pairs, and nothing the cost model says cannot happen;
:func:`time_speedup` times plain against speculative decoding until that check can read the result.
:func:`paid_costs` and :func:`in_run_problem` read the costs a timed comparison paid, round by
round, and say when they cannot be used; :func:`load_since_last_call` says how busy the machine was.
:func:`plot_speed_checks` draws checked speedups, pair by pair, beside their ceilings.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from .stats import GenerationStats
from .timing import quartiles, time_paired


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


# Fewest pairs behind any verdict on a speed ratio.
MIN_PAIRS = 5
# A verification pass reads every weight a one-token step reads, and more activations: it costs at
# least one step. Measured below MIN_VERIFY_COST (one step less timing noise), the timing is wrong.
MIN_VERIFY_COST = 0.9
# Per-pair noise a quartile may add above the ceiling before the spread itself is implausible.
QUARTILE_SLACK = 1.25


def speedup_ceiling(tokens_per_pass: float, draft_passes_per_iteration: float = 0.0, min_draft_cost: float = 0.0,
                    min_verify_cost: float = 1.0) -> float:
    """The most speculative decoding can gain over plain decoding when every iteration yields
    ``tokens_per_pass`` tokens (tau) for one verification pass and ``draft_passes_per_iteration``
    draft steps, each at its cheapest plausible cost in target steps: tau / (passes x c_min + v_min).
    A measured speedup above it did not come from the decoding: the timing is off."""
    return tokens_per_pass / (draft_passes_per_iteration * min_draft_cost + min_verify_cost)


@dataclass(frozen=True)
class SpeedCheck:
    """A speed ratio (above 1: faster) from ``pairs`` paired runs, checked against the cost model.

    ``problems`` lists why the timing cannot be read as a result (too few pairs, a speedup above
    :func:`speedup_ceiling`, a verification pass cheaper than a step); ``verdict`` is "faster",
    "slower", "not resolved" (the interquartile range straddles 1), or "not read" when a problem
    stands."""

    ratio: float
    spread: tuple[float, float]
    pairs: int
    ceiling: float | None
    problems: tuple[str, ...]

    @property
    def verdict(self) -> str:
        if self.problems:
            return "not read"
        # as printed (two decimals): an IQR shown as 1.00-1.03 does not lie above 1
        verdict = speed_verdict(self.ratio, (round(self.spread[0], 2), round(self.spread[1], 2)))
        return "not resolved" if verdict == "no measurable difference" else verdict

    def phrase(self, reference: str) -> str:
        """The ratio, its spread and the verdict in words, after a subject: e.g. "ran 1.32x as fast
        as plain decoding (IQR 1.29-1.33 over 9 pairs, above 1)"."""
        low, high = self.spread
        figures = f"{self.ratio:.2f}x {reference}'s speed, IQR {low:.2f}-{high:.2f} over {self.pairs} pairs"
        if self.problems:
            return f"gave no reading ({figures}: {'; '.join(self.problems)})"
        if self.verdict == "faster":
            return f"ran faster than {reference} ({figures}, above 1)"
        if self.verdict == "slower":
            return f"ran slower than {reference} ({figures}, below 1)"
        return f"is not resolved against {reference} ({figures}, straddles 1)"


def check_speed(ratios: Sequence[float], tokens_per_pass: float | None = None, draft_passes_per_iteration: float = 0.0,
                min_draft_cost: float = 0.0, verify_cost: float | None = None, min_pairs: int = MIN_PAIRS) -> SpeedCheck:
    """Check per-pair speed ratios of speculative over plain decoding (above 1: faster) against the
    cost model: at least ``min_pairs`` pairs; the median no higher than :func:`speedup_ceiling` for
    the run's own ``tokens_per_pass`` (when given), the upper quartile no higher than
    :data:`QUARTILE_SLACK` times it; a measured ``verify_cost`` (one verification
    pass in one-token steps, when given) no lower than :data:`MIN_VERIFY_COST`. Ratios of two ways
    of plain decoding (no tokens per pass) get only the pair count checked."""
    ratios = list(ratios)
    if not ratios:
        raise ValueError("no pairs to check")
    ratio, spread = statistics.median(ratios), quartiles(ratios)
    problems = []
    if len(ratios) < min_pairs:
        problems.append(f"{len(ratios)} pairs, fewer than the {min_pairs} a verdict needs")
    ceiling = None
    if tokens_per_pass is not None:
        ceiling = speedup_ceiling(tokens_per_pass, draft_passes_per_iteration, min_draft_cost)
        if ratio > ceiling:
            problems.append(f"{ratio:.2f}x is above the {ceiling:.2f}x that {tokens_per_pass:.2f} tokens per target "
                            "pass allow")
        elif spread[1] > ceiling * QUARTILE_SLACK:
            problems.append(f"a quarter of the pairs are above {spread[1]:.2f}x, beyond the {ceiling:.2f}x that "
                            f"{tokens_per_pass:.2f} tokens per target pass allow")
    if verify_cost is not None and verify_cost < MIN_VERIFY_COST:
        problems.append(f"a verification pass measured at {verify_cost:.2f} of a decode step, cheaper than a step")
    return SpeedCheck(ratio, spread, len(ratios), ceiling, tuple(problems))


def measured_until_readable(measure: Callable[[int], SpeedCheck], pairs: int = MIN_PAIRS,
                            max_pairs: int = 4 * MIN_PAIRS) -> SpeedCheck:
    """``measure(pairs)``, measured again with twice the pairs while its check finds a problem,
    up to ``max_pairs``: the last check, which a caller prints as it is (a problem that stands is
    shown as one, never as a verdict)."""
    check = measure(pairs)
    while check.problems and pairs * 2 <= max_pairs:
        pairs *= 2
        check = measure(pairs)
    return check


def time_speedup(run_baseline: Callable[[], Any], run_speculative: Callable[[], Any],
                 tokens_per_pass: float | Callable[[], float] | None = None, draft_passes_per_iteration: float = 0.0,
                 min_draft_cost: float = 0.0, verify_cost: float | None = None, pairs: int = MIN_PAIRS,
                 max_pairs: int = 4 * MIN_PAIRS) -> tuple[SpeedCheck, dict]:
    """Plain against speculative decoding in alternating pairs (:func:`specdec_ref.timing.time_paired`,
    one warm-up pair), checked by :func:`check_speed` and measured again with twice the pairs while
    the check finds a problem (:func:`measured_until_readable`). ``tokens_per_pass`` is the runs' tau,
    or a function that reads it after each measurement (from the outputs the last runs stored).
    Returns the last check and the :func:`~specdec_ref.timing.time_paired` result it was read from
    (``ratios`` are baseline seconds / speculative seconds: above 1, speculation was faster)."""
    timings: list[dict] = []

    def measure(count: int) -> SpeedCheck:
        timings.append(time_paired(run_baseline, run_speculative, warmup=0 if timings else 1, repeats=count))
        tau = tokens_per_pass() if callable(tokens_per_pass) else tokens_per_pass
        return check_speed(timings[-1]["ratios"], tau, draft_passes_per_iteration, min_draft_cost, verify_cost)

    check = measured_until_readable(measure, pairs, max_pairs)
    return check, timings[-1]


def side_of(spread: tuple[float, float], band: tuple[float, float]) -> str:
    """Where a measured interquartile range lies against a predicted range: "above", "below", or
    "overlapping" when the two ranges share any value."""
    if spread[0] > band[1]:
        return "above"
    if spread[1] < band[0]:
        return "below"
    return "overlapping"


def decode_step_seconds(baseline: Iterable[GenerationStats]) -> float:
    """The plain decode step inside baseline runs: seconds per target pass after the prefill."""
    baseline = list(baseline)
    steps = sum(s.target_forward_calls - (1 if s.prefill_seconds else 0) for s in baseline)
    decode_seconds = sum(s.verify_seconds for s in baseline)
    if steps < 1 or decode_seconds <= 0:
        raise ValueError("need baseline runs with decode steps")
    return decode_seconds / steps


def in_run_costs(baseline: Iterable[GenerationStats], speculative: Iterable[GenerationStats]) -> tuple[float, float]:
    """(c, v) as generation runs paid them, in units of the baseline runs' own decode step (their
    target passes after the prefill): c = draft seconds per draft pass, v = verification seconds
    per verification pass, each a ratio of totals over the runs given (one stats per run). The
    draft seconds include the drafter's own bookkeeping around its passes."""
    spec = GenerationStats.combined(list(speculative))
    if not spec.iterations:
        raise ValueError("need speculative runs with iterations")
    step = decode_step_seconds(baseline)
    c = spec.draft_seconds / spec.draft_forward_calls / step if spec.draft_forward_calls else 0.0
    return c, spec.verify_seconds / spec.iterations / step


def split_rounds(stats: Sequence[GenerationStats], rounds: int) -> list[Sequence[GenerationStats]]:
    """The stats :func:`recording` kept over ``rounds`` timed calls, one list per call (each call
    ran the same prompts, one stats per prompt)."""
    size = len(stats) // rounds
    return [stats[i * size:(i + 1) * size] for i in range(rounds)]


def paid_costs(baseline: Sequence[GenerationStats], speculative: Sequence[GenerationStats],
               rounds: int) -> tuple[float, float]:
    """(c, v) as timed runs paid them (:func:`in_run_costs`), round by round, then the median over
    the rounds, so that one disturbed round cannot set them."""
    each = [in_run_costs(b, s) for b, s in zip(split_rounds(baseline, rounds), split_rounds(speculative, rounds))]
    return tuple(statistics.median(x) for x in zip(*each))


def in_run_problem(check: SpeedCheck, costs: tuple[float, float], k: int) -> str:
    """Why the in-run (c, v) of a measurement cannot stand for the drafter's costs ("" when they
    can): read from a timing :func:`check_speed` flagged, or a fully rejected iteration (k draft
    passes and a verification) cheaper than the plain step it replaces, which no run can pay."""
    c_run, v_run = costs
    if check.problems:
        return "read from a flagged timing"
    if k * c_run + v_run < 1:
        return f"a fully rejected iteration at {k * c_run + v_run:.2f} plain steps, cheaper than the step it replaces"
    return ""


_THIS_PROCESS = psutil.Process()


def load_since_last_call() -> tuple[float, float]:
    """Cores busy since the previous call: (other programs, this process), from the machine's CPU
    use and this process's (the first call reads since the process started)."""
    own = _THIS_PROCESS.cpu_percent() / 100
    return max(0.0, psutil.cpu_percent() / 100 * psutil.cpu_count() - own), own


def recording(fn: Callable[[], Iterable[Any]], into: list[GenerationStats]) -> Callable[[], list[Any]]:
    """``fn`` (which returns generation outputs) wrapped to append each output's stats to ``into``
    at every call, so the statistics of timed calls can be read afterwards."""
    def run() -> list[Any]:
        outputs = list(fn())
        into.extend(out.stats for out in outputs)
        return outputs
    return run


FLAGGED_LABEL = "flagged: timing the cost model rules out"


def plot_speed_checks(ax, checked: Mapping[str, tuple[Sequence[float], SpeedCheck]]) -> None:
    """Draw paired speedups on the matplotlib axes ``ax``, one column per method (name ->
    ``(ratios, check)``, the ratios baseline seconds over speculative seconds in the order run):
    a point per pair, the median, and the ceiling the method's tokens per pass allow. A flagged
    check's points are hollow and its median gray; a pair above the ceiling of a check that was
    read is a red cross (possible only through the clock's noise, so drawn apart)."""
    from matplotlib.lines import Line2D

    above = False
    for i, (ratios, check) in enumerate(checked.values()):
        x = [i + 0.3 * (j / max(len(ratios) - 1, 1) - 0.5) for j in range(len(ratios))]
        high = [not check.problems and check.ceiling is not None and r > check.ceiling for r in ratios]
        above |= any(high)
        ax.scatter([p for p, h in zip(x, high) if not h], [r for r, h in zip(ratios, high) if not h], zorder=3,
                   edgecolors="tab:blue", facecolors="none" if check.problems else "tab:blue")
        ax.scatter([p for p, h in zip(x, high) if h], [r for r, h in zip(ratios, high) if h], zorder=3, marker="x",
                   color="tab:red")
        ax.hlines(check.ratio, i - 0.25, i + 0.25, color="tab:gray" if check.problems else "tab:orange", linewidth=3)
        if check.ceiling is not None:
            ax.hlines(check.ceiling, i - 0.3, i + 0.3, color="tab:red", linestyle=":")
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(checked)), list(checked))
    ax.set_xlim(-0.6, len(checked) - 0.4)
    ax.set_ylabel("speedup over the baseline (x)")
    handles = [Line2D([], [], marker="o", linestyle="", color="tab:blue", label="one pair"),
               Line2D([], [], color="tab:orange", linewidth=3, label="median"),
               Line2D([], [], color="tab:red", linestyle=":", label="ceiling its tokens per pass allow"),
               Line2D([], [], color="black", linestyle="--", label="baseline (1x)")]
    if above:
        handles.append(Line2D([], [], marker="x", linestyle="", color="tab:red", label="a pair above its ceiling"))
    if any(check.problems for _, check in checked.values()):
        handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="tab:blue",
                              label=FLAGGED_LABEL))
    ax.legend(handles=handles, fontsize=8)
