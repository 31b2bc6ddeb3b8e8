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

Times are in seconds because TorchServe 0.12's Prometheus histograms have the client
library's fixed default buckets (5 ms to 10 s). For sizes those buckets stop at 10: read the
mean from ``_sum / _count``.
"""

from __future__ import annotations

import logging
from typing import Any

from .metrics import PipelineObserver

logger = logging.getLogger(__name__)

STAGE_TIME = "MicroBatchStageSeconds"
QUEUE_TIME = "MicroBatchQueueSeconds"
MICRO_BATCH_SIZE = "MicroBatchSize"
MICRO_BATCHES_PER_BATCH = "MicroBatchesPerBatch"
REQUEST_ERRORS = "MicroBatchRequestErrors"
PADDED_ITEMS = "MicroBatchPaddedItems"
RECOMPILES = "MicroBatchRecompiles"
METRIC_NAMES = (
    STAGE_TIME,
    QUEUE_TIME,
    MICRO_BATCH_SIZE,
    MICRO_BATCHES_PER_BATCH,
    REQUEST_ERRORS,
    PADDED_ITEMS,
    RECOMPILES,
)


class TorchServeMetricsObserver(PipelineObserver):
    """Emits the pipeline's timings and sizes as TorchServe backend metrics.

    Args:
        metrics: ``context.metrics`` of the TorchServe worker.
        first_stage: the stage whose runs count as micro-batches for ``MicroBatchSize``.
    """

    def __init__(self, metrics: Any, first_stage: str = "preprocess") -> None:
        from ts.metrics.dimension import Dimension
        from ts.metrics.metric_type_enum import MetricTypes

        self._metrics = metrics
        self._first_stage = first_stage
        self._dimension = Dimension
        self._histogram = MetricTypes.HISTOGRAM
        self._counter = MetricTypes.COUNTER
        self._failed_once = False

    def _emit(
        self, name: str, value: float, unit: str, dims: dict[str, str], histogram: bool = True
    ) -> None:
        # Metrics are best-effort: a failure here must not fail the requests being measured.
        try:
            self._metrics.add_metric(
                name,
                value,
                unit,
                # The first request's id: without an index TorchServe appends every id of
                # the batch to the line (1.2 KB at batch 32, ~57 lines a batch), and the
                # frontend reads and parses every line. A stage thread may be reporting on
                # an earlier batch than the one the ids belong to, so no id would be exact.
                0,
                # A new list each call: TorchServe appends ModelName and Level to it.
                [self._dimension(k, v) for k, v in dims.items()],
                self._histogram if histogram else self._counter,
            )
        except Exception:
            if not self._failed_once:
                self._failed_once = True
                logger.exception("cannot emit metric %s; further failures are not logged", name)

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

    def on_recompile(self, count: int) -> None:
        self._emit(RECOMPILES, count, "count", {}, histogram=False)

    def on_request_error(self, status_code: int) -> None:
        self._emit(REQUEST_ERRORS, 1, "count", {"StatusCode": str(status_code)}, histogram=False)
