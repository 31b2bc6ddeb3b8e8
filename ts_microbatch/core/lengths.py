"""Variable-length items: the order a batch is cut in, token budgets and length buckets.

A text model's cost for a micro-batch is its shape: items x the length every item is padded
to (the longest of them, or the bucket over it), and attention grows faster than that. The
frontend hands a batch over in arrival order, so cutting it in that order puts one long
document with a few short queries, and all of them pay for its length. With lengths known
(a handler's ``item_length``, by default the body's size), a ``LengthRule``:

- refuses before any stage an item longer than the longest accepted (``max_tokens``, or the
  largest bucket), failing its request alone with ``PayloadTooLargeError`` (413), or, when
  ``truncate`` is set, counts it at that length and leaves cutting it to the handler;
- fails alone a request whose length cannot be measured (its body is unreadable);
- orders the rest by length (``order: length``), a request's items kept together, so
  micro-batches hold items of similar lengths and padding is small;
- cuts by a budget (``max_micro_batch_tokens``): a micro-batch takes items while the rows
  the model sees x padded length stays within it (the rows: its items, or the allowed
  micro-batch size they are padded to), so a run of short queries rides together and a
  long document goes with few others;
- pads lengths to ``allowed_sequence_lengths`` (buckets), so a compiled or fixed-shape model
  sees a few shapes only: a micro-batch's ``padded_length`` is the bucket over its longest.

``plan`` returns the order and the cut; the pipeline carries each micro-batch's lengths and
padded length to its stage calls (``MicroBatchInfo``), where preprocess pads to it.
"""

from __future__ import annotations

import bisect
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._padding import padded_size
from .batch import Batch
from .errors import ConfigError, InvalidInputError, PayloadTooLargeError, RequestError
from .micro_batch import _MicroBatch, cut
from .order import Order

logger = logging.getLogger(__name__)

ORDERS = ("arrival", "length")
# Longer than any model takes (torch indexes sequences with int32): a length over it is its
# request's 413 whatever the settings, so no measured length can overflow a cost fit.
MAX_LENGTH = 2**31 - 1


def check_order(value: Any, key: str) -> str:
    if value not in ORDERS:
        raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(ORDERS)}")
    return str(value)


