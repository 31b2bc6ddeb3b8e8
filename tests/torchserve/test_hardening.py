"""Regression tests for the defects of the hardening review, each named after its bug.

Every test first proves its scenario happened (the stage was blocked, the batch timed
out, the call was stuck) before asserting the outcome; none depends on timing beyond the
configured timeouts, which only decide *that* a batch times out, never how fast.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.core.fakes import Bad, FakeHandler, cause, expected
from tests.core.test_pipeline import WAIT_S, make_pipeline, outcomes
from tests.torchserve.test_micro_batching import (
    FakeContext,
    FakeTorchServeHandler,
    RowHandler,
    ts_request,
    ts_service,
)
from tests.torchserve.ts_machinery import decode
from ts_microbatch import (
    InvalidInputError,
    MicroBatching,
    MicroBatchingConfig,
    Pipeline,
    PipelineClosedError,
    PipelineObserver,
    PipelineStalledError,
    RequestTimeoutError,
)


class CallCounter(PipelineObserver):
    """Counts finished calls of one stage; the pipeline reports a call after unregistering it."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.finished = 0
        self._changed = threading.Condition()

    def on_stage(self, stage: str, size: int, queue_wait_s: float, run_s: float, **_: Any) -> None:
        if stage == self.stage:
            with self._changed:
                self.finished += 1
                self._changed.notify_all()

    def wait_for(self, count: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.finished >= count, WAIT_S)


class Gate:
    """Blocks the calls of a stage that contain ``blocked_item`` until opened."""

    def __init__(self, blocked_item: Any) -> None:
        self.blocked_item = blocked_item
        self.entered = threading.Event()
        self.opened = threading.Event()

    def __call__(self, items: list[Any]) -> None:
        if self.blocked_item in items:
            self.entered.set()
            assert self.opened.wait(WAIT_S), "gate never opened"

    def open(self) -> None:
        self.opened.set()


