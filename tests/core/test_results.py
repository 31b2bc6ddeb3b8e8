"""A batch's answers (``ts_microbatch.core._results``): each item answered once, the waiter
woken once, futures for those who ask, a cancelled future making its micro-batches stale."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ts_microbatch.core._results import Outcome, Results
from ts_microbatch.core.pipeline import Pipeline

pytestmark = pytest.mark.generative


def test_what_is_set_first_stays_and_the_last_answer_wakes_once() -> None:
    woken: list[int] = []
    results = Results(3, lambda: woken.append(results.remaining()))
    assert results.set_many([0, 1], ["a", "b"]) == [0, 1]
    assert not results.wait(0) and woken == []
    error = ValueError("late")
    assert results.set_many([1, 2], error=error) == [2]  # item 1 keeps "b"
    assert results.set_many([0, 1, 2], ["x", "y", "z"]) == []
    assert [results.outcome(i) for i in range(3)] == [
        Outcome("a", None),
        Outcome("b", None),
        Outcome(None, error),
    ]
    assert results.wait(0) and woken == [0]  # once, with every item answered
    assert not results.succeeded()


def test_the_last_answer_is_announced_outside_the_lock() -> None:
    # A callback that answers again (as a pipeline callback may) must not deadlock.
    results: Results
    seen: list[Outcome | None] = []

    def announced() -> None:
        results.set_many([0], ["again"])
        seen.append(results.outcome(0))

    results = Results(1, announced)
    results.set_many([0], ["first"])
    assert seen == [Outcome("first", None)]


def test_an_empty_batch_is_answered_from_the_start() -> None:
    results = Results(0, lambda: pytest.fail("nothing to announce"))
    assert results.wait(0) and results.succeeded() and results.futures() == []


def test_futures_made_late_hold_earlier_answers_and_get_later_ones() -> None:
    results = Results(3, lambda: None)
    results.set_many([0], ["early"])
    futures = results.futures()
    assert results.futures() is futures  # made once
    assert futures[0].result(timeout=0) == "early" and not futures[1].done()
    results.set_many([1, 2], error=KeyError("k"))
    assert isinstance(futures[1].exception(timeout=0), KeyError)
    assert isinstance(futures[2].exception(timeout=0), KeyError)


def test_cancelling_a_future_answers_its_item_with_cancelled_error() -> None:
    results = Results(2, lambda: None)
    futures = results.futures()
    assert futures[1].cancel()
    outcome = results.outcome(1)
    assert outcome is not None and isinstance(outcome.error, CancelledError)
    assert results.set_many([0, 1], ["a", "b"]) == [0]  # the cancelled one keeps its answer
    assert futures[0].result(timeout=0) == "a" and results.wait(0)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 24),
    calls=st.lists(st.lists(st.integers(0, 23), min_size=1, max_size=8), min_size=1, max_size=12),
)
def test_racing_answers_give_each_item_one_answer_and_one_wake_up(
    size: int, calls: list[list[int]]
) -> None:
    calls = [[i % size for i in call] for call in calls] + [list(range(size))]
    calls = [list(dict.fromkeys(call)) for call in calls]  # a micro-batch's items are distinct
    woken: list[None] = []
    results = Results(size, lambda: woken.append(None))
    answered: list[list[int]] = [[] for _ in calls]
    start = threading.Barrier(len(calls))

    def answer(n: int) -> None:
        start.wait(timeout=30)
        answered[n] = results.set_many(calls[n], [(n, item) for item in calls[n]])

    threads = [threading.Thread(target=answer, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Each item was answered by exactly one call, with that call's value for it.
    owners = sorted(item for items in answered for item in items)
    assert owners == list(range(size))
    for n, items in enumerate(answered):
        for item in items:
            assert results.outcome(item) == Outcome((n, item), None)
    assert woken == [None] and results.wait(0) and results.remaining() == 0


class _Gate:
    """A first stage that holds its first call until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.seen: list[list[Any]] = []

    def preprocess(self, items: list[Any]) -> list[Any]:
        self.seen.append(list(items))
        if len(self.seen) == 1:
            self.entered.set()
            assert self.release.wait(30)
        return items


def test_a_cancelled_requests_micro_batch_is_dropped_before_its_stage() -> None:
    gate = _Gate()
    with Pipeline({"preprocess": gate.preprocess}, micro_batch_size=2) as pipeline:
        futures = pipeline.submit([1, 2, 3, 4])
        assert gate.entered.wait(30)  # the first micro-batch holds the only thread
        assert all(f.cancel() for f in futures[2:])  # the second's requests give up
        gate.release.set()
        assert [f.result(timeout=30) for f in futures[:2]] == [1, 2]
        pipeline.shutdown(wait=True)
    assert gate.seen == [[1, 2]]  # [3, 4] was stale before its stage, and dropped


def test_hang_an_empty_batch_runs_its_callbacks_and_leaves_no_batch_in_flight() -> None:
    # A batch of no items is never answered by a stage: its callbacks must run at once, or
    # the pipeline counts it in flight and shutdown waits out its join timeout.
    from ts_microbatch.core.batch import Batch

    seen: list[Batch] = []
    batch = Batch(0)
    batch.when_answered(seen.append)
    assert seen == [batch] and batch.wait(0)
    with Pipeline({"preprocess": lambda items: items}, join_timeout_s=60) as pipeline:
        assert pipeline.submit([]) == []
        assert pipeline.stats().batches_in_flight == 0
