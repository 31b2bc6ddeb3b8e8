"""The micro-batching pipeline: stages connected by bounded queues, one answer slot per request.

A batch is split into micro-batches; each micro-batch flows through the stages in order,
every stage served by its own threads, so that stage k of one micro-batch overlaps stage
k+1 of the previous one. Every request has a slot in its batch's answers that is set in
``Outcomes.finish`` and nowhere else (or by its batch's timeout); ``submit`` hands out a
future per request for callers that want them. Where a batch is cut:
``ts_microbatch.core.micro_batch.cut``; the stage threads' lives: ``ts_microbatch.core.stages``;
one stage call, timed and reported: ``ts_microbatch.core.calls``; the batches in flight and
shutting down: ``ts_microbatch.core._flight``.

Failures: a micro-batch that fails in a stage is taken apart until each item that fails
has failed alone (``ts_microbatch.core.isolation``); a stage judged broken across batches
fails fast (``ts_microbatch.core.breaker``).

Allowed sizes: with ``allowed_sizes``, the ``padded_stages`` see only those sizes: a
micro-batch of another size is padded before the first of them and cut back after the last
(``ts_microbatch.core.calls``, ``ts_microbatch.core._padding``).

Stale work: a micro-batch whose requests are all answered already (its batch timed out,
or its futures were cancelled) is dropped before each stage instead of running ahead of
newer batches. A stage call still running for a batch that timed out is *abandoned*: its
thread is left to finish on its own and a new thread takes its place, up to as many
abandoned threads as the stage has threads. Past that the stage is stalled, and new
batches are refused at once with PipelineStalledError instead of queuing behind it, until
a stuck call returns (``ts_microbatch.core._stall``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

from ._flight import InFlight
from ._queue import StageQueue
from .autobudget import AutoTokenBudget
from .autosize import AutoMicroBatchSize
from .batch import Batch
from .calls import StageCalls, StageFn
from .config import _positive_int, check_micro_batch_size
from .errors import ConfigError, PipelineClosedError, PipelineStalledError
from .intra_op import stage_preparer
from .isolation import Isolator, declared_per_request
from .lengths import LengthRule
from .metrics import GuardedObserver, PipelineObserver
from .micro_batch import MicroBatchInfo, _MicroBatch, current_micro_batch
from .outcomes import Outcomes
from .planning import auto_size, plan_batch, report_cut
from .shapes import ShapeRule
from .stages import StageWorkers

logger = logging.getLogger(__name__)

_QUIET = PipelineObserver()  # what quiet (warm-up) batches report to: nothing


class PipelineStats(NamedTuple):
    """A snapshot of the pipeline's state."""

    micro_batch_size: int
    parallelism: dict[str, int]
    threads_alive: dict[str, int]
    queued: dict[str, int]
    batches_in_flight: int
    abandoned_threads: dict[str, int]  # stuck in calls that timed out, replaced
    # Stages judged broken now: a micro-batch failing there fails fast (ts_microbatch.core.breaker).
    broken_stages: tuple[str, ...] = ()


