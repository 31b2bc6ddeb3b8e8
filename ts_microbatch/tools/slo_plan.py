"""The latency tuner's first two steps (``ts_microbatch.tools.tune``): stage costs measured
in-process, and every configuration through the batching model.

A batch of more requests is never cheaper than a smaller one through the same pipeline, so a
larger batch measured cheaper by more than ``NOT_MONOTONE_MARGIN`` (noise, a machine busy
elsewhere) is measured once more, and flagged in the output, the trials file and the plan
if it still is; the model then counts it at the smaller one's cost (``service_curve``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

from ..core.config import MicroBatchingConfig
from .batching_model import (
    ServiceMs,
    Tail,
    cpu_cap_per_s,
    service_curve,
    shared_cores,
    sustained,
    tail_at,
)
from .corpus import Corpus
from .inprocess import measure_with_cpu
from .results import ResultsLog

# Run-to-run noise here is within 10-20%; a batch of twice the requests is not 25% cheaper.
NOT_MONOTONE_MARGIN = 1.25
# Batches of one are always measured (below saturation most batches are small), one body
# each of at least this many: their spread is the corpus's own, the floor of every P99.
SINGLE_BODIES = 32

# (mb, context, batches) -> (median seconds per batch, CPU seconds per batch, each's seconds)
Measure = Callable[[Any, Any, list[Any]], tuple[float, float, tuple[float, ...]]]


class StageCosts(NamedTuple):
    """One combination's milliseconds (the median batch) and CPU milliseconds per batch
    size, in-process, the pairs (smaller, larger) of sizes still out of order after a
    second measurement, and per size each batch's time over the median (``spread``)."""

    settings: dict[str, Any]
    batch_ms: dict[int, float]
    cpu_ms: dict[int, float]
    not_monotone: tuple[tuple[int, int], ...] = ()
    spread: dict[int, tuple[float, ...]] = {}  # noqa: RUF012 (a NamedTuple's default)

    def cpu_per_request_ms(self, batch_size: int) -> float:
        """A request's CPU at the largest measured batch up to ``batch_size`` (0: none)."""
        largest = max((n for n in self.cpu_ms if n <= batch_size), default=None)
        return self.cpu_ms[largest] / largest if largest is not None else 0.0


@dataclass
class Candidate:
    """One configuration and what the model predicts (``tail``: at the highest rate held, or
    at ``--rate``); ``measured_per_s``: what a real server held, once confirmed."""

    settings: dict[str, Any]
    batch_size: int
    window_ms: int
    tail: Tail | None
    flagged: bool = False  # its stage costs were out of order (``StageCosts.not_monotone``)
    measured_per_s: float = 0.0
    frontend_cpu_ms: float | None = None  # per request, measured while confirming
    curve: list[dict[str, Any]] | None = None  # its confirm points; None: not served
    current: bool = False  # what the user serves now (``tune.current_candidate``)

    @property
    def held_per_s(self) -> float:
        return self.tail.rate_per_s if self.tail else 0.0

    def frontend(self) -> dict[str, int]:
        return {"batchSize": self.batch_size, "maxBatchDelay": self.window_ms}

    def model_config(self) -> dict[str, Any]:
        """The model-config.yaml keys it stands for (one worker), in the order written."""
        return {
            "minWorkers": 1,
            "maxWorkers": 1,
            "micro_batching": self.settings,
            **self.frontend(),
        }

    def outcome(self) -> dict[str, Any]:
        """Its record once confirmed: predicted against held."""
        return {
            **self.model_config(),
            "predicted_per_s": self.held_per_s,
            "measured_per_s": self.measured_per_s,
        }

    def same_but_window(self, other: Candidate) -> bool:
        """Whether the two differ in maxBatchDelay alone (or not at all)."""
        return self.batch_size == other.batch_size and self.settings == other.settings

    def threads(self) -> str:
        p = self.settings["parallelism"]
        return f"{p['preprocess']}/{p['inference']}/{p['postprocess']}"

    def describe(self) -> str:
        return ("your configuration: " if self.current else "") + (
            f"micro_batch_size {self.settings['micro_batch_size']}, threads {self.threads()}, "
            f"batchSize {self.batch_size}, maxBatchDelay {self.window_ms} ms"
        )


def out_of_order(batch_ms: dict[int, float]) -> list[tuple[int, int]]:
    """The pairs (smaller, larger) of batch sizes where the larger was measured cheaper by
    more than ``NOT_MONOTONE_MARGIN``."""
    sizes = sorted(batch_ms)
    return [
        (a, b)
        for a, b in itertools.combinations(sizes, 2)
        if batch_ms[b] * NOT_MONOTONE_MARGIN < batch_ms[a]
    ]


