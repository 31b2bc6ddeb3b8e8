"""``MicroBatching``: the drop-in replacement for ``ts.handler_utils.micro_batching.MicroBatching``.

It replaces a handler's ``handle``. What a batch goes through, in order (``handle``):

1. its context is pinned (``context.BatchContext``) and its rows read as requests, each
   body's protocol decided once: a plain body is one item, a KServe body one item per
   instance, an unreadable one none (``_submission.unpack``);
2. the items are submitted to the pipeline (``ts_microbatch.core.pipeline``), which cuts
   them into micro-batches and runs preprocess, inference and postprocess on its threads;
3. ``handle`` waits for the batch, at most ``timeout_s`` (``timeouts``) counted from when
   it was entered: reading the requests and cutting the batch (shapes, lengths) spend it
   (``timeouts.Deadline``);
4. the batch is settled (what is late fails with a timeout) and each request's outcome
   becomes its status and the bytes TorchServe sends (``answers.answer_batch``).

Around it: the config it runs with and what changes in place (``settings``), warm-up at
load (``warmup``), TorchServe's envelopes, ``enabled: false`` and upstream's describe,
explain and profiler paths (``envelopes``), the asynchronous worker (``_async``), and the
helpers a stage calls (``current_context``). Steps 1 and 2, the same for ``handle`` and
``handle_async``: ``_submission``; the deadline's clock: ``timeouts``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from ..core.calls import method_stage
from ..core.config import STAGES, MicroBatchingConfig, Parallelism, _positive_int
from ..core.metrics import GuardedObserver, PipelineObserver
from ..core.micro_batch import MicroBatchInfo
from ..core.pipeline import Pipeline, PipelineStats
from . import timeouts
from ._async import call_soon, in_event_loop
from ._submission import SubmittedBatch, submit
from .answers import answer_batch
from .compiled import CompiledInference, check_inference_threads
from .context import stage_context, stage_request_ids
from .envelopes import add_handler_time, check_envelope, plain_handle, returning, upstream_paths
from .images import image_shape
from .metrics import TorchServeMetricsObserver
from .settings import apply_size, body_length, in_place, new_pipeline, shape_count
from .warmup import WarmUp

logger = logging.getLogger(__name__)

HANDLER_METHODS = STAGES


class MicroBatching:
    """Runs a handler's three stages as a pipeline of micro-batches.

    Use it as upstream's: ``self.handle = MicroBatching(self)`` in the handler's
    ``__init__``, then set ``micro_batch_size`` and ``parallelism``, or call
    :meth:`configure` with a :class:`MicroBatchingConfig` in ``initialize``.

    Args:
        parent_handler: an object with ``preprocess``, ``inference`` and ``postprocess``
            (and, for ``__call__``, the ``BaseHandler`` describe/explain helpers).
        micro_batch_size: requests per micro-batch; overrides ``config``.
        parallelism: threads per stage; overrides ``config`` stage by stage.
        config: every other setting; the defaults when None.
        observer: receives timings and errors, for metrics.
        compiled: the handler's model is compiled (``torch.compile``): inference calls are
            serialized, their outputs cloned and recompiles after :meth:`warm_up` reported
            (``ts_microbatch.torchserve.compiled``).
    """

    def __init__(
        self,
        parent_handler: Any,
        micro_batch_size: int | str | None = None,
        parallelism: Mapping[str, int] | None = None,
        *,
        config: MicroBatchingConfig | None = None,
        observer: PipelineObserver | None = None,
        compiled: bool = False,
    ) -> None:
        check_envelope()
        self.handler = parent_handler
        config = config or MicroBatchingConfig()
        if micro_batch_size is not None:
            config = MicroBatchingConfig.from_mapping(
                {"micro_batch_size": micro_batch_size}, config
            )
        if parallelism is not None:
            config = replace(
                config, parallelism=Parallelism.from_mapping(parallelism, base=config.parallelism)
            )
        self._config = config
        # Guarded once for every consumer (pipeline, answers, compiled model): a metrics hook
        # that raises is logged, and changes no answer.
        self._observer = GuardedObserver.wrap(observer or PipelineObserver())
        self._stages = {name: method_stage(parent_handler, name) for name in STAGES}
        self.compiled: CompiledInference | None = None
        if compiled:
            check_inference_threads(config.parallelism.inference)
            self.compiled = CompiledInference(
                self._stages["inference"], self._observer, config.on_recompile
            )
            self.compiled.recompile_limit = shape_count(config)
            self._stages["inference"] = self.compiled
        self._pipeline = self._new_pipeline(config)

    def _new_pipeline(self, config: MicroBatchingConfig) -> Pipeline:
        return new_pipeline(self._stages, config, self._observer, self.item_length, self.item_shape)

    def item_length(self, item: Any) -> Any:
        """One item's length: what the handler's ``item_length(item)`` returns (a
        tokenizer's count), else the size of its body (``body_length``). Checked in one
        place, the core's ``LengthRule.length_of``: an integer >= 0, else that request's 400."""
        measure = getattr(self.handler, "item_length", None)
        return measure(item) if measure is not None else body_length(item)

    def item_shape(self, item: Any) -> Any:
        """One item's (width, height): the handler's ``item_shape(item)``, else read from
        its image header (``ts_microbatch.torchserve.images``); None when unreadable."""
        measure = getattr(self.handler, "item_shape", None)
        return measure(item) if measure is not None else image_shape(item)

    # -- configuration ---------------------------------------------------------------

    @property
    def base_config(self) -> MicroBatchingConfig:
        """The config as given (constructor or ``configure``), not copied: cheap to read on
        every request; ``config`` adds the size and threads in force."""
        return self._config

    @property
    def config(self) -> MicroBatchingConfig:
        """The settings in force."""
        pipeline = self._pipeline
        auto = pipeline.auto_micro_batch_size is not None or pipeline.token_budget is not None
        return replace(
            self._config,
            micro_batch_size="auto" if auto else self._pipeline.micro_batch_size,
            parallelism=Parallelism(**self._pipeline.parallelism),
        )

    def configure(self, config: MicroBatchingConfig) -> None:
        """Applies ``config``; sizes, thread counts and ``on_recompile`` change in place, other
        settings replace the pipeline once the work already queued is done.

        Raises:
            ConfigError: ``config`` breaks a rule of a compiled model (one inference thread);
                nothing has changed then.
        """
        if self.compiled is not None:
            check_inference_threads(config.parallelism.inference)
        if in_place(self.config, config):
            self.micro_batch_size = config.micro_batch_size
            self.parallelism = config.parallelism.as_dict()
        else:
            old, self._pipeline = self._pipeline, self._new_pipeline(config)
            # The same model: a first stage that served before still has (a status rule).
            self._pipeline.first_stage_served = old.first_stage_served
            old.shutdown(wait=True)
        if self.compiled is not None:
            self.compiled.on_recompile = config.on_recompile
            self.compiled.recompile_limit = shape_count(config)
        self._config = config

    @property
    def micro_batch_size(self) -> int:
        """The size in force; with "auto", the one chosen for the last batch."""
        return self._pipeline.micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, size: int | str) -> None:
        """An integer >= 1, or "auto" within the config's min/max_micro_batch_size."""
        apply_size(self._pipeline, size, self._config)

    @property
    def parallelism(self) -> dict[str, int]:
        """Threads per stage; assign a mapping of some or all stages to change them."""
        return self._pipeline.parallelism

    @parallelism.setter
    def parallelism(self, parallelism: Mapping[str, int]) -> None:
        """As upstream's: returns once the threads a scale-down retires have exited (each
        finishes the call it is in first), or after ``join_timeout_s`` with a warning.

        Raises:
            ConfigError: an unknown stage, a count that is not an integer >= 1, or a second
                inference thread for a compiled model.
        """
        if self.compiled is not None and "inference" in parallelism:
            threads = parallelism["inference"]
            check_inference_threads(_positive_int(threads, "micro_batching.parallelism.inference"))
        self._pipeline.set_parallelism(parallelism)
        # From inside a stage call the caller may be a thread to retire: it cannot wait for itself.
        timeout_s = self._config.join_timeout_s
        if self.current_micro_batch() is None and not self._pipeline.wait_for_parallelism(
            timeout_s
        ):
            logger.warning(
                "parallelism %s: threads retired by the scale-down still running after %.1f s "
                "(each exits when its current call returns)",
                dict(parallelism),
                timeout_s,
            )

    @property
    def thread_groups(self) -> dict[str, list[threading.Thread]]:
        """Stage name to the threads serving it, as upstream's ``thread_groups`` (whose
        tests count them); a snapshot taken at each read."""
        return self._pipeline.threads()

    # -- warming up ------------------------------------------------------------------

    def warm_up(
        self, sample: Any, sizes: Sequence[int] | None = None, iterations: int | None = None
    ) -> float:
        """Warms the pipeline up with ``sample`` (one request's row, as TorchServe passes
        it): ``iterations`` micro-batches of each of ``sizes`` through the stage threads
        that will serve; returns the seconds it took. What it runs, its defaults and its
        errors: ``ts_microbatch.torchserve.warmup.WarmUp.run``."""
        return WarmUp(self._pipeline, self._config, self.compiled).run(sample, sizes, iterations)

    # -- running ---------------------------------------------------------------------

    def submit(self, data: Sequence[Any]) -> list[Future[Any]]:
        """Queues a batch; returns one future per request, resolved with its output or error."""
        return self._pipeline.submit(data)

    def handle(self, data: Sequence[Any], context: Any = None) -> list[Any]:
        """Runs a batch through the pipeline; returns one answer per request, in order.

        A plain request gets its output; a KServe v1 or v2 request gets one predictions
        body for all its instances (``ts_microbatch.torchserve.kserve``). A request that failed
        gets a JSON error body instead, and its status is set on ``context`` (the
        handler's ``context`` when None) when the batch has one row per request. When it
        does not (a request envelope such as TorchServe's ``json`` flattened several
        instances per request), no per-request status is set: an index would name the
        wrong request, and the error body stays in the output.
        """
        submitted = self._submit(data, context)
        batch, outcomes = submitted.batch, None
        if batch is not None:
            left_s = submitted.deadline.left_s()
            answered = threading.Event()
            batch.when_answered(lambda _: answered.set())
            answered.wait(left_s)
            outcomes = batch.settle(submitted.deadline.timeout_s)
        return answer_batch(submitted, outcomes, self._observer)

    async def handle_async(self, data: Sequence[Any], context: Any = None) -> list[Any]:
        """``handle`` for TorchServe's asynchronous worker (``asyncCommunication: true``):
        the call's requests go through the pipeline exactly as ``handle``'s, and the worker's
        event loop awaits them instead of blocking, so other calls are taken meanwhile."""
        submitted = self._submit(data, context)
        batch, outcomes = submitted.batch, None
        if batch is not None:
            left_s = submitted.deadline.left_s()
            loop = asyncio.get_running_loop()
            answered = loop.create_future()
            # One wake-up for the whole batch, on the loop's thread.
            batch.when_answered(lambda _: call_soon(loop, answered))
            await asyncio.wait([answered], timeout=left_s)
            outcomes = batch.settle(submitted.deadline.timeout_s)
        return answer_batch(submitted, outcomes, self._observer)

    def _submit(self, data: Sequence[Any], context: Any) -> SubmittedBatch:
        """The batch read and submitted, its deadline counted from now (``_submission``)."""
        start_s = timeouts.clock()
        return submit(self._pipeline, self._config, self.handler, data, context, start_s)

    def __call__(self, data: Sequence[Any], context: Any) -> Any:
        """Replaces ``BaseHandler.handle``: describe, explain and profiler paths as upstream,
        micro-batched inference otherwise, and the ``HandlerTime`` metric.

        In TorchServe's asynchronous worker (called from its event loop) it returns a
        coroutine, which that worker awaits; otherwise the list of answers."""
        if not self._config.enabled:
            # As without micro-batching: the handler's own handle on the whole batch (on the
            # asynchronous worker, which awaits what handle returns, in a coroutine).
            output = plain_handle(self.handler)(data, context)
            return returning(output) if in_event_loop() else output
        if in_event_loop():
            return self._call_async(data, context)
        start = time.time()
        output = upstream_paths(self.handler, data, context)
        if output is None:
            output = self.handle(data, context)
        add_handler_time(context, start)
        return output

    async def _call_async(self, data: Sequence[Any], context: Any) -> list[Any]:
        """``__call__`` on the asynchronous worker: the same paths, the call's requests
        awaited through ``handle_async``; HandlerTime once per call (TorchServe's
        asynchronous predict writes PredictionTime)."""
        start = time.time()
        output = upstream_paths(self.handler, data, context)
        if output is None:
            output = await self.handle_async(data, context)
        add_handler_time(context, start)
        return output

    # -- helpers for stages ----------------------------------------------------------

    def current_micro_batch(self) -> MicroBatchInfo | None:
        """Where this stage thread's micro-batch sits in the batch; None outside a stage."""
        return self._pipeline.current_micro_batch()

    def get_micro_batch_idx(self) -> int | None:
        """The index of the current micro-batch in its batch (upstream's API)."""
        info = self.current_micro_batch()
        return None if info is None else info.micro_batch_idx

    def current_context(self) -> Any:
        """The context of the current stage call, indexed by the rows of its input; None
        outside a stage call.

        Index i is row i of the data the stage was called with, as TorchServe's context is
        indexed by the rows ``handle()`` gets: ``get_request_id(i)``,
        ``get_request_header(i, key)``, ``set_response_status(code, phrase, i)``,
        ``set_response_header(i, key, value)`` and the rest reach the request row i came
        from. Every row of a KServe request of several instances reaches that request; no
        index reaches a request outside the micro-batch (a row of padding reaches none).
        It is pinned to the batch the micro-batch belongs to: ``self.context`` is the latest
        batch's, and a micro-batch of an earlier batch may still be running.

        ``current_micro_batch().context`` is the same batch indexed by request, with
        ``item_requests`` and ``request_indices`` to map rows to requests.
        """
        return stage_context(self.current_micro_batch())

    def current_request_ids(self) -> list[str | None]:
        """The TorchServe request id of each row of the current stage call's input (its
        micro-batch's items, in order; the rows of one KServe request repeat its id; a row
        of padding, with allowed sizes, has None); empty outside a stage call."""
        return stage_request_ids(self.current_micro_batch())

    def stats(self) -> PipelineStats:
        return self._pipeline.stats()

    def flush_metrics(self, timeout_s: float = 10.0) -> bool:
        """Writes the metric lines of what was reported so far, an interval's included;
        False if they were not written within ``timeout_s``. True without TorchServe metrics."""
        observer = self._observer.observer
        if isinstance(observer, TorchServeMetricsObserver):
            return observer.flush(timeout_s)
        return True

    # -- shutting down ---------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_pending: bool = False) -> None:
        """Stops the stage threads; idempotent. See :meth:`Pipeline.shutdown`. With ``wait``,
        the metric lines of what ran are written (and the metrics thread stopped) first."""
        self._pipeline.shutdown(wait, cancel_pending=cancel_pending)
        observer = self._observer.observer
        if wait and isinstance(observer, TorchServeMetricsObserver):
            # The stages report no more: the observer's lifetime ends with this pipeline's.
            observer.close(self._config.join_timeout_s)

    def __enter__(self) -> MicroBatching:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown(wait=True)
