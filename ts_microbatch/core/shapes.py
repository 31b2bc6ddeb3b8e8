"""Images of different sizes: micro-batches of one shape group, and a budget in pixels.

A detector or a segmenter runs a batch of images as one tensor: torchvision's detection
transform pads every image of a batch to the largest of it, and a handler that stacks
images cannot stack two sizes at all. So which images share a micro-batch decides what the
model computes (a 480x640 photo padded beside a 640x480 one is not the photo alone) and
what it costs (the padding). The frontend hands a batch over in arrival order. With each
item's shape known (the handler's ``item_shape``, by default the width and height read
from an image's header without decoding it), a ``ShapeRule``:

- groups a batch's requests by shape (``groups``): ``"exact"``, one width and height;
  ``"aspect"``, one aspect ratio (a model that resizes every image to a set size keeping
  its aspect ratio, as torchvision's detectors do, computes those at one size: nothing is
  padded either); ``"orientation"``, landscape, portrait or square; an integer n, width and
  height rounded up to multiples of n pixels (sizes that vary a little share micro-batches,
  padded by less than n pixels a side);
- orders the batch group by group (groups in order of their first request, requests in
  arrival order within a group, a request's items together), and cuts micro-batches that
  never span two groups, so with ``"exact"`` each image is computed as alone;
- cuts by a budget (``max_micro_batch_pixels``): a micro-batch takes items while the rows
  the model sees x its padded pixels (the widest width x the tallest height) stays within
  it, the image counterpart of a token budget.

An item whose shape cannot be read (not an image, or a header the reader does not reach)
gets a micro-batch of its own whenever groups are set: its shape may be any, so beside
another image, known or not, it could be padded, and its answer would no longer be the one
it gets alone (issue 32: two line-wrapped base64 photos, 640x480 and 480x640, once shared
the group of unknown shapes and both got other boxes). A body that is not an image then
fails alone in the stage that decodes it. The same machinery as lengths
(``ts_microbatch.core.lengths``): the plan is an order and a cut, requests are answered in
place, isolation goes by request, a KServe request's instances stay together (a request
whose instances differ in shape straddles micro-batches, each of one group).
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._padding import padded_size
from .errors import ConfigError

logger = logging.getLogger(__name__)

GROUPINGS = ("exact", "aspect", "orientation")
Shape = tuple[int, int]  # (width, height)
_UNKNOWN = ("unknown",)  # the key of items whose shape cannot be read (each cut alone)


def check_groups(value: Any, key: str) -> str | int | None:
    """``shape_groups``: null, "exact", "aspect", "orientation" or a number of pixels >= 1."""
    if value is None or value in GROUPINGS:
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f'{key}: got {value!r}, expected "exact", "aspect", "orientation", a number of '
            "pixels >= 1 (width and height rounded up to its multiples) or null"
        )
    return value


@dataclass(frozen=True)
class ShapeRule:
    """How a batch of images of different sizes is grouped and cut.

    Args:
        measure: the (width, height) of one item; None or an exception: unknown.
        groups: "exact", "aspect", "orientation", a rounding in pixels, or None (none).
        max_micro_batch_pixels: rows x padded pixels per micro-batch (at least one item).
        min_items: the fewest items a budget cut puts in a micro-batch (groups still split).
        allowed_sizes: the micro-batch sizes inference sees; the budget counts those rows.
    """

    measure: Callable[[Any], Any]
    groups: str | int | None = "exact"
    max_micro_batch_pixels: int | None = None
    min_items: int = 1
    allowed_sizes: tuple[int, ...] | None = None

    def shape_of(self, item: Any) -> Shape | None:
        """``item``'s (width, height), or None when it cannot be read: never raises (the
        stage that decodes the item reports what is wrong with it)."""
        try:
            shape = self.measure(item)
            if shape is None:
                return None
            width, height = (_size(n) for n in shape)
        except BaseException:  # noqa: BLE001 - the per-item boundary: a body that is not an
            return None  # image, a hook that raised anything; never the batch's failure
        return (width, height) if width > 0 and height > 0 else None

    def key(self, shape: Shape | None) -> Hashable:
        """The group of an item of ``shape`` (unknown shapes share a key, never a
        micro-batch: ``together``)."""
        if self.groups is None:
            return None
        if shape is None:
            return _UNKNOWN
        width, height = shape
        if self.groups == "exact":
            return shape
        if self.groups == "aspect":
            divisor = math.gcd(width, height)
            return ("aspect", width // divisor, height // divisor)
        if self.groups == "orientation":
            return "landscape" if width > height else "portrait" if height > width else "square"
        step = int(self.groups)
        return (math.ceil(width / step) * step, math.ceil(height / step) * step)

    def together(self, first: Shape | None, other: Shape | None) -> bool:
        """Whether items of these shapes may share a micro-batch: one group, and with
        groups set both known (an unknown shape may be any: its item is cut alone)."""
        if self.groups is None:
            return True
        return first is not None and other is not None and self.key(first) == self.key(other)

    def padded(self, shapes: Sequence[Shape | None]) -> Shape | None:
        """The shape a micro-batch of ``shapes`` is padded to: the widest by the tallest."""
        known = [s for s in shapes if s is not None]
        if not known:
            return None
        return (max(w for w, _ in known), max(h for _, h in known))

    def pixels(self, count: int, padded: Shape | None) -> int:
        """What ``count`` items padded to ``padded`` cost against the budget: the rows the
        model sees (padded to an allowed size) x the padded pixels."""
        area = padded[0] * padded[1] if padded is not None else 1
        return padded_size(self.allowed_sizes, count) * area


def _size(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a bool is not a size")
    return operator.index(value)


class ShapePlan(NamedTuple):
    """A batch's cut: which items, in which order, in micro-batches of which sizes."""

    order: tuple[int, ...]  # item indices in cut order
    sizes: tuple[int, ...]  # items per micro-batch, in cut order
    shapes: tuple[Shape | None, ...]  # the shape of each item of ``order``, in that order


