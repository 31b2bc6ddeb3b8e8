"""``timeout_s`` against TorchServe's ``responseTimeout``, through TorchServe's own loader.

The frontend kills a worker that has not answered a batch within responseTimeout, failing
every request of the batch: ``handle()`` must answer first. So ``timeout_s: null`` runs
with 90% of responseTimeout, and a ``timeout_s`` at or above it fails the load.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.compiled_model import build
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch import ConfigError

ROW = json.dumps([0.5] * 16).encode()


def load(tmp_path: Path, micro_batching: dict[str, Any], **top: Any) -> tuple[Any, Any]:
    config = build.model_config(micro_batching, compiled=False, **top)
    directory = build.model_dir(tmp_path / "tiny", config)
    service = load_service(directory, model_name="tiny", handler="tiny_handler.py")
    return service, service._entry_point.__self__


@pytest.mark.parametrize(("top", "timeout_s"), [({}, 108.0), ({"responseTimeout": 20}, 18.0)])
def test_timeout_null_runs_with_90_percent_of_response_timeout(
    tmp_path: Path, top: dict[str, Any], timeout_s: float
) -> None:
    _, handler = load(tmp_path, {"timeout_s": None}, **top)
    try:
        assert handler.micro_batching.config.timeout_s == timeout_s
    finally:
        handler.micro_batching.shutdown()


@pytest.mark.parametrize(
    ("timeout_s", "top", "response_s"),
    [(20, {"responseTimeout": 20}, 20), (30, {"responseTimeout": 20}, 20), (120, {}, 120)],
)
def test_timeout_s_at_or_above_response_timeout_fails_the_load(
    tmp_path: Path, timeout_s: int, top: dict[str, Any], response_s: int
) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {"timeout_s": timeout_s}, **top)
    message = str(info.value)
    assert message.startswith(f"micro_batching.timeout_s: got {timeout_s}, expected less than")
    assert f"responseTimeout ({response_s} s" in message


def test_timeout_s_below_response_timeout_is_kept(tmp_path: Path) -> None:
    _, handler = load(tmp_path, {"timeout_s": 19.5}, responseTimeout=20)
    try:
        assert handler.micro_batching.config.timeout_s == 19.5
    finally:
        handler.micro_batching.shutdown()


class StuckInference:
    """An inference stage that blocks until released; ``entered`` is set once it is in."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, batch: Any) -> Any:
        self.entered.set()
        self.release.wait(60)
        raise RuntimeError("released")


def answered_while_stuck(stage: StuckInference, call: Callable[[], Any]) -> Any:
    """Runs ``call`` on a thread; asserts it returned while ``stage`` was still stuck."""
    answers: list[Any] = []
    caller = threading.Thread(target=lambda: answers.append(call()))
    try:
        caller.start()
        assert stage.entered.wait(30), "the batch never reached inference"
        caller.join(30)
        assert not caller.is_alive(), "handle() did not return while inference was stuck"
    finally:
        stage.release.set()
        caller.join(60)
    return answers[0]


def test_hang_timeout_null_answers_a_stuck_batch_before_response_timeout(
    tmp_path: Path,
) -> None:
    service, handler = load(tmp_path, {"micro_batch_size": 2}, responseTimeout=1)
    handler.inference = stuck = StuckInference()
    try:
        answer = answered_while_stuck(
            stuck, lambda: service.predict([request(i, ROW) for i in range(3)])
        )
    finally:
        handler.micro_batching.shutdown()
    code, got = decode(answer)
    assert code == 200 and [status for _, status, _ in got] == [504] * 3


def test_defect_upstream_style_handler_waited_forever_on_a_stuck_batch() -> None:
    # Defect: the responseTimeout rule lived only in the mixin's initialize, so a handler
    # written upstream's way (self.handle = MicroBatching(self)), or a configure() at run
    # time, ran with timeout_s null: handle() blocked until the frontend killed the worker.
    from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext

    from tests.core.fakes import FakeHandler
    from ts_microbatch import MicroBatching

    handler = FakeHandler()
    handler.inference = stuck = StuckInference()
    context = MockContext()
    context.model_yaml_config = {"responseTimeout": 1}
    mb = MicroBatching(handler, micro_batch_size=2)
    try:
        answers = answered_while_stuck(stuck, lambda: mb.handle([1, 2, 3], context))
    finally:
        mb.shutdown()
    assert [a["code"] for a in answers] == [504, 504, 504]
    assert all("timeout_s=0.9" in a["message"] for a in answers)