@dataclass(frozen=True)
class LengthRule:
    """How a batch of variable-length items is ordered, refused and cut.

    Args:
        measure: the length of one item (tokens, or any unit the budget is in).
        order: "length" sorts a batch's requests by length before the cut.
        max_micro_batch_tokens: items x padded length per micro-batch (at least one item).
        allowed_lengths: the only padded lengths (sorted buckets); None: the longest item's.
        max_tokens: the longest accepted item; None: the largest bucket, or no limit.
        truncate: count a longer item at the limit (the handler cuts it) instead of
            refusing it.
        min_items: the fewest items a budget cut puts in a micro-batch.
        allowed_sizes: the micro-batch sizes inference sees (sorted); a budget counts the
            rows a micro-batch is padded to, not its items.
    """

    measure: Callable[[Any], int]
    order: str = "arrival"
    max_micro_batch_tokens: int | None = None
    allowed_lengths: tuple[int, ...] | None = None
    max_tokens: int | None = None
    truncate: bool = False
    min_items: int = 1
    allowed_sizes: tuple[int, ...] | None = None

    @property
    def limit(self) -> int | None:
        """The longest item accepted; None: any length."""
        limits = [n for n in (self.max_tokens, self.largest_bucket) if n is not None]
        return min(limits) if limits else None

    @property
    def largest_bucket(self) -> int | None:
        return self.allowed_lengths[-1] if self.allowed_lengths else None

    def padded(self, longest: int) -> int:
        """The length a micro-batch whose longest item is ``longest`` is padded to."""
        allowed = self.allowed_lengths
        if not allowed:
            return longest
        index = bisect.bisect_left(allowed, longest)
        return allowed[min(index, len(allowed) - 1)]

    def tokens(self, count: int, longest: int) -> int:
        """What a micro-batch of ``count`` items whose longest is ``longest`` costs against
        a budget: the rows the model sees (padded to an allowed size) x the padded length.
        The one formula of the cut (``cut_sizes``) and of warm-up (``most_items``)."""
        return padded_size(self.allowed_sizes, count) * self.padded(max(longest, 1))

    def most_items(self, length: int, ceiling: int) -> int:
        """The most items of ``length`` a micro-batch holds under the budget, at most
        ``ceiling`` and at least ``min_items`` (or ``ceiling`` without a budget)."""
        budget = self.max_micro_batch_tokens
        if budget is None:
            return ceiling
        count = 1
        while count < ceiling and self.tokens(count + 1, length) <= budget:
            count += 1
        return max(min(self.min_items, ceiling), count)

    def length_of(self, item: Any) -> int:
        """The length ``item`` is counted at; raises its request's error when it is refused.
        The one check of what ``measure`` returned.

        Raises:
            PayloadTooLargeError: longer than ``limit`` without ``truncate``, or than
                ``MAX_LENGTH``.
            RequestError: ``measure`` raised one, or another exception (the item cannot be
                read), or returned something that is not an integer >= 0 (a bool, a float,
                a str: integer types such as numpy's and torch's are integers).
        """
        try:
            length = _integer(self.measure(item))
        except RequestError:
            raise
        except Exception as exc:  # the per-item boundary: whatever reading its body raised
            raise InvalidInputError(
                f"its length cannot be measured: {type(exc).__name__}: {exc}"
            ) from exc
        limit = self.limit
        if limit is not None and length > limit:
            if self.truncate:
                return limit
            raise PayloadTooLargeError(
                f"the input is {length} tokens long, over the longest accepted ({limit}: "
                f"{_limit_source(self)})"
            )
        if length > MAX_LENGTH:
            raise PayloadTooLargeError(
                f"the input is {length} tokens long, over the longest any model takes "
                f"({MAX_LENGTH})"
            )
        return length


def _integer(value: Any) -> int:
    """``value`` as an int >= 0; raises InvalidInputError for anything else."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise InvalidInputError(f"item_length returned {value!r}, expected an integer >= 0")
    length = operator.index(value)
    if length < 0:
        raise InvalidInputError(f"item_length returned {value!r}, expected an integer >= 0")
    return length


def _limit_source(rule: LengthRule) -> str:
    if rule.max_tokens is not None and rule.max_tokens == rule.limit:
        return "micro_batching.max_tokens"
    return "the largest of micro_batching.allowed_sequence_lengths"


class Plan(NamedTuple):
    """A batch's cut: which items, in which order, in micro-batches of which sizes."""

    order: tuple[int, ...]  # item indices in cut order (refused items left out)
    sizes: tuple[int, ...]  # items per micro-batch, in cut order
    lengths: tuple[int, ...]  # the length of each item of ``order``, in that order
    refused: dict[int, BaseException]  # item index -> why its request was refused


def measure(
    rule: LengthRule, items: Sequence[Any], owners: Sequence[int]
) -> tuple[list[int], dict[int, BaseException]]:
    """Each item's length, and the items refused: every item of a request with one item
    refused (too long, unreadable), with that item's error."""
    lengths = [0] * len(items)
    by_request: dict[int, BaseException] = {}
    for index, item in enumerate(items):
        if owners[index] in by_request:
            continue
        try:
            lengths[index] = rule.length_of(item)
        except BaseException as error:  # noqa: BLE001 - a KeyboardInterrupt a hook raised
            # is its request's failure too (a 500, no input's fault), never the batch's.
            by_request[owners[index]] = error
    refused = {i: by_request[r] for i, r in enumerate(owners) if r in by_request}
    return lengths, refused


