"""A batch's answers: one slot per item, set once, under one lock for the whole batch.

Why not a ``concurrent.futures.Future`` per item: a Future has a Condition of its own, so a
micro-batch of n items resolved n locks, the batch's count of answered items took another
per item, ``concurrent.futures.wait`` put a waiter on each, and every "is this micro-batch
stale?" check before a stage took n more. With batches of 32 that was most of the
pipeline's bookkeeping per batch (``benchmarks/dev/pipeline_overhead.py``). Here a micro-batch's
items are answered under one lock acquisition, the waiter sleeps on one Event set when the
last item is answered, and a staleness check reads the slots without a lock: a slot goes
from empty to answered once and never back, so a read that sees it answered is final, and
one that sees it empty at worst runs a micro-batch that was about to be dropped.

Futures are still there for callers that want them (``Pipeline.submit``, ``Batch.futures``):
made on first use, resolved as their slots are, and cancelling one answers its item with
``CancelledError`` (its micro-batches are then stale). The adapter never makes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError
from functools import partial
from typing import Any, NamedTuple


class Outcome(NamedTuple):
    """An item's answer: its output, or the error it failed with."""

    value: Any
    error: BaseException | None


def set_future(future: Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    """Resolves ``future`` unless it is done already (its caller cancelled it): a late outcome
    is dropped rather than raised in a worker thread."""
    try:
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


class Results:
    """The answers of ``size`` items, each set once; what is set first stays.

    Args:
        size: the number of items.
        on_answered: called once with no argument when the last item is answered, on the
            thread that answered it, outside the lock.
    """

    def __init__(self, size: int, on_answered: Callable[[], None]) -> None:
        self._slots: list[Outcome | None] = [None] * size
        self._lock = threading.Lock()
        self._remaining = size
        self._all = threading.Event()
        self._on_answered = on_answered
        self._futures: list[Future[Any]] | None = None
        if not size:
            self._all.set()

    def __len__(self) -> int:
        return len(self._slots)

    def remaining(self) -> int:
        """How many items are not answered yet."""
        return self._remaining

    def all_answered(self, items: Iterable[int]) -> bool:
        """Whether ``items`` are all answered; no lock (see the module's docstring)."""
        slots = self._slots
        return all(slots[item] is not None for item in items)

    def outcome(self, item: int) -> Outcome | None:
        """Item ``item``'s answer; None while it has none."""
        return self._slots[item]

    def outcomes(self) -> list[Outcome | None]:
        """Every item's answer, in item order; None for one that has none yet."""
        return list(self._slots)

    def set_many(
        self,
        items: Iterable[int],
        values: Sequence[Any] | None = None,
        error: BaseException | None = None,
        *,
        record: Callable[[int], object] | None = None,
    ) -> list[int]:
        """Answers ``items`` with ``values`` (one per item, in order) or else ``error``; items
        answered already keep their answer. ``record(item)`` is called, under the lock, for
        each item this call answers. Returns the items it answered."""
        answered: list[int] = []
        with self._lock:
            slots = self._slots
            for row, item in enumerate(items):
                if slots[item] is not None:
                    continue
                slots[item] = Outcome(None, error) if values is None else Outcome(values[row], None)
                if record is not None:
                    record(item)
                answered.append(item)
            self._remaining -= len(answered)
            last = bool(answered) and not self._remaining
            futures = self._futures
        if last:
            # Before anyone waiting is woken: what the batch's last answer updates (the
            # stages' breakers, the in-flight set) is in place when its caller goes on to
            # submit the next batch.
            self._on_answered()
        if futures is not None:
            for item in answered:
                set_future(futures[item], *self._slots[item])  # type: ignore[misc]
        if last:
            self._all.set()
        return answered

    def wait(self, timeout_s: float | None = None) -> bool:
        """Waits until every item is answered; False if ``timeout_s`` ran out first."""
        return self._all.wait(timeout_s)

    def succeeded(self) -> bool:
        """Every item answered with an output, none with an error (or cancelled)."""
        return all(slot is not None and slot.error is None for slot in self._slots)

    def futures(self) -> list[Future[Any]]:
        """One future per item, made on the first call, resolved as the items are answered."""
        with self._lock:
            made = self._futures is None
            if self._futures is None:
                self._futures = [Future() for _ in self._slots]
            futures, known = self._futures, list(self._slots)
        if made:
            for item, (future, slot) in enumerate(zip(futures, known)):
                if slot is not None:
                    set_future(future, *slot)
                future.add_done_callback(partial(self._future_done, item))
        return futures

    def _future_done(self, item: int, future: Future[Any]) -> None:
        if future.cancelled():
            self.set_many((item,), error=CancelledError())