def plan(
    rule: ShapeRule,
    items: Sequence[Any],
    owners: Sequence[int] | None,
    size: int,
    *,
    exact: bool = False,
) -> ShapePlan:
    """Measures ``items`` and cuts them: by group, ``size`` items at a time at most, within
    the pixel budget.

    Args:
        owners: the request index of each item (consecutive per request); None: one each.
        exact: arrival order, ``size`` items each, whatever the groups and budget (warm-up
            runs chosen shapes).
    """
    owners = list(range(len(items))) if owners is None else list(owners)
    shapes = [rule.shape_of(item) for item in items]  # never raises: a guard per item
    arrival = tuple(range(len(items)))
    try:
        # Planning never fails a batch: whatever goes wrong, it is cut the plain way.
        order = arrival if exact else _grouped(rule, owners, shapes)
        ordered = [shapes[i] for i in order]
        sizes = cut_sizes(rule, ordered, size, exact=exact)
    except Exception:
        logger.exception(
            "planning the cut of a batch of %d images failed; cutting it in arrival order, "
            "%d at a time",
            len(items),
            size,
        )
        order, ordered = arrival, shapes
        sizes = cut_sizes(rule, ordered, size, exact=True)
    return ShapePlan(order, sizes, tuple(ordered))


def _grouped(
    rule: ShapeRule, owners: Sequence[int], shapes: Sequence[Shape | None]
) -> tuple[int, ...]:
    """Item indices by group: groups in order of their first request, requests in arrival
    order within a group, a request's items together (its group: its first item's)."""
    requests: dict[int, list[int]] = {}
    for index, owner in enumerate(owners):
        requests.setdefault(owner, []).append(index)
    groups: dict[Hashable, list[int]] = {}
    for owner, items in requests.items():
        key = rule.key(shapes[items[0]])
        if key == _UNKNOWN:  # not one group of unknown shapes: each request in its place
            key = (_UNKNOWN, owner)
        groups.setdefault(key, []).extend(items)
    return tuple(i for items in groups.values() for i in items)


def cut_sizes(
    rule: ShapeRule, shapes: Sequence[Shape | None], size: int, *, exact: bool = False
) -> tuple[int, ...]:
    """Micro-batch sizes over ``shapes`` (in cut order): ``size`` at a time, never two
    groups in one (nor an unknown shape beside another item), and with a budget as many as
    keep ``rule.pixels`` within it (at least ``min_items`` where the group allows)."""
    if exact or not shapes:
        full, rest = divmod(len(shapes), size)
        return (size,) * full + ((rest,) if rest else ())
    budget = rule.max_micro_batch_pixels
    sizes: list[int] = []
    current: list[Shape | None] = []
    for shape in shapes:
        if current:
            same_group = rule.together(current[0], shape)
            grown = rule.padded([*current, shape])
            fits = budget is None or rule.pixels(len(current) + 1, grown) <= budget
            full = len(current) >= size or (len(current) >= rule.min_items and not fits)
            if not same_group or full:
                sizes.append(len(current))
                current = []
        current.append(shape)
    if current:
        sizes.append(len(current))
    return tuple(sizes)