def slow_cut_handler(monkeypatch: pytest.MonkeyPatch, timeout_s: float) -> tuple[Any, Any, Any]:
    """A MicroBatching whose cut (``submit_batch``, where headers are read and the batch
    planned) takes ``timeout_s`` + 1 s on the deadline's clock, its inference stuck; the
    ``cut`` event is set once the cut ran."""
    from tests.core.fakes import FakeHandler
    from ts_microbatch import MicroBatching, MicroBatchingConfig
    from ts_microbatch.torchserve import timeouts

    handler = FakeHandler()
    handler.inference = stuck = StuckInference()
    config = MicroBatchingConfig.from_mapping({"micro_batch_size": 2, "timeout_s": timeout_s})
    mb = MicroBatching(handler, config=config)
    now_s = [1000.0]
    # raising=False: on a tree without the clock the batch waits timeout_s after its cut.
    # The clock is looked up in timeouts, where handle() and the cut both read it.
    monkeypatch.setattr(timeouts, "clock", lambda: now_s[0], raising=False)
    cut, submit_batch = threading.Event(), mb._pipeline.submit_batch

    def slow_cut(*args: Any, **kwargs: Any) -> Any:
        now_s[0] += timeout_s + 1  # reading the bodies took longer than the whole budget
        cut.set()
        return submit_batch(*args, **kwargs)

    monkeypatch.setattr(mb._pipeline, "submit_batch", slow_cut)
    return mb, stuck, cut


def returned_while_stuck(stage: StuckInference, call: Callable[[], Any]) -> Any:
    """Runs ``call`` on a thread; asserts it returned within a bounded wait (well under the
    100 s ``timeout_s`` the batch would otherwise have waited on top of its cut)."""
    answers: list[Any] = []
    caller = threading.Thread(target=lambda: answers.append(call()))
    try:
        caller.start()
        caller.join(30)
        assert not caller.is_alive(), "handle() waited timeout_s after a cut that spent it"
    finally:
        stage.release.set()
        caller.join(60)
    return answers[0]


@pytest.mark.parametrize("path", ["handle", "handle_async"])
def test_defect_the_time_spent_cutting_a_batch_did_not_count_against_timeout_s(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # Issue 40: timeout_s started after _submit returned, so the seconds a cut spent
    # reading hostile headers came on top of it, past the frontend's responseTimeout.
    mb, stuck, cut = slow_cut_handler(monkeypatch, timeout_s=100.0)
    if path == "handle":
        call = lambda: mb.handle([1, 2, 3], None)  # noqa: E731
    else:
        call = lambda: asyncio.run(mb.handle_async([1, 2, 3], None))  # noqa: E731
    try:
        answers = returned_while_stuck(stuck, call)
    finally:
        mb.shutdown()
    assert cut.is_set()  # the scenario: the cut ran, and spent the budget
    assert [a["code"] for a in answers] == [504, 504, 504]
    assert all("timeout_s=100.0" in a["message"] for a in answers)


@pytest.mark.parametrize("path", ["handle", "handle_async"])
def test_defect_a_cut_that_spent_timeout_s_still_started_its_micro_batches(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # Issue 40, after the deadline counted the cut: a batch whose cut used up timeout_s was
    # still queued, so the stage threads started micro-batches nobody waited for, work taken
    # from the next batch. Answered 504 at the cut now, none queued.
    mb, stuck, cut = slow_cut_handler(monkeypatch, timeout_s=100.0)
    queued: list[Any] = []
    enqueue = mb._pipeline._enqueue
    monkeypatch.setattr(
        mb._pipeline, "_enqueue", lambda *args, **kw: (queued.append(args), enqueue(*args, **kw))
    )
    if path == "handle":
        call = lambda: mb.handle([1, 2, 3], None)  # noqa: E731
    else:
        call = lambda: asyncio.run(mb.handle_async([1, 2, 3], None))  # noqa: E731
    try:
        answers = returned_while_stuck(stuck, call)
    finally:
        mb.shutdown(wait=True)  # the stage threads are joined: any call they made is counted
    assert cut.is_set()  # the scenario: the cut ran, and spent the budget
    assert [a["code"] for a in answers] == [504, 504, 504]
    assert all("timeout_s=100.0" in a["message"] for a in answers)
    assert queued == [] and not stuck.entered.is_set()
    assert mb.handler.calls == {"preprocess": [], "inference": [], "postprocess": []}
