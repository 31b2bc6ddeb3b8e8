"""MicroBatching as TorchServe calls it: a batch and a context in, one answer per request out."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.service import Service

from tests.core.fakes import FakeHandler, expected
from tests.helpers import ROOT
from tests.torchserve.metric_lines import written
from tests.torchserve.ts_machinery import decode
from ts_microbatch import ConfigError, MicroBatching, MicroBatchingConfig, PipelineClosedError
from ts_microbatch.core.config import STAGES
from ts_microbatch.torchserve.metrics import STAGE_TIME, TorchServeMetricsObserver


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


def row_text(row: Any) -> str:
    """A TorchServe row's text: a plain body's bytes, or a KServe instance's ``data``."""
    value = row["data"] if "data" in row else row["body"]
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


class RowHandler:
    """Stages over TorchServe rows (plain bodies and KServe instances): each row's text
    passes through, upper-cased. ``on_rows`` sees preprocess's rows first, so a test can call
    the stage helpers from inside a stage; then preprocess raises RuntimeError (an error with
    no 4xx meaning) if any row's text starts with "bad"."""

    def __init__(self) -> None:
        self.context: Any = None
        self.on_rows: Callable[[list[str]], None] = lambda texts: None

    def preprocess(self, rows: list[Any]) -> list[str]:
        texts = [row_text(row) for row in rows]
        self.on_rows(texts)
        bad = [text for text in texts if text.startswith("bad")]
        if bad:
            raise RuntimeError(f"cannot read {bad}")
        return texts

    def inference(self, texts: list[str]) -> list[str]:
        return [text.upper() for text in texts]

    def postprocess(self, texts: list[str]) -> list[str]:
        return list(texts)

    def _is_describe(self) -> bool:
        return False

    def _is_explain(self) -> bool:
        return False


def v2_body(*data: Any, datatype: str = "BYTES", shape: list[int] | None = None) -> bytes:
    """An Open Inference Protocol v2 body of one input (the strict shape: any kserve mode)."""
    tensor = {"name": "x", "shape": shape or [len(data)], "datatype": datatype, "data": list(data)}
    return json.dumps({"inputs": [tensor]}).encode()


