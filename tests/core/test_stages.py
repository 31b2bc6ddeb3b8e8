"""StageWorkers on their own: the threads of each stage started, resized, replaced when stuck,
stopped; fed by hand through their queues, no pipeline around them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ts_microbatch import ConfigError, PipelineClosedError, PipelineStalledError
from ts_microbatch.core._queue import StageQueue
from ts_microbatch.core.batch import Batch
from ts_microbatch.core.micro_batch import _MicroBatch
from ts_microbatch.core.stages import StageWorkers

WAIT_S = 10.0  # bound on any wait; threads start and exit in milliseconds
NAMES = ("a", "b")


class Served:
    """The ``serve`` callback: records what each thread served; holds the items in
    ``hold`` until ``release`` is set, reporting the call to the workers as the pipeline
    does (so the stall guard sees it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served: list[tuple[int, Any, str]] = []
        self.hold: set[Any] = set()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Condition(self.lock)
        self.workers: StageWorkers | None = None

    def __call__(self, stage: int, mb: _MicroBatch) -> None:
        held = mb.items[0] in self.hold
        if held and self.workers is not None:
            self.workers.begin_call(NAMES[stage], mb)
            self.entered.set()
            self.release.wait(WAIT_S)
            self.workers.end_call()
        with self.done:
            self.served.append((stage, mb.items[0], threading.current_thread().name))
            self.done.notify_all()

    def wait_for(self, count: int) -> None:
        with self.done:
            assert self.done.wait_for(lambda: len(self.served) >= count, WAIT_S), self.served


def micro_batch(item: Any) -> _MicroBatch:
    return _MicroBatch(Batch(1), 0, 0, [item])


@pytest.fixture
def queues() -> list[StageQueue[_MicroBatch]]:
    return [StageQueue[_MicroBatch](None) for _ in NAMES]


@pytest.fixture
def served() -> Served:
    return Served()


@pytest.fixture
def workers(queues: list[StageQueue[_MicroBatch]], served: Served) -> Iterator[StageWorkers]:
    w = StageWorkers(NAMES, queues, served)
    served.workers = w
    yield w
    served.release.set()
    w.stop(time.monotonic(), WAIT_S)


def test_threads_are_named_per_stage_and_serve_their_own_queue(
    workers: StageWorkers, queues: list[StageQueue[_MicroBatch]], served: Served
) -> None:
    workers.resize({"a": 2, "b": 1})
    names = {stage: sorted(t.name for t in ts) for stage, ts in workers.serving().items()}
    assert names == {"a": ["ts-microbatch-a-0", "ts-microbatch-a-1"], "b": ["ts-microbatch-b-0"]}
    assert workers.targets() == {"a": 2, "b": 1}
    for item in range(4):
        queues[0].put(micro_batch(item))
    queues[1].put(micro_batch("x"))
    served.wait_for(5)
    assert sorted(item for stage, item, _ in served.served if stage == 0) == [0, 1, 2, 3]
    assert [(item, name) for stage, item, name in served.served if stage == 1] == [
        ("x", "ts-microbatch-b-0")
    ]
    assert all(name.startswith("ts-microbatch-a-") for s, _, name in served.served if s == 0)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux: /proc/self/task")
def test_the_os_sees_each_stage_threads_name_and_so_can_its_tools(
    queues: list[StageQueue[_MicroBatch]],
) -> None:
    """``top -H``, py-spy and benchmarks/compare.py read a thread's name from the OS: 15
    bytes, so ``ts-microbatch-preprocess-1`` is ``tsmb-prepr-1`` there."""
    comms: dict[str, str] = {}
    seen = threading.Condition()

    def serve(stage: int, mb: _MicroBatch) -> None:
        comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
        with seen:
            comms[threading.current_thread().name] = comm
            seen.notify_all()

    workers = StageWorkers(("preprocess", "b"), queues, serve)
    try:
        workers.resize({"preprocess": 2, "b": 1})
        for item in range(8):
            queues[0].put(micro_batch(item))
        queues[1].put(micro_batch("x"))
        with seen:
            assert seen.wait_for(lambda: "ts-microbatch-b-0" in comms and len(comms) >= 2, WAIT_S)
    finally:
        workers.stop(time.monotonic(), WAIT_S)
    assert comms["ts-microbatch-b-0"] == "tsmb-b-0"
    assert {comms.get(f"ts-microbatch-preprocess-{i}") for i in (0, 1)} <= {
        "tsmb-prepr-0",
        "tsmb-prepr-1",
        None,  # one thread may have taken every micro-batch
    }
    assert any(name.startswith("ts-microbatch-preprocess-") for name in comms)


def test_scale_down_retires_threads_and_scale_up_starts_new_ones(workers: StageWorkers) -> None:
    workers.resize({"a": 3})
    before = workers.serving()["a"]
    workers.resize({"a": 1})
    assert workers.wait_for_targets(WAIT_S)
    after = workers.serving()["a"]
    assert len(after) == 1 and after[0] in before
    assert not any(t.is_alive() for t in before if t not in after)
    assert workers.alive() == {"a": 1, "b": 0}
    workers.resize({"a": 2})
    grown = workers.serving()["a"]
    # A new thread gets the next number: names are never reused.
    assert len(grown) == 2 and {t.name for t in grown if t not in after} == {"ts-microbatch-a-3"}


@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        ({"c": 1}, "micro_batching.parallelism.c: unknown stage; stages are a, b"),
        ({"a": 0}, "micro_batching.parallelism.a: got 0, expected an integer >= 1"),
        ({"b": True}, "micro_batching.parallelism.b: got True"),
    ],
)
def test_a_bad_count_is_refused_and_changes_nothing(
    workers: StageWorkers, parallelism: dict[str, Any], message: str
) -> None:
    workers.resize({"a": 1, "b": 1})
    with pytest.raises(ConfigError) as info:
        workers.resize({"a": 2} | parallelism)
    assert message in str(info.value)
    assert workers.targets() == {"a": 1, "b": 1}


