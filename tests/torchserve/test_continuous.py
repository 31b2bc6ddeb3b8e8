"""Continuous micro-batching through TorchServe's own asynchronous worker machinery.

TorchServe's loader loads the handler from a model directory whose model-config.yaml says
``asyncCommunication: true``; ``ts.async_service.AsyncService`` wraps the service as the
worker does, and each request is one ``predict`` coroutine on one event loop, as its
``fetch_batches`` thread hands them over. The responses are decoded as the frontend reads
them. Every test proves its scenario (micro-batches that held several requests, a queue
deep enough to refuse) from what the handler recorded before it asserts the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ts import async_service
from ts.async_service import AsyncService

from tests.torchserve.ts_machinery import (
    ResponseReader,
    decode,
    load_service,
    predict_message,
    request,
    write_manifest,
)
from ts_microbatch.torchserve._async import (
    _no_received_line,
    lean_predict,
    lean_receive_requests,
)

# Answers each body (an integer) with twice its value; "bad" fails preprocess alone (a
# bad input), "boom" fails inference alone (500). A gate held by the test stops the first
# stage, so arrivals gather behind it.
ECHO_HANDLER = """
import threading

from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import MicroBatchingMixin, RequestError


class EchoHandler(MicroBatchingMixin, BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True
        self.gate = threading.Event()
        self.gate.set()
        self.micro_batches = []
        self.start_micro_batching(context)

    def preprocess(self, data):
        self.gate.wait(30)
        self.micro_batches.append(len(data))
        values = []
        for row in data:
            value = row.get("body") or row.get("data")  # bytes, or a KServe instance
            text = bytes(value).decode() if isinstance(value, (bytes, bytearray)) else str(value)
            if text == "bad":
                raise RequestError("not a number")
            values.append(text)
        return values

    def inference(self, data, *args, **kwargs):
        if "boom" in data:
            raise RuntimeError("the model failed on boom")
        return [2 * int(v) for v in data]

    def postprocess(self, data):
        return [{"double": v} for v in data]
"""


def model_config(**section: Any) -> str:
    mb = {"micro_batch_size": 4, "parallelism": {"preprocess": 1, "inference": 1, "postprocess": 1}}
    mb.update(section)
    return "asyncCommunication: true\nbatchSize: 1\nmicro_batching: " + json.dumps(mb) + "\n"


def extract(directory: Path, config: str) -> Path:
    directory.mkdir()
    (directory / "echo_handler.py").write_text(ECHO_HANDLER, encoding="utf-8")
    (directory / "model-config.yaml").write_text(config, encoding="utf-8")
    write_manifest(directory, "echo", "echo_handler.py", configFile="model-config.yaml")
    return directory


@contextlib.contextmanager
def torchserve_s_own_worker() -> Iterator[None]:
    """TorchServe's own asynchronous worker back afterwards: installing ours is per process."""
    service = async_service.AsyncService
    saved = (async_service.predict, service.receive_requests, service.call_predict)
    try:
        yield
    finally:
        async_service.predict, service.receive_requests, service.call_predict = saved
        logging.getLogger().removeFilter(_no_received_line)


@pytest.fixture
def original_predict() -> Iterator[None]:
    with torchserve_s_own_worker():
        yield


def start(tmp_path: Path, **section: Any) -> tuple[AsyncService, Any]:
    service = load_service(
        extract(tmp_path / "echo", model_config(**section)),
        model_name="echo",
        handler="echo_handler.py",
    )
    return AsyncService(service), service._entry_point.__self__


def ask(worker: AsyncService, i: int, body: bytes, headers: dict[str, str] | None = None) -> Any:
    row = request(i, body, "text/plain")
    if headers:
        row["headers"] = [{"name": k.encode(), "value": v.encode()} for k, v in headers.items()]
    return worker.service.predict([row])


def answers(messages: list[bytes]) -> list[tuple[str, int, Any]]:
    out = []
    for message in messages:
        code, rows = decode(message)
        assert code == 200, message
        ((request_id, status, body),) = rows
        out.append((request_id, status, json.loads(body)))
    return out


def in_batcher(batcher: Any) -> int:
    """Requests gathered or in the pipeline."""
    stats = batcher.stats()
    return int(stats.gathered + stats.in_flight_items)


async def gathered(worker: AsyncService, handler: Any, bodies: list[bytes]) -> list[bytes]:
    """Sends ``bodies`` while the first stage is held, then lets it go: the first request
    runs alone, the rest gather behind it."""
    handler.gate.clear()
    tasks = [asyncio.ensure_future(ask(worker, i, body)) for i, body in enumerate(bodies)]
    batcher = handler.micro_batching.continuous_batcher()
    while in_batcher(batcher) < len(bodies):
        await asyncio.sleep(0.001)  # the coroutines reach the batcher in a few loop turns
    handler.gate.set()
    return list(await asyncio.gather(*tasks))


def test_requests_of_separate_calls_share_micro_batches_each_answered_its_own(
    tmp_path: Path, original_predict: None, caplog: pytest.LogCaptureFixture
) -> None:
    worker, handler = start(tmp_path)
    assert async_service.predict is lean_predict  # installed at load: asyncCommunication
    bodies = [str(i).encode() for i in range(9)]
    got = answers(asyncio.run(gathered(worker, handler, bodies)))
    assert max(handler.micro_batches) == 4, handler.micro_batches  # across separate calls
    assert sum(handler.micro_batches) == 9
    assert got == [(f"req-{i}", 200, {"double": 2 * i}) for i in range(9)]
    handler.micro_batching.shutdown()
    # Every metric line written: the model's metrics keep the loader's placeholder request
    # id on this worker, which TorchServe's add_metric could not index (a line lost).
    assert handler.micro_batching.flush_metrics()
    assert not [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]


def test_bad_requests_in_a_shared_micro_batch_fail_alone(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path)
    asyncio.run(_warm(worker))  # the first stage has served: a failure there alone is a 400
    handler.micro_batches.clear()
    bodies = [b"1", b"2", b"bad", b"3", b"boom", b"4", b"5"]
    got = answers(asyncio.run(gathered(worker, handler, bodies)))
    assert 4 in handler.micro_batches  # the bad ones shared a micro-batch with good ones
    statuses = {body: status for body, (_, status, _) in zip(bodies, got)}
    assert statuses == {
        b"1": 200,
        b"2": 200,
        b"bad": 400,
        b"3": 200,
        b"boom": 500,
        b"4": 200,
        b"5": 200,
    }
    assert [a[2] for a in got if a[1] == 200] == [{"double": 2 * v} for v in (1, 2, 3, 4, 5)]
    handler.micro_batching.shutdown()


async def _warm(worker: AsyncService) -> None:
    for i in range(3):
        await ask(worker, 100 + i, b"7")


def test_overload_is_answered_429_with_retry_after_before_any_stage(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path, max_latency_ms=1000)
    asyncio.run(_warm(worker))  # every stage has a measured cost

    async def scenario() -> tuple[list[bytes], float, list[bytes]]:
        batcher = handler.micro_batching.continuous_batcher()
        handler.gate.clear()
        queued = [asyncio.ensure_future(ask(worker, i, b"1")) for i in range(6)]
        await asyncio.sleep(0.05)
        # A stage that now takes 10 s per call: the queue ahead cannot drain within 1 s.
        batcher.policy._costs.on_stage("preprocess", 1, 0.0, 10.0, failed=False)  # noqa: SLF001
        predicted = batcher.policy.predicted_s(
            in_batcher(batcher), handler.micro_batching.parallelism
        )
        late = [
            await ask(worker, 50, b"1"),
            await ask(worker, 51, b"1", {"X-Envoy-Expected-Rq-Timeout-Ms": "5"}),
        ]
        handler.gate.set()
        return list(await asyncio.gather(*queued)), predicted, late

    served, predicted, late = asyncio.run(scenario())
    assert predicted is not None and predicted > 1.0  # the scenario: predicted past the objective
    assert [status for _, status, _ in answers(served)] == [200] * 6
    for message in late:
        _, ((_, status, body),) = decode(message)
        assert status == 429, body
        assert b"Retry-After" in message  # the header the frontend sends on
        assert json.loads(body)["code"] == 429
    assert handler.micro_batches.count(0) == 0 and sum(handler.micro_batches) == 3 + 6  # never ran
    handler.micro_batching.shutdown()


def test_deadline_header_alone_refuses_when_no_objective_is_set(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path)
    asyncio.run(_warm(worker))
    batcher = handler.micro_batching.continuous_batcher()
    batcher.policy._costs.on_stage("inference", 1, 0.0, 5.0, failed=False)  # noqa: SLF001

    async def scenario() -> list[bytes]:
        handler.gate.clear()
        first = asyncio.ensure_future(ask(worker, 0, b"3"))  # one ahead of the next two
        while in_batcher(batcher) < 1:
            await asyncio.sleep(0.001)
        tight = await ask(worker, 1, b"3", {"x-envoy-expected-rq-timeout-ms": "100"})
        unread = asyncio.ensure_future(
            ask(worker, 2, b"3", {"x-envoy-expected-rq-timeout-ms": "not a number"})
        )
        await asyncio.sleep(0.01)
        handler.gate.set()
        return [tight, await first, await unread]

    tight, first, unread = asyncio.run(scenario())
    assert decode(tight)[1][0][1] == 429
    assert decode(first)[1][0][1] == 200
    assert decode(unread)[1][0][1] == 200  # an unreadable header is advisory: ignored
    handler.micro_batching.shutdown()


def test_one_slow_call_does_not_refuse_every_later_request(
    tmp_path: Path, original_predict: None
) -> None:
    # A stage measured far over the objective once (a pause, a recompile): a request with
    # nothing ahead is still run, and its run is measured again, instead of every request
    # being refused on the old measure for good (nothing would run to measure it again).
    worker, handler = start(tmp_path, max_latency_ms=100)
    asyncio.run(_warm(worker))
    batcher = handler.micro_batching.continuous_batcher()
    batcher.policy._costs.on_stage("inference", 1, 0.0, 10.0, failed=False)  # noqa: SLF001
    predicted = batcher.policy.predicted_s(1, handler.micro_batching.parallelism)
    assert predicted is not None and predicted > 1.0  # the scenario: one ahead is refused

    async def one_by_one() -> list[bytes]:
        return [await ask(worker, i, b"2") for i in range(6)]

    assert [decode(m)[1][0][1] for m in asyncio.run(one_by_one())] == [200] * 6
    handler.micro_batching.shutdown()


def test_a_kserve_request_counts_its_instances_and_the_micro_batches_they_make(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path, kserve=True)
    batcher = handler.micro_batching.continuous_batcher()
    body = json.dumps({"instances": [str(i) for i in range(8)]}).encode()

    async def scenario() -> tuple[Any, list[bytes]]:
        handler.gate.clear()
        task = asyncio.ensure_future(ask(worker, 0, body))
        while batcher.stats().in_flight == 0:
            await asyncio.sleep(0.001)
        stats = batcher.stats()
        handler.gate.set()
        return stats, [await task]

    stats, (message,) = asyncio.run(scenario())
    assert (stats.in_flight, stats.in_flight_items) == (2, 8)  # 8 instances, micro-batch 4
    _, ((_, status, answer),) = decode(message)
    assert status == 200 and json.loads(answer)["predictions"] == [
        {"double": 2 * i} for i in range(8)
    ]
    assert batcher.stats() == (0, 0, 0)
    handler.micro_batching.shutdown()


def test_changing_only_the_batcher_s_limits_keeps_the_pipeline(
    tmp_path: Path, original_predict: None
) -> None:
    from dataclasses import replace

    _, handler = start(tmp_path)
    micro_batching = handler.micro_batching
    pipeline = micro_batching._pipeline  # noqa: SLF001
    micro_batching.configure(
        replace(micro_batching.base_config, max_window_ms=1.0, max_latency_ms=50.0)
    )
    assert micro_batching._pipeline is pipeline  # noqa: SLF001  (no threads rebuilt)
    assert micro_batching.continuous_batcher().policy.max_window_s == 0.001
    micro_batching.shutdown()


def test_a_stuck_first_stage_answers_every_request_at_its_timeout_none_waits_for_it(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path, timeout_s=0.5)

    async def scenario() -> list[bytes]:
        handler.gate.clear()
        first = asyncio.ensure_future(ask(worker, 0, b"1"))  # stuck in preprocess
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(ask(worker, i, b"1")) for i in range(1, 8)]
        done = await asyncio.gather(first, *rest)  # the gate is still closed: all answered
        handler.gate.set()
        return list(done)

    statuses = [decode(m)[1][0][1] for m in asyncio.run(scenario())]
    # The first three were in the pipeline (one slot per stage thread) at their deadline:
    # 504. Those gathered behind them go when a slot frees: 504 at their own deadline, or
    # 503 once every preprocess thread is stuck (the pipeline refuses, as synchronously).
    assert statuses[:3] == [504] * 3, statuses
    assert set(statuses[3:]) <= {503, 504}, statuses
    handler.micro_batching.shutdown()


