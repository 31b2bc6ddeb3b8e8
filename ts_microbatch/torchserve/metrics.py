"""Reports the pipeline through TorchServe's metrics API (``context.metrics``).

With ``metrics_mode=prometheus`` and the metrics declared in the metrics config
(``configs/metrics.yaml``), they appear on the metrics address's ``/metrics``; otherwise
they are written to ``model_metrics.log``. The names and what they measure: ``metric_names``.

Times are in seconds: TorchServe 0.12's frontend builds every histogram with the client
library's default buckets (5 ms to 10 s), and its metrics config has no key for others.
Those do not fit sizes, and a histogram line by interval is the interval's mean, so
``MicroBatchSize`` is a counter by size range: exact whatever ``metrics_interval_s``.

The lines are written on one thread of their own, ``ts-microbatch-metrics``, not on the
stage threads: a line costs ~57 us of the GIL through TorchServe's metric objects, three of
them per preprocess call were ~1.5 ms on the serial path of a batch of 32 (issue #17). By
interval (``metrics_interval_s`` > 0, the default), a hook adds its values to the interval's
on its own thread under one short lock (``_hold``), and the reporter wakes once an interval
to write them; with a line per report, a hook reads what only its own thread knows (the
request id of the micro-batch it reports on) and hands the rest to the reporter.
``flush()`` waits for what is pending, ``MicroBatching.shutdown()`` does so before it returns.

With TorchServe's own metrics cache, the lines are the ones its ``CachingMetric`` writes
(name, unit and dimension names of the cache's metric, type, host, time, request id), made
here and written together: the reporter wakes at most every ``COALESCE_S``, and what was
reported meanwhile goes out in one log record of one line per metric, which the frontend
reads line by line. Through the metric objects, one line each, a batch of 32 in
micro-batches of 4 (57 lines) cost the worker ~6 ms of CPU; written together, ~1 ms.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core._checks import MAX_METRICS_INTERVAL_S
from ..core.metrics import GuardedObserver, PipelineObserver
from ..core.micro_batch import MicroBatchInfo, current_micro_batch
from ._reporter import COALESCE_S as COALESCE_S
from ._reporter import MAX_PENDING_REPORTS, _Report, _Reporter
from ._reporter import REPORTER_THREAD as REPORTER_THREAD
from .metric_names import BATCHES as BATCHES
from .metric_names import METRIC_NAMES as METRIC_NAMES
from .metric_names import MICRO_BATCH_SIZE as MICRO_BATCH_SIZE
from .metric_names import MICRO_BATCHES_CUT as MICRO_BATCHES_CUT
from .metric_names import MICRO_BATCHES_PER_BATCH as MICRO_BATCHES_PER_BATCH
from .metric_names import PADDED_ITEMS as PADDED_ITEMS
from .metric_names import PADDED_TOKENS as PADDED_TOKENS
from .metric_names import QUEUE_TIME as QUEUE_TIME
from .metric_names import RECOMPILES as RECOMPILES
from .metric_names import REQUEST_ERRORS as REQUEST_ERRORS
from .metric_names import SHAPES_UNKNOWN as SHAPES_UNKNOWN
from .metric_names import SIZES as SIZES
from .metric_names import STAGE_TIME as STAGE_TIME
from .metric_names import TOKENS as TOKENS
from .metric_names import size_range as size_range

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    # Types only: Python 3.9, the official image's, has neither ParamSpec nor Concatenate
    # in typing, and evaluates a ``str | None`` alias at import (a TypeError there).
    from typing_extensions import Concatenate, ParamSpec, TypeAlias

    # A request id, or how to find it when it is needed (most reports of an interval need
    # none).
    _RequestId: TypeAlias = "str | None | Callable[[], str | None]"
    # name, unit, dims, histogram
    _WindowKey: TypeAlias = "tuple[str, str, tuple[tuple[str, str], ...], bool]"
    _P = ParamSpec("_P")
    _Hook: TypeAlias = "Callable[Concatenate[TorchServeMetricsObserver, _P], None]"


def _stage_request_id() -> str | None:
    """The id of the first request of the micro-batch whose stage call this thread is
    running, from its own batch's context; None outside stage calls or when unknown."""
    info = current_micro_batch()
    return None if info is None else _first_request_id(info)


