"""specdec_ref.paired: the rotation, paired ratios, the words they choose, and costs read off runs."""
from __future__ import annotations

import pytest

from specdec_ref.paired import (SpeedCheck, beyond_same_work, decode_step_seconds, gap_from_one, in_run_costs, in_run_problem,
                                load_since_last_call, paid_costs, paired_ratio, recording, side_of, speed_phrase,
                                speed_verdict, split_rounds, time_rotated)
from specdec_ref.stats import GenerationOutput, GenerationStats


def fake_clock_and_fns(costs):
    """Functions that advance a virtual clock by their cost, and record the order they ran in."""
    state = {"now": 0.0, "order": []}

    def make(name):
        def run():
            state["now"] += costs[name]
            state["order"].append(name)
        return run
    return (lambda: state["now"]), {name: make(name) for name in costs}, state


def test_time_rotated_rotates_the_order_and_times_each_call():
    clock, fns, state = fake_clock_and_fns({"a": 3.0, "b": 2.0, "c": 1.0})
    seconds = time_rotated(fns, warmup=1, repeats=3, clock=clock)
    assert seconds == {"a": [3.0] * 3, "b": [2.0] * 3, "c": [1.0] * 3}
    # warm-up in order, then each round starts one method later
    assert state["order"] == list("abc") + list("abc") + list("bca") + list("cab")


def test_time_rotated_rejects_bad_arguments():
    with pytest.raises(ValueError):
        time_rotated({}, repeats=1)
    with pytest.raises(ValueError):
        time_rotated({"a": lambda: None}, repeats=0)


def test_paired_ratio_is_per_round():
    ratio, (low, high) = paired_ratio([2.0, 4.0, 3.0], [1.0, 2.0, 1.0])
    assert ratio == 2.0 and low == 2.0 and high == 2.5
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


@pytest.mark.parametrize("ratio, spread, verdict", [
    (1.3, (1.1, 1.4), "faster"),
    (0.5, (0.4, 0.6), "slower"),
    (1.05, (0.98, 1.13), "no measurable difference"),
    (1.0, (1.0, 1.0), "no measurable difference"),
])
def test_speed_verdict_names_a_side_only_when_the_whole_spread_is_on_it(ratio, spread, verdict):
    assert speed_verdict(ratio, spread) == verdict
    phrase = speed_phrase(ratio, spread, "the baseline")
    assert "the baseline" in phrase and f"{spread[0]:.2f}-{spread[1]:.2f}" in phrase
    assert ("no measurable difference" in phrase) == (verdict == "no measurable difference")


def test_side_of():
    assert side_of((1.6, 1.8), (1.3, 1.5)) == "above"
    assert side_of((0.9, 1.1), (1.3, 1.5)) == "below"
    assert side_of((1.4, 1.6), (1.3, 1.5)) == "overlapping"


def test_in_run_costs_uses_the_baselines_decode_steps_as_the_unit():
    # two baseline runs: prefill + 4 decode steps of 10 ms each
    base = [GenerationStats(target_forward_calls=5, prefill_seconds=0.05, verify_seconds=0.04) for _ in range(2)]
    # 3 iterations: 12 draft passes of 2 ms, verification passes of 15 ms
    spec = [GenerationStats(iterations=3, draft_forward_calls=12, draft_seconds=0.024, verify_seconds=0.045)]
    c, v = in_run_costs(base, spec)
    assert c == pytest.approx(0.2) and v == pytest.approx(1.5)
    with pytest.raises(ValueError):
        in_run_costs([], spec)


