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
- cuts by a budget (``max_micro_batch_tokens``): a micro-batch takes items while items x
  padded length stays within it, so a run of short queries rides together and a long
  document goes with few others;
- pads lengths to ``allowed_sequence_lengths`` (buckets), so a compiled or fixed-shape model
  sees a few shapes only: a micro-batch's ``padded_length`` is the bucket over its longest.

``plan`` returns the order and the cut; the pipeline carries each micro-batch's lengths and
padded length to its stage calls (``MicroBatchInfo``), where preprocess pads to it.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .batch import Batch, _MicroBatch, cut
from .errors import ConfigError, InvalidInputError, PayloadTooLargeError, RequestError

logger = logging.getLogger(__name__)

ORDERS = ("arrival", "length")


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
    """

    measure: Callable[[Any], int]
    order: str = "arrival"
    max_micro_batch_tokens: int | None = None
    allowed_lengths: tuple[int, ...] | None = None
    max_tokens: int | None = None
    truncate: bool = False
    min_items: int = 1

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

    def length_of(self, item: Any) -> int:
        """The length ``item`` is counted at; raises its request's error when it is refused.

        Raises:
            PayloadTooLargeError: longer than ``limit`` without ``truncate``.
            RequestError: ``measure`` raised one, or another exception (the item cannot be
                read), or returned something that is not an integer >= 0.
        """
        try:
            length = self.measure(item)
        except RequestError:
            raise
        except Exception as exc:  # the per-item boundary: whatever reading its body raised
            raise InvalidInputError(
                f"its length cannot be measured: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise InvalidInputError(f"item_length returned {length!r}, expected an integer >= 0")
        limit = self.limit
        if limit is not None and length > limit:
            if self.truncate:
                return limit
            raise PayloadTooLargeError(
                f"the input is {length} tokens long, over the longest accepted ({limit}: "
                f"{_limit_source(self)})"
            )
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
    lengths, refused = measure(rule, items, owners)
    requests: dict[int, list[int]] = {}
    for index, owner in enumerate(owners):
        if index not in refused:
            requests.setdefault(owner, []).append(index)
    groups = list(requests.values())
    if rule.order == "length" and not exact:
        # Stable: requests of equal length keep their arrival order.
        groups.sort(key=lambda group: max(lengths[i] for i in group))
    order = tuple(i for group in groups for i in group)
    ordered = tuple(lengths[i] for i in order)
    if choose is not None and not exact:
        sizes = tuple(choose(ordered))
    else:
        sizes = cut_sizes(rule, ordered, size, exact=exact)
    return Plan(order, sizes, ordered, refused)


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
    batch = Batch(
        len(items),
        context,
        on_timeout,
        quiet=quiet,
        owners=owners,
        order=plan.order,
        lengths=plan.lengths,
        pad_length=rule.padded,
    )
    for item, error in plan.refused.items():
        batch.answer_items((item,), error=error)  # before any stage: its request alone
    return batch, cut(batch, [items[i] for i in plan.order], plan.sizes)


def cut_sizes(
    rule: LengthRule, lengths: Sequence[int], size: int, *, exact: bool = False
) -> tuple[int, ...]:
    """Micro-batch sizes over ``lengths`` (in cut order): ``size`` at a time, or, with a
    budget, as many as keep items x padded length within it, between ``min_items`` and
    ``size``."""
    budget = rule.max_micro_batch_tokens
    if budget is None or exact:
        full, rest = divmod(len(lengths), size)
        return (size,) * full + ((rest,) if rest else ())
    sizes: list[int] = []
    count = longest = 0
    for length in lengths:
        grown = max(longest, length)
        fits = (count + 1) * rule.padded(max(grown, 1)) <= budget
        if count and (count >= size or (count >= rule.min_items and not fits)):
            sizes.append(count)
            count, grown = 0, length
        count, longest = count + 1, grown
    if count:
        sizes.append(count)
    return tuple(sizes)
