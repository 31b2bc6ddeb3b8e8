"""TorchServe's asynchronous worker (``asyncCommunication: true``) through its own machinery.

TorchServe's loader loads the handler from a model directory whose model-config.yaml says
``asyncCommunication: true``; ``ts.async_service.AsyncService`` wraps the service as the
worker does, and each call (a batch of rows from the frontend) is one ``predict`` coroutine
on one event loop. Each call's requests go through the ordinary pipeline, as the synchronous
``handle`` runs them (``MicroBatching.handle_async``), the loop free meanwhile. The
responses are decoded as the frontend reads them. Every test proves its scenario (a call cut
into micro-batches, calls in flight together) from what the handler recorded before it
asserts the answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ts.async_service import AsyncService

from tests.torchserve.metric_lines import written
from tests.torchserve.ts_machinery import (
    ResponseReader,
    decode,
    load_service,
    predict_message,
    request,
    write_manifest,
)

# Answers each body (an integer) with twice its value; "bad" fails preprocess alone (a
# bad input), "boom" fails inference alone (500). A gate held by the test stops the first
# stage.
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
            value = row.get("body") or row.get("data")
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


def start(tmp_path: Path, **section: Any) -> tuple[AsyncService, Any]:
    mb = {"micro_batch_size": 4, "parallelism": {"preprocess": 1, "inference": 1, "postprocess": 1}}
    mb.update(section)
    directory = tmp_path / "echo"
    directory.mkdir()
    (directory / "echo_handler.py").write_text(ECHO_HANDLER, encoding="utf-8")
    config = "asyncCommunication: true\nbatchSize: 8\nmicro_batching: " + json.dumps(mb) + "\n"
    (directory / "model-config.yaml").write_text(config, encoding="utf-8")
    write_manifest(directory, "echo", "echo_handler.py", configFile="model-config.yaml")
    service = load_service(directory, model_name="echo", handler="echo_handler.py")
    return AsyncService(service), service._entry_point.__self__


async def call(worker: AsyncService, bodies: list[bytes], first: int = 0) -> bytes:
    """One call of the frontend: ``bodies`` as one batch, through TorchServe's asynchronous
    predict (which AsyncService bound to the service)."""
    rows = [request(first + i, body, "text/plain") for i, body in enumerate(bodies)]
    message: bytes = await worker.service.predict(rows)
    return message


def answers(message: bytes) -> list[tuple[str, int, Any]]:
    code, rows = decode(message)
    assert code == 200, message
    return [(request_id, status, json.loads(body)) for request_id, status, body in rows]


def test_a_call_s_requests_are_micro_batched_as_handle_does_and_each_answered_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # the metric lines, as the worker writes them
    worker, handler = start(tmp_path)
    bodies = [str(i).encode() for i in range(9)]
    got = answers(asyncio.run(call(worker, bodies)))
    assert handler.micro_batches == [4, 4, 1]  # the scenario: the call cut as handle cuts it
    assert got == [(f"req-{i}", 200, {"double": 2 * i}) for i in range(9)]
    assert answers(asyncio.run(call(worker, [b"20"], first=9))) == [("req-9", 200, {"double": 40})]
    # Per call, as on the synchronous worker: HandlerTime from MicroBatching, PredictionTime
    # from TorchServe's asynchronous predict.
    lines = written(caplog.records)
    assert sum(line.startswith("[METRICS]HandlerTime") for line in lines) == 2, lines
    assert sum(line.startswith("[METRICS]PredictionTime") for line in lines) == 2, lines
    handler.micro_batching.shutdown()
    # Every pipeline metric line written: the model's metrics keep the loader's placeholder
    # request id on this worker, which TorchServe's add_metric could not index (a line lost).
    assert handler.micro_batching.flush_metrics()
    assert not [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]


def test_calls_in_flight_together_each_get_their_own_answers_the_loop_never_blocked(
    tmp_path: Path,
) -> None:
    worker, handler = start(tmp_path)

    async def scenario() -> list[bytes]:
        handler.gate.clear()  # the first call's first micro-batch holds preprocess
        calls = [
            asyncio.ensure_future(call(worker, [str(10 * c + i).encode() for i in range(3)], 3 * c))
            for c in range(3)
        ]
        while handler.micro_batching.stats().batches_in_flight < 3:
            await asyncio.sleep(0.001)  # each call reaches the pipeline in a few loop turns
        assert not any(task.done() for task in calls)  # the scenario: all three in flight
        handler.gate.set()
        return list(await asyncio.gather(*calls))

    got = [answer for message in asyncio.run(scenario()) for answer in answers(message)]
    values = [10 * c + i for c in range(3) for i in range(3)]
    assert got == [(f"req-{n}", 200, {"double": 2 * v}) for n, v in enumerate(values)]
    assert handler.micro_batches == [3, 3, 3]  # each call its own batch, as handle runs it
    handler.micro_batching.shutdown()


def test_bad_requests_in_a_call_fail_alone(tmp_path: Path) -> None:
    worker, handler = start(tmp_path)
    asyncio.run(call(worker, [b"7"]))  # the first stage has served: a failure there alone is a 400
    handler.micro_batches.clear()
    bodies = [b"1", b"2", b"bad", b"3", b"boom", b"4", b"5"]
    got = answers(asyncio.run(call(worker, bodies)))
    assert 4 in handler.micro_batches  # the scenario: the bad ones shared a micro-batch
    assert [status for _, status, _ in got] == [200, 200, 400, 200, 500, 200, 200]
    assert [a[2] for a in got if a[1] == 200] == [{"double": 2 * v} for v in (1, 2, 3, 4, 5)]
    handler.micro_batching.shutdown()


def test_a_stuck_first_stage_answers_the_call_at_its_timeout(tmp_path: Path) -> None:
    worker, handler = start(tmp_path, timeout_s=0.5)
    handler.gate.clear()
    try:
        got = answers(asyncio.run(call(worker, [b"1", b"2", b"3"])))  # the gate still closed
        assert handler.micro_batches == []  # the scenario: no micro-batch passed preprocess
        assert [status for _, status, _ in got] == [504] * 3
    finally:
        handler.gate.set()
        handler.micro_batching.shutdown()


def test_enabled_false_runs_the_handler_s_own_handle_on_the_asynchronous_worker(
    tmp_path: Path,
) -> None:
    worker, handler = start(tmp_path, enabled=False)

    async def two() -> list[bytes]:
        return list(await asyncio.gather(call(worker, [b"3"]), call(worker, [b"4"], first=1)))

    got = [answer for message in asyncio.run(two()) for answer in answers(message)]
    assert [a[1:] for a in got] == [(200, {"double": 6}), (200, {"double": 8})]
    assert handler.micro_batches == [1, 1]  # BaseHandler.handle: no pipeline, a call each


def test_the_worker_over_its_socket_answers_every_request(tmp_path: Path) -> None:
    # As the frontend talks to the worker: predict messages streamed on the worker's socket,
    # responses read back; AsyncService.run, TorchServe's own transport, on a thread of its
    # own with its event loop.
    worker, handler = start(tmp_path)
    frontend, worker_end = socket.socketpair()
    worker.service.set_cl_socket(worker_end)

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        worker.run()

    threading.Thread(target=serve, daemon=True).start()
    count = 40
    for i in range(count):  # 40 in flight at once
        frontend.sendall(predict_message(i, str(i).encode()))
    reader = ResponseReader(frontend)
    assert sum(reader.response() for _ in range(count)) == count  # one answer each
    assert sum(handler.micro_batches) == count  # every request through the pipeline
    frontend.close()
    handler.micro_batching.shutdown()


def test_max_window_ms_and_max_latency_ms_load_with_a_warning_that_names_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Continuous micro-batching's keys, which it read, are kept so configs still load.
    with caplog.at_level(logging.WARNING):
        worker, handler = start(tmp_path, max_window_ms=2, max_latency_ms=200)
    (warning,) = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert "micro_batching.max_window_ms" in warning and "micro_batching.max_latency_ms" in warning
    assert answers(asyncio.run(call(worker, [b"1", b"2"]))) == [
        ("req-0", 200, {"double": 2}),
        ("req-1", 200, {"double": 4}),
    ]
    micro_batching = handler.micro_batching
    pipeline = micro_batching._pipeline  # noqa: SLF001
    micro_batching.configure(replace(micro_batching.base_config, max_window_ms=1.0))
    assert micro_batching._pipeline is pipeline  # noqa: SLF001  (nothing to rebuild)
    micro_batching.shutdown()


def test_a_default_config_logs_no_warning_about_keys_without_effect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        _, handler = start(tmp_path, max_window_ms=5)  # the default, set explicitly
    assert handler.micro_batching.base_config.max_window_ms == 5  # the scenario: it was read
    assert not [r for r in caplog.records if "no effect" in r.getMessage()]
    handler.micro_batching.shutdown()


@settings(max_examples=15, deadline=None)
@given(
    calls=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    gaps_ms=st.lists(st.integers(0, 4), min_size=8, max_size=8),
    bad=st.sets(st.integers(0, 47), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_any_schedule_of_calls_answers_every_request_once_with_its_own_answer(
    tmp_path_factory: pytest.TempPathFactory,
    calls: list[int],
    gaps_ms: list[int],
    bad: set[int],
    seed: int,
) -> None:
    worker, handler = start(tmp_path_factory.mktemp("schedule"))
    rng = random.Random(seed)
    busy = threading.Event()

    async def scenario() -> list[bytes]:
        tasks, first = [], 0
        for size, gap in zip(calls, gaps_ms):
            bodies = [b"bad" if first + i in bad else str(first + i).encode() for i in range(size)]
            tasks.append(asyncio.ensure_future(call(worker, bodies, first)))
            first += size
            busy.wait(rng.random() / 1000)  # the loop itself busy now and then
            await asyncio.sleep(gap / 1000)
        return list(await asyncio.gather(*tasks))

    got = [answer for message in asyncio.run(scenario()) for answer in answers(message)]
    assert [a[0] for a in got] == [f"req-{i}" for i in range(sum(calls))]
    for i, (_, status, body) in enumerate(got):
        if i in bad:
            assert status in (400, 500), body  # 500 while the first stage never served
        else:
            assert (status, body) == (200, {"double": 2 * i})
    handler.micro_batching.shutdown()
