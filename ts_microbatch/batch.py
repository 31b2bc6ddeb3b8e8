"""What the pipeline carries: a batch with its own context, and the micro-batches cut from it.

A ``Batch`` is created per ``Pipeline.submit_batch`` call and owns everything that belongs
to that batch alone: one future per request, the caller's context (request ids, headers,
statuses), and where each failed request failed. Micro-batches point at their batch, so a
stage thread running a micro-batch of an old batch never reads the state of a newer one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, wait
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import RequestTimeoutError

if TYPE_CHECKING:
    from .isolation import _Split


def _set_future(
    future: Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    # A future may already be done: a batch fails the ones that time out, and a caller may
    # cancel. The late outcome is dropped rather than raising in a worker thread.
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


class RequestFailure(NamedTuple):
    """Where and how a request failed, for the handler boundary to pick a status."""

    stage: str  # the stage that raised
    stage_index: int  # its place in the pipeline; 0 is the first stage
    isolated: bool  # the request failed on its own (alone in its micro-batch, no verdict)


class MicroBatchInfo(NamedTuple):
    """Where the micro-batch a stage thread is working on sits in its batch."""

    micro_batch_idx: int  # its place among the batch's micro-batches; re-run halves keep it
    offset: int  # index of its first request in the full batch
    size: int  # number of requests in it
    attempt: int  # 0 on the first run, n when re-run n times to isolate a failure
    context: Any = None  # the context its batch was submitted with; never another batch's

    @property
    def request_indices(self) -> range:
        """Indices of its requests in the full batch (for context.request_ids and headers)."""
        return range(self.offset, self.offset + self.size)


class Batch:
    """One submitted batch: its futures, its context and the failures of its requests.

    Args:
        size: number of requests.
        context: the caller's object for this batch (a TorchServe context); the pipeline
            hands it to stage threads through ``MicroBatchInfo.context`` and never reads it.
        on_timeout: called after ``wait`` timed out and failed the late requests.
        quiet: a warm-up batch: not reported to metrics or to the automatic size.
    """

    def __init__(
        self,
        size: int,
        context: Any = None,
        on_timeout: Callable[[], None] | None = None,
        *,
        quiet: bool = False,
    ) -> None:
        self.futures: list[Future[Any]] = [Future() for _ in range(size)]
        self.context = context
        self.quiet = quiet
        self.created_at = time.monotonic()
        self._on_timeout = on_timeout
        self._lock = threading.Lock()
        self._failures: dict[int, RequestFailure] = {}
        # True once any request of the batch got through the first stage: a request that
        # then fails there alone is evidently failing because of its own input.
        self.first_stage_passed = False
        # For ts_microbatch.isolation: the stage index -> exception type judged systemic for
        # this batch, how many micro-batches it was cut into, and how many of their first
        # runs failed, by (stage index, exception type).
        self.systemic: dict[int, type[BaseException]] = {}
        self.micro_batches = 0
        self.timed_out = False  # set once its late requests were failed with a timeout
        self.first_run_failures: dict[tuple[int, type[BaseException]], int] = {}
        self._remaining = size
        self._when_answered: list[Callable[[Batch], None]] = []
        for future in self.futures:
            future.add_done_callback(self._one_answered)

    def when_answered(self, callback: Callable[[Batch], None]) -> None:
        """Calls ``callback(self)`` once every request is answered (at once if they are)."""
        with self._lock:
            if self._remaining:
                self._when_answered.append(callback)
                return
        callback(self)

    def _one_answered(self, _: Future[Any]) -> None:
        with self._lock:
            self._remaining -= 1
            if self._remaining:
                return
            callbacks, self._when_answered = self._when_answered, []
        for callback in callbacks:
            callback(self)

    def __len__(self) -> int:
        return len(self.futures)

    def record_failure(self, index: int, failure: RequestFailure) -> None:
        with self._lock:
            self._failures.setdefault(index, failure)

    def failure(self, index: int) -> RequestFailure | None:
        """Where request ``index`` failed in a stage; None if it did not fail in one."""
        with self._lock:
            return self._failures.get(index)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Waits until every request is answered; returns False if ``timeout_s`` ran out.

        Requests still unanswered at the timeout fail with RequestTimeoutError, and their
        micro-batches are dropped before their next stage.
        """
        wait(self.futures, timeout=timeout_s)
        return self.expire(timeout_s)

    def expire(self, timeout_s: float | None) -> bool:
        """Fails the requests not answered yet with RequestTimeoutError (after the caller
        waited ``timeout_s``); returns True if there were none."""
        late = [f for f in self.futures if not f.done()]
        if not late:
            return True
        self.timed_out = True
        error = RequestTimeoutError(f"no answer within timeout_s={timeout_s}")
        for future in late:
            _set_future(future, error=error)
        if self._on_timeout is not None:
            self._on_timeout()
        return False


class _MicroBatch:
    """A slice of a batch on its way through the stages."""

    __slots__ = (
        "batch",
        "index",
        "offset",
        "items",
        "payload",
        "attempt",
        "enqueued_at",
        "split",
    )

    def __init__(
        self, batch: Batch, index: int, offset: int, items: Sequence[Any], attempt: int = 0
    ) -> None:
        self.batch = batch
        self.index = index  # its place among the batch's micro-batches; halves keep it
        self.offset = offset  # index of its first request in the batch
        self.items = items
        self.payload: Any = list(items)
        self.attempt = attempt
        self.enqueued_at = time.monotonic()
        self.split: _Split | None = None  # the bisection step waiting for this half's outcome

    def __len__(self) -> int:
        return len(self.items)

    @property
    def indices(self) -> range:
        """Its requests' places in the batch."""
        return range(self.offset, self.offset + len(self.items))

    @property
    def futures(self) -> list[Future[Any]]:
        return self.batch.futures[self.offset : self.offset + len(self.items)]

    def answered(self) -> bool:
        """True when every request is resolved already (timed out or cancelled): stale work."""
        return all(f.done() for f in self.futures)

    def halves(self) -> tuple[_MicroBatch, _MicroBatch]:
        mid = len(self.items) // 2
        return (
            _MicroBatch(self.batch, self.index, self.offset, self.items[:mid], self.attempt + 1),
            _MicroBatch(
                self.batch, self.index, self.offset + mid, self.items[mid:], self.attempt + 1
            ),
        )
