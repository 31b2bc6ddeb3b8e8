"""Stage calls that outlive their batch: found, abandoned within a budget, or refused.

A stage call still running for a batch that timed out, all its requests answered, is
stuck: Python cannot interrupt it, and nobody waits for its result. The pipeline then
*abandons* its thread (the thread exits whenever the call returns) and starts another in
its place, at most as many abandoned threads per stage as the stage has threads, so memory
stays bounded however many calls get stuck. When a stage has no thread left that is
neither abandoned nor stuck, it is stalled and new batches are refused at once.

Not thread-safe on its own: every method is called with the lock of its owner
(``ts_microbatch.core.stages.StageWorkers``) held, except those a stage thread calls about
itself: ``begin`` and ``end`` around each call, ``is_abandoned`` between calls. Those take
no lock, as a stage call is the pipeline's hot path (three per micro-batch) and a lock
shared by every stage thread there made them queue behind each other: each is one dict
operation on the thread's own key, atomic under the GIL, and ``check`` reads a copy of the
calls (a thread is only ever abandoned while it is inside a call; a call seen just before
it ended is one that was about to return anyway).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from .errors import PipelineStalledError
from .micro_batch import _MicroBatch

logger = logging.getLogger(__name__)


class _Call(NamedTuple):
    stage: str
    mb: _MicroBatch
    started: float


class StallGuard:
    """The stage calls running now and the threads abandoned while stuck.

    Whether a call is stuck depends on no clock: its batch timed out (so the call is at
    least ``timeout_s`` late) and every request of it is answered. A call that was about
    to return anyway costs one thread start; its thread exits when it does and frees its
    place in the budget.

    Args:
        start_thread: starts a new thread for the named stage (the owner's lock held).
    """

    def __init__(self, start_thread: Callable[[str], None]) -> None:
        self._start_thread = start_thread
        self._calls: dict[threading.Thread, _Call] = {}
        self._abandoned: dict[threading.Thread, str] = {}  # thread -> its stage

    def begin(self, thread: threading.Thread, stage: str, mb: _MicroBatch) -> None:
        self._calls[thread] = _Call(stage, mb, time.monotonic())

    def end(self, thread: threading.Thread) -> None:
        self._calls.pop(thread, None)

    def is_abandoned(self, thread: threading.Thread) -> bool:
        return thread in self._abandoned

    def forget(self, thread: threading.Thread) -> None:
        """``thread`` exits; if it was abandoned, its place in the budget is free again."""
        if self._abandoned.pop(thread, None) is not None:
            logger.warning("abandoned thread %s returned and exits", thread.name)

    def abandoned_counts(self, stages: Sequence[str]) -> dict[str, int]:
        counts = dict.fromkeys(stages, 0)
        for stage in self._abandoned.values():
            counts[stage] += 1
        return counts

    def check(
        self, workers: Mapping[str, list[threading.Thread]], targets: Mapping[str, int]
    ) -> None:
        """Abandons stuck calls while the budget lasts; raises PipelineStalledError if a
        stage has no thread left that is neither abandoned nor stuck."""
        now = time.monotonic()
        stuck = {
            thread: call
            for thread, call in self._calls.copy().items()  # stage threads change it
            if call.mb.batch.timed_out and call.mb.answered()
        }
        if not stuck:
            return
        for thread, call in stuck.items():
            if thread in self._abandoned:
                continue
            if sum(s == call.stage for s in self._abandoned.values()) >= targets[call.stage]:
                continue  # budget spent: it stays, and serves again if it ever returns
            self._abandoned[thread] = call.stage
            self._start_thread(call.stage)
            logger.error(
                "stage %s: thread %s has been in one call for %.1f s for a batch that "
                "timed out; abandoned it and started another thread",
                call.stage,
                thread.name,
                now - call.started,
            )
        for stage, threads in workers.items():
            if not any(t not in self._abandoned and t not in stuck for t in threads):
                raise PipelineStalledError(
                    f"stage {stage}: all {len(threads)} threads are stuck in calls for "
                    "batches that timed out; refusing new batches until one returns"
                )
