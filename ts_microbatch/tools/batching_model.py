"""What the frontend's batching does to latency: a model of TorchServe's batch formation.

A worker takes its next batch with ``Model.pollBatch`` (TorchServe 0.12): it waits for one
request, then polls for more until it has ``batchSize`` or ``maxBatchDelay`` has passed
since the first; with a window of 0 it takes one more at most. ``replay`` follows that for
given arrivals and a service time per batch size (one worker), and says how long each
request waited for the worker, for its batch to fill and for the batch to run.
``sustained`` finds the highest Poisson rate whose P99 is within an objective.

The replay's worker has the cores to itself, but the frontend (Java: HTTP, batching, the
bodies' bytes) shares them: ``cpu_cap_per_s`` caps the rate at what the cores can give the
frontend and the worker together, ``1000 * cores / (frontend_cpu_ms + worker_cpu_ms)``
(an MLP modelled at 1,166 req/s held 287-523 on two cores without it). Below the cap the
frontend's share still slows the worker: at rate r it keeps ``r * frontend_cpu_ms / 1000``
cores busy, and a batch whose run wants more cores than are left runs that much longer
(``shared_cores``; at the cap exactly as long as the cap allows). Without it a
transformer's batches were replayed at their in-process speed up to the cap, and the tuner
predicted 1.4-2.1x what the server held.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

ServiceMs = Callable[[int], float]
# A rate -> how many times longer a batch runs at that rate than alone (``shared_cores``).
Stretch = Callable[[float], float]
# A batch's size -> the factors its run takes over the median, one drawn per batch (bodies
# of different lengths: some batches run much longer than the median).
Jitter = Callable[[int], Sequence[float]]
REPLAYED = 6000  # arrivals a replay takes (``tail_at``)
SCAN_STEPS = 12  # rates ``sustained`` tries up to the capacity before it halves
# What bounds the rate held (``Tail.bound``), as the tuner says it.
BOUNDS = {
    "window": "maxBatchDelay: the slowest requests waited most for their batch to fill",
    "service": "batchSize and the pipeline: the slowest requests waited most for their batch "
    "to run",
    "queue": "the worker's capacity: the slowest requests waited most for the worker",
    "cpu": "the CPU: the cores cannot do more for the frontend and the worker together",
}


def service_curve(measured_ms: Mapping[int, float]) -> ServiceMs:
    """Milliseconds a batch of n takes, from batches measured at some sizes: linear between
    them, and past the largest at its cost per request. A batch is never cheaper than a
    smaller one: a measurement below a smaller size's (noise, a machine busy elsewhere)
    counts as that one's."""
    sizes = sorted(measured_ms)
    if not sizes or any(n < 1 or not measured_ms[n] > 0 for n in sizes):
        raise ValueError(f"measured_ms: got {dict(measured_ms)!r}, expected sizes >= 1, ms > 0")
    measured_ms = dict(zip(sizes, itertools.accumulate((measured_ms[n] for n in sizes), max)))

    def ms(n: int) -> float:
        if n <= sizes[0]:
            return measured_ms[sizes[0]]
        if n >= sizes[-1]:
            return measured_ms[sizes[-1]] * n / sizes[-1]
        k = bisect.bisect_left(sizes, n)
        lo, hi = sizes[k - 1], sizes[k]
        share = (n - lo) / (hi - lo)
        return measured_ms[lo] + share * (measured_ms[hi] - measured_ms[lo])

    return ms


@dataclass(frozen=True)
class Waits:
    """One request: its wait for the worker, for its batch to fill, and for it to run (ms)."""

    queue_ms: float
    window_ms: float
    service_ms: float

    @property
    def total_ms(self) -> float:
        return self.queue_ms + self.window_ms + self.service_ms


def replay(
    arrivals_s: Sequence[float],
    batch_size: int,
    window_ms: float,
    service_ms: ServiceMs,
    jitter: Jitter | None = None,
    rng: random.Random | None = None,
) -> list[Waits]:
    """Each request's waits, for ``arrivals_s`` (rising) served as pollBatch batches them.
    ``jitter``: each batch's run is ``service_ms`` times one of its factors for the batch's
    size, drawn by ``rng``."""
    draw = rng or random.Random(1)
    window_s = window_ms / 1000
    waits: list[Waits] = []
    free_s, i, n = 0.0, 0, len(arrivals_s)
    while i < n:
        start = max(free_s, arrivals_s[i])  # the worker takes the first queued request
        limit = batch_size if window_ms > 0 else min(batch_size, 2)
        deadline = start + window_s
        k = i + 1
        while k < n and k - i < limit and arrivals_s[k] <= (deadline if window_ms > 0 else start):
            k += 1
        # Full (or no window): it leaves with its last request; else the last poll waited
        # out the window.
        full = k - i == batch_size or window_ms <= 0
        dispatch = max(start, arrivals_s[k - 1]) if full else deadline
        run_s = service_ms(k - i) / 1000 * (draw.choice(jitter(k - i)) if jitter else 1.0)
        for j in range(i, k):
            joined = max(start, arrivals_s[j])
            waits.append(
                Waits(1000 * (joined - arrivals_s[j]), 1000 * (dispatch - joined), 1000 * run_s)
            )
        free_s, i = dispatch + run_s, k
    return waits


