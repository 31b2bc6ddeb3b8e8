"""Our image handler on upstream's stages with the pipeline's metric lines turned off: for
benchmarks/dev/worker_ab.py (``--variants no-metrics``), to measure what the metrics cost.
worker_ab.py copies handlers/micro_batching_handler.py into the model directory beside this
file."""

from micro_batching_handler import MicroBatchingHandler


class NoMetricsHandler(MicroBatchingHandler):  # type: ignore[misc]
    def micro_batching_observer(self, context):  # type: ignore[no-untyped-def]
        return None
