"""The continuous batcher's rules (ts_microbatch.core.continuous), with a clock the test sets."""

from __future__ import annotations

import pytest

from ts_microbatch.core.continuous import StageCosts, StreamPolicy, retry_after_s
from ts_microbatch.core.metrics import PipelineObserver

STAGES = ("preprocess", "inference", "postprocess")


def measured(**run_s: float) -> StageCosts:
    costs = StageCosts(STAGES)
    for stage, seconds in run_s.items():
        costs.on_stage(stage, 4, 0.0, seconds, failed=False)
    return costs


def arrivals(policy: StreamPolicy, gap_s: float, count: int = 20) -> None:
    for i in range(count):
        policy.arrived(i * gap_s)


def test_a_full_micro_batch_goes_at_once() -> None:
    policy = StreamPolicy(measured(preprocess=0.01, inference=0.01, postprocess=0.01), 0.005)
    arrivals(policy, 0.0001)
    assert policy.wait_s(4, 4, 0.0) == 0.0


def test_at_light_load_a_partial_micro_batch_goes_at_once() -> None:
    policy = StreamPolicy(measured(preprocess=0.01, inference=0.01, postprocess=0.01), 0.005)
    arrivals(policy, 0.05)  # 20 req/s: the rest of a micro-batch would take 150 ms
    assert policy.wait_s(1, 4, 0.0) == 0.0


def test_when_the_rest_arrives_within_the_window_it_waits_for_it_from_the_oldest() -> None:
    policy = StreamPolicy(measured(preprocess=0.01, inference=0.01, postprocess=0.01), 0.005)
    arrivals(policy, 0.001)  # the 3 missing in about 3 ms
    assert policy.wait_s(1, 4, 0.0) == pytest.approx(0.003)
    assert policy.wait_s(1, 4, 0.002) == pytest.approx(0.001)
    assert policy.wait_s(1, 4, 0.004) == 0.0


def test_it_never_waits_longer_than_a_micro_batch_takes_to_run() -> None:
    policy = StreamPolicy(measured(preprocess=0.0005, inference=0.001, postprocess=0.0005), 0.005)
    arrivals(policy, 0.001)  # the rest in 3 ms, but a whole micro-batch runs in 2 ms
    assert policy.wait_s(1, 4, 0.0) == 0.0


def test_a_zero_window_never_waits() -> None:
    policy = StreamPolicy(measured(), 0.0)
    arrivals(policy, 0.0001)
    assert policy.wait_s(1, 4, 0.0) == 0.0


def test_nothing_is_predicted_until_every_stage_has_run() -> None:
    policy = StreamPolicy(measured(preprocess=0.01, inference=0.01), 0.005)
    assert policy.predicted_s(100, dict.fromkeys(STAGES, 1)) is None


def test_the_prediction_drains_the_queue_at_the_slowest_stage_over_its_threads() -> None:
    costs = measured(preprocess=0.04, inference=0.02, postprocess=0.004)  # micro-batches of 4
    policy = StreamPolicy(costs, 0.005)
    # preprocess: 10 ms an item on 1 thread is the bottleneck; on 4 threads inference is.
    assert policy.predicted_s(10, dict.fromkeys(STAGES, 1)) == pytest.approx(10 * 0.01 + 0.064)
    threads = {"preprocess": 4, "inference": 1, "postprocess": 1}
    assert policy.predicted_s(10, threads) == pytest.approx(10 * 0.005 + 0.064)


def test_failed_calls_do_not_count_and_every_report_reaches_the_metrics() -> None:
    seen: list[tuple[str, bool]] = []

    class Metrics(PipelineObserver):
        def on_stage(
            self, stage: str, size: int, wait_s: float, run_s: float, *, failed: bool
        ) -> None:
            seen.append((stage, failed))

        def on_request_error(self, status_code: int) -> None:
            seen.append((str(status_code), False))

    costs = StageCosts(STAGES, Metrics())
    for stage in STAGES:
        costs.on_stage(stage, 2, 0.0, 0.01, failed=False)
    costs.on_stage("inference", 2, 0.0, 9.0, failed=True)
    costs.on_request_error(429)
    snapshot = costs.snapshot()
    assert snapshot is not None and snapshot["inference"].run_s == pytest.approx(0.01)
    assert seen[-2:] == [("inference", True), ("429", False)]


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after_s(0.3, 0.2) == 1
    assert retry_after_s(3.5, 0.2) == 4


def test_a_slower_measured_drain_than_the_stages_say_is_the_one_predicted_from() -> None:
    policy = StreamPolicy(measured(preprocess=0.004, inference=0.004, postprocess=0.004), 0.005)
    threads = dict.fromkeys(STAGES, 1)
    assert policy.predicted_s(10, threads) == pytest.approx(10 * 0.001 + 0.012)
    policy.answered(1.000, 4, busy=False)
    policy.answered(1.100, 4, busy=False)  # idle in between: says nothing of the rate
    assert policy.predicted_s(10, threads) == pytest.approx(10 * 0.001 + 0.012)
    policy.answered(1.120, 4, busy=True)  # 5 ms an item while never idle
    assert policy.predicted_s(10, threads) == pytest.approx(10 * 0.005 + 0.012)