def stage_costs(
    mb: Any,
    context: Any,
    corpus: Corpus,
    base: MicroBatchingConfig,
    combos: list[dict[str, Any]],
    batch_sizes: list[int],
    repeats: int,
    record: ResultsLog,
    measure: Measure = measure_with_cpu,
) -> list[StageCosts]:
    """Step 1: per combination, milliseconds (and CPU milliseconds) per batch of each size,
    in-process (``measure``); sizes out of order measured once more, flagged if still."""

    spread: dict[int, tuple[float, ...]] = {}

    def costs_of(n: int) -> tuple[float, float]:
        count = max(repeats, SINGLE_BODIES) if n == 1 else repeats
        seconds, cpu_s, each = measure(mb, context, corpus.batches(n, count + 1))
        spread[n] = tuple(s / seconds for s in each) if seconds > 0 else (1.0,)
        return 1000 * seconds, 1000 * cpu_s

    costs = []
    for index, combo in enumerate(combos, start=1):
        settings = {**base.as_dict(), **combo}
        mb.configure(MicroBatchingConfig.from_mapping(settings, base))
        batch_ms: dict[int, float] = {}
        cpu_ms: dict[int, float] = {}
        for n in sorted({1, *batch_sizes}):
            batch_ms[n], cpu_ms[n] = costs_of(n)
        first = dict(batch_ms)
        suspects = out_of_order(batch_ms)
        for n in sorted({n for pair in suspects for n in pair}):  # measured once more
            batch_ms[n], cpu_ms[n] = costs_of(n)
        flagged = tuple(out_of_order(batch_ms))
        costs.append(StageCosts(settings, batch_ms, cpu_ms, flagged, dict(spread)))
        record.append(
            {
                "kind": "stage-costs",
                "settings": settings,
                "batch_ms": batch_ms,
                "cpu_ms": cpu_ms,
                "spread": {n: [round(f, 3) for f in fs] for n, fs in spread.items()},
                **({"first_batch_ms": first} if suspects else {}),
                "not_monotone": [list(pair) for pair in flagged],
            }
        )
        shown = ", ".join(
            f"{n}: {ms:.1f}" + (f" (to {ms * max(spread[n]):.0f})" if max(spread[n]) > 1.5 else "")
            for n, ms in batch_ms.items()
        )
        print(f"[{index}/{len(combos)}] {json.dumps(combo)}: ms per batch of n {shown}", flush=True)
        if suspects:
            pairs = [
                f"batch {b} {first[b]:.1f} ms < batch {a} {first[a]:.1f} ms" for a, b in suspects
            ]
            again = "still" if flagged else "in order"
            print(f"  measured again ({again} after): {', '.join(pairs)}", flush=True)
        for a, b in flagged:
            print(
                f"  warning: not monotone: a batch of {b} took {batch_ms[b]:.1f} ms, one of "
                f"{a} {batch_ms[a]:.1f} ms, twice; the model counts {b} at {a}'s cost at "
                "least (a machine busy elsewhere, or a handler whose cost depends on the "
                "bodies: check with --repeats and a quiet machine)",
                flush=True,
            )
    return costs


