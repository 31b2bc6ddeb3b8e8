"""What the pipeline carries: a batch with its own context, its answers and its failures.

A ``Batch`` is created per ``Pipeline.submit_batch`` call and owns everything that belongs
to that batch alone: one answer slot per item, the caller's context (request ids, headers,
statuses), where each failed item failed, and its ``Order`` (``ts_microbatch.core.order``),
the one index space of its cut: the item, request, length and shape at each position.
Micro-batches (``ts_microbatch.core.micro_batch``) are runs of positions of their batch,
so a stage thread running a micro-batch of an old batch never reads the state of a newer
one. Answers stay in item order (the caller's), and failures are recorded by item.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

from ._results import Outcome, Results
from .errors import RequestTimeoutError
from .order import Order

logger = logging.getLogger(__name__)


class RequestFailure(NamedTuple):
    """Where and how a request failed, for the handler boundary to pick a status."""

    stage: str  # the stage that raised
    stage_index: int  # its place in the pipeline; 0 is the first stage
    # The request failed on its own (an item of it failed alone) with an Exception; never
    # for a stage judged broken, nor a BaseException such as SystemExit (no input's fault).
    isolated: bool


class Batch:
    """One submitted batch: its answers, its context and the failures of its items.

    Args:
        size: number of items.
        context: the caller's object for this batch (a TorchServe context); the pipeline
            hands it to stage threads through ``MicroBatchInfo.context`` and never reads it.
        on_timeout: called after ``wait`` timed out and failed the late items.
        quiet: a warm-up batch: not reported to metrics or to the automatic size.
        order: its cut's positions and what each holds; None: ``Order(size, owners=owners)``,
            every item in item order.
        owners: the request index of each item, when ``order`` is None (``check_owners``).
    """

    def __init__(
        self,
        size: int,
        context: Any = None,
        on_timeout: Callable[[], None] | None = None,
        *,
        quiet: bool = False,
        order: Order | None = None,
        owners: Sequence[int] | None = None,
    ) -> None:
        # One slot per item (``ts_microbatch.core._results``): a micro-batch's items are
        # answered under one lock, and nobody waits on a lock per item.
        self._results = Results(size, self._all_answered)
        self.context = context
        self.quiet = quiet
        # The known-good input this private batch replays alone (``breaker.KnownGood``).
        self.replays: Any = None
        self.order = order if order is not None else Order(size, owners=owners)
        self.created_at = time.monotonic()
        self._on_timeout = on_timeout
        self._lock = threading.Lock()  # guards _when_answered
        self._failures: dict[int, RequestFailure] = {}  # written under the results' lock
        # True once the first stage served any request, of this batch or (set when the
        # isolator tracks it) of one before: a request that fails there alone has then met
        # a bad input of its own (ts_microbatch.core.isolation).
        self.first_stage_served = False
        self.timed_out = False  # set once its late items were failed with a timeout
        # None once every item is answered (from the start for a batch of none).
        self._when_answered: list[Callable[[Batch], None]] | None = [] if size else None

    def when_answered(self, callback: Callable[[Batch], None]) -> None:
        """Calls ``callback(self)`` once every request is answered (at once if they are)."""
        with self._lock:
            if self._when_answered is not None:
                self._when_answered.append(callback)
                return
        callback(self)

    def _all_answered(self) -> None:
        with self._lock:
            callbacks, self._when_answered = self._when_answered or [], None
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # the stage thread that answered last goes on serving
                logger.exception("a callback on a batch's last answer raised; ignored")

    def __len__(self) -> int:
        return len(self._results)

    @property
    def futures(self) -> list[Future[Any]]:
        """One future per item, in item order (made on first use; cancelling one answers its
        item with CancelledError, which makes its micro-batches stale)."""
        return self._results.futures()

    def outcome(self, item: int) -> Outcome | None:
        """Item ``item``'s answer (its output or its error); None while it has none."""
        return self._results.outcome(item)

    def succeeded(self) -> bool:
        """Every item answered with an output, none failed, timed out or cancelled."""
        return self._results.succeeded()

    def answered_at(self, positions: range) -> bool:
        """Whether the items at ``positions`` are all answered (stale work); no lock."""
        return self._results.all_answered(self.order.items_at(positions))

    def answer(
        self,
        positions: range,
        outputs: Sequence[Any] | None = None,
        error: BaseException | None = None,
        failure: RequestFailure | None = None,
    ) -> None:
        """Answers the items at ``positions`` with ``outputs`` (one per position) or
        ``error``, recording ``failure`` for each item it fails; items answered already
        keep their answer."""
        self.answer_items(self.order.items_at(positions), outputs, error, failure)

    def answer_items(
        self,
        items: Sequence[int],
        outputs: Sequence[Any] | None = None,
        error: BaseException | None = None,
        failure: RequestFailure | None = None,
    ) -> None:
        """``answer`` by item indices."""
        record = None
        if failure is not None:
            failures = self._failures
            record = lambda item: failures.setdefault(item, failure)  # noqa: E731  (under the lock)
        self._results.set_many(items, outputs, error, record=record)

    def failure(self, item: int) -> RequestFailure | None:
        """Where item ``item`` failed in a stage; None if it did not fail in one."""
        return self._failures.get(item)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Waits until every request is answered; returns False if ``timeout_s`` ran out.

        Requests still unanswered at the timeout fail with RequestTimeoutError, and their
        micro-batches are dropped before their next stage.
        """
        self._results.wait(timeout_s)
        return self.expire(timeout_s)

    def expire(self, timeout_s: float | None) -> bool:
        """Fails the requests not answered yet with RequestTimeoutError (after the caller
        waited ``timeout_s``); returns True if there were none."""
        if not self._results.remaining():
            return True
        error = RequestTimeoutError(f"no answer within timeout_s={timeout_s}")
        # Set before the last answer, whose callbacks read it: a known-good probe held for
        # this batch expires with it only when it timed out (ts_microbatch.core.isolation).
        self.timed_out = True
        if not self._results.set_many(range(len(self._results)), error=error):
            self.timed_out = False
            return True  # the last ones were answered in between
        if self._on_timeout is not None:
            self._on_timeout()
        return False

    def settle(self, timeout_s: float | None) -> list[Outcome | None]:
        """Ends the caller's wait of ``timeout_s``: fails the requests not answered yet
        (``expire``), then returns every item's answer, in item order, at once (None only
        for an item still without one: never, unless a bug)."""
        self.expire(timeout_s)
        return self._results.outcomes()

    def fail_unanswered(self, error: BaseException) -> None:
        """Fails every item not answered yet with ``error``."""
        self._results.set_many(range(len(self._results)), error=error)