def test_requests_gathered_at_shutdown_are_run_not_left_waiting(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path)

    async def scenario() -> list[bytes]:
        handler.gate.clear()
        batcher = handler.micro_batching.continuous_batcher()
        tasks = [asyncio.ensure_future(ask(worker, i, str(i).encode())) for i in range(16)]
        while in_batcher(batcher) < 16:
            await asyncio.sleep(0.001)
        # The scenario: at most 3 slots x 4 are in flight, so some wait for a slot.
        assert batcher.stats().gathered >= 4
        loop = asyncio.get_running_loop()
        stopped = loop.run_in_executor(None, handler.micro_batching.shutdown)
        while batcher.stats().gathered:  # only the flush submits them: the gate holds all
            await asyncio.sleep(0.001)
        handler.gate.set()
        await stopped
        return list(await asyncio.gather(*tasks))

    got = answers(asyncio.run(scenario()))
    assert got == [(f"req-{i}", 200, {"double": 2 * i}) for i in range(16)]


def test_enabled_false_runs_the_handler_s_own_handle_on_the_asynchronous_worker(
    tmp_path: Path, original_predict: None
) -> None:
    worker, handler = start(tmp_path, enabled=False)

    async def two() -> list[bytes]:
        return list(await asyncio.gather(ask(worker, 0, b"3"), ask(worker, 1, b"4")))

    assert [a[1:] for a in answers(asyncio.run(two()))] == [
        (200, {"double": 6}),
        (200, {"double": 8}),
    ]
    assert handler.micro_batches == [1, 1]  # BaseHandler.handle: no pipeline, a call each


