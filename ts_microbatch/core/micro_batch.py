"""Micro-batches: runs of positions of a batch's cut, on their way through the stages.

``cut`` is the one place a batch becomes micro-batches. A micro-batch holds its rows (the
items at its positions, in cut order) and reads everything else through its batch's
``Order`` (``ts_microbatch.core.order``): the items, requests, lengths and shapes of its
positions. ``MicroBatchInfo`` is what a stage call sees of it (``current_micro_batch()``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from .batch import Batch


class MicroBatchInfo(NamedTuple):
    """Where the micro-batch a stage thread is working on sits in its batch."""

    micro_batch_idx: int  # its place among the batch's micro-batches; re-run halves keep it
    # Its first item's position in its batch's cut (``ts_microbatch.core.order``): the item
    # index while the batch keeps arrival order; ``items`` gives each row's item.
    offset: int
    size: int  # number of items in it (real ones: padding is not counted)
    attempt: int  # 0 on the first run, n when re-run n times to isolate a failure
    context: Any = None  # the context its batch was submitted with; never another batch's
    # The request index of each of its items, in order; None: its positions are the
    # requests (arrival order, one item per request).
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
    # The item index (the caller's order) of each of its items; None: its positions.
    items: tuple[int, ...] | None = None

    @property
    def item_requests(self) -> tuple[int, ...]:
        """The request index (a row of ``context``) of each of its items, in order."""
        if self.owners is None:
            return tuple(range(self.offset, self.offset + self.size))
        return self.owners

    @property
    def item_indices(self) -> tuple[int, ...]:
        """The item index (a row of the batch the pipeline was given) of each of its items."""
        if self.items is None:
            return tuple(range(self.offset, self.offset + self.size))
        return self.items

    @property
    def request_indices(self) -> tuple[int, ...]:
        """The distinct request indices of its items, in order (rows of ``context``)."""
        return tuple(dict.fromkeys(self.item_requests))

    @property
    def row_requests(self) -> tuple[int | None, ...]:
        """The request index of each row of the stage's input, in order: its items', then
        None for each row of padding."""
        return self.item_requests + (None,) * self.padding


_thread = threading.local()  # the micro-batch whose stage call this thread is running


def current_micro_batch() -> MicroBatchInfo | None:
    """The micro-batch whose stage call the calling thread is running, during the call and
    its report to the observer (a thread runs one stage call at a time); None elsewhere."""
    info: MicroBatchInfo | None = getattr(_thread, "info", None)
    return info


def set_current_micro_batch(info: MicroBatchInfo | None) -> None:
    """Called by the pipeline around a stage call; None once it is over."""
    _thread.info = info


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
        "probe",
        "witness",
        "_info",
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
        # On a probe, a ``ts_microbatch.core._probes.Probe`` (what waits for its outcome; not
        # imported, which would make a loop): set before it is queued, then read and cleared
        # under the isolator's lock.
        self.probe: Any = None
        # Its first item as a ``ts_microbatch.core.breaker.KnownGood`` once a stage passed
        # it (the same in every stage: made once, not at each), and what a stage call sees
        # of it at no padding: neither changes on its way, and each stage read them anew.
        self.witness: Any = None
        self._info: MicroBatchInfo | None = None

    def __len__(self) -> int:
        return len(self.items)

    @property
    def indices(self) -> range:
        """Its items' positions in the cut (``Batch.item`` gives the item at each)."""
        return range(self.offset, self.offset + len(self.items))

    @property
    def owners(self) -> tuple[int, ...]:
        """The request index of each of its items."""
        return self.batch.order.requests_at(self.indices)

    @property
    def item_indices(self) -> Sequence[int]:
        """The item index (the caller's order) of each of its items."""
        return self.batch.order.items_at(self.indices)

    @property
    def lengths(self) -> tuple[int, ...] | None:
        """Its items' lengths, in order; None when the batch's were not measured."""
        return self.batch.order.lengths_at(self.indices)

    @property
    def padded_length(self) -> int | None:
        """The length its rows are padded to: the bucket over its longest item, or that."""
        lengths = self.lengths
        return self.batch.order.pad_length(max(lengths)) if lengths else None

    @property
    def shapes(self) -> tuple[tuple[int, int] | None, ...] | None:
        """Its items' shapes, in order; None when the batch's were not measured."""
        return self.batch.order.shapes_at(self.indices)

    @property
    def padded_shape(self) -> tuple[int, int] | None:
        """The widest width by the tallest height of its items (what a model that pads
        images to a batch's largest pads them to); None without shapes or none readable."""
        known = [shape for shape in self.shapes or () if shape is not None]
        if not known:
            return None
        return (max(w for w, _ in known), max(h for _, h in known))

    def info(self, padding: int = 0) -> MicroBatchInfo:
        """What a stage call sees of it, with ``padding`` rows after its items."""
        info = self._info
        if info is None:
            info = self._info = self._unpadded_info()
        return info if padding == 0 else info._replace(padding=padding)

    def _unpadded_info(self) -> MicroBatchInfo:
        order = self.batch.order
        return MicroBatchInfo(
            self.index,
            self.offset,
            len(self.items),
            self.attempt,
            self.batch.context,
            self.owners,
            0,
            self.lengths,
            self.padded_length,
            self.shapes,
            self.padded_shape,
            None if order.items is None else tuple(order.items_at(self.indices)),
        )

    def one_request(self) -> bool:
        """True when its items all belong to one request (owners are non-decreasing)."""
        owners = self.owners
        return owners[0] == owners[-1]

    def answered(self) -> bool:
        """True when every item is answered already (timed out or cancelled): stale work."""
        return self.batch.answered_at(self.indices)

    def first_alone(self) -> tuple[_MicroBatch, _MicroBatch | None]:
        """Its first item alone and the rest (None for one item), each to run again on its
        own: ``ts_microbatch.core.isolation``'s probe and what waits for it."""
        rest = self._piece(1, len(self.items)) if len(self.items) > 1 else None
        return self._piece(0, 1), rest

    def requests(self) -> list[_MicroBatch]:
        """One piece per request it holds, in order (a slow failure's re-runs)."""
        owners = self.owners
        starts = [0, *(i for i in range(1, len(owners)) if owners[i] != owners[i - 1])]
        return [self._piece(a, b) for a, b in zip(starts, [*starts[1:], len(owners)])]

    def _piece(self, start: int, stop: int) -> _MicroBatch:
        return _MicroBatch(
            self.batch, self.index, self.offset + start, self.items[start:stop], self.attempt + 1
        )

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
    if len(items) != len(batch.order):
        raise ValueError(f"cut: got {len(items)} items for a cut of {len(batch.order)}")
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
