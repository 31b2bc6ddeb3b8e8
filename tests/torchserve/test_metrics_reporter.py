"""Metric lines are written by one reporter thread, never by the stage threads (issue #17)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from tests.core.fakes import FakeHandler, expected
from tests.torchserve.metric_lines import written_by
from ts_microbatch import MicroBatching
from ts_microbatch.torchserve.metrics import (
    MICRO_BATCHES_PER_BATCH,
    RECOMPILES,
    REPORTER_THREAD,
    SHAPES_UNKNOWN,
    STAGE_TIME,
    TorchServeMetricsObserver,
)

# A batch of 3 in micro-batches of 2 ([1 2] [3]): MicroBatchesPerBatch, MicroBatchBatches
# and MicroBatchesCut once, then per micro-batch and stage MicroBatchStageSeconds and
# MicroBatchQueueSeconds, plus a MicroBatchSize count per micro-batch in preprocess.
LINES_OF_ONE_BATCH = 3 + 2 * 3 * 2 + 2


class Context:
    """The parts of ts.context.Context the pipeline reads for a batch of ``n``."""

    def __init__(self, n: int, metrics: Any) -> None:
        self.request_ids = {i: f"req-{i}" for i in range(n)}
        self.metrics = metrics

    def get_request_id(self, idx: int = 0) -> str | None:
        return self.request_ids.get(idx)


class HeldMetrics:
    """The parts of TorchServe's metrics cache the observer writes through. Each line is
    recorded with the thread that wrote it; writing waits while ``gate`` is clear."""

    model_name = "m"

    def __init__(self) -> None:
        self.request_ids: dict[int, str] | None = None  # the live batch's, as TorchServe sets
        self.lines: list[tuple[str, float, str | None, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.writing = threading.Event()  # a write has started

    def get_metric(self, name: str, kind: Any) -> Any:
        metrics = self

        class Metric:
            def add_or_update(self, value: float, dims: list[str], request_id: str) -> None:
                metrics.writing.set()
                assert metrics.gate.wait(10)
                line = (name, value, request_id, threading.current_thread().name)
                metrics.lines.append(line)

        return Metric()

    def add_metric(
        self, name: str, value: float, unit: str, idx: Any, dims: list[Any], kind: Any
    ) -> None:
        """The path without a request id (no batch is live)."""
        self.get_metric(name, kind).add_or_update(value, [], None)


def reporters_since(before: set[threading.Thread]) -> set[str]:
    """The names of the threads started since ``before`` and still running."""
    return {t.name for t in set(threading.enumerate()) - before}


def test_hooks_return_before_their_lines_are_written_and_a_flush_writes_them_all() -> None:
    metrics = HeldMetrics()
    metrics.gate.clear()  # every write waits
    observer = TorchServeMetricsObserver(metrics, interval_s=0)
    context = Context(3, metrics)
    metrics.request_ids = context.request_ids
    with MicroBatching(FakeHandler(), micro_batch_size=2, observer=observer) as mb:
        assert mb.handle([1, 2, 3], context) == expected([1, 2, 3])
        # The scenario: every stage ran and the batch was answered while no line could be
        # written, so no stage thread waited for one.
        assert metrics.writing.wait(10) and metrics.lines == []
        metrics.request_ids = {0: "next-batch-0"}  # the frontend's next batch is live
        metrics.gate.set()
        assert observer.flush()
        lines = list(metrics.lines)
    assert len(lines) == LINES_OF_ONE_BATCH, lines
    assert {thread for *_, thread in lines} == {REPORTER_THREAD}
    # Each line carries the id its hook's thread knew: the batch's first request for the
    # batch's line, each micro-batch's first request for its stage lines.
    assert [rid for name, _, rid, _ in lines if name == MICRO_BATCHES_PER_BATCH] == ["req-0"]
    stage_ids = {rid for name, _, rid, _ in lines if name == STAGE_TIME}
    assert stage_ids == {"req-0", "req-2"}


def test_lines_through_torchserves_cache_are_logged_by_the_reporter_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    observer = TorchServeMetricsObserver(metrics, interval_s=0)
    mb = MicroBatching(FakeHandler(), micro_batch_size=2, observer=observer)
    before = set(threading.enumerate())
    with caplog.at_level(logging.INFO):
        with mb:
            assert mb.handle([1, 2, 3], Context(3, metrics)) == expected([1, 2, 3])
            assert REPORTER_THREAD in reporters_since(before)  # the scenario
        # shutdown() wrote what was pending and stopped the reporter.
        assert REPORTER_THREAD not in reporters_since(before)
    lines = written_by(caplog.records, "[METRICS]MicroBatch")
    assert len(lines) == LINES_OF_ONE_BATCH
    assert {thread for _, thread in lines} == {REPORTER_THREAD}


def test_a_full_hand_off_drops_reports_counts_them_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = HeldMetrics()
    metrics.gate.clear()
    observer = TorchServeMetricsObserver(metrics, max_pending=2, interval_s=0)
    try:
        observer.on_recompile(1)
        assert metrics.writing.wait(10)  # the reporter holds that one, waiting on the gate
        with caplog.at_level(logging.WARNING):
            for count in range(2, 6):
                observer.on_recompile(count)  # 2 and 3 wait; 4 and 5 find it full
        assert observer.dropped_reports == 2
        warnings = [r for r in caplog.records if r.name == "ts_microbatch.torchserve._reporter"]
        assert len(warnings) == 1 and "dropped" in warnings[0].getMessage()
        metrics.gate.set()
        assert observer.flush()
        assert [value for name, value, _, _ in metrics.lines if name == RECOMPILES] == [1, 2, 3]
    finally:
        metrics.gate.set()
        observer.close()


def test_close_is_idempotent_and_a_later_report_starts_the_reporter_again() -> None:
    metrics = HeldMetrics()
    observer = TorchServeMetricsObserver(metrics, interval_s=0)
    before = set(threading.enumerate())
    assert observer.flush() and observer.close()  # never started: nothing to wait for
    observer.on_batch(4, 1)
    assert observer.close() and observer.close()
    assert [name for name, *_ in metrics.lines] == [
        MICRO_BATCHES_PER_BATCH,
        "MicroBatchBatches",
        "MicroBatchesCut",
    ]
    assert REPORTER_THREAD not in reporters_since(before)
    observer.on_batch(8, 2)
    assert observer.flush()
    per_batch = [v for name, v, _, _ in metrics.lines if name == MICRO_BATCHES_PER_BATCH]
    assert per_batch == [1, 2]
    assert observer.close()


def test_hang_a_report_made_while_closing_waited_for_the_close() -> None:
    # close() held the lock that starting the reporter takes while it joined the thread:
    # a stage thread reporting then waited for the whole close.
    metrics = HeldMetrics()
    metrics.gate.clear()
    observer = TorchServeMetricsObserver(metrics, interval_s=0)
    observer.on_recompile(1)
    assert metrics.writing.wait(10)  # the reporter is held writing it
    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(observer.close()))
    closer.start()
    # Bounded wait until close() holds the reporter's lock (it keeps it until the join ends).
    lock = observer._reporter._lock
    assert any(lock.locked() or time.sleep(0.01) for _ in range(1000)), "close() never started"
    reported = threading.Event()

    def report() -> None:
        observer.on_recompile(2)
        reported.set()

    threading.Thread(target=report).start()
    try:
        assert reported.wait(10)
        assert closer.is_alive() and not closed  # the scenario: reported during the close
    finally:
        metrics.gate.set()
    closer.join(10)
    assert closed == [True]
    assert observer.flush()  # the report made while closing is written, by a new thread
    assert [value for name, value, _, _ in metrics.lines if name == RECOMPILES] == [1, 2]
    assert observer.close()


def interval_lines(caplog: pytest.LogCaptureFixture) -> dict[str, list[float]]:
    """Each pipeline metric line's values, by name and dimensions (``Name|#dims``)."""
    found: dict[str, list[float]] = {}
    for line, _ in written_by(caplog.records, "[METRICS]MicroBatch"):
        head, dims = line.removeprefix("[METRICS]").split("|#")[:2]
        name, value = head.split(":")
        found.setdefault(f"{name.split('.')[0]}|{dims}", []).append(float(value))
    return found


