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
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..core.config import MicroBatchingConfig
from .batching_model import ServiceMs, Tail, cpu_cap_per_s, service_curve, sustained, tail_at
from .corpus import Corpus
from .inprocess import measure_with_cpu
from .results import ResultsLog

# Run-to-run noise here is within 10-20%; a batch of twice the requests is not 25% cheaper.
NOT_MONOTONE_MARGIN = 1.25

# (mb, context, batches) -> (seconds per batch, CPU seconds per batch)
Measure = Callable[[Any, Any, list[Any]], tuple[float, float]]


class StageCosts(NamedTuple):
    """One combination's milliseconds and CPU milliseconds per batch size, in-process, and
    the pairs (smaller, larger) of sizes still out of order after a second measurement."""

    settings: dict[str, Any]
    batch_ms: dict[int, float]
    cpu_ms: dict[int, float]
    not_monotone: tuple[tuple[int, int], ...] = ()

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

    def costs_of(n: int) -> tuple[float, float]:
        seconds, cpu_s = measure(mb, context, corpus.batches(n, repeats + 1))
        return 1000 * seconds, 1000 * cpu_s

    costs = []
    for index, combo in enumerate(combos, start=1):
        settings = {**base.as_dict(), **combo}
        mb.configure(MicroBatchingConfig.from_mapping(settings, base))
        batch_ms: dict[int, float] = {}
        cpu_ms: dict[int, float] = {}
        for n in batch_sizes:
            batch_ms[n], cpu_ms[n] = costs_of(n)
        first = dict(batch_ms)
        suspects = out_of_order(batch_ms)
        for n in sorted({n for pair in suspects for n in pair}):  # measured once more
            batch_ms[n], cpu_ms[n] = costs_of(n)
        flagged = tuple(out_of_order(batch_ms))
        costs.append(StageCosts(settings, batch_ms, cpu_ms, flagged))
        record.append(
            {
                "kind": "stage-costs",
                "settings": settings,
                "batch_ms": batch_ms,
                "cpu_ms": cpu_ms,
                **({"first_batch_ms": first} if suspects else {}),
                "not_monotone": [list(pair) for pair in flagged],
            }
        )
        shown = ", ".join(f"{n}: {ms:.1f}" for n, ms in batch_ms.items())
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
) -> list[Candidate]:
    """Step 2: every configuration through the batching model, best first: the highest
    rate held within the objective, or with ``rate``, the lowest P99 at it. With
    ``frontend_cpu_ms``, capped at what ``cores`` can do for the frontend and the worker
    (its in-process CPU times ``worker_cpu_scale``: ``batching_model.cpu_cap_per_s``).
    ``capacity_scale``: what a real server answered against the model's capacity
    (``capacity_scale_of``); every batch's run is divided by it and the cap multiplied."""
    candidates = []
    for cost, size, window in itertools.product(costs, batch_sizes, windows):
        service = scaled_service(cost, size, capacity_scale)
        cap = None
        if frontend_cpu_ms is not None:
            worker_ms = worker_cpu_scale * cost.cpu_per_request_ms(size)
            cap = capacity_scale * cpu_cap_per_s(frontend_cpu_ms, worker_ms, cores)
        tail: Tail | None
        if rate is None:
            tail = sustained(slo_p99_ms, size, window, service, max_rate_per_s=cap)
        elif cap is not None and rate > cap:
            tail = None  # the cores cannot answer that many, whatever the batching
        else:
            at_rate = tail_at(rate, size, window, service)
            tail = at_rate if at_rate.p99_ms <= slo_p99_ms else None
        flagged = any(b <= size for _, b in cost.not_monotone)
        candidates.append(Candidate(cost.settings, size, window, tail, flagged=flagged))
    if rate is None:
        return sorted(candidates, key=lambda c: -c.held_per_s)
    return sorted(candidates, key=lambda c: c.tail.p99_ms if c.tail else float("inf"))


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
    ``batch_size``: full batches back to back, capped by the CPU when it is known."""
    worker = 1000 * batch_size / scaled_service(cost, batch_size)(batch_size)
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
