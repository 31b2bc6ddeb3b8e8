"""The pipeline with fake stages: ordering, isolation, failure paths, shutdown, reconfiguration."""

from __future__ import annotations

import threading
from concurrent.futures import Future, wait
from typing import Any

import pytest

from tests.core.fakes import Bad, FakeHandler, cause, expected
from ts_microbatch import ConfigError, Pipeline, PipelineClosedError, StageOutputError
from ts_microbatch.core.errors import SharedFailureError
from ts_microbatch.core.metrics import PipelineObserver
from ts_microbatch.core.micro_batch import current_micro_batch

WAIT_S = 10.0  # bound on any wait; a correct pipeline answers in milliseconds


def make_pipeline(handler: FakeHandler, **kwargs: Any) -> Pipeline:
    # Stages look the method up on each call, so a test can swap one mid-run.
    stages = {
        name: (lambda batch, name=name: getattr(handler, name)(batch))
        for name in ("preprocess", "inference", "postprocess")
    }
    return Pipeline(stages, **kwargs)


def outcomes(futures: list[Any]) -> list[Any]:
    done, not_done = wait(futures, timeout=WAIT_S)
    assert not not_done, f"{len(not_done)} requests never answered"
    return [f.exception() or f.result() for f in futures]


@pytest.mark.parametrize("micro_batch_size", [1, 2, 3, 7, 32, 100])
@pytest.mark.parametrize("threads", [1, 3])
def test_results_in_request_order_under_random_delays(micro_batch_size: int, threads: int) -> None:
    handler = FakeHandler(jitter_s=0.003, seed=micro_batch_size)
    items = list(range(64))
    with make_pipeline(
        handler,
        micro_batch_size=micro_batch_size,
        parallelism={"preprocess": threads, "inference": threads, "postprocess": threads},
    ) as pipeline:
        assert outcomes(pipeline.submit(items)) == expected(items)


@pytest.mark.parametrize("stage", ["preprocess", "inference", "postprocess"])
@pytest.mark.parametrize("micro_batch_size", [1, 4, 32])
def test_only_the_bad_requests_fail(stage: str, micro_batch_size: int) -> None:
    handler = FakeHandler()
    handler.fail_on[stage] = {5, 17, 18}
    items = list(range(32))
    with make_pipeline(
        handler, micro_batch_size=micro_batch_size, parallelism={"preprocess": 2}
    ) as p:
        results = outcomes(p.submit(items))
    for item, result in zip(items, results):
        if item in {5, 17, 18}:
            assert isinstance(result, Bad), (item, result)
        else:
            assert result == {"item": item, "value": item * 10 + 1}


def test_isolation_reruns_halves_not_every_request() -> None:
    handler = FakeHandler()
    handler.fail_on["preprocess"] = {13}
    with make_pipeline(handler, micro_batch_size=16) as p:
        outcomes(p.submit(list(range(32))))
    # 2 micro-batches, then halves 8+8, 4+4, 2+2, 1+1 of the failing one: 2 + 2*4 calls.
    assert len(handler.calls["preprocess"]) == 10
    assert [13] in handler.calls["preprocess"]


def test_isolation_off_fails_the_whole_micro_batch() -> None:
    handler = FakeHandler()
    handler.fail_on["inference"] = {2}
    with make_pipeline(handler, micro_batch_size=4, isolate_failures=False) as p:
        results = outcomes(p.submit(list(range(8))))
    # the whole micro-batch, in the server's words: its call's error was request 2's
    assert all(
        isinstance(r, SharedFailureError) and "isolation is disabled" in str(r) for r in results[:4]
    )
    assert all(isinstance(cause(r), Bad) for r in results[:4])
    assert results[4:] == expected([4, 5, 6, 7])


def test_hang_when_a_stage_raises_on_every_call_then_next_batch_is_served() -> None:
    handler = FakeHandler()
    handler.always_fail = {"inference"}
    with make_pipeline(handler, micro_batch_size=4, parallelism={"preprocess": 2}) as p:
        results = outcomes(p.submit(list(range(32))))
        assert all(isinstance(r, RuntimeError) and "inference is broken" in str(r) for r in results)
        handler.always_fail = set()
        assert outcomes(p.submit(list(range(32)))) == expected(list(range(32)))


