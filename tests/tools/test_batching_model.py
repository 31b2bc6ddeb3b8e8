"""The model of TorchServe's batch formation (ts_microbatch.tools.batching_model): batches
replayed as Model.pollBatch forms them, and the rate an objective allows."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from ts_microbatch.tools.batching_model import (
    replay,
    service_curve,
    shared_cores,
    sustained,
    tail_at,
)


def flat(ms: float) -> Callable[[int], float]:
    return lambda n: ms


def test_the_service_curve_interpolates_and_extrapolates_per_request() -> None:
    curve = service_curve({1: 10.0, 4: 16.0, 8: 40.0})
    assert [curve(1), curve(2), curve(4), curve(6), curve(8), curve(16)] == [
        10.0, 12.0, 16.0, 28.0, 40.0, 80.0,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="measured_ms"):
        service_curve({0: 1.0})
    noisy = service_curve({1: 17.0, 2: 15.0, 4: 52.0, 8: 41.0})  # a busy machine's noise
    assert [noisy(1), noisy(2), noisy(4), noisy(8)] == [17.0, 17.0, 52.0, 52.0]


def test_a_full_batch_leaves_at_its_last_arrival_a_short_one_at_the_window() -> None:
    full = replay([0.0, 0.002, 0.004, 0.006], 4, 10, flat(5))
    assert [(round(w.queue_ms, 6), round(w.window_ms, 6), w.service_ms) for w in full] == [
        (0, 6, 5), (0, 4, 5), (0, 2, 5), (0, 0, 5),
    ]  # fmt: skip
    short = replay([0.0, 0.020], 4, 10, flat(5))
    assert [round(w.total_ms, 6) for w in short] == [15, 15]  # each alone, a window each


def test_requests_queue_while_the_worker_runs_then_wait_for_a_window() -> None:
    waits = replay([0.0, 0.020, 0.021], 8, 10, flat(50))
    # The first waits out its window alone and runs until 60 ms; the two others queue
    # behind it, are taken together at 60 ms and wait a window for more.
    assert [round(w.queue_ms, 6) for w in waits] == [0, 40, 39]
    assert [round(w.window_ms, 6) for w in waits] == [10, 10, 10]


def test_a_window_of_zero_takes_two_queued_requests_at_most() -> None:
    # pollBatch's remaining delay is <= 0 after the second request: it stops there.
    waits = replay([0.0, 0.0, 0.0, 0.0, 0.0], 8, 0, lambda n: 10 * n)
    assert [w.service_ms for w in waits] == [20, 20, 20, 20, 10]


def test_the_tail_says_what_bounds_it() -> None:
    service = service_curve({1: 2.0, 32: 40.0})
    light = tail_at(20, 32, 50, service)
    assert light.bound == "window"  # few requests: batches wait out the window
    heavy = tail_at(700, 32, 50, service)
    assert heavy.bound in ("queue", "service") and heavy.p99_ms > light.p99_ms


def test_a_looser_objective_or_a_shorter_window_holds_more() -> None:
    service = service_curve({1: 2.0, 8: 8.0, 32: 40.0})
    tight = sustained(50, 32, 50, service)
    assert tight is None  # a 50 ms window and any service are over 50 ms
    loose = sustained(200, 32, 50, service)
    short = sustained(60, 32, 5, service)
    assert loose is not None and short is not None
    assert loose.p99_ms <= 200 and short.p99_ms <= 60 and short.rate_per_s > 0


def test_a_batch_runs_longer_as_the_frontend_takes_the_cores_it_would_use() -> None:
    # A batch keeping 1.5 cores busy alone, the frontend 5 ms of CPU a request, 2 cores.
    stretch = shared_cores(5.0, 1.5, 2.0)
    assert stretch(10.0) == 1.0  # 1.95 cores left: as fast as alone
    assert stretch(200.0) == pytest.approx(1.5)  # 1 core left
    assert stretch(400.0) == math.inf  # the frontend takes both
    service = service_curve({8: 40.0})  # 200 req/s alone
    alone = sustained(100.0, 8, 1, service)
    shared = sustained(100.0, 8, 1, service, stretch=stretch)
    assert alone is not None and shared is not None
    assert shared.rate_per_s < 0.9 * alone.rate_per_s  # the replay no longer ignores it


def test_a_length_mix_makes_some_batches_slow_and_the_p99_says_so() -> None:
    # The embedding workload: the median batch replayed for every batch put P99 near the
    # median; one body in twenty five times slower than the median is the P99's floor.
    service = service_curve({1: 10.0})
    even = tail_at(20.0, 1, 1, service)
    mixed = tail_at(20.0, 1, 1, service, jitter=lambda n: (0.8,) * 19 + (5.0,))
    assert even.p99_ms < 30.0 and mixed.p99_ms >= 50.0