def test_paid_costs_are_the_median_over_rounds_of_each_rounds_costs():
    # three rounds of one prompt each; the second round's draft passes were slowed by something else
    base = [GenerationStats(target_forward_calls=5, prefill_seconds=0.05, verify_seconds=0.04) for _ in range(3)]
    spec = [GenerationStats(iterations=3, draft_forward_calls=12, draft_seconds=seconds, verify_seconds=0.045)
            for seconds in (0.024, 0.240, 0.030)]
    assert split_rounds(spec, 3) == [[spec[0]], [spec[1]], [spec[2]]]
    assert decode_step_seconds(base) == pytest.approx(0.01)
    c, v = paid_costs(base, spec, 3)
    assert c == pytest.approx(0.25) and v == pytest.approx(1.5)  # the disturbed round sets neither


def test_in_run_problem_names_flagged_timings_and_impossible_costs():
    clean = SpeedCheck(ratio=1.3, spread=(1.2, 1.4), pairs=9, ceiling=2.0, problems=())
    flagged = SpeedCheck(ratio=3.0, spread=(2.8, 3.1), pairs=9, ceiling=2.0, problems=("above the ceiling",))
    assert in_run_problem(clean, (0.2, 1.5), 3) == ""
    assert in_run_problem(flagged, (0.2, 1.5), 3) == "read from a flagged timing"
    assert "0.80 plain steps" in in_run_problem(clean, (0.1, 0.5), 3)  # 3 * 0.1 + 0.5 < 1


def test_load_since_last_call_counts_this_process_apart():
    load_since_last_call()
    sum(i * i for i in range(3_000_000))  # keeps this process busy for a moment
    others, own = load_since_last_call()
    assert own > 0.2 and others >= 0.0


def test_recording_keeps_each_outputs_stats():
    into = []
    outputs = [GenerationOutput(sequences=None, stats=GenerationStats(new_tokens=n)) for n in (3, 4)]
    run = recording(lambda: outputs, into)
    assert run() == outputs and run() == outputs
    assert [s.new_tokens for s in into] == [3, 4, 3, 4]


@pytest.mark.parametrize("ratio, spread, same_work, verdict", [
    (0.88, (0.86, 0.89), 1.12, "within the same-work check"),   # lesson 6 idle: as far from 1 as the A/A check
    (0.91, (0.89, 0.93), 1.08, "slower"),                        # 0.09 from 1, beyond the A/A check's 0.08
    (1.30, (1.25, 1.35), 1.05, "faster"),
    (1.04, (0.98, 1.08), 1.01, "no measurable difference"),      # the spread straddles 1 whatever the check says
])
def test_a_gap_counts_only_beyond_the_same_work_check(ratio, spread, same_work, verdict):
    assert beyond_same_work(ratio, spread, same_work) == verdict
    phrase = speed_phrase(ratio, spread, "plain decoding", same_work=same_work)
    assert (f"{gap_from_one(same_work):.2f}" in phrase) == (verdict != "no measurable difference")


def test_gap_from_one_is_symmetric_as_printed():
    assert gap_from_one(0.88) == gap_from_one(1.12) == 0.12 and gap_from_one(1.0) == 0.0


