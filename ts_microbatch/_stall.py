"""Stage calls that outlive their requests: found, abandoned within a budget, or refused.

A stage call whose requests are all answered (their batch timed out) and that has run
longer than ``stall_timeout_s`` is stuck: Python cannot interrupt it. The pipeline then
*abandons* its thread (the thread exits whenever the call returns) and starts another in
its place, at most as many abandoned threads per stage as the stage has threads, so memory
stays bounded however many calls get stuck. When a stage has no thread left that is
neither abandoned nor stuck, it is stalled and new batches are refused at once.

Not thread-safe on its own: every method is called with the pipeline's lock held, except
``is_abandoned``, which a stage thread asks between calls without it (a dict membership
test; a thread is only ever abandoned while it is inside a call).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from .batch import _MicroBatch
from .errors import PipelineStalledError

logger = logging.getLogger(__name__)


class _Call(NamedTuple):
    stage: str
    mb: _MicroBatch
    started: float


class StallGuard:
    """The stage calls running now and the threads abandoned while stuck.

    Args:
        stall_timeout_s: the age past which a call for answered requests is stuck; None
            turns the guard off.
        start_thread: starts a new thread for the named stage (pipeline lock held).
    """

    def __init__(self, stall_timeout_s: float | None, start_thread: Callable[[str], None]) -> None:
        self._stall_timeout_s = stall_timeout_s
        self._start_thread = start_thread
        self._calls: dict[threading.Thread, _Call] = {}
        self._abandoned: dict[threading.Thread, str] = {}  # thread -> its stage

    def begin(self, thread: threading.Thread, stage: str, mb: _MicroBatch) -> None:
        self._calls[thread] = _Call(stage, mb, time.monotonic())

    def end(self, thread: threading.Thread) -> None:
        del self._calls[thread]

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
        stall_s = self._stall_timeout_s
        if stall_s is None:
            return
        now = time.monotonic()
        stuck = {
            thread: call
            for thread, call in self._calls.items()
            if now - call.started > stall_s and call.mb.answered()
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
                "stage %s: thread %s has been in one call for %.1f s for requests that "
                "timed out; abandoned it and started another thread",
                call.stage,
                thread.name,
                now - call.started,
            )
        for stage, threads in workers.items():
            if not any(t not in self._abandoned and t not in stuck for t in threads):
                raise PipelineStalledError(
                    f"stage {stage}: all {len(threads)} threads are stuck in calls that ran "
                    f"past the timeout (stall_timeout_s={stall_s}); refusing new batches "
                    "until one returns"
                )
