"""The micro-batching pipeline: stages connected by bounded queues, one future per request.

A batch is split into micro-batches; each micro-batch flows through the stages in order,
every stage served by its own threads, so that stage k of one micro-batch overlaps stage
k+1 of the previous one. Every request carries a ``concurrent.futures.Future`` that is
resolved in ``_finish`` and nowhere else.

When a stage raises for a micro-batch of n > 1 requests and ``isolate_failures`` is on,
the micro-batch is split in halves that start over from the first stage, until the
requests that fail on their own are alone; the others get their normal answers. One bad
request among n costs about 2*log2(n) extra stage calls, not n.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, NamedTuple

from ._queue import Signal, StageQueue
from .autosize import AutoMicroBatchSize
from .errors import ConfigError, PipelineClosedError, RequestError, StageOutputError
from .metrics import PipelineObserver

logger = logging.getLogger(__name__)

StageFn = Callable[[Any], Any]


class MicroBatchInfo(NamedTuple):
    """Where the micro-batch a stage thread is working on sits in its batch."""

    micro_batch_idx: int  # its place among the batch's micro-batches; re-run halves keep it
    offset: int  # index of its first request in the full batch
    size: int  # number of requests in it
    attempt: int  # 0 on the first run, n when re-run n times to isolate a failure

    @property
    def request_indices(self) -> range:
        """Indices of its requests in the full batch (for context.request_ids and headers)."""
        return range(self.offset, self.offset + self.size)


class PipelineStats(NamedTuple):
    """A snapshot of the pipeline's state."""

    micro_batch_size: int
    parallelism: dict[str, int]
    threads_alive: dict[str, int]
    queued: dict[str, int]
    micro_batches_in_flight: int


class _MicroBatch:
    __slots__ = ("index", "offset", "items", "futures", "payload", "attempt", "enqueued_at")

    def __init__(
        self,
        index: int,
        offset: int,
        items: Sequence[Any],
        futures: list[Future[Any]],
        attempt: int,
    ) -> None:
        self.index = index
        self.offset = offset
        self.items = items
        self.futures = futures
        self.payload: Any = list(items)
        self.attempt = attempt
        self.enqueued_at = time.monotonic()

    def halves(self) -> tuple[_MicroBatch, _MicroBatch]:
        mid = len(self.items) // 2
        return (
            _MicroBatch(
                self.index, self.offset, self.items[:mid], self.futures[:mid], self.attempt + 1
            ),
            _MicroBatch(
                self.index,
                self.offset + mid,
                self.items[mid:],
                self.futures[mid:],
                self.attempt + 1,
            ),
        )

    def info(self) -> MicroBatchInfo:
        return MicroBatchInfo(self.index, self.offset, len(self.items), self.attempt)