@pytest.mark.parametrize("bad_output", [None, [1, 2, 3], "text", [{"a": 1}] * 5])
def test_wrong_number_of_outputs_is_an_error_giving_both_counts(bad_output: Any) -> None:
    handler = FakeHandler()
    handler.postprocess = lambda batch: bad_output  # type: ignore[method-assign,assignment]
    with make_pipeline(handler, micro_batch_size=4, isolate_failures=False) as p:
        results = outcomes(p.submit(list(range(4))))
    assert all(isinstance(r, StageOutputError) for r in results)
    assert "postprocess" in str(results[0]) and "4" in str(results[0])


def test_base_exception_in_a_stage_resolves_requests_and_thread_keeps_serving() -> None:
    handler = FakeHandler()

    class Fatal(BaseException):
        pass

    def explode(batch: list[int]) -> list[int]:
        raise Fatal("not an Exception")

    original = handler.inference
    handler.inference = explode  # type: ignore[method-assign]
    with make_pipeline(handler, micro_batch_size=2) as p:
        results = outcomes(p.submit([1, 2, 3]))
        assert all(isinstance(cause(r), Fatal) for r in results)
        handler.inference = original  # type: ignore[method-assign]
        assert outcomes(p.submit([1, 2, 3])) == expected([1, 2, 3])
        assert p.stats().threads_alive == {"preprocess": 1, "inference": 1, "postprocess": 1}


class SplitWatcher(PipelineObserver):
    """Records the inference calls it is told about; ``raise_on(size, failed)`` makes it raise
    on such a call, after noting which of ``futures`` were answered at that moment."""

    def __init__(self, raise_on: tuple[int, bool]) -> None:
        self.raise_on = raise_on
        self.futures: list[Future[Any]] = []
        self.calls: list[tuple[int, bool]] = []
        self.answered_when_raised: list[list[bool]] = []

    def on_stage(
        self, stage: str, size: int, queue_wait_s: float, run_s: float, *, failed: bool
    ) -> None:
        if stage != "inference":
            return
        self.calls.append((size, failed))
        if (size, failed) == self.raise_on:
            self.answered_when_raised.append([f.done() for f in self.futures])
            raise ValueError("observer bug")


def hold_until(handler: FakeHandler, ready: threading.Event) -> None:
    """Makes preprocess wait for ``ready``, so a test can set things up before stages run."""
    original = handler.preprocess

    def preprocess(data: list[int]) -> list[int]:
        assert ready.wait(WAIT_S)
        return original(data)

    handler.preprocess = preprocess  # type: ignore[method-assign]


def test_hang_observer_raising_while_a_bisection_split_is_pending() -> None:
    # Request 1 fails inference: [0 1 2 3] is split, [0 1] fails and waits for its sibling's
    # outcome. The observer raised on [2 3]'s success, the pipeline failed [2 3] with the
    # observer's error and never gave the split its outcome: [0 1] were never answered
    # (until timeout_s; with timeout_s null, never).
    observer = SplitWatcher(raise_on=(2, False))
    handler = FakeHandler()
    handler.fail_on["inference"] = {1}
    ready = threading.Event()
    hold_until(handler, ready)
    with make_pipeline(handler, micro_batch_size=4, observer=observer) as p:
        observer.futures = p.submit([0, 1, 2, 3])
        ready.set()
        results = outcomes(observer.futures)
    # The scenario: [0 1 2 3] failed, then [0 1] failed, then the observer raised on [2 3]'s
    # success while the split waited for it: none of the four were answered then.
    assert observer.calls[:3] == [(4, True), (2, True), (2, False)]
    assert observer.answered_when_raised == [[False] * 4]
    assert isinstance(results[1], Bad)
    assert [results[i] for i in (0, 2, 3)] == expected([0, 2, 3])