def test_check_speed_reads_only_what_the_cost_model_allows():
    from specdec_ref.paired import check_speed, measured_until_readable, speedup_ceiling

    assert speedup_ceiling(2.0) == 2.0 and speedup_ceiling(3.0, 4, 0.25) == pytest.approx(1.5)
    clean = check_speed([1.3, 1.4, 1.35, 1.32, 1.38], tokens_per_pass=2.2, draft_passes_per_iteration=4,
                        min_draft_cost=0.05, verify_cost=1.1)
    assert clean.verdict == "faster" and not clean.problems and "over 5 pairs, above 1" in clean.phrase("plain decoding")
    # lesson 7's prompt lookup: a median above tau itself
    assert check_speed([1.2, 0.14, 4.69, 1.24, 1.3], tokens_per_pass=1.22).verdict == "not read"
    # lesson 5's k = 4: a plausible median with a quarter of the pairs far above the ceiling
    assert "a quarter of the pairs" in check_speed([1.29, 1.2, 4.22, 4.3, 1.25, 3.9, 1.1], tokens_per_pass=2.5).problems[0]
    assert "cheaper than a step" in check_speed([1.3] * 5, tokens_per_pass=2.5, verify_cost=0.52).problems[0]
    assert "fewer than the 5" in check_speed([1.3, 1.4, 1.2], tokens_per_pass=2.5).problems[0]
    assert check_speed([0.9, 1.2, 1.05, 1.0, 1.1]).verdict == "not resolved"
    assert check_speed([0.8, 0.85, 0.9, 0.82, 0.88]).verdict == "slower"
    # read as printed: an IQR shown as 1.00-1.03 straddles 1
    assert check_speed([1.004, 1.003, 1.01, 1.03, 1.02]).verdict == "not resolved"
    asked = []

    def measure(pairs):
        asked.append(pairs)
        return check_speed([1.3] * pairs, tokens_per_pass=2.0)

    assert measured_until_readable(measure).verdict == "faster" and asked == [5]
    asked.clear()
    assert measured_until_readable(lambda pairs: asked.append(pairs) or check_speed([3.0] * pairs, tokens_per_pass=2.0),
                                   max_pairs=20).verdict == "not read"
    assert asked == [5, 10, 20]


def test_time_speedup_measures_again_while_the_check_cannot_read_the_timing():
    import time

    from specdec_ref.paired import time_speedup

    calls = {"baseline": 0, "speculative": 0}

    def work(name, seconds):
        def run():
            calls[name] += 1
            time.sleep(seconds)
        return run

    # speculation twice as fast: readable at tau 3 (ceiling 3x) from the first five pairs after one warm-up
    check, timing = time_speedup(work("baseline", 0.004), work("speculative", 0.002), tokens_per_pass=3.0)
    assert check.verdict == "faster" and check.pairs == 5 and len(timing["ratios"]) == 5
    assert calls == {"baseline": 6, "speculative": 6}
    # the same timings read against tau 1.2 (at most 1.2x): impossible, so measured with 10, then 20 pairs
    calls.update(baseline=0, speculative=0)
    taus = []
    check, timing = time_speedup(work("baseline", 0.004), work("speculative", 0.002),
                                 tokens_per_pass=lambda: taus.append(1.2) or 1.2)
    assert check.verdict == "not read" and check.pairs == 20 and len(taus) == 3
    assert calls == {"baseline": 36, "speculative": 36}
    assert "above the 1.20x" in check.phrase("plain decoding")


def test_plot_speed_checks_draws_each_pair_its_median_and_ceiling_and_marks_what_is_not_read():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdec_ref.paired import FLAGGED_LABEL, plot_speed_checks

    read = SpeedCheck(ratio=1.3, spread=(1.2, 1.4), pairs=3, ceiling=1.5, problems=())
    flagged = SpeedCheck(ratio=3.0, spread=(2.8, 3.1), pairs=2, ceiling=2.0, problems=("above the ceiling",))
    fig, ax = plt.subplots()
    plot_speed_checks(ax, {"lookup": ([1.2, 1.3, 1.6], read), "head": ([2.8, 3.1], flagged)})
    from matplotlib.collections import PathCollection

    points = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_offsets().size]
    # lookup: two pairs at or under its ceiling filled, one above it a cross; head: two hollow points
    by_count = sorted((len(c.get_offsets()), tuple(c.get_offsets()[:, 1])) for c in points)
    assert by_count == [(1, (1.6,)), (2, (1.2, 1.3)), (2, (2.8, 3.1))]
    hollow = [c for c in points if len(c.get_offsets()) == 2 and not c.get_facecolor().size]
    assert [tuple(c.get_offsets()[:, 1]) for c in hollow] == [(2.8, 3.1)]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "a pair above its ceiling" in labels and FLAGGED_LABEL in labels
    assert [t.get_text() for t in ax.get_xticklabels()] == ["lookup", "head"]
    assert ax.get_ylabel() == "speedup over the baseline (x)"
    plt.close(fig)