def ts_request(i: int, body: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Request ``i`` as the frontend sends it to the worker (id req-i, headers)."""
    return {
        "requestId": f"req-{i}".encode(),
        "parameters": [{"name": "body", "value": body, "contentType": "application/json"}],
        "headers": [{"name": k.encode(), "value": v.encode()} for k, v in (headers or {}).items()],
    }


def ts_service(entry_point: Any, metrics: MetricsCacheYamlImpl | None = None) -> Service:
    """TorchServe's own Service around ``entry_point``: its ``predict`` overwrites the one
    Context's request ids and RequestProcessors for each batch, as the worker does."""
    if metrics is None:
        metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
        metrics.initialize_cache()
    service = Service("rows", str(ROOT), None, entry_point, None, 8, metrics_cache=metrics)
    service.set_cl_socket(None)
    return service


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
    # The first batch waits out the timeout whatever it is; the second must finish within
    # it on a machine busy with other suites (0.05 s was not enough in CI).
    config = MicroBatchingConfig(micro_batch_size=2, timeout_s=1.0)
    context = FakeContext(3)
    with MicroBatching(handler, config=config) as mb:
        out = mb([1, 2, 3], context)
        assert [o["code"] for o in out] == [504, 504, 504]
        assert context.statuses[2][0] == 504
        handler.inference = original  # type: ignore[method-assign]
        release.set()
        assert mb([4, 5], FakeContext(2)) == expected([4, 5])


# Rows of every shape a batch holds: plain bodies, a KServe request of several instances, a
# malformed one (no items at all) and another of three instances; row -> its request.
MIXED_ROWS = [b"p0", v2_body("a1", "a2"), v2_body(1.0, 2.0, datatype="FP32", shape=[3]), b"p3"]
MIXED_ROWS += [v2_body("c1", "c2", "c3")]
MIXED_OWNERS = {"p0": 0, "a1": 1, "a2": 1, "p3": 3, "c1": 4, "c2": 4, "c3": 4}


@pytest.mark.parametrize(
    ("bodies", "owners", "micro_batch_size"),
    [
        ([f"p{i}".encode() for i in range(7)], {f"p{i}": i for i in range(7)}, 3),
        (MIXED_ROWS, MIXED_OWNERS, 2),
        (MIXED_ROWS, MIXED_OWNERS, 3),
    ],
    ids=["plain", "kserve-2", "kserve-3"],
)
def test_stage_helpers_map_rows_to_request_ids(
    bodies: list[bytes], owners: dict[str, int], micro_batch_size: int
) -> None:
    handler = RowHandler()
    seen: dict[str, str | None] = {}
    mb = MicroBatching(handler, micro_batch_size=micro_batch_size)

    def record(texts: list[str]) -> None:
        assert mb.get_micro_batch_idx() is not None
        seen.update(zip(texts, mb.current_request_ids()))

    handler.on_rows = record
    with mb:
        out = mb([{"body": body} for body in bodies], FakeContext(len(bodies)))
    assert len(out) == len(bodies)
    assert seen == {text: f"req-{request}" for text, request in owners.items()}
    assert mb.get_micro_batch_idx() is None


def test_defect_stage_helpers_read_another_requests_id_and_headers() -> None:
    # Rows were mapped to requests by item index: with a KServe request of several instances
    # (and a malformed one, which has no items) in the batch, instance a2 read request 2's
    # id and headers, and c1..c3 none. Through TorchServe's own Service.predict and Context.
    handler = RowHandler()
    mb = MicroBatching(handler, micro_batch_size=2)
    seen: dict[str, tuple[str | None, ...]] = {}
    request_indices: list[tuple[int, ...]] = []

    def look(texts: list[str]) -> None:
        context, info = mb.current_context(), mb.current_micro_batch()
        ids = mb.current_request_ids()
        assert info is not None
        request_indices.append(info.request_indices)
        for row, text in enumerate(texts):
            header, sequence = context.get_request_header(row, "tag"), context.get_sequence_id(row)
            seen[text] = (ids[row], context.get_request_id(row), header, sequence)
            context.set_response_header(row, f"x-{text}", "seen")
        if "c2" in texts:
            context.set_response_status(203, "tagged", texts.index("c2"))

    handler.on_rows = look
    service = ts_service(mb.handle)
    headers = [{"tag": f"t{i}", "ts_request_sequence_id": f"s{i}"} for i in range(5)]
    with mb:
        message = service.predict([ts_request(i, b, headers[i]) for i, b in enumerate(MIXED_ROWS)])
    code, answers = decode(message)
    assert request_indices == [(0, 1), (1, 3), (4,), (4,)]  # requests 1 and 4 span two
    assert code == 200 and [status for _, status, _ in answers] == [200, 200, 400, 200, 203]
    assert seen == {
        text: (f"req-{i}", f"req-{i}", f"t{i}", f"s{i}") for text, i in MIXED_OWNERS.items()
    }
    written = [
        sorted(key for key in processor.get_response_headers() if key.startswith("x-"))
        for processor in service.context.request_processor
    ]
    assert written == [["x-p0"], ["x-a1", "x-a2"], [], ["x-p3"], ["x-c1", "x-c2", "x-c3"]]


BAD3 = v2_body("bad0", "bad1", "bad2")
BAD6 = v2_body(*(f"bad{i}" for i in range(6)))


@pytest.mark.parametrize(
    ("bodies", "micro_batch_size", "first_runs", "statuses"),
    [
        # One micro-batch: its halves, then the request's first instance alone.
        ([b"p0", BAD3, b"p1"], 8, [["p0", "bad0", "bad1", "bad2", "p1"]], [200, 400, 200]),
        # Four micro-batches, every one failing its first run (9a922de's batch rule).
        (
            [b"p0", BAD6, b"p1"],
            2,
            [["p0", "bad0"], ["bad1", "bad2"], ["bad3", "bad4"], ["bad5", "p1"]],
            [200, 400, 200],
        ),
        # Alone, nothing shows that the input is to blame rather than the stage: 500.
        ([BAD3], 2, [["bad0", "bad1"], ["bad2"]], [500]),
    ],
    ids=["one-micro-batch", "every-micro-batch", "alone"],
)
def test_defect_one_requests_instances_failing_alike_judged_systemic(
    bodies: list[bytes], micro_batch_size: int, first_runs: list[list[str]], statuses: list[int]
) -> None:
    # An image model sent {"instances": [1, 2, 3]} answered 500 to the whole batch: the
    # request's instances failed alike and the probe or the batch rule took that for a
    # broken stage, though they were one request's. Now an item fails only alone.
    handler = RowHandler()
    calls: list[list[str]] = []
    handler.on_rows = calls.append
    mb = MicroBatching(handler, micro_batch_size=micro_batch_size)
    service = ts_service(mb.handle)
    with mb:
        code, answers = decode(service.predict([ts_request(i, b) for i, b in enumerate(bodies)]))
    # The scenario: the first run held a bad instance (the later ones of the request need
    # not run: once one of its instances failed alone, the request has failed).
    assert first_runs[0] in calls
    assert code == 200 and [status for _, status, _ in answers] == statuses
    for (_, status, body), sent in zip(answers, bodies):
        if status == 200:
            assert body.decode() == sent.decode().upper()  # plain requests, plain answers
        else:
            assert "cannot read" in json.loads(body)["error"]


def test_defect_stage_metric_lines_carry_another_requests_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Stage metric lines carried the live batch's first request id whatever micro-batch
    # they measured; each carries its micro-batch's first request now.
    metrics = MetricsCacheYamlImpl(str(Path(ROOT) / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    handler = RowHandler()
    mb = MicroBatching(
        handler, micro_batch_size=2, observer=TorchServeMetricsObserver(metrics, interval_s=0)
    )
    service = ts_service(mb.handle, metrics)
    bodies = [b"p0", v2_body("a1", "a2", "a3"), b"p2"]  # micro-batches [p0 a1] [a2 a3] [p2]
    # mb's exit (shutdown) inside the log level: it writes the metric lines still pending.
    with caplog.at_level(logging.INFO), mb:
        code, answers = decode(service.predict([ts_request(i, b) for i, b in enumerate(bodies)]))
    assert code == 200 and [status for _, status, _ in answers] == [200, 200, 200]
    for stage in ("preprocess", "inference", "postprocess"):
        lines = [
            line
            for line in written(caplog.records, f"[METRICS]{STAGE_TIME}.")
            if f"Stage:{stage}," in line
        ]
        assert [line.rsplit(",", 1)[1] for line in lines] == ["req-0", "req-1", "req-2"], lines


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


class PaddingWatcher:
    """Stages over ints that record, per stage call, how many rows the input has and what
    the stage helpers say about those rows."""

    def __init__(self) -> None:
        self.context: Any = None
        self.mb: MicroBatching | None = None
        self.seen: list[tuple[str, int, list[str | None], list[str | None], int | None]] = []

    def _look(self, stage: str, rows: list[Any]) -> None:
        if self.mb is None:
            return  # warm-up, before the test looks
        ids = self.mb.current_request_ids()
        context = self.mb.current_context()
        by_row = [context.get_request_id(row) for row in range(len(rows))]
        self.seen.append((stage, len(rows), ids, by_row, context.request_count))

    def preprocess(self, rows: list[Any]) -> list[Any]:
        self._look("preprocess", rows)
        return list(rows)

    def inference(self, rows: list[Any]) -> list[Any]:
        self._look("inference", rows)
        return list(rows)

    def postprocess(self, rows: list[Any]) -> list[Any]:
        self._look("postprocess", rows)
        return list(rows)

    def _is_describe(self) -> bool:
        return False

    def _is_explain(self) -> bool:
        return False


@pytest.mark.parametrize(
    ("pad", "padded"),
    [("requests", {"preprocess", "inference", "postprocess"}), ("tensors", {"inference"})],
)
def test_defect_current_request_ids_shorter_than_a_padded_stage_input(
    pad: str, padded: set[str]
) -> None:
    # With allowed sizes [1, 4], a micro-batch of 3 requests reaches the padded stages as 4
    # rows, but current_request_ids() gave one id per real request (3): a stage zipping its
    # rows with the ids lost the last row. One entry per row now, None for padding.
    settings = {"micro_batch_size": 4, "allowed_micro_batch_sizes": [1, 4], "pad": pad}
    handler = PaddingWatcher()
    config = MicroBatchingConfig.from_mapping(settings | {"warmup": {}})
    with MicroBatching(handler, config=config) as mb:
        handler.mb = mb
        assert mb([1, 2, 3], FakeContext(3)) == [1, 2, 3]
    real = ["req-0", "req-1", "req-2"]
    # The scenario: the padded stages, and only those, saw 4 rows.
    assert {stage: rows for stage, rows, *_ in handler.seen} == {
        stage: 4 if stage in padded else 3 for stage in STAGES
    }
    for stage, rows, ids, by_row, count in handler.seen:
        want = real + [None] if stage in padded else real
        assert (ids, by_row, count) == (want, want, rows), stage


def test_broken_metrics_change_no_answer_and_are_logged_once_per_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One guard: TorchServeMetricsObserver lets TorchServe's error out, and the
    # GuardedObserver the pipeline wraps it in logs each hook's first failure and drops it.
    class BrokenMetrics:
        calls = 0

        def add_metric(self, *args: Any, **kwargs: Any) -> None:
            BrokenMetrics.calls += 1
            raise RuntimeError("metrics cache is broken")

    handler = FakeTorchServeHandler()
    observer = TorchServeMetricsObserver(BrokenMetrics(), interval_s=0)
    with (
        caplog.at_level(logging.DEBUG),
        MicroBatching(handler, micro_batch_size=2, observer=observer) as mb,
    ):
        assert mb([1, 2, 3], FakeContext(3)) == expected([1, 2, 3])
        assert mb([4, 5], FakeContext(2)) == expected([4, 5])
    assert BrokenMetrics.calls > 4  # the scenario: every report raised
    first = [r for r in caplog.records if r.levelno >= logging.ERROR]
    hooks = sorted(r.getMessage().split(".")[1].split(" ")[0] for r in first)
    assert hooks == ["on_batch", "on_stage"], [r.getMessage() for r in first]
    assert all(r.exc_info and r.name == "ts_microbatch.core.metrics" for r in first)


@pytest.mark.parametrize("how", ["setter", "configure"])
def test_defect_auto_set_at_run_time_kept_the_old_size_as_its_ceiling(how: str) -> None:
    # With lengths on and a fixed size of 2 in force, "auto" set at run time got a token
    # budget whose most items were 2, where a fresh "auto" config gets max_micro_batch_size.
    handler = FakeTorchServeHandler()
    config = MicroBatchingConfig(micro_batch_size=2, order="length")
    with MicroBatching(handler, config=config) as mb:
        assert mb._pipeline.token_budget is None  # the scenario: a fixed size in force
        if how == "setter":
            mb.micro_batch_size = "auto"
        else:
            mb.configure(MicroBatchingConfig.from_mapping({"micro_batch_size": "auto"}, config))
        budget = mb._pipeline.token_budget
        assert budget is not None and budget.max_items == config.max_micro_batch_size == 32
        fresh = MicroBatching(
            handler, config=MicroBatchingConfig(micro_batch_size="auto", order="length")
        )
        try:
            assert fresh._pipeline.token_budget is not None
            assert fresh._pipeline.token_budget.max_items == budget.max_items
        finally:
            fresh.shutdown()
        assert [o for o in mb.handle(list(range(16)))] == expected(list(range(16)))


@pytest.mark.parametrize("length", [True, 3.9, "12", None])
def test_defect_item_length_true_float_or_str_was_accepted(length: Any) -> None:
    # The adapter ran int() on item_length's result before the core's check: True, 3.9 and
    # "12" were counted as 1, 3 and 12 instead of failing that request with 400.
    class Measured(FakeTorchServeHandler):
        def item_length(self, item: int) -> Any:
            return length if item == 1 else 4

    context = FakeContext(3)
    with MicroBatching(Measured(), config=MicroBatchingConfig(order="length")) as mb:
        out = mb(list(range(3)), context)
    assert out[0] == expected([0])[0] and out[2] == expected([2])[0]
    assert out[1]["code"] == 400 and "item_length returned" in out[1]["message"]
    assert context.statuses[1][0] == 400 and set(context.statuses) == {1}


def test_defect_configure_forgot_the_first_stages_record() -> None:
    # configure() with a change other than size or threads replaces the pipeline: the same
    # bad body alone went from 400 (the first stage had served) to 500.
    handler = FakeTorchServeHandler()
    handler.fail_on["preprocess"] = {7}
    with MicroBatching(handler, micro_batch_size=1) as mb:
        assert mb.handle([1]) == expected([1])
        before = mb.handle([7])[0]
        assert before["code"] == 400
        mb.configure(MicroBatchingConfig(micro_batch_size=1, max_queued_micro_batches=2))
        assert mb.handle([7])[0]["code"] == before["code"]