def test_resize_after_close_is_refused(workers: StageWorkers) -> None:
    workers.resize({"a": 1})
    workers.close()
    with pytest.raises(PipelineClosedError, match="cannot change parallelism"):
        workers.resize({"a": 2})
    assert workers.targets()["a"] == 1


def test_stop_drains_the_queues_then_joins_every_thread(
    queues: list[StageQueue[_MicroBatch]], served: Served
) -> None:
    workers = StageWorkers(NAMES, queues, served)
    workers.resize({"a": 2, "b": 2})
    threads = [t for ts in workers.serving().values() for t in ts]
    assert all(workers.is_worker(t) for t in threads)
    assert not workers.is_worker(threading.current_thread())
    for item in range(6):
        queues[item % 2].put(micro_batch(item))
    workers.stop(time.monotonic(), WAIT_S)
    assert sorted(item for _, item, _ in served.served) == list(range(6))
    assert not any(t.is_alive() for t in threads)
    assert workers.alive() == {"a": 0, "b": 0}
    with pytest.raises(PipelineClosedError):
        workers.resize({"a": 1})


def test_a_thread_stuck_for_a_timed_out_batch_is_abandoned_and_replaced(
    workers: StageWorkers, queues: list[StageQueue[_MicroBatch]], served: Served
) -> None:
    workers.resize({"a": 1, "b": 1})  # a pipeline's every stage has a thread
    stuck_mb = micro_batch("stuck")
    served.hold.add("stuck")
    queues[0].put(stuck_mb)
    assert served.entered.wait(WAIT_S), "the call never started"
    [stuck] = workers.serving()["a"]
    workers.check_stalled()  # its batch has not timed out: nothing is abandoned
    assert workers.abandoned() == {"a": 0, "b": 0}

    stuck_mb.batch.expire(0.0)  # as Batch.wait does at the timeout: every request answered
    workers.check_stalled()
    assert workers.abandoned() == {"a": 1, "b": 0}
    [replacement] = workers.serving()["a"]
    assert replacement is not stuck and replacement.name == "ts-microbatch-a-1"
    queues[0].put(micro_batch("next"))
    served.wait_for(1)
    assert served.served[0][1:] == ("next", "ts-microbatch-a-1")

    served.release.set()  # the stuck call returns: its thread exits, the budget is free
    stuck.join(WAIT_S)
    assert not stuck.is_alive()
    assert workers.abandoned() == {"a": 0, "b": 0}
    assert workers.serving()["a"] == [replacement]


def test_a_stage_whose_every_thread_is_stuck_past_the_budget_is_stalled(
    workers: StageWorkers, queues: list[StageQueue[_MicroBatch]], served: Served
) -> None:
    workers.resize({"a": 1, "b": 1})
    first, second = micro_batch("stuck-1"), micro_batch("stuck-2")
    served.hold.update({"stuck-1", "stuck-2"})
    queues[0].put(first)
    assert served.entered.wait(WAIT_S)
    first.batch.expire(0.0)
    workers.check_stalled()  # abandoned; its replacement takes the second one
    served.entered.clear()
    queues[0].put(second)
    assert served.entered.wait(WAIT_S)
    second.batch.expire(0.0)
    # The budget (one abandoned thread per thread) is spent: the replacement stays.
    with pytest.raises(PipelineStalledError, match="stage a: all 2 threads are stuck"):
        workers.check_stalled()
    assert workers.abandoned() == {"a": 1, "b": 0}
