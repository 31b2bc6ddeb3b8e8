"""The metric names the pipeline reports through TorchServe (``metrics``), and what they
measure::

    MicroBatchStageSeconds  histogram s      one stage on one micro-batch, by Stage
    MicroBatchQueueSeconds  histogram s      wait before a stage, by Stage
    MicroBatchSize          counter   count  micro-batches into preprocess, by Sizes (their
                                             size's power-of-two range: 1, 2, 3-4, 5-8, ...)
    MicroBatchesPerBatch    histogram count  micro-batches a frontend batch was split into
    MicroBatchRequestErrors counter   count  requests answered with an error, by StatusCode
    MicroBatchPaddedItems   histogram count  items added to a micro-batch to reach an allowed
                                             size (allowed_micro_batch_sizes only)
    MicroBatchRecompiles    counter   count  compiles of a compiled model on the request path
                                             (after warm-up; every one without warm-up)
    MicroBatchTokens        counter   count  tokens of the items cut into micro-batches, and
    MicroBatchBatches       counter   count  frontend batches the pipeline took, and the
    MicroBatchesCut         counter   count  micro-batches they were cut into (exact counts
                                             whatever metrics_interval_s; the histograms'
                                             _count counts intervals by default)
    MicroBatchPaddedTokens  counter   count  what they were padded to (items x padded length):
                                             the useful share is their ratio (length settings
                                             only: ts_microbatch.core.lengths)
    MicroBatchShapesUnknown counter   count  items whose shape was not read with shape_groups
                                             set, each cut into a micro-batch of its own

Kept apart from ``metrics`` (the observer that writes the lines) because the names are
what a metrics config declares and what ``tools.scrape`` reads back; ``metrics`` re-exports
them.
"""

from __future__ import annotations

STAGE_TIME = "MicroBatchStageSeconds"
QUEUE_TIME = "MicroBatchQueueSeconds"
MICRO_BATCH_SIZE = "MicroBatchSize"
SIZES = "Sizes"  # MicroBatchSize's label: the range of sizes (size_range)
MICRO_BATCHES_PER_BATCH = "MicroBatchesPerBatch"
REQUEST_ERRORS = "MicroBatchRequestErrors"
PADDED_ITEMS = "MicroBatchPaddedItems"
RECOMPILES = "MicroBatchRecompiles"
TOKENS = "MicroBatchTokens"
PADDED_TOKENS = "MicroBatchPaddedTokens"
BATCHES = "MicroBatchBatches"
MICRO_BATCHES_CUT = "MicroBatchesCut"
SHAPES_UNKNOWN = "MicroBatchShapesUnknown"
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
    BATCHES,
    MICRO_BATCHES_CUT,
    SHAPES_UNKNOWN,
)


def size_range(size: int) -> str:
    """``MicroBatchSize``'s ``Sizes`` label: "1", "2", "3-4", "5-8", "9-16", ..."""
    if size <= 2:
        return str(max(0, size))
    top = 1 << (size - 1).bit_length()
    return f"{top // 2 + 1}-{top}"