def _first_request_id(info: MicroBatchInfo) -> str | None:
    """The id of ``info``'s first request, from its own batch's context (which keeps its
    batch's ids: it may be read after the call, on another thread); None when unknown."""
    if info.context is None or not info.size:
        return None
    get_request_id = getattr(info.context, "get_request_id", None)
    owner = info.offset if info.owners is None else info.owners[0]
    request_id = get_request_id(owner) if get_request_id else None
    return request_id if isinstance(request_id, str) else None


def _nothing() -> None:
    """The write of a report that only wakes the reporter (an interval began)."""


def _deferred(hook: _Hook[_P]) -> _Hook[_P]:
    """``hook`` run on the reporter thread with the request id its caller's thread knows;
    by interval, run at once, adding to the interval's values (``_hold``)."""
    name = hook.__name__

    def defer(self: TorchServeMetricsObserver, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        if self._interval_s > 0:
            # What the hook emits is added to the interval's values on this thread, under
            # one short lock: no hand-over to the reporter, which wakes once an interval.
            writing = self._writing
            writing.report = _Report(name, _nothing, self._request_id_source())
            try:
                hook(self, *args, **kwargs)
            finally:
                writing.report = None
            return
        write = functools.partial(hook, self, *args, **kwargs)
        self._reporter.put(_Report(name, write, self._request_id_now()))

    functools.update_wrapper(defer, hook)
    return defer


class TorchServeMetricsObserver(PipelineObserver):
    """Emits the pipeline's timings and sizes as TorchServe backend metrics.

    Its hooks return at once: the lines are written in order by one thread,
    ``ts-microbatch-metrics`` (:meth:`flush` waits for them, :meth:`close` stops it). What
    TorchServe's metrics API raises there is logged once per hook (once per metric for the
    lines of an interval), as ``GuardedObserver`` logs it, and changes no answer.

    Args:
        metrics: ``context.metrics`` of the TorchServe worker.
        first_stage: the stage whose runs count as micro-batches for ``MicroBatchSize``
            (each run of it adds one, under its size's range).
        max_pending: reports waiting to be written beyond which new ones are dropped.
        interval_s: one line per metric (and dimensions) for the reports of each interval:
            for a histogram the mean of the values reported, for a counter their sum (0:
            one line per report); the config's ``metrics_interval_s``.
    """

    def __init__(
        self,
        metrics: Any,
        first_stage: str = "preprocess",
        *,
        max_pending: int = MAX_PENDING_REPORTS,
        interval_s: float = 1.0,
    ) -> None:
        from ts.metrics import caching_metric
        from ts.metrics.dimension import Dimension
        from ts.metrics.metric_cache_abstract import MetricCacheAbstract
        from ts.metrics.metric_cache_errors import MetricsCacheKeyError
        from ts.metrics.metric_type_enum import MetricTypes

        if not 0 <= interval_s <= MAX_METRICS_INTERVAL_S:  # False for NaN too
            raise ValueError(f"interval_s: got {interval_s!r}, expected 0 to an hour")
        self._metrics = metrics
        # TorchServe's own cache: its lines are made here and written together, through the
        # logger its CachingMetric writes them with (module docstring).
        self._together = isinstance(metrics, MetricCacheAbstract)
        self._line_logger = caching_metric.logger
        self._hostname = socket.gethostname()
        self._lines: list[str] = []  # the reporter thread's, until the burst is written
        self._found: dict[tuple[str, Any], Any] = {}  # (name, type): the cache's metric
        # interval_s > 0: what the reports of an interval say, one line per metric and
        # dimensions (a histogram's mean, a counter's sum), kept by the reporter thread.
        self._interval_s = interval_s
        self._window: dict[_WindowKey, list[Any]] = {}
        self._window_lock = threading.Lock()  # the window is filled by the reporting threads
        self._window_started = 0.0
        self._first_stage = first_stage
        self._dimension = Dimension
        self._key_error = MetricsCacheKeyError
        self._histogram = MetricTypes.HISTOGRAM
        self._counter = MetricTypes.COUNTER
        # The reporter thread's guard: what a write raises is logged once per hook, as the
        # GuardedObserver the pipeline wraps every observer in would log it.
        self._guard = GuardedObserver(self)._guard
        self._reporter = _Reporter(self._write, max_pending, self._write_lines)
        self._writing = threading.local()  # report: the one the reporter thread is writing

    @property
    def dropped_reports(self) -> int:
        """Reports dropped because ``max_pending`` were waiting."""
        return self._reporter.dropped

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Waits until every report made before the call is written; False on timeout."""
        return self._reporter.flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Writes what is pending and stops the reporter thread; idempotent (a later report
        starts it again). False if it was still writing after ``timeout_s``."""
        return self._reporter.close(timeout_s)

    def _request_id_source(self) -> _RequestId:
        """``_request_id_now``, but on a stage thread read only when a line needs it."""
        info = current_micro_batch()
        if info is not None and info.context is not None:
            return functools.partial(_first_request_id, info)
        return self._request_id_now()

    def _request_id_now(self) -> str | None:
        """The request id a line of a report made now carries: the first request of the
        micro-batch this stage thread runs, else (the handler's thread) the live batch's
        first, which will have changed by the time the reporter writes it."""
        request_id = _stage_request_id()
        if request_id is not None:
            return request_id
        ids = getattr(self._metrics, "request_ids", None)
        if isinstance(ids, str):
            # The loader's placeholder (a uuid), which no batch replaces on the asynchronous
            # worker (each request gets a copy of the metrics): TorchServe's add_metric
            # would look an index up in it and raise, losing the line.
            return ids
        live = ids.get(0) if isinstance(ids, dict) else None
        return live if isinstance(live, str) else None

    def _write(self, report: _Report) -> None:
        self._writing.report = report
        self._writing.collect = True
        try:
            self._guard(report.hook, report.write)
        finally:
            self._writing.report = None
            self._writing.collect = False

    def _emit(
        self, name: str, value: float, unit: str, dims: dict[str, str], histogram: bool = True
    ) -> None:
        writing: _Report | None = getattr(self._writing, "report", None)
        request_id = writing.request_id if writing is not None else self._request_id_now()
        if writing is None or self._interval_s <= 0:
            if callable(request_id):
                request_id = request_id()
            self._line(name, value, unit, dims, histogram, request_id)
            return
        self._hold((name, unit, tuple(dims.items()), histogram), value, request_id)

    def _hold(self, key: _WindowKey, value: float, request_id: _RequestId) -> None:
        """Adds ``value`` to the interval's values of ``key`` (the stage threads' and the
        handler's, under the window's lock); the first value of an interval wakes the
        reporter, which writes the interval's lines when it is over."""
        with self._window_lock:
            kept = self._window.get(key)
            if kept is not None:
                kept[0] += value
                kept[1] += 1
                if kept[2] is None:  # the interval's first id known
                    kept[2] = request_id() if callable(request_id) else request_id
                return
            started = not self._window
            if started:
                self._window_started = time.monotonic()
            self._window[key] = [value, 1, request_id() if callable(request_id) else request_id]
        if started:
            self._reporter.put(_Report("interval", _nothing, None))

    def _line(
        self,
        name: str,
        value: float,
        unit: str,
        dims: dict[str, str],
        histogram: bool,
        request_id: str | None,
    ) -> None:
        # What TorchServe raises here escapes to the guard of _write (or, for a hook that is
        # not deferred, to the GuardedObserver the pipeline wraps every observer in).
        # A new list each call: TorchServe appends ModelName and Level to it.
        dimensions = [self._dimension(k, v) for k, v in dims.items()]
        metric_type = self._histogram if histogram else self._counter
        if request_id is not None and hasattr(self._metrics, "get_metric"):
            self._emit_for(request_id, name, value, unit, dimensions, metric_type)
            return
        self._metrics.add_metric(
            name,
            value,
            unit,
            # The live batch's first request's id (a metrics API without get_metric, or no
            # id known): without an index TorchServe appends every id of the batch to the
            # line (1.2 KB at batch 32, ~57 lines a batch), and the frontend reads and
            # parses every line.
            0,
            dimensions,
            metric_type,
        )

    def _emit_for(
        self, request_id: str, name: str, value: float, unit: str, dimensions: list[Any], kind: Any
    ) -> None:
        """Emits with ``request_id`` itself: TorchServe's ``add_metric`` looks an index up in
        the live batch's ids, and a stage thread may be measuring an earlier batch. The
        metric is found or declared, and the dimensions completed, as ``add_metric`` does."""
        dimensions.append(self._dimension("ModelName", self._metrics.model_name))
        dimensions.append(self._dimension("Level", "Model"))
        metric = self._found.get((name, kind))
        if metric is None:
            try:
                metric = self._metrics.get_metric(name, kind)
            except self._key_error:
                metric = self._metrics.add_metric_to_cache(
                    name, unit, [d.name for d in dimensions], kind
                )
            self._found[name, kind] = metric
        values = [d.value for d in dimensions]
        if not (self._together and getattr(self._writing, "collect", False)):
            metric.add_or_update(value, values, request_id)
            return
        # CachingMetric.add_or_update's checks and emit_metrics' line, kept for the burst.
        if len(values) != len(metric.dimension_names):
            raise ValueError(
                f"{name}: dimension values {values} do not match the metric's dimension "
                f"names {metric.dimension_names}"
            )
        if kind == self._counter and value < 0:
            raise ValueError(f"{name}: a counter cannot be updated by {value}")
        dims = ",".join(f"{n}:{v}" for n, v in zip(metric.dimension_names, values))
        line = (
            f"[METRICS]{metric.metric_name}.{metric.unit}:{value}|#{dims}|"
            f"#type:{metric.metric_type.name}|#hostname:{self._hostname},{int(time.time())}"
        )
        self._lines.append(f"{line},{request_id}" if request_id else line)

    def _write_lines(self, force: bool) -> float | None:
        """The reporter thread, after a burst (``force``: before a flush is answered or it
        stops): writes the interval's lines when it is over, and the lines made, in one
        record; returns the seconds until the interval is over (None: nothing held)."""
        due = None
        with self._window_lock:
            held, started = bool(self._window), self._window_started
        if held:
            left = self._interval_s - (time.monotonic() - started)
            if force or left <= 0:
                self._write_window()
            else:
                due = left
        if self._lines:
            lines, self._lines = self._lines, []
            self._line_logger.info("\n".join(lines))
        return due

    def _write_window(self) -> None:
        with self._window_lock:
            window, self._window = self._window, {}
        self._writing.collect = True
        try:
            for (name, unit, dims, histogram), (total, count, request_id) in window.items():
                value = total / count if histogram else total
                line = functools.partial(
                    self._line, name, value, unit, dict(dims), histogram, request_id
                )
                self._guard(name, line)
        finally:
            self._writing.collect = False

    @_deferred
    def on_batch(self, batch_size: int, micro_batches: int) -> None:
        self._emit(MICRO_BATCHES_PER_BATCH, micro_batches, "count", {})
        self._emit(BATCHES, 1, "count", {}, histogram=False)
        self._emit(MICRO_BATCHES_CUT, micro_batches, "count", {}, histogram=False)

    @_deferred
    def on_stage(
        self, stage: str, size: int, queue_wait_s: float, run_s: float, *, failed: bool
    ) -> None:
        self._emit(STAGE_TIME, run_s, "s", {"Stage": stage})
        self._emit(QUEUE_TIME, queue_wait_s, "s", {"Stage": stage})
        if stage == self._first_stage:
            # One count per micro-batch, under its size range (module docstring).
            self._emit(MICRO_BATCH_SIZE, 1, "count", {SIZES: size_range(size)}, histogram=False)

    @_deferred
    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        self._emit(PADDED_ITEMS, padded_to - size, "count", {})

    @_deferred
    def on_tokens(self, real: int, padded: int) -> None:
        self._emit(TOKENS, real, "count", {}, histogram=False)
        self._emit(PADDED_TOKENS, padded, "count", {}, histogram=False)

    @_deferred
    def on_shapes_unknown(self, count: int) -> None:
        self._emit(SHAPES_UNKNOWN, count, "count", {}, histogram=False)

    @_deferred
    def on_recompile(self, count: int) -> None:
        self._emit(RECOMPILES, count, "count", {}, histogram=False)

    @_deferred
    def on_request_error(self, status_code: int) -> None:
        self._emit(REQUEST_ERRORS, 1, "count", {"StatusCode": str(status_code)}, histogram=False)