def plan(
    costs: list[StageCosts],
    batch_sizes: list[int],
    windows: list[int],
    slo_p99_ms: float,
    rate: float | None = None,
    frontend_cpu_ms: float | None = None,
    cores: float = 2.0,
    worker_cpu_scale: float = 1.0,
    capacity_scale: float = 1.0,
    overhead_ms: float = 0.0,
) -> list[Candidate]:
    """Step 2: every configuration through the batching model, best first: the highest
    rate held within the objective, or with ``rate``, the lowest P99 at it. With
    ``frontend_cpu_ms``, capped at what ``cores`` can do for the frontend and the worker
    (its in-process CPU times ``worker_cpu_scale``: ``batching_model.cpu_cap_per_s``).
    ``capacity_scale``: what a real server answered against the model's capacity; every
    batch's run is divided by it and the cap multiplied. ``overhead_ms``: what a request
    alone took on a real server over the model's (``floor_ms``), added to every P99."""
    candidates = []
    slo_p99_ms -= overhead_ms
    spreads: dict[int, tuple[float, ...]] = {}

    def jitter(n: int) -> tuple[float, ...]:
        if n not in spreads:
            spreads[n] = spread_at(costs, n)
        return spreads[n]

    for cost, size, window in itertools.product(costs, batch_sizes, windows):
        service = scaled_service(cost, size, capacity_scale)
        cap, stretch = None, None
        if frontend_cpu_ms is not None:
            worker_ms = worker_cpu_scale * cost.cpu_per_request_ms(size)
            # Scaled up (a pessimistic model) never past what the frontend alone allows.
            cap = capacity_scale * cpu_cap_per_s(frontend_cpu_ms, worker_ms, cores)
            if frontend_cpu_ms > 0:
                cap = min(cap, 1000 * cores / frontend_cpu_ms)
            # The cores a batch of ``size`` keeps busy while it runs, as the server spends.
            busy = worker_ms * size / service(size)
            stretch = shared_cores(frontend_cpu_ms, busy, cores)
        tail: Tail | None
        if rate is None:
            tail = sustained(
                slo_p99_ms, size, window, service, max_rate_per_s=cap, stretch=stretch,
                jitter=jitter,
            )  # fmt: skip
        elif cap is not None and rate > cap:
            tail = None  # the cores cannot answer that many, whatever the batching
        else:
            at_rate = tail_at(rate, size, window, service, stretch, jitter)
            tail = at_rate if at_rate.p99_ms <= slo_p99_ms else None  # NaN: None
        if tail is not None and overhead_ms:
            tail = replace(tail, p99_ms=tail.p99_ms + overhead_ms)
        flagged = any(b <= size for _, b in cost.not_monotone)
        candidates.append(Candidate(cost.settings, size, window, tail, flagged=flagged))
    if rate is None:
        return sorted(candidates, key=lambda c: -c.held_per_s)
    return sorted(candidates, key=lambda c: c.tail.p99_ms if c.tail else float("inf"))


def floor_ms(
    costs: list[StageCosts], cost: StageCosts, batch_size: int, window_ms: int, scale: float
) -> float:
    """The model's P99 for one configuration when requests come one at a time (a rate of
    one every 10 s): its batches of one, their spread, the window waited out."""
    service = scaled_service(cost, batch_size, scale)
    return tail_at(0.1, batch_size, window_ms, service, None, partial(spread_at, costs)).p99_ms


def spread_at(costs: list[StageCosts], batch_size: int) -> tuple[float, ...]:
    """Each batch's time over its median, pooled over every combination at the largest
    measured size up to ``batch_size`` (the corpus's length mix, not the combination's)."""
    sizes = [n for cost in costs for n in cost.spread if n <= batch_size]
    if not sizes:
        return (1.0,)
    largest = max(sizes)
    return tuple(f for cost in costs for f in cost.spread.get(largest, ()))


def scaled_service(cost: StageCosts, batch_size: int, capacity_scale: float = 1.0) -> ServiceMs:
    """``cost``'s batch times up to ``batch_size`` as a service curve, each divided by
    ``capacity_scale``."""
    measured = {n: ms / capacity_scale for n, ms in cost.batch_ms.items() if n <= batch_size}
    return service_curve(measured)


def capacity_per_s(
    cost: StageCosts,
    batch_size: int,
    frontend_cpu_ms: float | None,
    cores: float,
    worker_cpu_scale: float = 1.0,
) -> float:
    """The most requests a second the model lets one worker answer with ``cost`` at
    ``batch_size``: full batches back to back (their mean time), capped by the CPU when it
    is known."""
    factors = spread_at([cost], batch_size)
    mean_ms = scaled_service(cost, batch_size)(batch_size) * sum(factors) / len(factors)
    worker = 1000 * batch_size / mean_ms
    if frontend_cpu_ms is None:
        return worker
    worker_ms = worker_cpu_scale * cost.cpu_per_request_ms(batch_size)
    return min(worker, cpu_cap_per_s(frontend_cpu_ms, worker_ms, cores))


def worker_cpu_scale(costs: list[StageCosts], candidate: Candidate, worker_ms: float) -> float:
    """What a real worker spent a request (``worker_ms``, serving ``candidate``) against the
    handler's CPU in-process at its batch size (the worker also decodes and encodes, and
    long texts cost more on the server's mix); never below 1.0, 1.0 with nothing to compare."""
    cost = next((c for c in costs if c.settings == candidate.settings), None)
    in_process_ms = cost.cpu_per_request_ms(candidate.batch_size) if cost else 0.0
    return max(1.0, worker_ms / in_process_ms) if in_process_ms > 0 else 1.0
