"""Bootstrap intervals on a P99 and on a ratio of two, and the calls they allow
(ts_microbatch.tools.intervals): coverage on a known distribution, seeded, no timing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ts_microbatch.tools import intervals
from ts_microbatch.tools.intervals import LOSS, SAME, WIN


def exponential(n: int, seed: int, mean: float = 1.0) -> list[float]:
    return list(np.random.default_rng(seed).exponential(mean, n))


def test_the_p99_interval_covers_the_true_p99_about_95_times_in_100() -> None:
    true_p99 = math.log(100)  # of an exponential of mean 1
    trials = 120
    covered = 0
    for trial in range(trials):
        found = intervals.percentile_interval(exponential(1500, trial), 99, resamples=400)
        assert found.low <= found.value <= found.high and found.samples == 1500
        covered += found.low <= true_p99 <= found.high
    # 95% nominal; a percentile bootstrap of a tail runs a little under it. With 120 trials
    # the binomial spread is about +-2 points.
    assert 0.85 <= covered / trials <= 0.995, covered


def test_the_interval_is_seeded_and_narrows_with_more_answers() -> None:
    few = intervals.percentile_interval(exponential(20, 1), 99)
    many = intervals.percentile_interval(exponential(1500, 1), 99)
    assert intervals.percentile_interval(exponential(1500, 1), 99) == many  # same seed
    assert few.value == max(exponential(20, 1))  # a P99 of 20 answers is their maximum
    assert many.high - many.low < few.high - few.low


def test_a_ratio_of_clearly_different_samples_excludes_1_and_is_called() -> None:
    slow, fast = exponential(1500, 1, mean=1.5), exponential(1500, 2)
    ratio = intervals.ratio_interval(slow, fast, 99)
    assert ratio.value == pytest.approx(1.5, rel=0.25)
    assert ratio.low > 1  # the scenario: the interval excludes 1
    assert intervals.call(ratio) == LOSS
    assert intervals.call(intervals.ratio_interval(fast, slow, 99)) == WIN


def test_a_ratio_of_the_same_distribution_includes_1_and_is_no_difference() -> None:
    for seed in range(5):
        ratio = intervals.ratio_interval(exponential(1500, seed), exponential(1500, 100 + seed))
        assert ratio.low <= 1 <= ratio.high
        assert intervals.call(ratio) == SAME


def test_a_point_estimate_alone_decides_nothing() -> None:
    # 2% apart at P99 on 1,500 answers each: the point ratio is under 1, the call is not.
    a, b = exponential(1500, 7), exponential(1500, 8)
    ratio = intervals.ratio_interval(a, b)
    assert ratio.value != 1 and intervals.call(ratio) == SAME


def test_unanswered_requests_count_as_slowest_and_two_lost_tails_are_equal() -> None:
    lost = [1.0] * 90 + [math.inf] * 10
    assert intervals.percentile(lost, 99) == math.inf
    ratio = intervals.ratio_interval(lost, lost)
    assert (ratio.value, ratio.low, ratio.high) == (1.0, 1.0, 1.0)
    assert intervals.call(intervals.ratio_interval([1.0] * 100, lost)) == WIN


def test_rounds_that_agree_are_pooled_and_rounds_that_disagree_must_each_say_so() -> None:
    a = [exponential(1500, 1, mean=2.0), exponential(1500, 2, mean=2.0)]
    b = [exponential(1500, 3), exponential(1500, 4)]
    pooled = intervals.compare_rounds(a, b)
    assert pooled["pooled"] and pooled["call"] == LOSS
    assert [r["call"] for r in pooled["rounds"]] == [LOSS, LOSS]
    # b's second round ran on a busy machine: 3x slower, its rounds disagree. Round 1 says
    # a loses, round 2 that a wins: no call.
    busy = [b[0], exponential(1500, 4, mean=3.0)]
    split = intervals.compare_rounds(a, busy)
    assert not split["pooled"]
    assert [r["call"] for r in split["rounds"]] == [LOSS, WIN]
    assert split["call"] == SAME


def test_an_empty_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        intervals.percentile_interval([], 99)


def test_percentile_is_nearest_rank() -> None:
    assert intervals.percentile([5, 1, 4, 2, 3], 50) == 3
    assert intervals.percentile(list(range(1, 101)), 99) == 99
    assert math.isnan(intervals.percentile([], 50))
