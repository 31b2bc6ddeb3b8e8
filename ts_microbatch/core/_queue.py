"""A bounded FIFO between two pipeline stages, woken by conditions rather than polling.

Unlike ``queue.Queue`` it has two out-of-band signals that take no capacity, so that they
can never be stuck behind a full queue: ``retire(n)`` tells n consumers to exit (scaling a
stage down) and ``close()`` tells every consumer to exit once the queue is empty.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from typing import Generic, TypeVar

from .errors import PipelineClosedError

T = TypeVar("T")


class Signal(enum.Enum):
    """What ``get`` returns instead of an item."""

    RETIRE = "retire"  # this consumer should exit; the others go on
    CLOSED = "closed"  # the queue is closed and empty; every consumer should exit


class StageQueue(Generic[T]):
    """FIFO of items with an optional capacity; ``maxsize=None`` means unbounded."""

    def __init__(self, maxsize: int | None = None) -> None:
        self._maxsize = maxsize
        self._items: deque[T] = deque()
        self._retire_requests = 0
        self._closed = False
        lock = threading.Lock()
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)

    def put(self, item: T, *, front: bool = False) -> None:
        """Appends ``item`` (or puts it first, with ``front``), waiting while the queue is full.

        Raises:
            PipelineClosedError: the queue is closed, before or while waiting.
        """
        with self._not_full:
            while (
                not self._closed and self._maxsize is not None and len(self._items) >= self._maxsize
            ):
                self._not_full.wait()
            if self._closed:
                raise PipelineClosedError("the micro-batching pipeline is shut down")
            if front:
                self._items.appendleft(item)
            else:
                self._items.append(item)
            self._not_empty.notify()

    def get(self) -> T | Signal:
        """Removes and returns the oldest item, or a Signal; waits while there is neither."""
        with self._not_empty:
            while True:
                if self._retire_requests > 0:
                    self._retire_requests -= 1
                    return Signal.RETIRE
                if self._items:
                    item = self._items.popleft()
                    self._not_full.notify()
                    return item
                if self._closed:
                    return Signal.CLOSED
                self._not_empty.wait()

    def retire(self, consumers: int) -> None:
        """Asks ``consumers`` consumers to exit; each takes one request on its next ``get``."""
        with self._not_empty:
            self._retire_requests += consumers
            self._not_empty.notify_all()

    def close(self) -> None:
        """Refuses further puts; consumers drain what is queued, then get Signal.CLOSED."""
        with self._not_empty:
            self._closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def drain(self) -> list[T]:
        """Removes and returns every queued item."""
        with self._not_empty:
            items = list(self._items)
            self._items.clear()
            self._not_full.notify_all()
            return items

    def __len__(self) -> int:
        with self._not_empty:
            return len(self._items)
