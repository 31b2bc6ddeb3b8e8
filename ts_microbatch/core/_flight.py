"""A pipeline's batches in flight and its shutdown, under one lock.

Kept apart from ``pipeline`` (micro-batches flowing through the stages) because the
shutdown contract is a state machine of its own: open, closed (no new batch), cancelling
(queued work fails instead of running), stopped (the stage threads are gone). It needs to
know which batches are still unanswered, and nothing else of a batch: the queues close
only once none is in flight, since re-runs that isolate a failure go back to the first
queue; the batches left unanswered after the join timeout are failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ._queue import StageQueue
from .batch import Batch
from .errors import PipelineClosedError
from .micro_batch import _MicroBatch
from .outcomes import Outcomes
from .stages import StageWorkers


class InFlight:
    """The batches submitted and not yet fully answered, and the steps of shutting down."""

    def __init__(
        self,
        workers: StageWorkers,
        queues: Sequence[StageQueue[_MicroBatch]],
        outcomes: Outcomes,
        join_timeout_s: float,
    ) -> None:
        self._workers = workers
        self._queues = queues
        self._outcomes = outcomes
        self._join_timeout_s = join_timeout_s
        self._lock = threading.Lock()  # guards the fields below
        self._idle = threading.Condition(self._lock)  # notified when no batch is in flight
        self._batches: set[Batch] = set()  # submitted, not yet fully answered
        self._closed = False
        self._cancelling = False
        self._stopped = threading.Event()

    @property
    def cancelling(self) -> bool:
        """Whether queued work and later re-runs fail instead of running."""
        return self._cancelling

    def admit(self, batch: Batch) -> None:
        """Counts ``batch`` in flight until it is answered.

        Raises:
            PipelineClosedError: the pipeline is shut down.
        """
        with self._lock:
            if self._closed:
                raise PipelineClosedError("cannot submit: the micro-batching pipeline is shut down")
            self._batches.add(batch)
        batch.when_answered(self._answered)

    def _answered(self, batch: Batch) -> None:
        with self._lock:
            self._batches.discard(batch)
            if not self._batches:
                self._idle.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._batches)

    def shutdown(self, wait: bool, cancel_pending: bool) -> None:
        """Closes to new work and stops the stage threads; idempotent (Pipeline.shutdown
        states the contract)."""
        with self._lock:
            first = not self._closed
            self._closed = True
            self._cancelling = self._cancelling or cancel_pending
        self._workers.close()
        if first and cancel_pending:
            closed = PipelineClosedError("the pipeline shut down before this request was processed")
            for queue in self._queues:
                for mb in queue.drain():
                    self._outcomes.fail_unrun(mb, closed)
        if first and wait:
            self._stop_stages()
        elif first:
            threading.Thread(
                target=self._stop_stages, name="ts-microbatch-shutdown", daemon=True
            ).start()
        elif wait and not self._workers.is_worker(threading.current_thread()):
            self._stopped.wait()

    def _stop_stages(self) -> None:
        started = time.monotonic()
        deadline = started + self._join_timeout_s
        with self._idle:
            # Re-runs go back to the first queue, so no queue may close while work is in flight.
            while self._batches and self._idle.wait(max(0.0, deadline - time.monotonic())):
                pass
        self._workers.stop(started, self._join_timeout_s)
        with self._lock:
            stranded = list(self._batches)
        error = PipelineClosedError("the pipeline shut down before this request was answered")
        for batch in stranded:
            batch.fail_unanswered(error)
        self._stopped.set()