def test_observer_raising_on_every_call_changes_no_answer() -> None:
    class BrokenObserver(PipelineObserver):
        def on_batch(self, *args: Any, **kwargs: Any) -> None:
            raise ValueError("observer bug")

        on_stage = on_padding = on_batch

    handler = FakeHandler()
    handler.fail_on["inference"] = {5}
    with make_pipeline(handler, micro_batch_size=4, observer=BrokenObserver()) as p:
        results = outcomes(p.submit(list(range(8))))
        assert isinstance(results[5], Bad)
        assert [r for i, r in enumerate(results) if i != 5] == expected([0, 1, 2, 3, 4, 6, 7])
        assert p.stats().threads_alive == {"preprocess": 1, "inference": 1, "postprocess": 1}


def test_internal_error_outside_a_stage_fails_the_micro_batch_not_the_thread() -> None:
    # A bug in the pipeline's own bookkeeping (injected: the isolator raises on [2 3]'s
    # success while [0 1] wait for it) fails that micro-batch, not the thread, and the
    # pending split still gets an outcome: [0 1] are answered.
    handler = FakeHandler()
    handler.fail_on["inference"] = {1}
    ready = threading.Event()
    hold_until(handler, ready)
    observer = SplitWatcher(raise_on=(0, False))  # never raises; records the calls
    with make_pipeline(handler, micro_batch_size=4, observer=observer) as p:
        passed = p._isolator.passed
        answered_when_raised: list[list[bool]] = []

        def broken(mb: Any, stage: int, run_s: Any = None) -> Any:
            if stage == 1 and list(mb.items) == [2, 3]:
                answered_when_raised.append([f.done() for f in observer.futures])
                raise RuntimeError("bookkeeping bug")
            return passed(mb, stage, run_s)

        p._isolator.passed = broken  # type: ignore[method-assign]
        observer.futures = p.submit([0, 1, 2, 3])
        ready.set()
        results = outcomes(observer.futures)
        p._isolator.passed = passed  # type: ignore[method-assign]
        assert outcomes(p.submit([7, 8])) == expected([7, 8])
    assert observer.calls[:3] == [(4, True), (2, True), (2, False)]
    assert answered_when_raised == [[False] * 4]  # the split was pending
    assert isinstance(results[1], Bad) and results[0] == expected([0])[0]
    assert all(isinstance(r, RuntimeError) and "bookkeeping" in str(r) for r in results[2:])


def test_threads_are_named_by_stage() -> None:
    handler = FakeHandler()
    with make_pipeline(handler, parallelism={"preprocess": 2, "inference": 1, "postprocess": 3}):
        names = {t.name for t in threading.enumerate() if t.name.startswith("ts-microbatch-")}
    assert {
        "ts-microbatch-preprocess-0",
        "ts-microbatch-preprocess-1",
        "ts-microbatch-inference-0",
        "ts-microbatch-postprocess-2",
    } <= names


def test_current_micro_batch_gives_offsets_in_the_full_batch() -> None:
    seen: list[tuple[int, int, int, list[int]]] = []
    lock = threading.Lock()
    pipeline: Pipeline

    def record(batch: list[int]) -> list[int]:
        info = pipeline.current_micro_batch()
        assert info is not None
        with lock:
            seen.append((info.micro_batch_idx, info.offset, info.size, list(batch)))
        return batch

    pipeline = Pipeline({"only": record}, micro_batch_size=3, parallelism={"only": 2})
    with pipeline:
        assert outcomes(pipeline.submit(list(range(100, 110)))) == list(range(100, 110))
        assert pipeline.current_micro_batch() is None
    for index, offset, size, batch in seen:
        assert offset == index * 3
        assert batch == list(range(100 + offset, 100 + offset + size))
    assert sorted(s[0] for s in seen) == [0, 1, 2, 3]