def _set_future(
    future: Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    # A future may already be done: handle() fails the ones that time out, and a caller may
    # cancel. The late outcome is dropped rather than raising in a worker thread.
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


def _check_positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: got {value!r}, expected an integer >= 1")
    return value


class _BatchTimer:
    """Reports a batch's wall time to the automatic size once its last future resolves
    (batches with a failed request are left out: retries would skew them)."""

    def __init__(self, auto: AutoMicroBatchSize, size: int, futures: list[Future[Any]]) -> None:
        self._auto = auto
        self._size = size
        self._futures = futures
        self._remaining = len(futures)
        self._lock = threading.Lock()
        self._started = time.monotonic()
        for future in futures:
            future.add_done_callback(self._one_done)

    def _one_done(self, _: Future[Any]) -> None:
        with self._lock:
            self._remaining -= 1
            if self._remaining:
                return
        elapsed = time.monotonic() - self._started
        if all(not f.cancelled() and f.exception() is None for f in self._futures):
            self._auto.observe_batch(self._size, len(self._futures), elapsed)


class Pipeline:
    """Runs a sequence of batch functions as a pipeline of micro-batches.

    Args:
        stages: stage name to function, in pipeline order. Each function takes the list of
            a micro-batch's items (first stage) or the previous stage's output, and the last
            one must return a list with one output per request.
        parallelism: threads per stage name; stages not named get one thread.
        micro_batch_size: requests per micro-batch.
        max_queued_micro_batches: capacity of each queue between two stages.
        isolate_failures: re-run a failed micro-batch in halves to find the bad requests.
        join_timeout_s: how long shutdown waits for each stage's threads.
        observer: receives stage timings; see ``ts_microbatch.metrics``.
    """

    def __init__(
        self,
        stages: Mapping[str, StageFn],
        *,
        parallelism: Mapping[str, int] | None = None,
        micro_batch_size: int = 1,
        max_queued_micro_batches: int = 4,
        isolate_failures: bool = True,
        join_timeout_s: float = 30.0,
        observer: PipelineObserver | None = None,
    ) -> None:
        if not stages:
            raise ConfigError("stages: got none, expected at least one stage")
        self._names = list(stages)
        self._fns = dict(stages)
        self._auto: AutoMicroBatchSize | None = None
        self.micro_batch_size = micro_batch_size
        _check_positive_int(max_queued_micro_batches, "micro_batching.max_queued_micro_batches")
        # The first queue holds requests that are already in memory, and re-runs must never
        # block a worker, so it is unbounded; the queues that hold stage outputs are bounded.
        self._queues: list[StageQueue[_MicroBatch]] = [StageQueue[_MicroBatch](None)] + [
            StageQueue[_MicroBatch](max_queued_micro_batches) for _ in self._names[1:]
        ]
        self._isolate_failures = isolate_failures
        self._join_timeout_s = join_timeout_s
        self._observer = observer or PipelineObserver()
        self._local = threading.local()
        self._lock = threading.Lock()  # guards the fields below
        self._targets = {name: 0 for name in self._names}
        self._workers: dict[str, list[threading.Thread]] = {name: [] for name in self._names}
        self._thread_ids = {name: itertools.count() for name in self._names}
        self._in_flight: set[_MicroBatch] = set()
        self._closed = False
        self._stopped = threading.Event()
        self.set_parallelism({name: 1 for name in self._names} | dict(parallelism or {}))

    # -- configuration ---------------------------------------------------------------

    @property
    def micro_batch_size(self) -> int:
        """The size in force; with an automatic size, the one chosen for the last batch."""
        auto = self._auto
        return auto.last_size if auto is not None else self._micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, size: int) -> None:
        # Plain attribute writes are atomic; submit() reads them once per batch.
        self._micro_batch_size = _check_positive_int(size, "micro_batching.micro_batch_size")
        self._auto = None

    @property
    def auto_micro_batch_size(self) -> AutoMicroBatchSize | None:
        return self._auto

    @auto_micro_batch_size.setter
    def auto_micro_batch_size(self, policy: AutoMicroBatchSize | None) -> None:
        """Lets ``policy`` choose each batch's micro-batch size from measured stage costs."""
        self._auto = policy

    @property
    def parallelism(self) -> dict[str, int]:
        with self._lock:
            return dict(self._targets)

    def set_parallelism(self, parallelism: Mapping[str, int]) -> None:
        """Sets the thread count of the named stages; safe while batches are running.

        Raises:
            ConfigError: an unknown stage or a count that is not an integer >= 1.
        """
        for name, threads in parallelism.items():
            if name not in self._fns:
                raise ConfigError(
                    f"micro_batching.parallelism.{name}: unknown stage; "
                    f"stages are {', '.join(self._names)}"
                )
            _check_positive_int(threads, f"micro_batching.parallelism.{name}")
        with self._lock:
            if self._closed:
                raise PipelineClosedError("cannot change parallelism: the pipeline is shut down")
            for name, threads in parallelism.items():
                self._resize_locked(name, threads)

    def _resize_locked(self, name: str, threads: int) -> None:
        delta = threads - self._targets[name]
        self._targets[name] = threads
        if delta < 0:
            # Retire signals take no queue capacity, so scaling down never waits on a full queue.
            self._queues[self._names.index(name)].retire(-delta)
        for _ in range(delta):
            stage = self._names.index(name)
            thread = threading.Thread(
                target=self._work,
                args=(stage,),
                name=f"ts-microbatch-{name}-{next(self._thread_ids[name])}",
                daemon=True,  # a TorchServe worker is killed, not asked, to stop
            )
            self._workers[name].append(thread)
            thread.start()

    # -- running ---------------------------------------------------------------------

    def submit(self, items: Sequence[Any]) -> list[Future[Any]]:
        """Queues a batch and returns one future per item, in item order.

        Raises:
            PipelineClosedError: the pipeline is shut down.
        """
        auto = self._auto
        size = auto.choose(len(items), self.parallelism) if auto else self._micro_batch_size
        futures: list[Future[Any]] = [Future() for _ in items]
        micro_batches = [
            _MicroBatch(
                index, offset, items[offset : offset + size], futures[offset : offset + size], 0
            )
            for index, offset in enumerate(range(0, len(items), size))
        ]
        with self._lock:
            if self._closed:
                raise PipelineClosedError("cannot submit: the micro-batching pipeline is shut down")
            self._in_flight.update(micro_batches)
        self._observer.on_batch(len(items), len(micro_batches))
        if auto is not None:
            _BatchTimer(auto, size, futures)
        for mb in micro_batches:
            self._enqueue(0, mb, cause=None)
        return futures

    def current_micro_batch(self) -> MicroBatchInfo | None:
        """The micro-batch the calling stage thread is working on; None outside stage calls."""
        info: MicroBatchInfo | None = getattr(self._local, "info", None)
        return info

    def stats(self) -> PipelineStats:
        with self._lock:
            return PipelineStats(
                micro_batch_size=self.micro_batch_size,
                parallelism=dict(self._targets),
                threads_alive={n: sum(t.is_alive() for t in ts) for n, ts in self._workers.items()},
                queued={n: len(q) for n, q in zip(self._names, self._queues)},
                micro_batches_in_flight=len(self._in_flight),
            )

    def _enqueue(self, stage: int, mb: _MicroBatch, cause: BaseException | None) -> None:
        mb.enqueued_at = time.monotonic()
        try:
            self._queues[stage].put(mb)
        except PipelineClosedError as closed:
            closed.__cause__ = cause
            self._finish(mb, error=closed)

    def _work(self, stage: int) -> None:
        name = self._names[stage]
        queue = self._queues[stage]
        try:
            while True:
                mb = queue.get()
                if isinstance(mb, Signal):
                    return
                try:
                    self._process(stage, mb)
                except BaseException as exc:
                    # Only a bug in this module gets here; stage errors are handled in
                    # _process. Fail the micro-batch rather than the thread.
                    logger.exception("internal error in stage %s; failing its micro-batch", name)
                    self._finish(mb, error=exc)
        finally:
            with self._lock:
                self._workers[name].remove(threading.current_thread())

    def _process(self, stage: int, mb: _MicroBatch) -> None:
        name = self._names[stage]
        last = stage == len(self._names) - 1
        started = time.monotonic()
        self._local.info = mb.info()
        try:
            output = self._fns[name](mb.payload)
            if last:
                output = self._check_outputs(name, output, len(mb.items))
        except BaseException as exc:
            self._observer.on_stage(
                name,
                len(mb.items),
                started - mb.enqueued_at,
                time.monotonic() - started,
                failed=True,
            )
            self._on_stage_error(name, mb, exc)
            return
        finally:
            self._local.info = None
        run_s = time.monotonic() - started
        self._observer.on_stage(name, len(mb.items), started - mb.enqueued_at, run_s, failed=False)
        auto = self._auto
        if auto is not None:
            auto.observe(name, len(mb.items), run_s)
        if last:
            self._finish(mb, outputs=output)
        else:
            mb.payload = output
            self._enqueue(stage + 1, mb, cause=None)

    @staticmethod
    def _check_outputs(name: str, output: Any, expected: int) -> list[Any]:
        if not isinstance(output, list):
            raise StageOutputError(
                f"stage {name} returned {type(output).__name__}, "
                f"expected a list of {expected} outputs"
            )
        if len(output) != expected:
            raise StageOutputError(
                f"stage {name} returned {len(output)} outputs for {expected} requests"
            )
        return output

    def _on_stage_error(self, name: str, mb: _MicroBatch, exc: BaseException) -> None:
        if self._isolate_failures and len(mb.items) > 1:
            logger.warning(
                "stage %s failed for %d requests at offset %d (%s: %s); "
                "re-running them in halves to isolate the failing ones",
                name,
                len(mb.items),
                mb.offset,
                type(exc).__name__,
                exc,
            )
            halves = mb.halves()
            with self._lock:
                self._in_flight.discard(mb)
                self._in_flight.update(halves)
            for half in halves:
                self._enqueue(0, half, cause=exc)
            return
        if isinstance(exc, RequestError):
            logger.info("request %d rejected in %s: %s", mb.offset, name, exc)
        else:
            logger.error(
                "stage %s failed for requests %d..%d",
                name,
                mb.offset,
                mb.offset + len(mb.items) - 1,
                exc_info=exc,
            )
        self._finish(mb, error=exc)

    def _finish(
        self, mb: _MicroBatch, outputs: list[Any] | None = None, error: BaseException | None = None
    ) -> None:
        """Resolves every future of ``mb``: the one place a request gets its outcome."""
        with self._lock:
            self._in_flight.discard(mb)
        if error is None and outputs is not None:
            for future, output in zip(mb.futures, outputs):
                _set_future(future, result=output)
        else:
            for future in mb.futures:
                _set_future(future, error=error or PipelineClosedError("micro-batch lost"))

    # -- shutting down ---------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_pending: bool = False) -> None:
        """Stops the stage threads; idempotent.

        Queued micro-batches are finished first unless ``cancel_pending``, in which case
        their requests fail with PipelineClosedError. Work submitted afterwards raises
        PipelineClosedError. Requests still unanswered once the threads are stopped (a stage
        stuck past ``join_timeout_s``) fail with PipelineClosedError.

        Args:
            wait: block until the threads have stopped.
            cancel_pending: fail queued work instead of finishing it.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
        if first and cancel_pending:
            closed = PipelineClosedError("the pipeline shut down before this request was processed")
            for queue in self._queues:
                for mb in queue.drain():
                    self._finish(mb, error=closed)
        if first and wait:
            self._stop_stages()
        elif first:
            threading.Thread(
                target=self._stop_stages, name="ts-microbatch-shutdown", daemon=True
            ).start()
        elif wait and threading.current_thread() not in self._all_workers():
            self._stopped.wait()

    def _all_workers(self) -> list[threading.Thread]:
        with self._lock:
            return [t for threads in self._workers.values() for t in threads]

    def _stop_stages(self) -> None:
        me = threading.current_thread()
        # Close stage by stage, so that what a stage drains still finds the next one open.
        for name, queue in zip(self._names, self._queues):
            queue.close()
            with self._lock:
                threads = [t for t in self._workers[name] if t is not me]
            deadline = time.monotonic() + self._join_timeout_s
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            stragglers = [t.name for t in threads if t.is_alive()]
            if stragglers:
                logger.warning(
                    "stage %s threads still running %.1f s after shutdown: %s",
                    name,
                    self._join_timeout_s,
                    ", ".join(stragglers),
                )
        with self._lock:
            stranded = list(self._in_flight)
        for mb in stranded:
            self._finish(
                mb,
                error=PipelineClosedError(
                    "the pipeline shut down before this request was answered"
                ),
            )
        self._stopped.set()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown(wait=True)
