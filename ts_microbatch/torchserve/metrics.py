"""Reports the pipeline through TorchServe's metrics API (``context.metrics``).

With ``metrics_mode=prometheus`` and the metrics declared in the metrics config
(``configs/metrics.yaml``), they appear on the metrics address's ``/metrics``; otherwise
they are written to ``model_metrics.log``. The names and what they measure:

    MicroBatchStageSeconds  histogram s      one stage on one micro-batch, by Stage
    MicroBatchQueueSeconds  histogram s      wait before a stage, by Stage
    MicroBatchSize          histogram count  requests per micro-batch that entered preprocess
    MicroBatchesPerBatch    histogram count  micro-batches a frontend batch was split into
    MicroBatchRequestErrors counter   count  requests answered with an error, by StatusCode
    MicroBatchPaddedItems   histogram count  items added to a micro-batch to reach an allowed
                                             size (allowed_micro_batch_sizes only)
    MicroBatchRecompiles    counter   count  compiles of a compiled model on the request path
                                             (after warm-up; every one without warm-up)
    MicroBatchTokens        counter   count  tokens of the items cut into micro-batches, and
    MicroBatchPaddedTokens  counter   count  what they were padded to (items x padded length):
                                             the useful share is their ratio (length settings
                                             only: ts_microbatch.core.lengths)

Times are in seconds because TorchServe 0.12's Prometheus histograms have the client
library's fixed default buckets (5 ms to 10 s). For sizes those buckets stop at 10: read the
mean from ``_sum / _count``.
"""

from __future__ import annotations

from typing import Any

from ..core.batch import current_micro_batch
from ..core.metrics import PipelineObserver

STAGE_TIME = "MicroBatchStageSeconds"
QUEUE_TIME = "MicroBatchQueueSeconds"
MICRO_BATCH_SIZE = "MicroBatchSize"
MICRO_BATCHES_PER_BATCH = "MicroBatchesPerBatch"
REQUEST_ERRORS = "MicroBatchRequestErrors"
PADDED_ITEMS = "MicroBatchPaddedItems"
RECOMPILES = "MicroBatchRecompiles"
TOKENS = "MicroBatchTokens"
PADDED_TOKENS = "MicroBatchPaddedTokens"
METRIC_NAMES = (
    STAGE_TIME,
    QUEUE_TIME,
    MICRO_BATCH_SIZE,
    MICRO_BATCHES_PER_BATCH,
    REQUEST_ERRORS,
    PADDED_ITEMS,
    RECOMPILES,
    TOKENS,
    PADDED_TOKENS,
)


def _stage_request_id() -> str | None:
    """The id of the first request of the micro-batch whose stage call this thread is
    running, from its own batch's context; None outside stage calls or when unknown."""
    info = current_micro_batch()
    if info is None or info.context is None or not info.size:
        return None
    get_request_id = getattr(info.context, "get_request_id", None)
    request_id = get_request_id(info.item_requests[0]) if get_request_id else None
    return request_id if isinstance(request_id, str) else None


class TorchServeMetricsObserver(PipelineObserver):
    """Emits the pipeline's timings and sizes as TorchServe backend metrics.

    What TorchServe's metrics API raises escapes its hooks: ``MicroBatching`` and
    ``Pipeline`` wrap every observer in a ``GuardedObserver``, which logs it and drops it.

    Args:
        metrics: ``context.metrics`` of the TorchServe worker.
        first_stage: the stage whose runs count as micro-batches for ``MicroBatchSize``.
    """

    def __init__(self, metrics: Any, first_stage: str = "preprocess") -> None:
        from ts.metrics.dimension import Dimension
        from ts.metrics.metric_cache_errors import MetricsCacheKeyError
        from ts.metrics.metric_type_enum import MetricTypes

        self._metrics = metrics
        self._first_stage = first_stage
        self._dimension = Dimension
        self._key_error = MetricsCacheKeyError
        self._histogram = MetricTypes.HISTOGRAM
        self._counter = MetricTypes.COUNTER

    def _emit(
        self, name: str, value: float, unit: str, dims: dict[str, str], histogram: bool = True
    ) -> None:
        # What TorchServe raises here escapes: the pipeline wraps every observer in a
        # GuardedObserver (ts_microbatch.core.metrics), the one guard that keeps a metric failure
        # from failing the requests it measures.
        # A new list each call: TorchServe appends ModelName and Level to it.
        dimensions = [self._dimension(k, v) for k, v in dims.items()]
        metric_type = self._histogram if histogram else self._counter
        request_id = _stage_request_id()
        if request_id is not None and hasattr(self._metrics, "get_metric"):
            self._emit_for(request_id, name, value, unit, dimensions, metric_type)
            return
        self._metrics.add_metric(
            name,
            value,
            unit,
            # Outside a stage call (the handler's thread, whose batch the live ids are), the
            # batch's first request's id: without an index TorchServe appends every id of
            # the batch to the line (1.2 KB at batch 32, ~57 lines a batch), and the frontend
            # reads and parses every line.
            0,
            dimensions,
            metric_type,
        )

    def _emit_for(
        self, request_id: str, name: str, value: float, unit: str, dimensions: list[Any], kind: Any
    ) -> None:
        """Emits with ``request_id`` itself: TorchServe's ``add_metric`` looks an index up in
        the live batch's ids, and a stage thread may be measuring an earlier batch. The
        metric is found or declared, and the dimensions completed, as ``add_metric`` does."""
        dimensions.append(self._dimension("ModelName", self._metrics.model_name))
        dimensions.append(self._dimension("Level", "Model"))
        try:
            metric = self._metrics.get_metric(name, kind)
        except self._key_error:
            metric = self._metrics.add_metric_to_cache(
                name, unit, [d.name for d in dimensions], kind
            )
        metric.add_or_update(value, [d.value for d in dimensions], request_id)

    def on_batch(self, batch_size: int, micro_batches: int) -> None:
        self._emit(MICRO_BATCHES_PER_BATCH, micro_batches, "count", {})

    def on_stage(
        self, stage: str, size: int, queue_wait_s: float, run_s: float, *, failed: bool
    ) -> None:
        self._emit(STAGE_TIME, run_s, "s", {"Stage": stage})
        self._emit(QUEUE_TIME, queue_wait_s, "s", {"Stage": stage})
        if stage == self._first_stage:
            self._emit(MICRO_BATCH_SIZE, size, "count", {})

    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        self._emit(PADDED_ITEMS, padded_to - size, "count", {})

    def on_tokens(self, real: int, padded: int) -> None:
        self._emit(TOKENS, real, "count", {}, histogram=False)
        self._emit(PADDED_TOKENS, padded, "count", {}, histogram=False)

    def on_recompile(self, count: int) -> None:
        self._emit(RECOMPILES, count, "count", {}, histogram=False)

    def on_request_error(self, status_code: int) -> None:
        self._emit(REQUEST_ERRORS, 1, "count", {"StatusCode": str(status_code)}, histogram=False)