def test_queues_between_stages_are_bounded() -> None:
    release = threading.Event()
    lock = threading.Lock()
    produced = consumed = high_water = 0

    def pre(batch: list[int]) -> list[int]:
        nonlocal produced, high_water
        with lock:
            produced += 1
            high_water = max(high_water, produced - consumed)
        return batch

    def infer(batch: list[int]) -> list[int]:
        nonlocal consumed
        release.wait(WAIT_S)
        with lock:
            consumed += 1
        return batch

    with Pipeline(
        {"pre": pre, "infer": infer},
        micro_batch_size=1,
        parallelism={"pre": 4},
        max_queued_micro_batches=2,
    ) as p:
        futures = p.submit(list(range(64)))
        # Wait until the preprocess threads are all blocked on the full queue.
        for _ in range(1000):
            stats = p.stats()
            if stats.queued["pre"] <= 64 - 7:
                break
            threading.Event().wait(0.005)
        release.set()
        assert outcomes(futures) == list(range(64))
    # Outputs of preprocess not yet taken by inference: 2 queued + 1 being inferred +
    # 4 held by preprocess threads blocked on put.
    assert high_water <= 2 + 1 + 4


def test_parallelism_changes_while_batches_run() -> None:
    handler = FakeHandler(jitter_s=0.001)
    items = list(range(40))
    with make_pipeline(handler, micro_batch_size=2) as p:
        futures = p.submit(items)
        p.set_parallelism({"preprocess": 4, "inference": 2})
        p.set_parallelism({"preprocess": 1})
        p.micro_batch_size = 5
        futures += p.submit(items)
        assert outcomes(futures) == expected(items) * 2
        assert p.parallelism == {"preprocess": 1, "inference": 2, "postprocess": 1}
        stats = p.stats()
        assert stats.micro_batch_size == 5
    assert p.stats().threads_alive == {"preprocess": 0, "inference": 0, "postprocess": 0}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"preprocess": 0},
            "micro_batching.parallelism.preprocess: got 0, expected an integer >= 1",
        ),
        ({"inference": 1.5}, "micro_batching.parallelism.inference: got 1.5"),
        ({"decode": 2}, "micro_batching.parallelism.decode: unknown stage"),
    ],
)
def test_bad_parallelism_is_refused_with_the_key(change: dict[str, Any], message: str) -> None:
    with (
        make_pipeline(FakeHandler()) as p,
        pytest.raises(ConfigError, match=message.replace(".", r"\.")),
    ):
        p.set_parallelism(change)


def test_shutdown_finishes_queued_work_and_is_idempotent() -> None:
    handler = FakeHandler(jitter_s=0.002)
    p = make_pipeline(handler, micro_batch_size=1)
    futures = p.submit(list(range(20)))
    p.shutdown(wait=True)
    p.shutdown(wait=True)
    p.shutdown(wait=False)
    assert outcomes(futures) == expected(list(range(20)))
    with pytest.raises(PipelineClosedError, match="shut down"):
        p.submit([1])
    with pytest.raises(PipelineClosedError):
        p.set_parallelism({"inference": 2})


def test_shutdown_cancel_pending_fails_queued_requests_clearly() -> None:
    started = threading.Event()
    release = threading.Event()

    def slow(batch: list[int]) -> list[int]:
        started.set()
        release.wait(WAIT_S)
        return batch

    p = Pipeline({"slow": slow}, micro_batch_size=1)
    futures = p.submit([1, 2, 3])
    assert started.wait(WAIT_S)
    # shutdown(wait=False) drains the queues before it returns, so the running call is
    # released only after requests 2 and 3 were cancelled: no race with the drain.
    p.shutdown(wait=False, cancel_pending=True)
    release.set()
    p.shutdown(wait=True)
    results = outcomes(futures)
    assert results[0] == 1  # the one already running finishes
    assert all(
        isinstance(r, PipelineClosedError) and "before this request" in str(r) for r in results[1:]
    )


def test_hang_when_a_stage_is_stuck_at_shutdown_requests_still_get_an_error() -> None:
    release = threading.Event()
    p = Pipeline({"stuck": lambda batch: release.wait(WAIT_S) and batch}, join_timeout_s=0.05)
    futures = p.submit([1, 2])
    p.shutdown(wait=True)
    results = outcomes(futures)
    release.set()
    assert all(isinstance(r, PipelineClosedError) for r in results)


