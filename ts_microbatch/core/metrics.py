"""Observation hooks of the pipeline.

``PipelineObserver`` is the interface the pipeline reports to; it does nothing by itself.
Observers run on the pipeline's threads, inside the hot path: they must be quick. What one
raises is logged and dropped (``GuardedObserver``, which the pipeline wraps every observer
in): it changes no answer and leaves no request waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


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

    def on_tokens(self, real: int, padded: int) -> None:
        """A micro-batch of items with ``real`` tokens in all was cut, to be padded to
        ``padded`` (items x padded length): reported for each micro-batch of a batch whose
        lengths were measured (``ts_microbatch.core.lengths``)."""

    def on_shapes_unknown(self, count: int) -> None:
        """``count`` items of a batch cut with shape groups had no readable shape, so each
        was cut into a micro-batch of its own (``ts_microbatch.core.shapes``)."""

    def on_recompile(self, count: int) -> None:
        """A compiled model recompiled ``count`` times in one call after warm-up."""

    def on_request_error(self, status_code: int) -> None:
        """A request was answered with an error status."""


class GuardedObserver(PipelineObserver):
    """``observer`` with every report guarded: what it raises is logged and dropped.

    An observer (a metrics hook) runs in the middle of the pipeline's bookkeeping; one that
    raised failed the requests it was reporting on and left the bisection step waiting for
    them unresolved, so the requests held back there were never answered (#16). The first
    failure of each hook is logged with its traceback, later ones at debug level.
    """

    def __init__(self, observer: PipelineObserver) -> None:
        self.observer = observer
        self._failed: set[str] = set()

    @classmethod
    def wrap(cls, observer: PipelineObserver) -> GuardedObserver:
        """``observer`` guarded (itself when it is guarded already)."""
        return observer if isinstance(observer, GuardedObserver) else cls(observer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.observer, name)

    def _guard(self, hook: str, report: Callable[[], None]) -> None:
        try:
            report()
        except Exception:
            if hook in self._failed:
                logger.debug("observer %s raised again; ignored", hook, exc_info=True)
                return
            self._failed.add(hook)
            logger.exception(
                "observer %s.%s raised; ignored (later failures of it are logged at debug level)",
                type(self.observer).__name__,
                hook,
            )

    def on_batch(self, batch_size: int, micro_batches: int) -> None:
        self._guard("on_batch", lambda: self.observer.on_batch(batch_size, micro_batches))

    def on_stage(
        self, stage: str, size: int, queue_wait_s: float, run_s: float, *, failed: bool
    ) -> None:
        self._guard(
            "on_stage",
            lambda: self.observer.on_stage(stage, size, queue_wait_s, run_s, failed=failed),
        )

    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        self._guard("on_padding", lambda: self.observer.on_padding(stage, size, padded_to))

    def on_tokens(self, real: int, padded: int) -> None:
        self._guard("on_tokens", lambda: self.observer.on_tokens(real, padded))

    def on_shapes_unknown(self, count: int) -> None:
        self._guard("on_shapes_unknown", lambda: self.observer.on_shapes_unknown(count))

    def on_recompile(self, count: int) -> None:
        self._guard("on_recompile", lambda: self.observer.on_recompile(count))

    def on_request_error(self, status_code: int) -> None:
        self._guard("on_request_error", lambda: self.observer.on_request_error(status_code))
