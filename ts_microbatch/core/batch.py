"""What the pipeline carries: a batch with its own context, and the micro-batches ``cut`` from it.

A ``Batch`` is created per ``Pipeline.submit_batch`` call and owns everything that belongs
to that batch alone: one future per item, which request each item belongs to (``owners``),
the caller's context (request ids, headers, statuses), and where each failed item failed.
Micro-batches point at their batch, so a stage thread running a micro-batch of an old batch
never reads the state of a newer one.

Items and requests: an item is what a stage sees as one row; a request is a row of the
batch TorchServe handed over. A plain request is one item; a KServe request of n instances
is n consecutive items (``ts_microbatch.torchserve.kserve``); a malformed one has none.
``owners[i]`` is the request index of item i, so whatever is per request (ids, headers,
statuses, metric lines, whether a failure is one request's) is looked up through it, never
by item index.

Items and positions: a batch may be cut in an order other than its items' (by length,
``ts_microbatch.core.lengths``), and items refused before any stage are in no micro-batch.
``order[p]`` is the item at position p of the cut; micro-batches are runs of positions.
Answers stay in item order (the caller's), and failures are recorded by item.
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

logger = logging.getLogger(__name__)


class RequestFailure(NamedTuple):
    """Where and how a request failed, for the handler boundary to pick a status."""

    stage: str  # the stage that raised
    stage_index: int  # its place in the pipeline; 0 is the first stage
    # The request failed on its own (alone in its micro-batch, no verdict) with an Exception;
    # never for a BaseException such as SystemExit, which is no input's fault.
    isolated: bool


class MicroBatchInfo(NamedTuple):
    """Where the micro-batch a stage thread is working on sits in its batch."""

    micro_batch_idx: int  # its place among the batch's micro-batches; re-run halves keep it
    offset: int  # index of its first item among the batch's items
    size: int  # number of items in it (real ones: padding is not counted)
    attempt: int  # 0 on the first run, n when re-run n times to isolate a failure
    context: Any = None  # the context its batch was submitted with; never another batch's
    # The request index of each of its items, in order; None: item i is request i.
    owners: tuple[int, ...] | None = None
    # Rows of padding after its items in the stage's input (allowed sizes): every padded
    # stage's with pad "requests", inference's alone with pad "tensors".
    padding: int = 0
    # With lengths (ts_microbatch.core.lengths): each item's length, and the length every
    # row is to be padded to (the bucket over the longest, or the longest); else None.
    lengths: tuple[int, ...] | None = None
    padded_length: int | None = None
    # With shapes (ts_microbatch.core.shapes): each item's (width, height) (None: not
    # readable), and the shape the micro-batch would be padded to (widest x tallest).
    shapes: tuple[tuple[int, int] | None, ...] | None = None
    padded_shape: tuple[int, int] | None = None

    @property
    def item_requests(self) -> tuple[int, ...]:
        """The request index (a row of ``context``) of each of its items, in order."""
        if self.owners is None:
            return tuple(range(self.offset, self.offset + self.size))
        return self.owners

    @property
    def request_indices(self) -> tuple[int, ...]:
        """The distinct request indices of its items, in order (rows of ``context``)."""
        return tuple(dict.fromkeys(self.item_requests))

    @property
    def row_requests(self) -> tuple[int | None, ...]:
        """The request index of each row of the stage's input, in order: its items', then
        None for each row of padding."""
        return self.item_requests + (None,) * self.padding


def check_owners(owners: Sequence[int], size: int) -> tuple[int, ...]:
    """``owners`` as a tuple, checked: one request index (an int >= 0) per item, each
    request's items consecutive and the requests in order (non-decreasing).

    Raises:
        ValueError: ``owners`` breaks one of those rules.
    """
    checked = tuple(owners)
    if len(checked) != size:
        raise ValueError(f"owners: got {len(checked)} request indices for {size} items")
    previous = 0
    for item, owner in enumerate(checked):
        if not isinstance(owner, int) or isinstance(owner, bool) or owner < previous:
            raise ValueError(
                f"owners[{item}]: got {owner!r}, expected an integer >= {previous} (each "
                "request's items consecutive, requests in order)"
            )
        previous = owner
    return checked


_thread = threading.local()  # the micro-batch whose stage call this thread is running


def current_micro_batch() -> MicroBatchInfo | None:
    """The micro-batch whose stage call the calling thread is running, during the call and
    its report to the observer (a thread runs one stage call at a time); None elsewhere."""
    info: MicroBatchInfo | None = getattr(_thread, "info", None)
    return info


def set_current_micro_batch(info: MicroBatchInfo | None) -> None:
    """Called by the pipeline around a stage call; None once it is over."""
    _thread.info = info


class Batch:
    """One submitted batch: its answers, its context and the failures of its items.

    Args:
        size: number of items.
        context: the caller's object for this batch (a TorchServe context); the pipeline
            hands it to stage threads through ``MicroBatchInfo.context`` and never reads it.
        on_timeout: called after ``wait`` timed out and failed the late items.
        quiet: a warm-up batch: not reported to metrics or to the automatic size.
        owners: the request index of each item (see ``check_owners``); None: item i is
            request i.
        order: the item at each position of the cut (distinct item indices, each request's
            items consecutive); None: every item, in item order.
        lengths: the length of the item at each position; None: lengths not measured.
        pad_length: the length a micro-batch whose longest item is n is padded to.
        shapes: the (width, height) of the item at each position; None: not measured.
    """

    def __init__(
        self,
        size: int,
        context: Any = None,
        on_timeout: Callable[[], None] | None = None,
        *,
        quiet: bool = False,
        owners: Sequence[int] | None = None,
        order: Sequence[int] | None = None,
        lengths: Sequence[int] | None = None,
        pad_length: Callable[[int], int] | None = None,
        shapes: Sequence[tuple[int, int] | None] | None = None,
    ) -> None:
        # One slot per item (``ts_microbatch.core._results``): a micro-batch's items are
        # answered under one lock, and nobody waits on a lock per item.
        self._results = Results(size, self._all_answered)
        self.context = context
        self.quiet = quiet
        self.owners = check_owners(owners, size) if owners is not None else None
        self.order = _check_order(order, size) if order is not None else None
        # The request at each position (None: position p is request p), and for isolation
        # the requests numbered in cut order: non-decreasing, as ``fewest_requests`` needs.
        self._requests: tuple[int, ...] | None = self.owners
        self.groups: tuple[int, ...] | None = self.owners
        if self.order is not None:
            self._requests = tuple(self.owner(i) for i in self.order)
            self.groups = _numbered(self._requests)
        # The length of the item at each position, and the length a micro-batch whose
        # longest item is n is padded to (ts_microbatch.core.lengths); None without lengths.
        self.lengths = tuple(lengths) if lengths is not None else None
        self.pad_length = pad_length or (lambda longest: longest)
        self.shapes = tuple(shapes) if shapes is not None else None
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

    def owner(self, item: int) -> int:
        """The request index of item ``item``."""
        return item if self.owners is None else self.owners[item]

    @property
    def positions(self) -> int:
        """How many items the cut holds (every item, less those refused before any stage)."""
        return len(self._results) if self.order is None else len(self.order)

    def item(self, position: int) -> int:
        """The item at ``position`` of the cut."""
        return position if self.order is None else self.order[position]

    def items_at(self, positions: range) -> Sequence[int]:
        """The items at ``positions`` of the cut."""
        return positions if self.order is None else self.order[positions.start : positions.stop]

    def answered_at(self, positions: range) -> bool:
        """Whether the items at ``positions`` are all answered (stale work); no lock."""
        return self._results.all_answered(self.items_at(positions))

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
        self.answer_items(self.items_at(positions), outputs, error, failure)

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

    def requests_at(self, start: int, stop: int) -> tuple[int, ...]:
        """The request index of the items at positions ``start``..``stop - 1``."""
        if self._requests is None:
            return tuple(range(start, stop))
        return self._requests[start:stop]

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
        if not self._results.set_many(range(len(self._results)), error=error):
            return True  # the last ones were answered in between
        self.timed_out = True
        if self._on_timeout is not None:
            self._on_timeout()
        return False

    def fail_unanswered(self, error: BaseException) -> None:
        """Fails every item not answered yet with ``error``."""
        self._results.set_many(range(len(self._results)), error=error)


class _MicroBatch:
    """A slice of a batch's items on its way through the stages."""

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
        self.offset = offset  # index of its first item in the batch
        self.items = items
        self.payload: Any = list(items)
        self.attempt = attempt
        self.enqueued_at = time.monotonic()
        # The isolator's step waiting for this micro-batch's outcome (a bisection step, or
        # a verdict waiting for a lone probe); only ts_microbatch.core.isolation reads it.
        self.split: Any = None

    def __len__(self) -> int:
        return len(self.items)

    @property
    def indices(self) -> range:
        """Its items' positions in the cut (``Batch.item`` gives the item at each)."""
        return range(self.offset, self.offset + len(self.items))

    @property
    def owners(self) -> tuple[int, ...]:
        """The request index of each of its items."""
        return self.batch.requests_at(self.offset, self.offset + len(self.items))

    @property
    def lengths(self) -> tuple[int, ...] | None:
        """Its items' lengths, in order; None when the batch's were not measured."""
        lengths = self.batch.lengths
        return None if lengths is None else lengths[self.offset : self.offset + len(self.items)]

    @property
    def padded_length(self) -> int | None:
        """The length its rows are padded to: the bucket over its longest item, or that."""
        lengths = self.lengths
        return self.batch.pad_length(max(lengths)) if lengths else None

    @property
    def shapes(self) -> tuple[tuple[int, int] | None, ...] | None:
        """Its items' shapes, in order; None when the batch's were not measured."""
        shapes = self.batch.shapes
        return None if shapes is None else shapes[self.offset : self.offset + len(self.items)]

    @property
    def padded_shape(self) -> tuple[int, int] | None:
        """The widest width by the tallest height of its items (what a model that pads
        images to a batch's largest pads them to); None without shapes or none readable."""
        known = [shape for shape in self.shapes or () if shape is not None]
        if not known:
            return None
        return (max(w for w, _ in known), max(h for _, h in known))

    def one_request(self) -> bool:
        """True when its items all belong to one request (owners are non-decreasing)."""
        owners = self.owners
        return owners[0] == owners[-1]

    def answered(self) -> bool:
        """True when every item is answered already (timed out or cancelled): stale work."""
        return self.batch.answered_at(self.indices)

    def first_request(self) -> tuple[_MicroBatch, _MicroBatch | None]:
        """Its first request's items alone, and the rest (None when it is one request's),
        to run again."""
        owners = self.owners
        end = next((i for i in range(1, len(owners)) if owners[i] != owners[0]), len(owners))
        alone = _MicroBatch(self.batch, self.index, self.offset, self.items[:end], self.attempt + 1)
        if end == len(owners):
            return alone, None
        rest = _MicroBatch(
            self.batch, self.index, self.offset + end, self.items[end:], self.attempt + 1
        )
        return alone, rest

    def halves(self) -> tuple[_MicroBatch, _MicroBatch]:
        """Two halves that split no request: cut at the request boundary nearest the middle
        (the middle itself when each item is its own request, or all are one request's)."""
        owners, middle = self.owners, len(self.items) // 2
        boundaries = [i for i in range(1, len(owners)) if owners[i] != owners[i - 1]]
        mid = min(boundaries, key=lambda i: abs(i - middle)) if boundaries else middle
        return (
            _MicroBatch(self.batch, self.index, self.offset, self.items[:mid], self.attempt + 1),
            _MicroBatch(
                self.batch, self.index, self.offset + mid, self.items[mid:], self.attempt + 1
            ),
        )