@dataclass(frozen=True)
class Tail:
    """The P99 of a replay, and what the requests at or past it waited for on average."""

    rate_per_s: float
    p99_ms: float
    queue_ms: float
    window_ms: float
    service_ms: float
    cpu_bound: bool = False  # held up to the CPU's cap (``cpu_cap_per_s``), not past it

    @property
    def bound(self) -> str:
        """A key of ``BOUNDS``: "cpu" when the rate held is the cores' cap, else what the
        slowest requests spent most on."""
        if self.cpu_bound:
            return "cpu"
        parts = {"queue": self.queue_ms, "window": self.window_ms, "service": self.service_ms}
        return max(parts, key=lambda name: parts[name])


def shared_cores(frontend_cpu_ms: float, worker_cores: float, cores: float) -> Stretch:
    """The stretch of a batch that keeps ``worker_cores`` busy alone, when the frontend
    spends ``frontend_cpu_ms`` of CPU a request on the same ``cores``: at rate r the cores
    left are ``cores - r * frontend_cpu_ms / 1000``; never below 1 (no faster than alone)."""

    def stretch(rate_per_s: float) -> float:
        left = cores - rate_per_s * frontend_cpu_ms / 1000
        return max(1.0, worker_cores / left) if left > 0 else math.inf

    return stretch


def tail_at(
    rate_per_s: float,
    batch_size: int,
    window_ms: float,
    service_ms: ServiceMs,
    stretch: Stretch | None = None,
    jitter: Jitter | None = None,
) -> Tail:
    """Replays ``REPLAYED`` Poisson arrivals at ``rate_per_s`` (the first tenth left out:
    the queue starts empty) and returns the tail: a P99 over 5,400 requests, the mean of
    their slowest 54, however fast the model (a replay's cost is its number of requests).
    ``stretch``: each batch's run times its value at this rate; ``jitter``: as ``replay``
    takes it."""
    if stretch is not None:
        factor, alone = stretch(rate_per_s), service_ms
        service_ms = lambda n: factor * alone(n)  # noqa: E731
    rng = random.Random(0)
    arrivals, now = [], 0.0
    for _ in range(REPLAYED):
        now += rng.expovariate(rate_per_s)
        arrivals.append(now)
    waits = replay(arrivals, batch_size, window_ms, service_ms, jitter, random.Random(1))
    waits = waits[len(arrivals) // 10 :]
    ranked = sorted(waits, key=lambda w: w.total_ms)
    slowest = ranked[max(0, math.ceil(0.99 * len(ranked)) - 1) :]
    count = len(slowest)
    return Tail(
        rate_per_s,
        slowest[0].total_ms,
        sum(w.queue_ms for w in slowest) / count,
        sum(w.window_ms for w in slowest) / count,
        sum(w.service_ms for w in slowest) / count,
    )


def cpu_cap_per_s(frontend_cpu_ms: float, worker_cpu_ms: float, cores: float) -> float:
    """The most requests a second ``cores`` cores can answer when each costs the frontend
    ``frontend_cpu_ms`` and the worker ``worker_cpu_ms`` of CPU (the module's docstring)."""
    per_request_ms = frontend_cpu_ms + worker_cpu_ms
    if not per_request_ms > 0 or not cores > 0:
        raise ValueError(
            f"got {frontend_cpu_ms!r} + {worker_cpu_ms!r} ms a request on {cores!r} cores, "
            "expected a CPU time > 0 and cores > 0"
        )
    return 1000 * cores / per_request_ms


def sustained(
    slo_p99_ms: float,
    batch_size: int,
    window_ms: float,
    service_ms: ServiceMs,
    *,
    max_rate_per_s: float | None = None,
    stretch: Stretch | None = None,
    jitter: Jitter | None = None,
) -> Tail | None:
    """The highest Poisson rate whose replayed P99 is within ``slo_p99_ms`` (a scan up to the
    worker's capacity, or ``max_rate_per_s`` when lower: the CPU's cap, then halving
    between the last rate held and the first not), and its tail; None when even the lowest
    rate misses it. ``stretch`` and ``jitter``: as ``tail_at`` takes them."""
    factors = jitter(batch_size) if jitter else (1.0,)
    mean_factor = sum(factors) / len(factors)
    worker_capacity = 1000 * batch_size / (service_ms(batch_size) * mean_factor)
    capacity = min(worker_capacity, max_rate_per_s or worker_capacity)
    held: Tail | None = None
    missed = capacity
    for step in range(1, SCAN_STEPS + 1):
        tail = tail_at(
            capacity * step / SCAN_STEPS, batch_size, window_ms, service_ms, stretch, jitter
        )
        if not tail.p99_ms <= slo_p99_ms:  # NaN (a stretch of inf): missed
            missed = tail.rate_per_s
            break
        held = tail
    low = held.rate_per_s if held else 0.0
    for _ in range(5):
        middle = (low + missed) / 2  # > 0: ``missed`` is a rate replayed, or the capacity
        tail = tail_at(middle, batch_size, window_ms, service_ms, stretch, jitter)
        if tail.p99_ms <= slo_p99_ms:  # NaN compares False: missed
            held, low = tail, middle
        else:
            missed = middle
    capped = capacity < worker_capacity
    if capped and held is not None and held.rate_per_s >= capacity * (1 - 1e-9):
        return replace(held, cpu_bound=True)
    return held
