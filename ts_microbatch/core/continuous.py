"""Continuous micro-batching: when a micro-batch gathered from a stream of requests goes,
and whether a request that just arrived can still be answered within its latency objective.

The decisions live here, with no clock, thread or event loop of their own: the caller
(TorchServe's asynchronous worker, ``ts_microbatch.torchserve.stream``) asks at each arrival,
at each answer and when the wait it was told has passed.

**Dispatch** (``StreamPolicy.wait_s``). A gathered micro-batch may go only while the pipeline
has a free slot: fewer micro-batches in flight than stage threads, one per thread, which
keeps every stage busy without queueing work ahead of later arrivals (those join the next
micro-batch instead, so micro-batches grow with the load). With a free slot it goes

* at once when it is full (``size`` items);
* otherwise once waiting no longer pays. Waiting for the rest of a micro-batch pays only
  when, at the measured arrival rate, the rest is expected within ``max_window_s`` and
  sooner than one micro-batch takes to run (the measured stage costs): then it waits for
  it, from its oldest request's arrival. Otherwise (light load: the rest would not come in
  time) it goes at once. So the window adapts: zero at light load, up to the expected fill
  time as the rate rises, and never past ``max_window_s``.

**Admission** (``StreamPolicy.predicted_s``). A request is predicted to be answered after
the items ahead of it (gathered, and in flight) drain, plus one micro-batch's pass through
every stage. They drain at the rate of the slowest stage (its measured time per item over
its threads), or at the rate measured while the pipeline was busy, whichever is slower:
stage threads share the cores and the interpreter, so threads do not divide a stage's time
on a loaded machine. Predicted past its budget, it is refused before any stage (the adapter
answers 429 with ``Retry-After``). Until every stage has run once nothing is refused: there
is nothing to predict from; nor is a request with nothing ahead of it (the adapter's rule:
its run is the freshest measure of the costs).

Stage costs are measured by ``StageCosts``, an observer of the pipeline: an exponentially
weighted mean of each stage's run time and micro-batch size.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .metrics import PipelineObserver

_WEIGHT = 0.2  # of the newest sample in the running means: about the last ten count


def _mean(old: float | None, sample: float) -> float:
    return sample if old is None else old + _WEIGHT * (sample - old)


class StageCost(NamedTuple):
    """One stage's running means: seconds per call and items per call."""

    run_s: float
    items: float


class StageCosts(PipelineObserver):
    """The pipeline's stage costs, measured as it runs: an observer in front of ``then``
    (the metrics), to which every report goes on. Cheap: it runs on the stage threads."""

    def __init__(self, stages: Sequence[str], then: PipelineObserver | None = None) -> None:
        self._stages = tuple(stages)
        self.then = then or PipelineObserver()
        self._lock = threading.Lock()
        self._costs: dict[str, StageCost] = {}

    def on_stage(
        self, stage: str, size: int, queue_wait_s: float, run_s: float, *, failed: bool
    ) -> None:
        self.then.on_stage(stage, size, queue_wait_s, run_s, failed=failed)
        if failed or size < 1:  # a failure's time says nothing of the stage's rate
            return
        with self._lock:
            old = self._costs.get(stage)
            self._costs[stage] = StageCost(
                _mean(old.run_s if old else None, run_s), _mean(old.items if old else None, size)
            )

    # Every other report goes on to the metrics as it came.
    def on_batch(self, batch_size: int, micro_batches: int) -> None:
        self.then.on_batch(batch_size, micro_batches)

    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        self.then.on_padding(stage, size, padded_to)

    def on_tokens(self, real: int, padded: int) -> None:
        self.then.on_tokens(real, padded)

    def on_shapes_unknown(self, count: int) -> None:
        self.then.on_shapes_unknown(count)

    def on_recompile(self, count: int) -> None:
        self.then.on_recompile(count)

    def on_request_error(self, status_code: int) -> None:
        self.then.on_request_error(status_code)

    def snapshot(self) -> dict[str, StageCost] | None:
        """Every stage's means; None until each stage has run at least once."""
        with self._lock:
            costs = dict(self._costs)
        return costs if all(stage in costs for stage in self._stages) else None


class StreamPolicy:
    """The dispatch and admission rules of a stream of requests (see the module docstring).

    Args:
        costs: the pipeline's measured stage costs.
        max_window_s: the longest a gathered micro-batch waits to fill while a slot is free.
    """

    def __init__(self, costs: StageCosts, max_window_s: float) -> None:
        self._costs = costs
        self.max_window_s = max_window_s
        self._last_arrival: float | None = None
        self._gap_s: float | None = None  # running mean of the time between arrivals
        self._last_answer: float | None = None
        self._drain_s: float | None = None  # running mean of the time per item answered, busy

    def arrived(self, now: float) -> None:
        """A request arrived at ``now`` (seconds, any monotonic clock)."""
        if self._last_arrival is not None:
            self._gap_s = _mean(self._gap_s, max(0.0, now - self._last_arrival))
        self._last_arrival = now

    def started(self, now: float) -> None:
        """A micro-batch went into an empty pipeline at ``now``: it stood idle since its last
        answer, so the next answer's interval measures idle time, not draining, and teaches
        the drain rate nothing. (Counted, a burst after 3 s of quiet made the drain ~1 s an
        item and refused later requests for good: the test named after it.)"""
        self._last_answer = None

    def answered(self, now: float, items: int, busy: bool) -> None:
        """``items`` were answered at ``now``; ``busy``: work was waiting all along since the
        answer before, so the time between the two is what the pipeline took per item when
        it never stood idle (every overhead included, which the stage costs leave out). Only
        an interval with items in flight throughout counts (``started``)."""
        last, self._last_answer = self._last_answer, now
        if busy and last is not None and items > 0:
            self._drain_s = _mean(self._drain_s, (now - last) / items)

    @property
    def arrival_gap_s(self) -> float | None:
        """The mean time between arrivals; None before the second."""
        return self._gap_s

    def wait_s(self, gathered: int, size: int, waited_s: float) -> float:
        """How much longer ``gathered`` items (the oldest waiting ``waited_s``) should wait
        for a micro-batch of ``size``, given a free slot: 0 means go now."""
        if gathered >= size or self.max_window_s <= 0 or self._gap_s is None:
            return 0.0
        fill_s = (size - gathered) * self._gap_s
        if fill_s > self.max_window_s:
            return 0.0  # it would not fill in time: waiting only adds latency
        costs = self._costs.snapshot()
        if costs is not None and fill_s >= sum(cost.run_s for cost in costs.values()):
            return 0.0  # the rest comes later than a micro-batch takes to run
        return max(0.0, fill_s - waited_s)

    def predicted_s(self, ahead: int, threads: Mapping[str, int]) -> float | None:
        """When a request with ``ahead`` items before it would be answered, in seconds from
        now; None while some stage's cost is unknown."""
        costs = self._costs.snapshot()
        if costs is None:
            return None
        per_item_s = max(
            cost.run_s / max(cost.items, 1.0) / max(threads.get(stage, 1), 1)
            for stage, cost in costs.items()
        )
        if self._drain_s is not None:  # measured busy: threads share the cores and the GIL
            per_item_s = max(per_item_s, self._drain_s)
        return ahead * per_item_s + sum(cost.run_s for cost in costs.values())


def retry_after_s(predicted_s: float, budget_s: float) -> int:
    """The ``Retry-After`` of a refusal, whole seconds >= 1: when the queue that made the
    prediction miss the budget should have drained."""
    return max(1, math.ceil(predicted_s - budget_s))
