"""The breakers judge the model, not the inputs on trial, through TorchServe's own worker
machinery, on both workers: the synchronous one (``Service.predict`` on a batch of rows)
and the asynchronous one (``asyncCommunication: true``: TorchServe's asynchronous predict
awaiting ``handle_async`` on the same batch); either way one pipeline batch.

The handler is a text model whose inference fails a call holding a text past 512
characters, as BERT's position embeddings do past 512 tokens; its answer depends on the
text alone. Each scenario is proven (the over-long and the short text shared a failing
inference call) before its answers are asserted. The defect named here was reproduced on
81bb3fd; its test fails there.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from ts.async_service import AsyncService

from tests.torchserve.ts_machinery import decode, load_service, request, write_manifest
from ts_microbatch.core.micro_batch import MicroBatchInfo
from ts_microbatch.torchserve.context import BatchContext, stage_context

pytestmark = pytest.mark.generative

TEXT_HANDLER = """
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import MicroBatchingMixin

# The model's errors: a text past 512 positions fails with ERRORS[its first digit].
ERRORS = (IndexError, ConnectionRefusedError, TimeoutError)


class TextHandler(MicroBatchingMixin, BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True
        self.inference_calls = []
        self.start_micro_batching(context)

    def preprocess(self, data):
        self.preprocess_calls = getattr(self, "preprocess_calls", 0) + 1
        if getattr(self, "store_down", False):  # the store preprocess reads features from
            raise ConnectionRefusedError("feature store down")
        texts = []
        for row in data:
            value = row.get("body") or row.get("data")
            readable = isinstance(value, (bytes, bytearray))
            texts.append(bytes(value).decode() if readable else str(value))
        return texts

    def inference(self, texts, *args, **kwargs):
        self.inference_calls.append(list(texts))
        if getattr(self, "down", False):  # the store it looks texts up in is down
            raise RuntimeError("store down, looking up: " + " | ".join(texts))
        for text in texts:
            if len(text) > 512:  # BERT's position embeddings stop at 512
                raise ERRORS[int(text[0])]("index out of range in self")
        return [len(text) for text in texts]

    def postprocess(self, lengths):
        return [{"length": n} for n in lengths]
"""

WORKERS = ("synchronous", "asynchronous")
HANDLER = "known_good_text_handler.py"


def over_long(error: int = 0, n: int = 0) -> str:
    """A text inference fails on, with its error ``ERRORS[error]``; ``n`` tells them apart."""
    return f"{error}:{n}:" + "x" * 600


class Worker:
    """A TorchServe worker serving ``TextHandler`` in-process; ``send`` sends texts as one
    batch (on the asynchronous worker, one predict coroutine run on an event loop) and
    gives each its (status, body)."""

    def __init__(
        self,
        kind: str,
        directory: Path,
        micro_batch_size: int,
        handler: tuple[str, str] = (HANDLER, TEXT_HANDLER),
        **section: Any,
    ) -> None:
        """``handler``: its file name (a module name of its own: TorchServe imports a handler
        by name, and the text example's tests import theirs as "text_handler" in this
        process) and source; ``section``: more micro_batching keys."""
        self.kind = kind
        directory.mkdir()
        name, source = handler
        (directory / name).write_text(source, encoding="utf-8")
        section = {"micro_batch_size": micro_batch_size, **section}
        config = f"batchSize: 64\nmicro_batching: {json.dumps(section)}\n"
        if kind == "asynchronous":
            config = "asyncCommunication: true\n" + config
        (directory / "model-config.yaml").write_text(config, encoding="utf-8")
        write_manifest(directory, "text", name, configFile="model-config.yaml")
        service = load_service(directory, model_name="text", handler=name)
        self.handler = service._entry_point.__self__
        self.service = service
        self.asynchronous = AsyncService(service) if kind == "asynchronous" else None

    def send(self, texts: list[str | bytes]) -> list[tuple[int, Any]]:
        """Each text as a plain body; bytes as a JSON body (a KServe one)."""
        rows = [
            request(i, text, "application/json")
            if isinstance(text, bytes)
            else request(i, text.encode(), "text/plain")
            for i, text in enumerate(texts)
        ]
        if self.asynchronous is not None:
            # The asynchronous predict AsyncService bound to the service: a coroutine.
            message = asyncio.run(self.service.predict(rows))
        else:
            message = self.service.predict(rows)
        code, answers = decode(message)
        assert code == 200
        return [(status, json.loads(body)) for _, status, body in answers]

    def broken_stages(self) -> tuple[str, ...]:
        return tuple(self.handler.micro_batching._pipeline.stats().broken_stages)

    def close(self) -> None:
        self.handler.micro_batching.shutdown()


@pytest.fixture(params=WORKERS)
def worker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_defect_a_burst_of_bad_inputs_failed_a_short_text_served_alone(
    worker_kind: str, tmp_path: Path
) -> None:
    # A model that has served; a burst of over-long texts (IndexError in inference),
    # nothing served: the breaker opened, and each later [over-long, short] micro-batch
    # was probed with the over-long text, so the short text got 500 in 5/5 batches.
    worker = Worker(worker_kind, tmp_path / "text", micro_batch_size=2)
    try:
        assert worker.send(["served"]) == [(200, {"length": 6})]
        burst = worker.send([over_long(0, n) for n in range(12)])
        assert [status for status, _ in burst] == [500] * 12  # the scenario: nothing served
        for n in range(5):
            long, short = over_long(0, 100 + n), f"short {n}"
            calls = len(worker.handler.inference_calls)
            got = worker.send([long, short])
            assert [long, short] in worker.handler.inference_calls[calls:]  # shared, failed
            assert got[-2][0] == 500
            assert got[-1] == (200, {"length": len(short)})  # what it gets alone
        assert worker.broken_stages() == ()
    finally:
        worker.close()


bad_texts = st.tuples(st.integers(0, 2), st.integers(0, 10**6))


@pytest.mark.parametrize("kind", WORKERS)
@settings(max_examples=8, deadline=None)
@given(
    micro_batch_size=st.integers(1, 4),
    burst=st.lists(bad_texts, max_size=16),
    mixed=st.lists(st.lists(st.none() | bad_texts, min_size=1, max_size=8), max_size=3),
)
@example(micro_batch_size=2, burst=[(0, n) for n in range(8)], mixed=[[(0, 9), None]])
def test_a_healthy_model_serves_every_short_text_after_any_burst_of_over_long_ones(
    kind: str,
    tmp_path_factory: pytest.TempPathFactory,
    micro_batch_size: int,
    burst: list[tuple[int, int]],
    mixed: list[list[tuple[int, int] | None]],
) -> None:
    # A model that has served one text, then a burst of 0-16 over-long texts of mixed error
    # types, then batches of short and over-long ones: every short text gets 200 and its
    # length (what it gets alone), every over-long one 500; no stage is ever judged.
    worker = Worker(kind, tmp_path_factory.mktemp("text") / "model", micro_batch_size)
    try:
        assert worker.send(["served"]) == [(200, {"length": 6})]
        for texts in [[over_long(*b) for b in burst], *mixed_texts(mixed)]:
            if not texts:
                continue
            for text, (status, body) in zip(texts, worker.send(texts)):
                if len(text) > 512:
                    assert status == 500, (text[:12], body)
                else:
                    assert (status, body) == (200, {"length": len(text)}), text
            assert worker.broken_stages() == ()
    finally:
        worker.close()


def test_no_answer_carries_another_request_s_words_when_a_stage_is_judged_broken(
    worker_kind: str, tmp_path: Path
) -> None:
    # Issue 49: judged broken, a micro-batch failed whole with its call's exception, whose
    # text here names every text the call held: a good request's 500 read another's words.
    worker = Worker(worker_kind, tmp_path / "text", micro_batch_size=4)
    try:
        assert worker.send(["served a"]) == [(200, {"length": 8})]
        assert worker.send(["served b"]) == [(200, {"length": 8})]
        worker.handler.down = True  # every inference call fails now, the witnesses' too
        burst = worker.send([f"burst {n}" for n in range(6)])
        assert [status for status, _ in burst] == [500] * 6  # each alone: on trial
        token = "tok3n-5e3a"
        calls = len(worker.handler.inference_calls)
        kserve = json.dumps(
            {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["good v2"]}]}
        ).encode()
        got = worker.send([f"secret {token}", "good", kserve])
        shared = worker.handler.inference_calls[calls]
        assert token in " ".join(shared) and "good" in shared  # the scenario: one call
        assert worker.broken_stages() == ("inference",)  # and a verdict: judged broken
        for status, body in got:
            assert status == 500, body
            text = json.dumps(body)
            assert "inference" in text and "known to be good" in text, text
        for _, body in got[1:]:
            assert token not in json.dumps(body)  # no other request's words
    finally:
        worker.close()


def test_a_preprocess_whose_store_goes_down_fails_fast_and_serves_when_it_is_back(
    worker_kind: str, tmp_path: Path
) -> None:
    # Issue 49: a first stage that had served was never judged broken, so a preprocess
    # whose feature store went down cost every batch its whole isolation, each request
    # answered 400 as if its own input were bad. It is judged as inference is now.
    worker = Worker(worker_kind, tmp_path / "text", micro_batch_size=2)
    try:
        assert worker.send(["served a"]) == [(200, {"length": 8})]  # its two witnesses
        assert worker.send(["served b"]) == [(200, {"length": 8})]
        worker.handler.store_down = True
        first = worker.send([f"down {n}" for n in range(6)])
        assert [status for status, _ in first] == [400] * 6  # no verdict yet: each alone
        assert worker.broken_stages() == ()
        for _ in range(2):
            calls = worker.handler.preprocess_calls
            later = worker.send([f"later {n}" for n in range(6)])
            assert worker.broken_stages() == ("preprocess",)  # judged on what it served
            assert worker.handler.preprocess_calls - calls <= 3 + 2  # a call a micro-batch
            for status, body in later:
                assert status == 500 and "preprocess" in json.dumps(body), body
        worker.handler.store_down = False
        assert worker.send(["back a", "back b"]) == [(200, {"length": 6})] * 2
        assert worker.broken_stages() == ()
    finally:
        worker.close()


def mixed_texts(batches: list[list[tuple[int, int] | None]]) -> list[list[str]]:
    return [
        [f"short {n}.{i}" if kind is None else over_long(*kind) for i, kind in enumerate(batch)]
        for n, batch in enumerate(batches)
    ]


class _Processor:
    """TorchServe's RequestProcessor, as far as a context reaches it."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.written: list[Any] = []

    def get_request_property(self, key: str) -> str | None:
        return self.headers.get(key)

    def get_request_properties(self) -> dict[str, str]:
        return self.headers

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self.written.append((code, reason_phrase))

    def add_response_property(self, key: str, value: str) -> None:
        self.written.append((key, value))


def test_a_known_good_probe_s_context_reads_its_own_row_and_writes_nowhere() -> None:
    # The probe replays a request of a batch that may still be in flight (asynchronous
    # worker): it reads that request's id and headers, and its writes reach no processor.
    processors = [_Processor({"k": "zero"}), _Processor({"k": "one"})]
    live = SimpleNamespace(request_ids={0: "id-0", 1: "id-1"}, request_processor=processors)
    row = BatchContext(live).private_row(1)
    view = stage_context(MicroBatchInfo(0, 0, 1, 0, context=row))  # as a stage call gets it
    assert view.get_request_id(0) == "id-1"
    assert view.get_request_header(0, "k") == "one"
    view.set_response_status(500, "no", 0)
    view.set_all_response_status(503)
    view.set_response_header(0, "x", "y")
    assert processors[0].written == processors[1].written == []
    assert row.request_ids == {0: "id-1"} and row.request_processor is not processors