def cut(batch: Batch, items: Sequence[Any], sizes: int | Sequence[int]) -> list[_MicroBatch]:
    """The micro-batches of ``batch``: ``items`` (the item at each position of the cut, in
    that order) ``sizes`` at a time (an int: that many each, the last one holding the rest);
    the one place a batch becomes micro-batches.

    The cut goes by items, as a stage sees rows: a request of several items (a KServe
    request of n instances) may straddle two micro-batches, and each of them reaches that
    request (``MicroBatchInfo.request_indices``). Re-runs that isolate a failure are cut at
    request boundaries instead (``_MicroBatch.halves``).

    Raises:
        ValueError: ``items`` is not one item per position of ``batch``'s cut, or ``sizes``
            do not add up to it.
    """
    if len(items) != batch.positions:
        raise ValueError(f"cut: got {len(items)} items for a cut of {batch.positions}")
    if isinstance(sizes, int):
        full, rest = divmod(len(items), sizes)
        sizes = (sizes,) * full + ((rest,) if rest else ())
    if sum(sizes) != len(items) or any(size < 1 for size in sizes):
        raise ValueError(f"cut: sizes {list(sizes)} do not cut {len(items)} items")
    micro_batches, offset = [], 0
    for index, size in enumerate(sizes):
        micro_batches.append(_MicroBatch(batch, index, offset, items[offset : offset + size]))
        offset += size
    return micro_batches


def _check_order(order: Sequence[int], size: int) -> tuple[int, ...]:
    checked = tuple(order)
    if len(set(checked)) != len(checked) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size for i in checked
    ):
        raise ValueError(f"order: got {list(checked)!r}, expected distinct item indices < {size}")
    return checked


def _numbered(requests: Sequence[int]) -> tuple[int, ...]:
    """``requests`` (each one's items consecutive) renumbered 0, 1, 2... in order of first
    appearance; raises ValueError when a request's items are not consecutive."""
    numbers: list[int] = []
    seen: set[int] = set()
    for position, request in enumerate(requests):
        if position and request == requests[position - 1]:
            numbers.append(numbers[-1])
            continue
        if request in seen:
            raise ValueError(f"order: request {request}'s items are not consecutive")
        seen.add(request)
        numbers.append(len(seen) - 1)
    return tuple(numbers)
