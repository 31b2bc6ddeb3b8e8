"""From a submitted batch's items to its ``Batch`` and micro-batches: what happens before
the first stage call.

The size in force (fixed, or chosen per batch by ``"auto"``), then the cut: ``size`` items
at a time in arrival order, or as the length rule (``lengths``) or the shape rule
(``shapes``) measures, refuses, orders and cuts them. Planning never fails a batch: a
policy that raises while choosing is logged and the batch is cut a plain way (the rules
guard their own ordering and budgets the same way), and every measurement is guarded per
request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import lengths, shapes
from ._checks import _positive_int
from .autobudget import AutoTokenBudget
from .autosize import AutoMicroBatchSize
from .batch import Batch
from .metrics import PipelineObserver
from .micro_batch import _MicroBatch, cut
from .order import Order

logger = logging.getLogger(__name__)


def auto_size(auto: AutoMicroBatchSize, count: int, threads: Mapping[str, int]) -> int:
    """The size ``auto`` chooses for a batch of ``count``; its last one if choosing fails."""
    try:
        return _positive_int(auto.choose(count, threads), "micro_batch_size")
    except Exception:
        logger.exception(
            "choosing a micro-batch size failed; the batch is cut at %d", auto.last_size
        )
        return max(1, auto.last_size)


def plan_batch(
    items: Sequence[Any],
    context: Any,
    owners: Sequence[int] | None,
    size: int,
    *,
    quiet: bool,
    exact: bool,
    on_timeout: Callable[[], None],
    length_rule: lengths.LengthRule | None = None,
    shape_rule: shapes.ShapeRule | None = None,
    token_budget: AutoTokenBudget | None = None,
    threads: Mapping[str, int] | None = None,
) -> tuple[Batch, list[_MicroBatch]]:
    """The batch of ``items`` and its micro-batches.

    Args:
        size: items per micro-batch (at most, with a budget).
        quiet: a warm-up batch (no token budget is chosen for it).
        exact: arrival order, ``size`` items each, whatever the rules (warm-up's shapes).
        threads: each stage's threads, for a token budget's makespan.
    """
    if shape_rule is not None:
        by_shape = shapes.plan(shape_rule, items, owners, size, exact=exact)
        order = Order(len(items), owners=owners, items=by_shape.order, shapes=by_shape.shapes)
        batch = Batch(len(items), context, on_timeout, quiet=quiet, order=order)
        return batch, cut(batch, [items[i] for i in by_shape.order], by_shape.sizes)
    if length_rule is None:
        batch = Batch(len(items), context, on_timeout, quiet=quiet, owners=owners)
        return batch, cut(batch, items, size)
    choose = None
    if token_budget is not None and not quiet:
        rule, budget, stage_threads = length_rule, token_budget, dict(threads or {})
        choose = lambda ordered: budget.choose(rule, ordered, stage_threads)  # noqa: E731
    plan = lengths.plan(length_rule, items, owners, size, exact=exact, choose=choose)
    return lengths.cut_batch(plan, length_rule, items, context, owners, on_timeout, quiet=quiet)


def report_cut(
    observer: PipelineObserver,
    batch: Batch,
    micro_batches: Sequence[_MicroBatch],
    shape_rule: shapes.ShapeRule | None,
) -> None:
    """What a batch's cut tells the metrics: its micro-batches, their tokens (lengths
    measured), the items cut alone because their shape is unknown (shape groups set)."""
    order = batch.order
    observer.on_batch(order.size, len(micro_batches))
    if order.lengths is not None:
        for mb in micro_batches:
            observer.on_tokens(sum(mb.lengths or ()), len(mb) * (mb.padded_length or 0))
    if order.shapes is not None and shape_rule is not None and shape_rule.groups is not None:
        unknown = sum(shape is None for shape in order.shapes)
        if unknown:  # a counter: no line for the batches where every shape was read
            observer.on_shapes_unknown(unknown)
