"""A batch's one index space: the positions of its cut.

Three things are numbered in a batch. *Items* are what a stage sees as rows, in the order
the caller gave them; each has one answer slot, and failures are kept by item. *Requests*
are the rows TorchServe handed over: a plain request is one item, a KServe request of n
instances n consecutive items, a malformed one none. *Positions* are the cut: the items in
the order micro-batches take them (arrival, by length, by shape), less those refused before
any stage. ``Order`` is the one mapping between them: for each position, the item it holds,
that item's request and, when measured, its length or shape. A micro-batch is a run of
positions; whatever is per item or per request is reached through its batch's ``Order``,
never by arithmetic on a position.

The common case (arrival order, one item per request) keeps no tuples at all: position p is
item p is request p.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

Shape = tuple[int, int]


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


class Order:
    """The positions of a batch's cut, and the item, request, length and shape at each.

    Args:
        size: the batch's number of items.
        owners: the request index of each item (``check_owners``); None: item i is request i.
        items: the item at each position (distinct item indices, each request's items
            consecutive and in item order: its lowest failing item is then the first of
            any run of it, ``ts_microbatch.core.outcomes.Outcomes.skip_items_above``);
            None: every item, in item order.
        lengths: the length of the item at each position; None: not measured.
        pad_length: the length a micro-batch whose longest item is n is padded to.
        shapes: the (width, height) of the item at each position (None where unreadable);
            None: not measured.

    Raises:
        ValueError: ``owners`` or ``items`` breaks its rules.
    """

    __slots__ = ("size", "owners", "items", "requests", "lengths", "pad_length", "shapes")

    def __init__(
        self,
        size: int,
        *,
        owners: Sequence[int] | None = None,
        items: Sequence[int] | None = None,
        lengths: Sequence[int] | None = None,
        pad_length: Callable[[int], int] | None = None,
        shapes: Sequence[Shape | None] | None = None,
    ) -> None:
        self.size = size
        self.owners = check_owners(owners, size) if owners is not None else None
        self.items = _check_items(items, size) if items is not None else None
        # The request at each position (None: position p is request p).
        self.requests: tuple[int, ...] | None = self.owners
        if self.items is not None:
            self.requests = tuple(self.owner(i) for i in self.items)
            _check_consecutive(self.requests, self.items)
        self.lengths = tuple(lengths) if lengths is not None else None
        self.pad_length = pad_length or (lambda longest: longest)
        self.shapes = tuple(shapes) if shapes is not None else None

    def __len__(self) -> int:
        """How many positions: every item, less those refused before any stage."""
        return self.size if self.items is None else len(self.items)

    def owner(self, item: int) -> int:
        """The request of item ``item``."""
        return item if self.owners is None else self.owners[item]

    def items_of(self, request: int) -> range:
        """The items of request ``request`` (consecutive, by ``check_owners``)."""
        owners = self.owners
        if owners is None:
            return range(request, request + 1)
        return range(bisect.bisect_left(owners, request), bisect.bisect_right(owners, request))

    def item(self, position: int) -> int:
        """The item at ``position``."""
        return position if self.items is None else self.items[position]

    def items_at(self, positions: range) -> Sequence[int]:
        """The items at ``positions``."""
        return positions if self.items is None else self.items[positions.start : positions.stop]

    def requests_at(self, positions: range) -> tuple[int, ...]:
        """The request of the item at each of ``positions``."""
        if self.requests is None:
            return tuple(positions)
        return self.requests[positions.start : positions.stop]

    def lengths_at(self, positions: range) -> tuple[int, ...] | None:
        lengths = self.lengths
        return None if lengths is None else lengths[positions.start : positions.stop]

    def shapes_at(self, positions: range) -> tuple[Shape | None, ...] | None:
        shapes = self.shapes
        return None if shapes is None else shapes[positions.start : positions.stop]


def _check_items(items: Sequence[int], size: int) -> tuple[int, ...]:
    checked = tuple(items)
    if len(set(checked)) != len(checked) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size for i in checked
    ):
        raise ValueError(f"order: got {list(checked)!r}, expected distinct item indices < {size}")
    return checked


def _check_consecutive(requests: Sequence[int], items: Sequence[int]) -> None:
    """Raises ValueError when a request's items are not consecutive in ``requests``, or not
    in item order."""
    seen: set[int] = set()
    for position, request in enumerate(requests):
        if position and request == requests[position - 1]:
            if items[position] < items[position - 1]:
                raise ValueError(f"order: request {request}'s items are not in item order")
            continue
        if request in seen:
            raise ValueError(f"order: request {request}'s items are not consecutive")
        seen.add(request)
