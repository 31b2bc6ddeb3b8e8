"""A batch on its way into the pipeline (steps 1 and 2 of ``micro_batching``'s list):
its context pinned, its rows read as requests, its items submitted with the deadline
``timeout_s`` that ``handle`` started counting when it was entered.

Kept apart from ``micro_batching`` (the drop-in ``MicroBatching``: its settings, the
synchronous and asynchronous waits, the stage helpers) because both of its waits,
``handle`` and ``handle_async``, submit a batch in the same way, here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..core.config import MicroBatchingConfig
from ..core.errors import PipelineStalledError
from ..core.pipeline import Pipeline
from . import kserve
from .answers import SubmittedBatch
from .context import BatchContext
from .timeouts import default_timeout_s, left_s

logger = logging.getLogger(__name__)


def batch_timeout_s(config: MicroBatchingConfig, submitted: SubmittedBatch) -> float:
    """How long a batch may take: ``timeout_s``, or when it is null 90% of TorchServe's
    responseTimeout for the model (its default when no context says), so ``handle()``
    answers before the frontend gives up on the worker, however the handler was built."""
    if config.timeout_s is not None:
        return config.timeout_s
    return default_timeout_s(getattr(submitted.view, "model_yaml_config", None))


def submit(
    pipeline: Pipeline,
    config: MicroBatchingConfig,
    handler: Any,
    data: Sequence[Any],
    context: Any,
    start_s: float,
) -> SubmittedBatch:
    """Unpacks and submits a batch whose ``timeout_s`` started at ``start_s``: a cut that
    spent the whole timeout expires the batch before any stage starts it. ``context``
    None: the handler's."""
    submitted, items, owners = unpack(data, context, handler, config.kserve)
    if not items:
        return submitted
    # When rows are not requests, stage calls reach no request at all.
    view = submitted.view
    stages_view = view if submitted.target is not None or view is None else view.for_rows(())
    timeout_s = batch_timeout_s(config, submitted)
    timed_out = lambda: timeout_s if left_s(timeout_s, start_s) <= 0 else None  # noqa: E731
    try:
        submitted.batch = pipeline.submit_batch(
            items, stages_view, owners=owners, timed_out=timed_out
        )
    except PipelineStalledError as stalled:
        # Answered at once: waiting would only turn this into TorchServe's timeout.
        logger.error("batch of %d refused: %s", len(data), stalled)
        submitted.refused = stalled
    return submitted


def unpack(
    data: Sequence[Any], context: Any, handler: Any, kserve_bodies: bool | str
) -> tuple[SubmittedBatch, list[Any], list[int]]:
    """The batch's requests, its items and the request each item came from (stage
    helpers, statuses, metric lines and failure isolation go by requests: a KServe
    request is several items, a malformed one none)."""
    live = context if context is not None else getattr(handler, "context", None)
    view = BatchContext(live) if live is not None else None
    requests, items = kserve.unpack(list(data), kserve_bodies, view)
    # Statuses go on the context only when row i is request i: a request envelope
    # (TorchServe's json) may have flattened several instances per request.
    aligned = view is not None and view.request_count in (None, len(data))
    if view is not None and not aligned:
        logger.debug(
            "%d rows for %d requests: per-request statuses are not set",
            len(data),
            view.request_count,
        )
    submitted = SubmittedBatch(view if aligned else None, view, requests)
    return submitted, items, kserve.owners(requests)
