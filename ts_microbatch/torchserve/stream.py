"""Continuous micro-batching on TorchServe's asynchronous worker (``asyncCommunication: true``).

That worker hands each request over as it arrives (a batch of one, ``ts.async_service``),
each in a coroutine of its own on one event loop, without waiting for earlier answers.
``ContinuousBatcher`` gathers them: requests wait in arrival order and leave as
micro-batches of whole requests when ``ts_microbatch.core.continuous.StreamPolicy`` says (a
free slot, and full or no longer worth waiting for). Each micro-batch is submitted to the
pipeline as a batch of its own, under a context merged from its requests' (their request
ids and ``RequestProcessor`` objects, which carry each request's headers, status and
response headers back to the coroutine that sends its answer), so everything the
synchronous path does holds per request: failure isolation, statuses, KServe bodies, shape
groups and lengths within what has arrived. Each request is answered when its micro-batch is.

Admission: with ``max_latency_ms`` (or the request's ``x-envoy-expected-rq-timeout-ms``,
which Envoy and Istio set in front of KServe, and a client may send), a request predicted
to miss it is answered 429 with ``Retry-After`` at once, before any stage.

Timeouts: a request still gathered after its timeout is answered 504; one in the pipeline
expires with its batch (``Batch.expire``), as on the synchronous path.

Everything here runs on the event loop's thread; the pipeline's answers come back to it
through ``call_soon_threadsafe`` (and ``flush``, at shutdown from another thread, runs there
too). So no lock is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..core.continuous import StreamPolicy, retry_after_s
from ..core.errors import OverloadedError, PipelineClosedError, RequestTimeoutError
from .answers import SubmittedBatch

logger = logging.getLogger(__name__)

DEADLINE_HEADER = "x-envoy-expected-rq-timeout-ms"


class StreamHost(Protocol):
    """What the batcher needs of ``MicroBatching``."""

    def submit_rows(self, data: list[Any], context: Any) -> SubmittedBatch: ...

    def refuse_rows(self, data: list[Any], context: Any, error: BaseException) -> list[Any]: ...

    def answer_rows(self, submitted: SubmittedBatch) -> list[Any]: ...

    def rows_timeout_s(self, context: Any) -> float: ...

    def report_time(self, context: Any, start: float) -> None: ...

    def gather_size(self) -> int: ...

    def stage_threads(self) -> Mapping[str, int]: ...


class _Load(NamedTuple):
    """What a submitted group holds in the pipeline."""

    slots: int  # micro-batches: a group of KServe requests may be cut into several
    items: int


class StreamStats(NamedTuple):
    """The batcher's state now."""

    gathered: int  # rows (requests) waiting to leave in a micro-batch
    in_flight: int  # micro-batches in the pipeline
    in_flight_items: int  # their items: a KServe request's instances each count


@dataclass(eq=False)
class _Waiting:
    """One call of the asynchronous worker: its rows, its context and its answer's future."""

    data: list[Any]
    context: Any
    arrived: float  # the loop's clock
    answer: asyncio.Future[list[Any]]
    arrived_wall: float = 0.0  # time.time(), for TorchServe's metrics