def test_shutdown_without_wait_returns_and_stops_threads() -> None:
    p = make_pipeline(FakeHandler())
    futures = p.submit([1, 2, 3])
    p.shutdown(wait=False)
    assert outcomes(futures) == expected([1, 2, 3])
    p.shutdown(wait=True)  # waits for the background stop
    assert sum(p.stats().threads_alive.values()) == 0


def test_concurrent_submitters_each_get_their_own_answers() -> None:
    handler = FakeHandler(jitter_s=0.001)
    results: dict[int, list[Any]] = {}

    def client(n: int) -> None:
        items = list(range(n * 100, n * 100 + 17))
        results[n] = outcomes(p.submit(items))

    with make_pipeline(
        handler, micro_batch_size=4, parallelism={"preprocess": 2, "postprocess": 2}
    ) as p:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
    for n in range(8):
        assert results[n] == expected(list(range(n * 100, n * 100 + 17)))


def test_empty_batch_returns_no_futures() -> None:
    with make_pipeline(FakeHandler()) as p:
        assert p.submit([]) == []


class PaddingRecorder(PipelineObserver):
    def __init__(self) -> None:
        self.padding: list[tuple[str, int, int]] = []

    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        self.padding.append((stage, size, padded_to))


def test_defect_padding_metric_reported_without_allowed_sizes() -> None:
    # With no allowed sizes the plan's empty range starts at stage 0, so every preprocess
    # call reported "padded by 0": a MicroBatchPaddedItems line per micro-batch that the
    # frontend parses for nothing. Only a pipeline with allowed sizes reports padding.
    plain, padded = PaddingRecorder(), PaddingRecorder()
    with make_pipeline(FakeHandler(), micro_batch_size=2, observer=plain) as p:
        assert outcomes(p.submit([1, 2, 3])) == expected([1, 2, 3])
    with make_pipeline(
        FakeHandler(),
        micro_batch_size=3,
        observer=padded,
        allowed_sizes=[1, 4],
        padded_stages=["preprocess", "inference", "postprocess"],
    ) as p:
        assert outcomes(p.submit([1, 2, 3])) == expected([1, 2, 3])
    assert padded.padding == [("preprocess", 3, 4)]
    assert plain.padding == []


def test_each_stage_call_sees_its_own_padding_though_the_view_is_made_once() -> None:
    # A micro-batch's view (MicroBatchInfo) is made at its first stage call and kept: only
    # the padded stage's call may see the padding rows, before and after it none.
    seen: list[tuple[str, int, Any]] = []

    def stage(name: str) -> Any:
        def call(rows: list[Any]) -> list[Any]:
            info = current_micro_batch()
            assert info is not None
            seen.append((name, info.padding, info))
            return list(rows)

        return call

    with Pipeline(
        {name: stage(name) for name in ("preprocess", "inference", "postprocess")},
        micro_batch_size=3,
        allowed_sizes=[1, 4],
        padded_stages=["inference"],
    ) as p:
        assert [f.result(WAIT_S) for f in p.submit([7, 8, 9])] == [7, 8, 9]
    assert [(name, padding) for name, padding, _ in seen] == [
        ("preprocess", 0),
        ("inference", 1),
        ("postprocess", 0),
    ]
    (_, _, before), (_, _, padded), (_, _, after) = seen
    assert before is after  # made once: the unpadded stages see the very same view
    assert padded._replace(padding=0) == before


def test_padded_last_stage_output_count_is_checked_against_the_padded_size() -> None:
    # The last padded stage must answer every row it was given, padding included; the
    # mismatch names both counts.
    def short(rows: list[int]) -> list[int]:
        return rows[:3]

    stages = {"preprocess": lambda rows: rows, "postprocess": short}
    with Pipeline(stages, micro_batch_size=3, allowed_sizes=[4], padded_stages=list(stages)) as p:
        results = outcomes(p.submit([1, 2, 3]))
    assert all(isinstance(r, StageOutputError) for r in results), results
    assert "returned 3 outputs for 4 requests" in str(results[0])
