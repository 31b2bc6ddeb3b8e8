"""Observation hooks of the pipeline.

``PipelineObserver`` is the interface the pipeline reports to; it does nothing by itself.
Observers run on the pipeline's threads, inside the hot path: they must be quick. What one
raises is logged and dropped (``ts_microbatch.pipeline.GuardedObserver``): it changes no
answer and leaves no request waiting.
"""

from __future__ import annotations


class PipelineObserver:
    """Receives what the pipeline does; every method is a no-op here."""

    def on_batch(self, batch_size: int, micro_batches: int) -> None:
        """A batch of ``batch_size`` requests was split into ``micro_batches`` micro-batches."""

    def on_stage(
        self, stage: str, size: int, queue_wait_s: float, run_s: float, *, failed: bool
    ) -> None:
        """A stage ran on a micro-batch of ``size`` requests after waiting ``queue_wait_s``."""

    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        """A micro-batch of ``size`` requests entered ``stage`` padded to ``padded_to`` items
        (equal when it was an allowed size); reported for every micro-batch of that stage."""

    def on_recompile(self, count: int) -> None:
        """A compiled model recompiled ``count`` times in one call after warm-up."""

    def on_request_error(self, status_code: int) -> None:
        """A request was answered with an error status."""