def gated(handler: FakeHandler, stage: str, gate: Gate) -> None:
    original = getattr(handler, stage)

    def run(batch: list[Any]) -> Any:
        gate([x // 10 if stage != "preprocess" else x for x in batch])
        return original(batch)

    setattr(handler, stage, run)


def test_hang_timed_out_batch_runs_ahead_of_the_next_one() -> None:
    # Batch 1 times out while its first micro-batch is stuck in inference and the other
    # seven wait behind it; once the stage frees up they must be dropped, not run.
    handler = FakeHandler()
    gate = Gate(blocked_item=0)
    gated(handler, "inference", gate)
    with make_pipeline(handler, micro_batch_size=1) as p:
        first = p.submit_batch(list(range(8)))
        assert gate.entered.wait(WAIT_S)
        assert first.wait(timeout_s=0.05) is False
        assert all(isinstance(f.exception(), RequestTimeoutError) for f in first.futures)
        gate.open()
        second = p.submit_batch(list(range(100, 108)))
        assert second.wait(WAIT_S)
        assert [f.result() for f in second.futures] == expected(list(range(100, 108)))
    inferred = [x for call in handler.calls["inference"] for x in call]
    assert [x for x in inferred if x < 100] == [0], "stale micro-batches of batch 1 ran"


def test_hang_stage_stuck_forever_refuses_new_batches_promptly() -> None:
    # One inference thread stuck for good: the first timeout abandons it and starts a
    # replacement (the budget is one per thread), so batch 2 is served. When the
    # replacement is stuck too, batch 3 is refused at once instead of queuing.
    handler = FakeHandler()
    gate_a, gate_b = Gate(blocked_item=0), Gate(blocked_item=100)
    original = handler.inference

    def inference(batch: list[int]) -> list[int]:
        gate_a([x // 10 for x in batch])
        gate_b([x // 10 for x in batch])
        return original(batch)

    handler.inference = inference  # type: ignore[method-assign]
    counter = CallCounter("inference")
    p = make_pipeline(handler, micro_batch_size=4, observer=counter)
    try:
        first = p.submit_batch([0, 1, 2, 3])
        assert gate_a.entered.wait(WAIT_S)
        assert first.wait(timeout_s=0.05) is False
        served = p.submit_batch([10, 11])
        assert served.wait(WAIT_S) and p.stats().abandoned_threads["inference"] == 1
        assert [f.result() for f in served.futures] == expected([10, 11])
        stuck_too = p.submit_batch([100])
        assert gate_b.entered.wait(WAIT_S)
        assert stuck_too.wait(timeout_s=0.05) is False
        with pytest.raises(PipelineStalledError, match="stage inference: all 2 threads"):
            p.submit_batch([200])
        assert p.stats().batches_in_flight == 0  # nothing queues behind the stuck stage
        gate_a.open()
        gate_b.open()
        assert counter.wait_for(3)  # batch 2's call and both stuck calls have returned
        # The abandoned thread exits when its call returns; the other serves again.
        recovered = p.submit_batch([300, 301])
        assert recovered.wait(WAIT_S)
        assert [f.result() for f in recovered.futures] == expected([300, 301])
    finally:
        gate_a.open()
        gate_b.open()
        p.shutdown()


def test_hang_stale_micro_batch_reads_the_next_batch_context() -> None:
    # TorchServe's worker keeps one Context and overwrites its request ids and
    # RequestProcessors (request headers, response status and headers) for each batch
    # (Service.predict). A stage call of batch 1 still running after batch 1 timed out
    # wrote a response header onto batch 2's request and read batch 2's sequence id.
    handler = RowHandler()
    gate = Gate(blocked_item="stale")
    seen: dict[str, Any] = {}
    recorded = threading.Event()
    mb = MicroBatching(
        handler,
        config=MicroBatchingConfig.from_mapping(
            {"micro_batch_size": 2, "timeout_s": 0.2, "parallelism": {"preprocess": 2}}
        ),
    )

    def stale_stage(texts: list[str]) -> None:
        gate(texts)
        if "stale" not in texts:
            return
        rows, info = mb.current_context(), mb.current_micro_batch()
        assert info is not None
        for name, context in (("rows", rows), ("batch", info.context)):
            seen[name] = {
                "ids": [context.get_request_id(i) for i in range(2)],
                "sequence": [context.get_sequence_id(i) for i in range(2)],
                "tags": [context.get_request_header(i, "tag") for i in range(2)],
                "all_headers": [context.get_all_request_header(i)["tag"] for i in range(2)],
                "processors": list(context.request_processor),
                "request_ids": dict(context.request_ids),
                "response_headers": dict(context.get_response_headers(0)),
            }
            context.set_response_header(0, f"x-stale-{name}", "1")
            context.set_response_content_type(1, f"text/stale-{name}")
        rows.set_all_response_status(299, "stale")
        seen["status"] = [rows.get_response_status(i) for i in range(2)]
        recorded.set()

    handler.on_rows = stale_stage
    service = ts_service(mb.handle)

    def predict(batch: int, texts: list[str]) -> list[int]:
        headers = [{"tag": f"b{batch}-{i}", "ts_request_sequence_id": f"s{batch}"} for i in (0, 1)]
        requests = [ts_request(i, text.encode(), headers[i]) for i, text in enumerate(texts)]
        code, answers = decode(service.predict(requests))
        return [status for _, status, _ in answers]

    with mb:
        assert predict(1, ["stale", "x"]) == [504, 504]
        assert gate.entered.is_set()  # batch 1's call is still running
        first = service.context.request_processor
        assert predict(2, ["y", "z"]) == [200, 200]
        second = service.context.request_processor  # the worker's overwrite happened
        assert second is not first and service.context.request_ids == {0: "req-0", 1: "req-1"}
        gate.open()
        assert recorded.wait(WAIT_S)
    for name in ("rows", "batch"):
        assert seen[name]["ids"] == ["req-0", "req-1"]
        assert seen[name]["sequence"] == ["s1", "s1"]
        assert seen[name]["tags"] == seen[name]["all_headers"] == ["b1-0", "b1-1"]
        assert len(seen[name]["processors"]) == len(first)
        assert all(a is b for a, b in zip(seen[name]["processors"], first))
        assert seen[name]["request_ids"] == {0: "req-0", 1: "req-1"}
    assert seen["status"] == [(299, "stale"), (299, "stale")]
    # Every write landed on batch 1's requests, none on batch 2's.
    assert [p.get_response_headers() for p in first] == [
        {"x-stale-rows": "1", "x-stale-batch": "1"},
        {"content-type": "text/stale-batch"},
    ]
    assert [p.get_response_status_code() for p in first] == [299, 299]
    assert [p.get_response_headers() for p in second] == [{}, {}]
    assert [p.get_response_status_code() for p in second] == [200, 200]


@pytest.mark.parametrize(("batch", "micro_batch_size"), [(32, 32), (32, 4)])
def test_hang_systemic_failure_multiplies_the_load(batch: int, micro_batch_size: int) -> None:
    # Before the breakers, every batch of a broken model was bisected: 63 inference calls
    # and 192 preprocessed items for 32 requests at size 32, batch after batch. Now the
    # first batch that shows it costs at most 2n calls, and from the next one on, one call
    # per micro-batch and one probe (ts_microbatch.core.breaker).
    handler = FakeHandler()
    handler.always_fail = {"inference"}
    micro_batches = batch // micro_batch_size
    with make_pipeline(handler, micro_batch_size=micro_batch_size) as p:
        first = outcomes(p.submit(list(range(batch))))
        assert len(handler.calls["inference"]) <= 2 * batch
        assert p.stats().broken_stages == ("inference",)
        for _ in range(3):
            handler.calls["inference"].clear()
            handler.calls["preprocess"].clear()
            later = outcomes(p.submit(list(range(batch))))
            assert len(handler.calls["inference"]) == micro_batches + 1
            assert sum(len(c) for c in handler.calls["preprocess"]) == batch + 1
    assert all(isinstance(cause(r), RuntimeError) for r in first + later)


@pytest.mark.parametrize("bad", [{0}, {13}, {31}, {3, 20}, {16, 17}])
def test_one_or_two_bad_requests_are_still_isolated_exactly(bad: set[int]) -> None:
    handler = FakeHandler()
    handler.fail_on["inference"] = bad
    with make_pipeline(handler, micro_batch_size=32) as p:
        results = outcomes(p.submit(list(range(32))))
    for item, result in enumerate(results):
        assert isinstance(result, Bad) if item in bad else result == expected([item])[0]
    if len(bad) == 1:
        # 1 call, then 2 per level of 5 halvings: 2*log2(32) extra calls.
        assert len(handler.calls["inference"]) == 1 + 2 * 5


def test_hang_graceful_shutdown_drops_reruns() -> None:
    # A failed micro-batch's halves are queued again after shutdown began; they used to
    # get 503. Graceful shutdown finishes them.
    handler = FakeHandler()
    handler.fail_on["inference"] = {5}
    gate = Gate(blocked_item=5)
    gated(handler, "inference", gate)
    p = make_pipeline(handler, micro_batch_size=8)
    futures = p.submit(list(range(8)))
    assert gate.entered.wait(WAIT_S)  # the micro-batch with the bad request is running
    p.shutdown(wait=False)
    with pytest.raises(PipelineClosedError):
        p.submit([1])
    gate.open()
    results = outcomes(futures)
    p.shutdown(wait=True)
    assert isinstance(results[5], Bad)
    assert [r for i, r in enumerate(results) if i != 5] == expected([0, 1, 2, 3, 4, 6, 7])
    assert len(handler.calls["inference"]) > 1  # the re-runs happened after shutdown began


def test_declared_bad_inputs_are_isolated_exactly_however_many() -> None:
    # Five bad requests in one micro-batch, each its own: every one is isolated and the
    # rest are served (as for any error: RequestError only keeps them from a breaker).
    bad = {1, 2, 3, 9, 14}
    pipeline = Pipeline(
        {"decode": lambda items: [_decode(x, bad) for x in items]}, micro_batch_size=16
    )
    with pipeline:
        results = outcomes(pipeline.submit(list(range(16))))
    for item, result in enumerate(results):
        assert isinstance(result, InvalidInputError) if item in bad else result == item


def _decode(item: int, bad: set[int]) -> int:
    if item in bad:
        raise InvalidInputError(f"request {item} is not an image")
    return item


class Stopping(FakeTorchServeHandler):
    """Raises ``stop`` (a BaseException that is not an Exception) in ``stage`` for a call
    that holds ``item``."""

    def __init__(self, stage: str, item: int, stop: BaseException) -> None:
        super().__init__()
        self.stage, self.item, self.stop = stage, item, stop

    def _step(self, stage: str, items: list[int]) -> None:
        super()._step(stage, items)
        if stage == self.stage and self.item in items:
            raise self.stop


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()])
@pytest.mark.parametrize("stage", ["preprocess", "inference", "postprocess"])
def test_defect_stage_base_exception_answered_as_bad_input(stage: str, stop: BaseException) -> None:
    # A KeyboardInterrupt or SystemExit raised in preprocess was bisected down to its request,
    # which failed alone in the first stage while others passed it: answered 400, "bad
    # input", as if a request could ask the worker to stop. Only an Exception says anything
    # about an input: a BaseException fails its micro-batch whole, 500, and the thread that
    # caught it serves the next batch.
    handler = Stopping(stage, 3, stop)
    context = FakeContext(4)
    with MicroBatching(handler, micro_batch_size=2) as mb:
        out = mb([1, 2, 3, 4], context)
        # The scenario: [1, 2] got through, [3, 4] raised in the stage.
        assert [1, 2] in handler.calls["preprocess"] and [3, 4] in handler.calls[stage]
        assert out[:2] == expected([1, 2])
        assert sorted(context.statuses) == [2, 3]
        assert [context.statuses[i][0] for i in (2, 3)] == [500, 500]
        # Answered in the server's words (the request to stop may be either one's doing).
        assert [o["type"] for o in out[2:]] == ["SharedFailureError"] * 2
        assert all(f"stage {stage} was stopped" in o["message"] for o in out[2:])
        # Not re-run in halves: nothing is learnt about inputs from a request to stop.
        assert not any(call in ([3], [4]) for call in handler.calls[stage])
        handler.item = -1  # the same threads answer the next batch
        assert mb([5, 6, 7], FakeContext(3)) == expected([5, 6, 7])
        alive = mb.stats().threads_alive
    assert alive == {"preprocess": 1, "inference": 1, "postprocess": 1}
