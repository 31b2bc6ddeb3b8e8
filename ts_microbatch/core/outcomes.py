"""Where a request gets its outcome: the isolator decides, ``Outcomes`` carries it out.

``Isolator`` (``ts_microbatch.core.isolation``) resolves nothing itself: it returns an
``Outcome`` (micro-batches to re-run, probes to run first, failures to give). The stage
threads hand every outcome here, and ``finish`` is the one place a request's future is
resolved from a stage (besides its batch's timeout). Which items of a request a failure
leaves to run is ``Outcomes.skip_items_above``'s rule: the lowest-index item that fails
names its request's failure, whichever thread finishes first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from .batch import Batch, RequestFailure
from .errors import PipelineClosedError, RequestError, SiblingFailedError
from .isolation import Fail, Isolator, Outcome
from .micro_batch import _MicroBatch

logger = logging.getLogger(__name__)


def requests_text(owners: Sequence[int]) -> str:
    """The requests of a micro-batch for a log line: "requests 3..6", or, cut by length
    (not in order), "requests 9, 2, 5"."""
    distinct = list(dict.fromkeys(owners))
    if distinct == list(range(distinct[0], distinct[-1] + 1)):
        return f"requests {distinct[0]}..{distinct[-1]}"
    return "requests " + ", ".join(str(r) for r in distinct)


class Outcomes:
    """Carries out the isolator's outcomes for the stages ``names``.

    Args:
        enqueue: puts a micro-batch in a stage's queue, at its front when the last argument
            is True (re-runs go to stage 0, a lone probe at the front).
    """

    def __init__(
        self,
        names: Sequence[str],
        isolator: Isolator,
        enqueue: Callable[[int, _MicroBatch, bool], None],
    ) -> None:
        self._names = names
        self._isolator = isolator
        self._enqueue = enqueue

    def passed(self, mb: _MicroBatch, stage: int, run_s: float | None = None) -> None:
        self.apply(self._isolator.passed(mb, stage, run_s))

    def dropped(self, mb: _MicroBatch) -> None:
        """``mb`` was not run (stale): an outcome for the split it belongs to."""
        self.apply(self._isolator.dropped(mb))

    def fail_unrun(self, mb: _MicroBatch, error: BaseException) -> None:
        self.finish(mb.batch, mb.indices, error=error)
        self.dropped(mb)

    def stage_failed(
        self, stage: int, mb: _MicroBatch, exc: BaseException, failed_s: float | None = None
    ) -> None:
        outcome = self._isolator.failed(mb, stage, exc, failed_s)
        if outcome.rerun or outcome.first:
            logger.warning(
                "stage %s failed for %s (%s: %s); re-running them apart to find the failing ones",
                self._names[stage],
                requests_text(mb.owners),
                type(exc).__name__,
                exc,
            )
        self.apply(outcome)

    def apply(self, outcome: Outcome) -> None:
        for fail in outcome.fail:
            self._log_failure(fail)
            self.finish(
                fail.mb.batch, fail.mb.indices, error=fail.error, failure=self._failure(fail)
            )
            self.skip_items_above(fail)
        for mb in outcome.first:
            self._enqueue(0, mb, True)
        for mb in outcome.rerun:
            self._enqueue(0, mb, False)

    @staticmethod
    def skip_items_above(fail: Fail) -> None:
        """The rule for a request of several items (a KServe request's instances) with one
        failed: **the lowest-index item that fails names the request's status and message**,
        whichever stage thread finishes first.

        So a failed item answers its request only once every item below it has passed or
        failed (they go on running; the request is answered when its last item is), while
        the items above it cannot change the answer: those not answered yet are answered
        now with ``SiblingFailedError``, caused by the failed item's error, and their pieces
        still queued are dropped as stale. The failed item is the lowest of its micro-batch
        that belongs to its request (a request's items keep item order in the cut:
        ``ts_microbatch.core.order``), so an isolation probe's waiting rest, all above it, is
        never run. A request of n bad items costs at most the two runs per micro-batch of
        isolation (``ts_microbatch.core.isolation``): a micro-batch's failure and its probe.
        The answer (``ts_microbatch.torchserve.answers``) takes the first error in item order.
        """
        batch, order = fail.mb.batch, fail.mb.batch.order
        if order.owners is None:
            return  # one item per request
        lowest: dict[int, int] = {}
        for item, request in zip(fail.mb.item_indices, fail.mb.owners):
            lowest[request] = min(item, lowest.get(request, item))
        for request, failed in lowest.items():
            above = range(failed + 1, order.items_of(request).stop)
            if above:
                sibling = SiblingFailedError(
                    f"not run: item {failed} of request {request} failed before it "
                    f"({type(fail.error).__name__})"
                )
                sibling.__cause__ = fail.error
                batch.answer_items(above, error=sibling)

    def _failure(self, fail: Fail) -> RequestFailure:
        return RequestFailure(self._names[fail.stage], fail.stage, fail.isolated)

    def _log_failure(self, fail: Fail) -> None:
        owners, error, name = fail.mb.owners, fail.error, self._names[fail.stage]
        if isinstance(error, RequestError) and fail.isolated:
            logger.info("request %d rejected in %s: %s", owners[0], name, error)
        else:
            logger.error("stage %s failed for %s", name, requests_text(owners), exc_info=error)

    @staticmethod
    def finish(
        batch: Batch,
        positions: range,
        *,
        outputs: list[Any] | None = None,
        error: BaseException | None = None,
        failure: RequestFailure | None = None,
    ) -> None:
        """Answers the items at ``positions`` of ``batch``'s cut with ``outputs`` or
        ``error``: the one place a request gets its outcome from a stage. Requests answered
        already (timed out, cancelled) keep their answer."""
        if outputs is not None:
            batch.answer(positions, outputs)
        else:
            batch.answer(
                positions, error=error or PipelineClosedError("micro-batch lost"), failure=failure
            )