def test_an_interval_is_one_line_per_metric_the_mean_of_a_histogram_the_sum_of_a_counter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    metrics.request_ids = {i: f"req-{i}" for i in range(3)}  # as Service.predict sets them
    observer = TorchServeMetricsObserver(metrics, interval_s=3600)  # ends only at shutdown
    handler = FakeHandler()
    handler.fail_on["preprocess"] = {3}
    mb = MicroBatching(handler, micro_batch_size=2, observer=observer)
    with caplog.at_level(logging.INFO), mb:  # mb's exit writes the interval
        for _ in range(2):  # two batches of 3: micro-batches [1 2] and [3], 3 failing
            answers = mb.handle([1, 2, 3], Context(3, metrics))
            assert answers[:2] == expected([1, 2]) and answers[2]["code"] == 400
    lines = interval_lines(caplog)
    model = "ModelName:None,Level:Model"
    assert lines[f"MicroBatchesPerBatch|{model}"] == [2.0]
    # One count per micro-batch, by size range: [1 2] and [3] twice, summed.
    assert lines[f"MicroBatchSize|Sizes:2,{model}"] == [2.0]
    assert lines[f"MicroBatchSize|Sizes:1,{model}"] == [2.0]
    for stage in ("preprocess", "inference", "postprocess"):
        assert len(lines[f"MicroBatchStageSeconds|Stage:{stage},{model}"]) == 1
        assert len(lines[f"MicroBatchQueueSeconds|Stage:{stage},{model}"]) == 1
    assert lines[f"MicroBatchRequestErrors|StatusCode:400,{model}"] == [2.0]  # sums
    assert lines[f"MicroBatchBatches|{model}"] == [2.0]
    assert lines[f"MicroBatchesCut|{model}"] == [4.0]
    assert sum(len(v) for v in lines.values()) == 12


