"""The stage threads: started, resized, replaced when stuck in a call, stopped.

Each stage of the pipeline is served by its own threads, all taking micro-batches from the
stage's queue. This module owns their lives; the pipeline owns what they do with each
micro-batch (``serve``). Kept apart so that the pipeline reads as the flow of micro-batches,
and the rules for threads (how many, which are abandoned, when they exit) sit in one place:

* Resizing never blocks: a scale-down puts retire signals, which take no queue capacity, and
  the first threads to take them exit once their current call returns.
* A thread stuck in a call for a batch that timed out is abandoned and replaced, within a
  budget (``ts_microbatch.core._stall``); a stage left with no usable thread is stalled.
* Stopping closes the queues (threads drain what is queued, then exit), joins with a
  deadline and logs the stragglers by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ._checks import _positive_int
from ._queue import Signal, StageQueue
from ._stall import StallGuard
from .errors import ConfigError, PipelineClosedError
from .micro_batch import _MicroBatch

logger = logging.getLogger(__name__)

_PR_SET_NAME = 15  # prctl(2)


def _name_os_thread(name: str) -> None:
    """Gives the calling thread ``name`` in the OS too (Linux; ``ts-microbatch-preprocess-0``
    as ``tsmb-prepr-0``: 15 bytes at most), where ``top -H``, ``py-spy`` and
    /proc/<pid>/task/*/comm show it. Threads started from it, its OpenMP team among them,
    inherit the name, so a stage's CPU can be told apart from outside the worker
    (benchmarks/compare.py reads it so)."""
    prefix = "ts-microbatch-"
    if not name.startswith(prefix) or not sys.platform.startswith("linux"):
        return
    stage, _, index = name[len(prefix) :].rpartition("-")
    short = f"tsmb-{stage[:5]}-{index}"[:15].encode()
    with contextlib.suppress(OSError, AttributeError):  # no prctl: the process's name
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(short), 0, 0, 0)


class StageWorkers:
    """The threads serving each stage, named ``ts-microbatch-<stage>-<i>``.

    Args:
        names: the stage names, in pipeline order.
        queues: the queue each stage's threads take micro-batches from, in the same order.
        serve: called with a stage's index and a micro-batch, on one of its threads; it must
            not raise (an exception would end the thread, which is then not replaced).
        prepare: called with a stage's index on each of its threads before the thread's
            first micro-batch (after the handler's initialize, unlike the thread's start);
            an exception is logged and the thread serves on.
    """

    def __init__(
        self,
        names: Sequence[str],
        queues: Sequence[StageQueue[_MicroBatch]],
        serve: Callable[[int, _MicroBatch], None],
        prepare: Callable[[int], None] | None = None,
    ) -> None:
        self._names = list(names)
        self._queues = list(queues)
        self._serve = serve
        self._prepare = prepare
        self._lock = threading.Lock()  # guards the fields below and the stall guard
        self._exited = threading.Condition(self._lock)  # notified when a thread exits
        self._targets = dict.fromkeys(self._names, 0)
        self._threads: dict[str, list[threading.Thread]] = {name: [] for name in self._names}
        self._ids = {name: itertools.count() for name in self._names}
        self._stall = StallGuard(self._start_locked)
        self._closed = False

    # -- how many ----------------------------------------------------------------------

    def targets(self) -> dict[str, int]:
        """The thread count each stage is set to."""
        with self._lock:
            return dict(self._targets)

    def resize(self, parallelism: Mapping[str, int]) -> None:
        """Sets the thread count of the named stages; never waits for a thread.

        Raises:
            ConfigError: an unknown stage or a count that is not an integer >= 1.
            PipelineClosedError: after ``close``.
        """
        for name, threads in parallelism.items():
            if name not in self._names:
                raise ConfigError(
                    f"micro_batching.parallelism.{name}: unknown stage; "
                    f"stages are {', '.join(self._names)}"
                )
            _positive_int(threads, f"micro_batching.parallelism.{name}")
        with self._lock:
            if self._closed:
                raise PipelineClosedError("cannot change parallelism: the pipeline is shut down")
            for name, threads in parallelism.items():
                delta = threads - self._targets[name]
                self._targets[name] = threads
                if delta < 0:
                    # Retire signals take no queue capacity: a scale-down never waits on a
                    # full queue.
                    self._queues[self._names.index(name)].retire(-delta)
                for _ in range(delta):
                    self._start_locked(name)

    def wait_for_targets(self, timeout_s: float) -> bool:
        """Waits until no stage has more serving threads than its count, that is until the
        threads a scale-down retired have exited; False if some still run after
        ``timeout_s`` (a retired thread finishes the call it is in first)."""
        with self._exited:
            return self._exited.wait_for(
                lambda: all(len(self._serving_locked(n)) <= self._targets[n] for n in self._names),
                timeout_s,
            )

    # -- which ---------------------------------------------------------------------------

    def serving(self) -> dict[str, list[threading.Thread]]:
        """Each stage's threads that serve it (not those abandoned in a stuck call), now."""
        with self._lock:
            return {name: self._serving_locked(name) for name in self._names}

    def alive(self) -> dict[str, int]:
        """Each stage's running threads, abandoned ones included."""
        with self._lock:
            return {n: sum(t.is_alive() for t in ts) for n, ts in self._threads.items()}

    def abandoned(self) -> dict[str, int]:
        """Each stage's threads abandoned in a stuck call and not returned yet."""
        with self._lock:
            return self._stall.abandoned_counts(self._names)

    def is_worker(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is one of the stage threads (abandoned ones included)."""
        with self._lock:
            return any(thread in threads for threads in self._threads.values())

    def _serving_locked(self, name: str) -> list[threading.Thread]:
        return [t for t in self._threads[name] if not self._stall.is_abandoned(t)]

    # -- stuck calls ---------------------------------------------------------------------

    def begin_call(self, stage: str, mb: _MicroBatch) -> None:
        """The calling thread starts a call of ``stage`` on ``mb`` (no lock: see ``_stall``)."""
        self._stall.begin(threading.current_thread(), stage, mb)

    def end_call(self) -> None:
        """The calling thread's call returned (or raised)."""
        self._stall.end(threading.current_thread())

    def check_stalled(self) -> None:
        """Replaces threads stuck in calls for batches that timed out, within the budget.

        Raises:
            PipelineStalledError: a stage has no thread left that is neither abandoned
                nor stuck.
        """
        with self._lock:
            self._stall.check(self._threads, self._targets)

    # -- their lives ---------------------------------------------------------------------

    def _start_locked(self, name: str) -> None:
        thread = threading.Thread(
            target=self._run,
            args=(self._names.index(name),),
            name=f"ts-microbatch-{name}-{next(self._ids[name])}",
            daemon=True,  # a TorchServe worker is killed, not asked, to stop
        )
        self._threads[name].append(thread)
        thread.start()

    def _run(self, stage: int) -> None:
        queue = self._queues[stage]
        me = threading.current_thread()
        _name_os_thread(me.name)
        prepare = self._prepare
        try:
            while not self._stall.is_abandoned(me):
                mb = queue.get()
                if isinstance(mb, Signal):  # retired, or the queue closed and drained
                    return
                if prepare is not None:
                    self._prepare_guarded(prepare, stage)
                    prepare = None
                self._serve(stage, mb)
        finally:
            with self._lock:
                self._threads[self._names[stage]].remove(me)
                self._stall.forget(me)
                self._exited.notify_all()

    def _prepare_guarded(self, prepare: Callable[[int], None], stage: int) -> None:
        try:
            prepare(stage)
        except Exception:
            logger.exception("preparing a %s thread failed; it serves on", self._names[stage])

    def close(self) -> None:
        """Refuses further resizes; threads keep serving until ``stop``."""
        with self._lock:
            self._closed = True

    def stop(self, started: float, timeout_s: float) -> None:
        """Closes the queues and joins every thread (but the caller) until ``timeout_s``
        after ``started`` (``time.monotonic()``); logs the threads still running then."""
        deadline = started + timeout_s
        me = threading.current_thread()
        with self._lock:
            self._closed = True
            threads = [t for ts in self._threads.values() for t in ts if t is not me]
        for queue in self._queues:
            queue.close()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stragglers = [t.name for t in threads if t.is_alive()]
        if stragglers:
            logger.warning(
                "threads still running %.1f s after shutdown began: %s",
                timeout_s,
                ", ".join(stragglers),
            )