def test_lean_predict_answers_byte_for_byte_as_torchserve_s_predict(
    tmp_path: Path, original_predict: None
) -> None:
    torchserve_predict = async_service.predict
    worker, handler = start(tmp_path)  # installs lean_predict
    assert async_service.predict is lean_predict and torchserve_predict is not lean_predict
    service = worker.service
    bodies = [b"5", b"bad", b"boom", b"6"]

    async def each(predict: Any) -> list[bytes]:
        return [
            await predict(service, [request(i, body, "text/plain")])
            for i, body in enumerate(bodies)
        ]

    asyncio.run(_warm(worker))  # the same first-stage record for both
    lean, theirs = asyncio.run(each(lean_predict)), asyncio.run(each(torchserve_predict))
    assert [decode(m)[1][0][1] for m in lean] == [200, 400, 500, 200]
    assert lean == theirs
    assert service.context.request_ids is None  # the model's own context is never written
    handler.micro_batching.shutdown()


def test_the_worker_s_transport_over_its_socket_answers_every_request_without_a_log_line_each(
    tmp_path: Path, original_predict: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # the level TorchServe's worker logs at
    # As the frontend talks to the worker: predict messages streamed on the worker's socket,
    # responses read back; AsyncService.run on a thread of its own with its event loop.
    worker, handler = start(tmp_path)
    assert worker.receive_requests.__func__ is lean_receive_requests  # installed at load
    frontend, worker_end = socket.socketpair()
    worker.service.set_cl_socket(worker_end)

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        worker.run()

    threading.Thread(target=serve, daemon=True).start()
    count = 40
    for i in range(count):  # 40 in flight at once: several per micro-batch
        frontend.sendall(predict_message(i, str(i).encode()))
    reader = ResponseReader(frontend)
    assert sum(reader.response() for _ in range(count)) == count  # one answer each
    assert max(handler.micro_batches) > 1  # the scenario: micro-batches across requests
    frontend.close()
    handler.micro_batching.shutdown()
    assert "Backend received inference" not in caplog.text
    logging.info("Backend received inference at: %d", 1)  # as TorchServe's reader does
    assert "Backend received inference" not in caplog.text


@settings(max_examples=15, deadline=None)
@given(
    gaps_ms=st.lists(st.integers(0, 4), min_size=1, max_size=24),
    bad=st.sets(st.integers(0, 23), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_any_arrival_schedule_answers_every_request_once_with_its_own_answer(
    tmp_path_factory: pytest.TempPathFactory, gaps_ms: list[int], bad: set[int], seed: int
) -> None:
    with torchserve_s_own_worker():
        worker, handler = start(tmp_path_factory.mktemp("schedule"), max_window_ms=2)
        rng = random.Random(seed)
        slow = threading.Event()

        async def scenario() -> list[bytes]:
            tasks = []
            for i, gap in enumerate(gaps_ms):
                body = b"bad" if i in bad else str(i).encode()
                tasks.append(asyncio.ensure_future(ask(worker, i, body)))
                slow.wait(rng.random() / 1000)  # the loop itself busy now and then
                await asyncio.sleep(gap / 1000)
            return list(await asyncio.gather(*tasks))

        got = answers(asyncio.run(scenario()))
        assert [a[0] for a in got] == [f"req-{i}" for i in range(len(gaps_ms))]
        for i, (_, status, body) in enumerate(got):
            if i in bad:
                assert status in (400, 500), body  # 500 while the first stage never served
            else:
                assert (status, body) == (200, {"double": 2 * i})
        handler.micro_batching.shutdown()


def test_drain_rate_counts_no_idle_time_before_a_burst_() -> None:
    """The drain rate counted the whole time since the previous answer as busy: after 3 s of
    quiet, the first answers of a burst made it about a second an item, and a model of ~1 ms
    a stage refused 20 of 40 later requests against a 200 ms objective."""
    from ts_microbatch.core.continuous import StageCosts, StreamPolicy

    stages = ("preprocess", "inference", "postprocess")
    costs = StageCosts(stages)
    for stage in stages:
        costs.on_stage(stage, 1, 0.0, 0.001, failed=False)
    policy = StreamPolicy(costs, max_window_s=0.005)
    threads = dict.fromkeys(stages, 1)
    now = 0.0
    policy.started(now)
    for _ in range(20):  # a busy stretch: an item answered every millisecond
        now += 0.001
        policy.answered(now, 1, busy=True)
    now += 3.0  # quiet: the pipeline empty
    policy.started(now)  # a burst goes into the empty pipeline
    for _ in range(5):
        now += 0.001
        policy.answered(now, 1, busy=True)  # requests of the burst wait behind it
    predicted = policy.predicted_s(20, threads)
    assert predicted is not None and predicted < 0.2, predicted