def test_an_interval_is_written_when_it_ends_without_a_flush(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    mb = MicroBatching(
        FakeHandler(),
        micro_batch_size=2,
        observer=TorchServeMetricsObserver(metrics, interval_s=0.05),
    )
    with caplog.at_level(logging.INFO), mb:
        assert mb.handle([1, 2, 3], Context(3, metrics)) == expected([1, 2, 3])
        deadline = time.monotonic() + 30
        while not interval_lines(caplog) and time.monotonic() < deadline:
            time.sleep(0.01)  # no report, flush or shutdown: the reporter's own deadline
        lines = written_by(caplog.records, "[METRICS]MicroBatchesPerBatch")
        assert len(lines) == 1 and lines[0][1] == REPORTER_THREAD


def test_a_flush_writes_a_held_interval_at_once(caplog: pytest.LogCaptureFixture) -> None:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    metrics.request_ids = {0: "req-0"}
    observer = TorchServeMetricsObserver(metrics, interval_s=3600)  # would hold it an hour
    try:
        with caplog.at_level(logging.INFO):
            observer.on_batch(4, 2)
            assert observer.flush(timeout_s=30)
            lines = interval_lines(caplog)
        assert lines["MicroBatchesPerBatch|ModelName:None,Level:Model"] == [2.0]
        assert lines["MicroBatchesCut|ModelName:None,Level:Model"] == [2.0]
    finally:
        observer.close()


@pytest.mark.parametrize("interval_s", [-1.0, float("nan"), 1e12])
def test_an_interval_out_of_range_is_refused(interval_s: float) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        TorchServeMetricsObserver(HeldMetrics(), interval_s=interval_s)


def test_items_of_unknown_shape_are_a_counter(caplog: pytest.LogCaptureFixture) -> None:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    metrics.request_ids = {0: "req-0"}  # as Service.predict sets them
    observer = TorchServeMetricsObserver(metrics, interval_s=3600)
    try:
        with caplog.at_level(logging.INFO):
            observer.on_shapes_unknown(2)
            observer.on_shapes_unknown(1)
            assert observer.flush(timeout_s=30)
            lines = interval_lines(caplog)
            kinds = [line for line, _ in written_by(caplog.records, f"[METRICS]{SHAPES_UNKNOWN}.")]
        assert lines[f"{SHAPES_UNKNOWN}|ModelName:None,Level:Model"] == [3.0]  # summed
        assert kinds and all("#type:COUNTER" in line for line in kinds)
    finally:
        observer.close()


def test_micro_batch_size_was_an_intervals_mean_in_latency_buckets_now_a_count_per_micro_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # MicroBatchSize was a histogram observed once an interval with the interval's mean
    # size, in TorchServe's fixed buckets (5 ms to 10 s): 38 observations for 3,608
    # requests, sizes 16 and 32 in one "+Inf" bucket. Now every micro-batch counts once
    # under its power-of-two size range, summed exactly per interval, as the package's
    # metrics.yaml declares it.
    from ts_microbatch.tools import METRICS_YAML

    metrics = MetricsCacheYamlImpl(str(METRICS_YAML))
    metrics.initialize_cache()
    metrics.request_ids = {i: f"req-{i}" for i in range(64)}
    declared = metrics.get_metric("MicroBatchSize", MetricTypes.COUNTER)
    assert declared.dimension_names[0] == "Sizes"
    observer = TorchServeMetricsObserver(metrics, interval_s=3600)  # one interval
    sizes = [32, 32, 16, 7, 5, 1, 1, 2, 3, 64]
    try:
        with caplog.at_level(logging.INFO):
            for size in sizes:
                observer.on_stage("preprocess", size, 0.0, 0.001, failed=False)
            observer.on_stage("inference", 32, 0.0, 0.001, failed=False)  # not a new one
            assert observer.flush(timeout_s=30)
            lines = interval_lines(caplog)
            kinds = [line for line, _ in written_by(caplog.records, "[METRICS]MicroBatchSize.")]
    finally:
        observer.close()
    model = "ModelName:None,Level:Model"
    counted = {k.split("|")[1]: v for k, v in lines.items() if k.startswith("MicroBatchSize|")}
    assert counted == {
        f"Sizes:17-32,{model}": [2.0],
        f"Sizes:9-16,{model}": [1.0],
        f"Sizes:5-8,{model}": [2.0],
        f"Sizes:1,{model}": [2.0],
        f"Sizes:2,{model}": [1.0],
        f"Sizes:3-4,{model}": [1.0],
        f"Sizes:33-64,{model}": [1.0],
    }
    assert sum(v[0] for v in counted.values()) == len(sizes)  # one per micro-batch
    assert kinds and all("#type:COUNTER" in line for line in kinds)


def test_size_ranges_are_powers_of_two() -> None:
    from ts_microbatch.torchserve.metrics import size_range

    assert [size_range(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 65)] == [
        "0", "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "9-16", "17-32", "33-64", "65-128",
    ]  # fmt: skip