class Pipeline:
    """Runs a sequence of batch functions as a pipeline of micro-batches.

    Args:
        stages: stage name to function, in pipeline order. Each function takes the list of
            a micro-batch's items (first stage) or the previous stage's output, and the last
            one must return a list with one output per request.
        parallelism: threads per stage name; stages not named get one thread.
        micro_batch_size: requests per micro-batch, or the policy that chooses it for each
            batch (``ts_microbatch.core.autosize``).
        max_queued_micro_batches: capacity of each queue between two stages.
        isolate_failures: re-run a failed micro-batch in halves to find the bad requests.
        join_timeout_s: how long shutdown waits for queued work and then for the threads.
        observer: receives stage timings; see ``ts_microbatch.core.metrics``.
        allowed_sizes: the only micro-batch sizes ``padded_stages`` are called with.
        is_input_error: whether an error means its request's input is bad (bisected to the
            request, never a systemic verdict); a ``RequestError`` by default.
        padded_stages: consecutive stages: the input of the first is padded to an allowed
            size (the items themselves when it is the first stage), the output of the last
            is cut back to the real items.
        lengths: how items of variable length are measured, refused, ordered and cut
            (``ts_microbatch.core.lengths``); None: arrival order, ``micro_batch_size`` each.
        token_budget: with ``lengths``, chooses each batch's cut from measured costs per
            padded token (``ts_microbatch.core.autobudget``) instead of the rule's budget;
            ``micro_batch_size`` is then the most items a micro-batch holds.
        intra_op_threads: torch intra-op threads for each named stage's threads, set on each
            thread alone before its first micro-batch (``ts_microbatch.core.intra_op``);
            stages not named, or named with None, keep the process's setting.
        shape_rule: how images of different sizes are grouped and cut
            (``ts_microbatch.core.shapes``); not with ``lengths``.
    """

    def __init__(
        self,
        stages: Mapping[str, StageFn],
        *,
        parallelism: Mapping[str, int] | None = None,
        micro_batch_size: int | AutoMicroBatchSize = 1,
        max_queued_micro_batches: int = 4,
        isolate_failures: bool = True,
        join_timeout_s: float = 30.0,
        observer: PipelineObserver | None = None,
        allowed_sizes: Sequence[int] | None = None,
        padded_stages: Sequence[str] | None = None,
        is_input_error: Callable[[BaseException], bool] = declared_per_request,
        lengths: LengthRule | None = None,
        token_budget: AutoTokenBudget | None = None,
        intra_op_threads: Mapping[str, int | None] | None = None,
        shape_rule: ShapeRule | None = None,
    ) -> None:
        if not stages:
            raise ConfigError("stages: got none, expected at least one stage")
        self._calls = StageCalls(stages, allowed_sizes, padded_stages)
        self._names = self._calls.names
        self._allowed = self._calls.allowed
        self._micro_batch_size = 1
        self._auto: AutoMicroBatchSize | None = None
        self.micro_batch_size = micro_batch_size
        _positive_int(max_queued_micro_batches, "micro_batching.max_queued_micro_batches")
        # The first queue holds requests that are already in memory, and re-runs must never
        # block a worker, so it is unbounded; the queues that hold stage outputs are bounded.
        self._queues: list[StageQueue[_MicroBatch]] = [StageQueue[_MicroBatch](None)] + [
            StageQueue[_MicroBatch](max_queued_micro_batches) for _ in self._names[1:]
        ]
        self._isolator = Isolator(self._names, isolate_failures, is_input_error)
        self._outcomes = Outcomes(self._names, self._isolator, self._enqueue)
        self._lengths = lengths
        if lengths is not None and shape_rule is not None:
            raise ConfigError(
                "micro_batching.shape_groups: set with a length setting (order: length, token "
                "budgets, buckets, max_tokens): lengths are for text, shapes for images; set one"
            )
        self._shapes = shape_rule
        self.token_budget = token_budget if lengths is not None else None
        self._observer = GuardedObserver.wrap(observer or PipelineObserver())
        self._workers = StageWorkers(
            self._names, self._queues, self._serve, stage_preparer(self._names, intra_op_threads)
        )
        self._flight = InFlight(self._workers, self._queues, self._outcomes, join_timeout_s)
        self._workers.resize(dict.fromkeys(self._names, 1) | dict(parallelism or {}))

    # -- configuration ---------------------------------------------------------------

    @property
    def micro_batch_size(self) -> int:
        """The size in force; with an automatic size, the one chosen for the last batch."""
        auto = self._auto
        return auto.last_size if auto is not None else self._micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, size: int | AutoMicroBatchSize) -> None:
        """An integer (checked by ``check_micro_batch_size`` against the allowed sizes), or
        the policy that chooses each batch's size from measured stage costs."""
        # Plain attribute writes are atomic; submit() reads them once per batch.
        if isinstance(size, AutoMicroBatchSize):
            self._auto = size
            return
        # Checked whole before it is stored: a refused size must not stay in force.
        checked = check_micro_batch_size(size, self._allowed)
        if not isinstance(checked, int):
            raise ConfigError(
                'micro_batching.micro_batch_size: got "auto", expected an integer >= 1 or an '
                "AutoMicroBatchSize (which holds the bounds of the sizes to choose from)"
            )
        self._micro_batch_size = checked
        self._auto = None

    @property
    def first_stage_served(self) -> bool:
        """Whether the first stage has served a request since the pipeline started (or was
        told so: a pipeline replaced for the same model carries its predecessor's record)."""
        return self._isolator.first_stage_served

    @first_stage_served.setter
    def first_stage_served(self, served: bool) -> None:
        self._isolator.first_stage_served = self._isolator.first_stage_served or served

    @property
    def auto_micro_batch_size(self) -> AutoMicroBatchSize | None:
        """The policy choosing each batch's size; None with a fixed size."""
        return self._auto

    @property
    def parallelism(self) -> dict[str, int]:
        return self._workers.targets()

    def set_parallelism(self, parallelism: Mapping[str, int]) -> None:
        """Sets the thread count of the named stages; safe while batches are running.

        Raises:
            ConfigError: an unknown stage or a count that is not an integer >= 1.
            PipelineClosedError: the pipeline is shut down.
        """
        self._workers.resize(parallelism)

    # -- running ---------------------------------------------------------------------

    def submit(self, items: Sequence[Any]) -> list[Future[Any]]:
        """Queues a batch and returns one future per item, in item order.

        Raises:
            PipelineClosedError: the pipeline is shut down.
            PipelineStalledError: a stage's threads are all stuck in calls that timed out.
        """
        return self.submit_batch(items).futures

    def submit_batch(
        self,
        items: Sequence[Any],
        context: Any = None,
        *,
        owners: Sequence[int] | None = None,
        micro_batch_size: int | None = None,
        quiet: bool = False,
        timed_out: Callable[[], float | None] | None = None,
    ) -> Batch:
        """Queues a batch that carries ``context`` to its stage calls; returns the Batch.

        Args:
            owners: ``owners[i]`` is the request index (the row of ``context``) of item i;
                each request's items consecutive, requests in order. None: item i is
                request i. Stage helpers, statuses and failure isolation go by requests.
            micro_batch_size: split this batch at this size instead of the one in force, in
                arrival order whatever the length rule (warm-up runs chosen shapes).
            quiet: report nothing of it to the observer or the automatic size (warm-up).
            timed_out: asked once the batch is cut: the caller's timeout when the cut used it
                up (the batch is then expired with it and no micro-batch is queued), else None.

        Raises:
            ValueError: ``owners`` does not give one request index per item, in order.
            PipelineClosedError: the pipeline is shut down.
            PipelineStalledError: a stage's threads are all stuck in calls that timed out.
        """
        self._check_stalled()
        auto = None if quiet or micro_batch_size is not None else self._auto
        if micro_batch_size is not None:
            size = _positive_int(micro_batch_size, "micro_batch_size")
        elif auto is not None:
            size = auto_size(auto, len(items), self.parallelism)
        else:
            size = self._micro_batch_size
        batch, micro_batches = plan_batch(
            items,
            context,
            owners,
            size,
            quiet=quiet,
            exact=micro_batch_size is not None,
            on_timeout=self._check_stalled_quietly,
            length_rule=self._lengths,
            shape_rule=self._shapes,
            token_budget=self.token_budget,
            threads=self.parallelism,
        )
        self._isolator.track(batch)
        self._flight.admit(batch)
        if not quiet:
            report_cut(self._observer, batch, micro_batches, self._shapes)
        if auto is not None:
            batch.when_answered(auto.batch_reporter(size))
        spent_s = timed_out() if timed_out is not None else None
        if spent_s is not None:  # nobody waits for it: no stage starts it (issue 40)
            batch.expire(spent_s)
            return batch
        for mb in micro_batches:
            self._enqueue(0, mb)
        return batch

    def current_micro_batch(self) -> MicroBatchInfo | None:
        """The micro-batch the calling stage thread is working on; None outside stage calls."""
        return current_micro_batch()

    def threads(self) -> dict[str, list[threading.Thread]]:
        """Each stage's threads that serve it (not those abandoned in a stuck call), now."""
        return self._workers.serving()

    def wait_for_parallelism(self, timeout_s: float) -> bool:
        """Waits until no stage has more serving threads than its count, that is until the
        threads a scale-down retired have exited; False if some are still running after
        ``timeout_s`` (a retired thread finishes the call it is in first)."""
        return self._workers.wait_for_targets(timeout_s)

    def stats(self) -> PipelineStats:
        in_flight = len(self._flight)
        return PipelineStats(
            micro_batch_size=self.micro_batch_size,
            parallelism=self._workers.targets(),
            threads_alive=self._workers.alive(),
            queued={n: len(q) for n, q in zip(self._names, self._queues)},
            batches_in_flight=in_flight,
            abandoned_threads=self._workers.abandoned(),
            broken_stages=tuple(self._isolator.broken()),
        )

    def _enqueue(self, stage: int, mb: _MicroBatch, front: bool = False) -> None:
        mb.enqueued_at = time.monotonic()
        try:
            if self._flight.cancelling:
                raise PipelineClosedError(
                    "the pipeline shut down before this request was processed"
                )
            self._queues[stage].put(mb, front=front)
        except PipelineClosedError as closed:
            self._outcomes.fail_unrun(mb, closed)

    def _serve(self, stage: int, mb: _MicroBatch) -> None:
        """What a stage thread does with each micro-batch it takes; never raises."""
        try:
            self._process(stage, mb)
        except BaseException as exc:
            # Only a bug in this module gets here; stage errors are handled in _process.
            # Fail the micro-batch rather than the thread, and give its bisection step an
            # outcome: a sibling half may be waiting for it.
            name = self._names[stage]
            logger.exception("internal error in stage %s; failing its micro-batch", name)
            try:
                self._outcomes.fail_unrun(mb, exc)
            except BaseException:
                logger.exception("internal error failing a micro-batch of %s", name)

    def _process(self, stage: int, mb: _MicroBatch) -> None:
        if mb.answered():
            # Its batch timed out or was cancelled: running it would delay newer batches.
            self._outcomes.dropped(mb)
            return
        name = self._names[stage]
        last = stage == len(self._names) - 1
        observer = _QUIET if mb.batch.quiet else self._observer
        started = time.monotonic()
        try:
            output, size, run_s = self._calls.timed(stage, mb, self._workers, observer)
        except BaseException as exc:
            self._outcomes.stage_failed(stage, mb, exc, time.monotonic() - started)
            return
        auto, budget = self._auto, self.token_budget
        if auto is not None and not mb.batch.quiet:
            auto.observe(name, size, run_s)  # the cost is the padded size's
        if budget is not None and not mb.batch.quiet and mb.padded_length is not None:
            budget.observe(name, size, mb.padded_length, run_s)
        self._outcomes.passed(mb, stage, run_s)
        if last:
            self._outcomes.finish(mb.batch, mb.indices, outputs=output)
        else:
            mb.payload = output
            self._enqueue(stage + 1, mb)

    # -- stuck stage calls -----------------------------------------------------------

    def _check_stalled_quietly(self) -> None:
        with contextlib.suppress(PipelineStalledError):  # reported to the next submit
            self._check_stalled()

    def _check_stalled(self) -> None:
        self._workers.check_stalled()

    # -- shutting down ---------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_pending: bool = False) -> None:
        """Stops the stage threads; idempotent.

        The contract: work submitted afterwards raises PipelineClosedError. Unless
        ``cancel_pending``, every batch already submitted is finished first, re-runs that
        isolate a failure included; the queues close only once no batch is in flight, or
        after ``join_timeout_s``. With ``cancel_pending``, queued micro-batches and later
        re-runs fail with PipelineClosedError, and calls already running finish. Requests
        still unanswered once the threads are stopped (a stage stuck past
        ``join_timeout_s``) fail with PipelineClosedError.

        Args:
            wait: block until the threads have stopped.
            cancel_pending: fail queued work instead of finishing it.
        """
        self._flight.shutdown(wait, cancel_pending)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown(wait=True)