def plan(
    rule: LengthRule,
    items: Sequence[Any],
    owners: Sequence[int] | None,
    size: int,
    *,
    exact: bool = False,
    choose: Callable[[Sequence[int]], Sequence[int]] | None = None,
) -> Plan:
    """Measures ``items`` and cuts them: in arrival order or by length, ``size`` items at a
    time, or as many as the token budget holds (at least ``min_items``, at most ``size``).

    Args:
        owners: the request index of each item (consecutive per request); None: one each.
        exact: arrival order, ``size`` items each, whatever the order and budget (warm-up
            runs chosen shapes).
        choose: the micro-batch sizes for the lengths in cut order, instead of the rule's
            budget (``ts_microbatch.core.autobudget``).
    """
    owners = list(range(len(items))) if owners is None else list(owners)
    lengths, refused = measure(rule, items, owners)  # never raises: a guard per item
    requests: dict[int, list[int]] = {}
    for index, owner in enumerate(owners):
        if index not in refused:
            requests.setdefault(owner, []).append(index)
    groups = list(requests.values())
    arrival = tuple(i for group in groups for i in group)
    try:
        # Planning never fails a batch: whatever goes wrong ordering or choosing (a cost
        # fit that cannot be solved, a policy's bug), the batch is cut the plain way.
        order, sizes = _order_and_sizes(rule, groups, lengths, size, exact, choose)
    except Exception:
        logger.exception(
            "planning the cut of a batch of %d items failed; cutting it in arrival order, "
            "%d items at a time",
            len(arrival),
            size,
        )
        order = arrival
        sizes = cut_sizes(rule, [lengths[i] for i in order], size, exact=True)
    return Plan(order, sizes, tuple(lengths[i] for i in order), refused)


def _order_and_sizes(
    rule: LengthRule,
    groups: list[list[int]],
    lengths: Sequence[int],
    size: int,
    exact: bool,
    choose: Callable[[Sequence[int]], Sequence[int]] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if rule.order == "length" and not exact:
        # Stable: requests of equal length keep their arrival order.
        groups = sorted(groups, key=lambda group: max(lengths[i] for i in group))
    order = tuple(i for group in groups for i in group)
    ordered = tuple(lengths[i] for i in order)
    if choose is not None and not exact:
        sizes = tuple(choose(ordered))
    else:
        sizes = cut_sizes(rule, ordered, size, exact=exact)
    if sum(sizes) != len(order) or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes
    ):
        raise ValueError(f"the cut {list(sizes)} does not cut {len(order)} items")
    return order, sizes


def cut_batch(
    plan: Plan,
    rule: LengthRule,
    items: Sequence[Any],
    context: Any,
    owners: Sequence[int] | None,
    on_timeout: Callable[[], None],
    *,
    quiet: bool,
) -> tuple[Batch, list[_MicroBatch]]:
    """The batch of ``items`` cut as ``plan`` says; its refused requests answered at once."""
    order = Order(
        len(items), owners=owners, items=plan.order, lengths=plan.lengths, pad_length=rule.padded
    )
    batch = Batch(len(items), context, on_timeout, quiet=quiet, order=order)
    for item, error in plan.refused.items():
        batch.answer_items((item,), error=error)  # before any stage: its request alone
    return batch, cut(batch, [items[i] for i in plan.order], plan.sizes)


def cut_sizes(
    rule: LengthRule, lengths: Sequence[int], size: int, *, exact: bool = False
) -> tuple[int, ...]:
    """Micro-batch sizes over ``lengths`` (in cut order): ``size`` at a time, or, with a
    budget, as many as keep ``rule.tokens`` within it, between ``min_items`` and ``size``."""
    budget = rule.max_micro_batch_tokens
    if budget is None or exact:
        full, rest = divmod(len(lengths), size)
        return (size,) * full + ((rest,) if rest else ())
    sizes: list[int] = []
    count = longest = 0
    for length in lengths:
        grown = max(longest, length)
        fits = rule.tokens(count + 1, grown) <= budget
        if count and (count >= size or (count >= rule.min_items and not fits)):
            sizes.append(count)
            count, grown = 0, length
        count, longest = count + 1, grown
    if count:
        sizes.append(count)
    return tuple(sizes)
