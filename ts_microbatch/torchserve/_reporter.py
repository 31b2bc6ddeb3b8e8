"""The reporter thread of the pipeline's metric lines (``ts_microbatch.torchserve.metrics``).

One daemon thread, ``ts-microbatch-metrics``, runs the reports the hooks hand it, in order,
off the stage threads; it wakes at most every ``COALESCE_S`` while reports come one by one,
and while its owner holds an interval's values it sleeps until the interval ends (a flush, a
close or a half-full queue wake it sooner).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

logger = logging.getLogger(__name__)

# Hook calls waiting for the reporter thread; a batch of 32 in micro-batches of 4 makes ~30.
MAX_PENDING_REPORTS = 10_000
REPORTER_THREAD = "ts-microbatch-metrics"
# The reporter's pause after a wake-up, so that the reports of a burst are written together
# (one wake-up and one write instead of one per line); a flush or close waits at most this.
COALESCE_S = 0.02


class _Report(NamedTuple):
    hook: str
    write: Callable[[], None]
    request_id: str | None | Callable[[], str | None]  # a callable: read when a line needs it


class _Reporter:
    """One daemon thread, started at the first report, that runs the reports in order.

    ``put`` never blocks its caller (a stage thread): when ``max_pending`` reports are
    waiting it drops the new one, counts it in ``dropped`` and warns once; while
    :meth:`close` runs, it queues without starting a thread (``close`` starts one for
    what it finds queued, a later ``put`` or ``flush`` for what came after).
    """

    def __init__(
        self,
        run: Callable[[_Report], None],
        max_pending: int,
        written: Callable[[bool], float | None] = lambda force: None,
    ) -> None:
        self._run = run
        # After each burst, and with force=True before a flush is answered or the thread
        # stops: writes what is due, returns the seconds until more is (None: nothing held).
        self._written = written
        self._queue: queue.Queue[_Report | threading.Event | None] = queue.Queue(max_pending)
        self._lock = threading.Lock()  # starting and stopping the thread
        self._dropped_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._urgent = threading.Event()  # a flush or close is queued: do not wait for the interval
        self.dropped = 0

    def put(self, report: _Report) -> None:
        if self._thread is None:
            self._start(block=False)
        try:
            self._queue.put_nowait(report)
            # Read without the queue's lock (a heuristic; a deque's len is atomic).
            if len(self._queue.queue) > self._queue.maxsize // 2:
                self._urgent.set()  # drain before the interval ends, not drop
        except queue.Full:
            with self._dropped_lock:
                self.dropped += 1
                first = self.dropped == 1
            if first:
                logger.warning(
                    "%d metric reports pending: %s dropped (and later ones while full, "
                    "counted in dropped, not logged)",
                    self._queue.maxsize,
                    report.hook,
                )

    def _start(self, block: bool = True) -> None:
        if not self._lock.acquire(blocking=block):
            return  # close() is running
        try:
            if self._thread is None:
                self._start_locked()
        finally:
            self._lock.release()

    def _start_locked(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=REPORTER_THREAD)
        self._thread.daemon = True  # never what keeps a worker from exiting
        self._thread.start()

    def _loop(self) -> None:
        due: float | None = None  # seconds until held lines must be written
        while True:
            if due is None:  # nothing held: the next report wakes the thread
                burst = [self._queue.get()]
                if burst[0] is not None:
                    time.sleep(COALESCE_S)  # let the rest of the burst arrive
            else:  # an interval is held: reports wait for its end, a flush or close does not
                self._urgent.wait(due)
                self._urgent.clear()
                burst = []
            while not burst or burst[-1] is not None:  # what follows a stop stays queued
                try:
                    burst.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for item in burst:
                if item is None or isinstance(item, threading.Event):
                    due = self._written_guarded(force=True)
                    if item is None:
                        return
                    item.set()  # a flush: every report put before it is written
                    continue
                try:
                    self._run(item)
                except BaseException:  # the thread outlives any report (the runner guards them)
                    logger.exception("metric report %s failed", item.hook)
            due = self._written_guarded(force=False)

    def _written_guarded(self, force: bool) -> float | None:
        try:
            return self._written(force)
        except BaseException:
            logger.exception("writing metric lines failed")
            return None

    def flush(self, timeout_s: float) -> bool:
        """Waits until the reports put before the call are written; False after ``timeout_s``."""
        if self._thread is None:
            if self._queue.empty():
                return True
            self._start()
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        self._urgent.set()
        return done.wait(timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Writes what is pending and stops the thread; idempotent. A report put later
        starts a new one. False if the thread was still writing after ``timeout_s``."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return True
            try:
                self._queue.put(None, timeout=timeout_s)
                self._urgent.set()
                thread.join(timeout_s)
            except queue.Full:
                pass
            if thread.is_alive():
                logger.warning(
                    "metric reporter still writing after %.1f s; left running", timeout_s
                )
                return False
            self._thread = None
            if not self._queue.empty():  # reported while it was closing
                self._start_locked()
            return True
