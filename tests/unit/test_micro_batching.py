"""MicroBatching as TorchServe calls it: a batch and a context in, one answer per request out."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.unit.fakes import FakeHandler, expected
from ts_microbatch import ConfigError, MicroBatching, MicroBatchingConfig, PipelineClosedError


class FakeMetrics:
    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []

    def add_time(self, name: str, value: float, idx: Any = None, unit: str = "ms") -> None:
        self.times.append((name, value))


class FakeContext:
    """The parts of ts.context.Context that handlers use."""

    def __init__(self, n: int, headers: dict[str, str] | None = None) -> None:
        self.request_ids = {i: f"req-{i}" for i in range(n)}
        self.statuses: dict[int, tuple[int, str]] = {}
        self.headers = headers or {}
        self.metrics = FakeMetrics()

    def get_request_id(self, idx: int = 0) -> str | None:
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.headers.get(key)

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.statuses[idx] = (code, phrase)


class FakeTorchServeHandler(FakeHandler):
    """FakeHandler plus BaseHandler's describe/explain hooks."""

    def _is_describe(self) -> bool:
        return self.context.get_request_header(0, "describe") == "True"

    def _is_explain(self) -> bool:
        return self.context.get_request_header(0, "explain") == "True"

    def describe_handle(self) -> dict[str, str]:
        return {"model": "fake"}

    def explain_handle(self, preprocessed: list[int], raw: list[int]) -> list[str]:
        return [f"explained {x}" for x in preprocessed]


def test_drop_in_constructor_and_setters() -> None:
    handler = FakeTorchServeHandler()
    with MicroBatching(handler) as mb:
        assert mb.micro_batch_size == 1
        assert mb.parallelism == {"preprocess": 1, "inference": 1, "postprocess": 1}
        mb.parallelism = {"preprocess": 2, "postprocess": 2}
        mb.micro_batch_size = 4
        assert mb.parallelism == {"preprocess": 2, "inference": 1, "postprocess": 2}
        assert mb.config.micro_batch_size == 4
        assert mb.handle(list(range(10))) == expected(list(range(10)))
    with MicroBatching(handler, 3, {"inference": 2}) as mb:
        assert (mb.micro_batch_size, mb.parallelism["inference"]) == (3, 2)


def test_bad_settings_raise_config_errors_not_asserts() -> None:
    with MicroBatching(FakeTorchServeHandler()) as mb:
        with pytest.raises(ConfigError, match="micro_batch_size: got 0"):
            mb.micro_batch_size = 0
        with pytest.raises(ConfigError, match="parallelism.render: unknown stage"):
            mb.parallelism = {"render": 1}
    with pytest.raises(ConfigError, match="parallelism.inference: got 0"):
        MicroBatching(FakeTorchServeHandler(), parallelism={"inference": 0})


@pytest.mark.parametrize(("stage", "code"), [("preprocess", 400), ("inference", 500)])
def test_call_answers_each_request_with_its_own_status(stage: str, code: int) -> None:
    # A plain exception pinned on one request in the first stage, while the rest of the
    # batch got through it, is that request's input (400); in a later stage it is a 500.
    handler = FakeTorchServeHandler()
    handler.fail_on[stage] = {3}
    context = FakeContext(8)
    with MicroBatching(handler, micro_batch_size=4) as mb:
        out = mb(list(range(8)), context)
    phrase = {400: "Bad Request", 500: "Internal Server Error"}[code]
    assert context.statuses == {3: (code, phrase)}
    assert out[3] == {
        "code": code,
        "type": "Bad",
        "message": f"{stage} rejects [3]",
        "request_id": "req-3",
    }
    assert [o for i, o in enumerate(out) if i != 3] == expected([0, 1, 2, 4, 5, 6, 7])
    assert [name for name, _ in context.metrics.times] == ["HandlerTime"]


def test_describe_and_explain_paths() -> None:
    handler = FakeTorchServeHandler()
    with MicroBatching(handler) as mb:
        assert mb([1], FakeContext(1, {"describe": "True"})) == [{"model": "fake"}]
        assert mb([1, 2], FakeContext(2, {"explain": "True"})) == ["explained 10", "explained 20"]


def test_timeout_answers_504_and_next_batch_is_served() -> None:
    handler = FakeTorchServeHandler()
    release = threading.Event()
    original = handler.inference

    def stuck(batch: list[int]) -> list[int]:
        release.wait(10)
        return original(batch)

    handler.inference = stuck  # type: ignore[method-assign]
    config = MicroBatchingConfig(micro_batch_size=2, timeout_s=0.05)
    context = FakeContext(3)
    with MicroBatching(handler, config=config) as mb:
        out = mb([1, 2, 3], context)
        assert [o["code"] for o in out] == [504, 504, 504]
        assert context.statuses[2][0] == 504
        handler.inference = original  # type: ignore[method-assign]
        release.set()
        assert mb([4, 5], FakeContext(2)) == expected([4, 5])


def test_stage_helpers_map_rows_to_request_ids() -> None:
    handler = FakeTorchServeHandler()
    seen: list[list[str | None]] = []
    lock = threading.Lock()
    mb = MicroBatching(handler, micro_batch_size=3)
    original = handler.inference

    def record(batch: list[int]) -> list[int]:
        with lock:
            seen.append(mb.current_request_ids())
        assert mb.get_micro_batch_idx() is not None
        return original(batch)

    handler.inference = record  # type: ignore[method-assign]
    with mb:
        mb(list(range(7)), FakeContext(7))
    assert sorted(seen) == [["req-0", "req-1", "req-2"], ["req-3", "req-4", "req-5"], ["req-6"]]
    assert mb.get_micro_batch_idx() is None


def test_configure_replaces_the_pipeline_when_queue_settings_change() -> None:
    handler = FakeTorchServeHandler()
    with MicroBatching(handler) as mb:
        mb.configure(
            MicroBatchingConfig(
                micro_batch_size=2, max_queued_micro_batches=1, isolate_failures=False
            )
        )
        handler.fail_on["inference"] = {1}
        out = mb.handle([0, 1, 2])
        assert [o.get("code") for o in out] == [500, 500, None]
        mb.configure(MicroBatchingConfig(micro_batch_size=5))
        assert mb.config.micro_batch_size == 5


def test_after_shutdown_handle_raises_clearly() -> None:
    mb = MicroBatching(FakeTorchServeHandler())
    mb.shutdown()
    mb.shutdown()
    with pytest.raises(PipelineClosedError, match="shut down"):
        mb.handle([1])


def test_every_request_of_a_failing_batch_gets_an_error_and_bad_is_isolated() -> None:
    handler = FakeTorchServeHandler()
    handler.always_fail = {"postprocess"}
    context = FakeContext(32)
    with MicroBatching(handler, micro_batch_size=4, parallelism={"preprocess": 2}) as mb:
        out = mb(list(range(32)), context)
        assert len(context.statuses) == 32 and all(o["code"] == 500 for o in out)
        handler.always_fail = set()
        handler.fail_on["inference"] = {7}
        context = FakeContext(32)
        out = mb(list(range(32)), context)
    assert list(context.statuses) == [7]
    assert context.statuses[7][0] == 500 and out[7]["type"] == "Bad"