class ContinuousBatcher:
    """Forms micro-batches across the calls of TorchServe's asynchronous worker.

    Args:
        host: the ``MicroBatching`` whose pipeline runs the micro-batches.
        policy: when a micro-batch goes, and what a request is predicted to take.
        max_latency_s: the latency objective enforced at arrival; None: none.
    """

    def __init__(self, host: StreamHost, policy: StreamPolicy, max_latency_s: float | None) -> None:
        self._host = host
        self.policy = policy
        self._max_latency_s = max_latency_s
        self._gathered: deque[_Waiting] = deque()
        self._gathered_items = 0
        self._in_flight = 0  # micro-batches submitted and not answered yet
        self._in_flight_items = 0
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's, at the first call

    def configure(self, max_window_s: float, max_latency_s: float | None) -> None:
        """New limits, in force from the next arrival; what is gathered stays."""
        self.policy.max_window_s = max_window_s
        self._max_latency_s = max_latency_s

    def stats(self) -> StreamStats:
        return StreamStats(self._gathered_items, self._in_flight, self._in_flight_items)

    async def handle(self, data: list[Any], context: Any) -> list[Any]:
        """One call's answers, one per row, once its micro-batch is answered (or at once:
        refused by the latency objective)."""
        loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        self.policy.arrived(now)
        refusal = self._refusal(len(data), context)
        if refusal is not None:
            return self._host.refuse_rows(data, context, refusal)
        waiting = _Waiting(list(data), context, now, loop.create_future(), time.time())
        timeout_s = self._host.rows_timeout_s(context)
        expiry = loop.call_later(timeout_s, self._expire_gathered, waiting, timeout_s)
        self._gathered.append(waiting)
        self._gathered_items += len(data)
        self._pump()
        try:
            return await waiting.answer
        finally:
            expiry.cancel()
            if waiting in self._gathered:  # cancelled while gathered
                self._drop(waiting)

    def flush(self, timeout_s: float, *, cancel: bool = False) -> None:
        """Submits every gathered request now, whatever the slots (or, with ``cancel``,
        answers them 503): before the pipeline shuts down, so none is left waiting. From
        another thread, it runs on the event loop and is waited for up to ``timeout_s``."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def flush_now() -> None:
            try:
                while self._gathered:
                    group = self._take(self._host.gather_size())
                    if cancel:
                        closed = PipelineClosedError("the pipeline shut down first")
                        for waiting in group:
                            _resolve(waiting, self._refuse(waiting, closed))
                    else:
                        self._submit(group)
            finally:
                done.set()

        done = threading.Event()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            flush_now()
            return
        with contextlib.suppress(RuntimeError):  # closed in between: nothing is gathered
            loop.call_soon_threadsafe(flush_now)
            if not done.wait(timeout_s):
                logger.warning("gathered requests not flushed within %.1f s", timeout_s)

    # -- admission -----------------------------------------------------------------------

    def _refusal(self, rows: int, context: Any) -> OverloadedError | None:
        budget_s = self._budget_s(rows, context)
        if budget_s is None:
            return None
        ahead = self._gathered_items + self._in_flight_items
        if ahead == 0:
            # Nothing to wait for: its own run is the freshest measure of the stage costs.
            # Refusing it on an old measure (one slow call) would refuse every request after
            # it for good, since nothing would run to measure them again.
            return None
        predicted_s = self.policy.predicted_s(ahead, self._host.stage_threads())
        if predicted_s is None or predicted_s <= budget_s:
            return None
        return OverloadedError(
            f"overloaded: predicted answer in {predicted_s * 1000:.0f} ms ({ahead} requests "
            f"ahead), over the latency objective of {budget_s * 1000:.0f} ms; retry later",
            retry_after_s(predicted_s, budget_s),
        )

    def _budget_s(self, rows: int, context: Any) -> float | None:
        """The tightest of ``max_latency_ms`` and the rows' deadline headers, in seconds."""
        budgets = [] if self._max_latency_s is None else [self._max_latency_s]
        for idx in range(rows):
            header = _header(context, idx, DEADLINE_HEADER)
            if header is None:
                continue
            try:
                milliseconds = float(header)
            except ValueError:
                milliseconds = math.nan
            if math.isfinite(milliseconds) and milliseconds > 0:
                budgets.append(milliseconds / 1000)
            else:  # advisory: a value that is no duration is not a reason to fail the request
                logger.debug(
                    "%s: %r is no number of milliseconds; ignored", DEADLINE_HEADER, header
                )
        return min(budgets, default=None)

    # -- dispatch ------------------------------------------------------------------------

    def _pump(self) -> None:
        """Submits gathered micro-batches while a slot is free and the policy says go."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        loop = asyncio.get_running_loop()
        slots = self._slots()
        while self._gathered and self._in_flight < slots:
            size = self._host.gather_size()
            waited_s = loop.time() - self._gathered[0].arrived
            wait_s = self.policy.wait_s(self._gathered_items, size, waited_s)
            if wait_s > 0:
                self._timer = loop.call_later(wait_s, self._pump)
                return
            self._submit(self._take(size))

    def _slots(self) -> int:
        """Micro-batches in flight at most: one per stage thread."""
        return sum(self._host.stage_threads().values())

    def _take(self, size: int) -> list[_Waiting]:
        """The oldest calls, whole, up to ``size`` rows (at least one call); a context that
        cannot be merged (not TorchServe's) goes alone."""
        group = [self._gathered.popleft()]
        rows = len(group[0].data)
        while (
            self._gathered
            and rows + len(self._gathered[0].data) <= size
            and _mergeable(group[0].context)
            and _mergeable(self._gathered[0].context)
        ):
            group.append(self._gathered.popleft())
            rows += len(group[-1].data)
        self._gathered_items -= rows
        return group

    def _submit(self, group: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        data = [row for waiting in group for row in waiting.data]
        context = merged_context([waiting.context for waiting in group])
        try:
            submitted = self._host.submit_rows(data, context)
        except Exception as exc:  # the pipeline shut down: each request gets its error
            logger.warning("micro-batch of %d requests not submitted: %s", len(group), exc)
            for waiting in group:
                _resolve(waiting, self._refuse(waiting, exc))
            return
        batch = submitted.batch
        # A KServe request may hold several instances: what is in flight is counted in items
        # and in the micro-batches the pipeline cuts them into, one slot each.
        items = len(batch) if batch is not None else 0
        load = _Load(max(1, math.ceil(items / self._host.gather_size())), items)
        if self._in_flight == 0:  # the pipeline was idle: that time is no drain time
            self.policy.started(loop.time())
        self._in_flight += load.slots
        self._in_flight_items += load.items
        if batch is None:  # nothing to run (unreadable bodies, or refused): answered now
            loop.call_soon(self._answered, group, submitted, load, None)
            return
        timeout_s = self._host.rows_timeout_s(context)
        deadline = min(waiting.arrived for waiting in group) + timeout_s
        expiry = loop.call_at(deadline, batch.expire, timeout_s)

        def answered(_: object) -> None:  # on a stage thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits
                loop.call_soon_threadsafe(self._answered, group, submitted, load, expiry)

        batch.when_answered(answered)

    def _answered(
        self,
        group: list[_Waiting],
        submitted: SubmittedBatch,
        load: _Load,
        expiry: asyncio.TimerHandle | None,
    ) -> None:
        if expiry is not None:
            expiry.cancel()
        if submitted.refused is None and load.items:  # it ran: the drain rate learns from it
            # Busy since the last answer: the pipeline was full, or requests waited for a slot.
            busy = self._in_flight >= self._slots() or bool(self._gathered)
            self.policy.answered(asyncio.get_running_loop().time(), load.items, busy)
        self._in_flight -= load.slots
        self._in_flight_items -= load.items
        try:
            answers = self._host.answer_rows(submitted)
        except Exception as exc:  # answer_rows guards each request: only a bug gets here
            logger.exception("answering a micro-batch of %d requests failed", len(group))
            for waiting in group:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
        else:
            start = 0
            for waiting in group:
                _resolve(waiting, answers[start : start + len(waiting.data)])
                start += len(waiting.data)
            self._host.report_time(group[0].context, group[0].arrived_wall)
        self._pump()

    # -- timeouts ------------------------------------------------------------------------

    def _expire_gathered(self, waiting: _Waiting, timeout_s: float) -> None:
        if waiting not in self._gathered:
            return  # submitted: it expires with its batch
        self._drop(waiting)
        error = RequestTimeoutError(f"no answer within timeout_s={timeout_s} (still queued)")
        _resolve(waiting, self._refuse(waiting, error))

    def _refuse(self, waiting: _Waiting, error: BaseException) -> list[Any]:
        return self._host.refuse_rows(waiting.data, waiting.context, error)

    def _drop(self, waiting: _Waiting) -> None:
        self._gathered.remove(waiting)
        self._gathered_items -= len(waiting.data)


def _resolve(waiting: _Waiting, answers: list[Any]) -> None:
    if not waiting.answer.done():  # cancelled when its coroutine gave up
        waiting.answer.set_result(answers)


def _header(context: Any, idx: int, name: str) -> str | None:
    """Request ``idx``'s header ``name``, in any case; None when it has none."""
    read = getattr(context, "get_all_request_header", None)
    if read is None:
        return None
    headers = read(idx) or {}
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name:
            return value if isinstance(value, str) else None
    return None


def _mergeable(context: Any) -> bool:
    """A TorchServe context: request ids by row and one RequestProcessor per row."""
    return isinstance(getattr(context, "request_ids", None), dict) and isinstance(
        getattr(context, "request_processor", None), list
    )


def merged_context(contexts: list[Any]) -> Any:
    """One context for the rows of ``contexts``, in order: a shallow copy of the first with
    every row's request id and ``RequestProcessor``. The processors are the calls' own
    objects, so a status or response header set on the merged context is the one each
    call's coroutine sends. The model's parts (name, manifest, metrics) are the first's."""
    if len(contexts) == 1:
        return contexts[0]
    merged = copy.copy(contexts[0])
    ids: dict[int, str] = {}
    processors: list[Any] = []
    for context in contexts:
        row_ids = context.request_ids
        for row, processor in enumerate(context.request_processor):
            ids[len(processors)] = row_ids.get(row)
            processors.append(processor)
    merged.request_ids = ids
    merged.request_processor = processors
    return merged
