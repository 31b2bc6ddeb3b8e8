"""``micro_batch_size: "auto"``: the micro-batch size chosen from measured costs.

The rule has two parts: a cost model proposes, the measured batch time decides.

The model. Each stage s is modelled as ``cost_s(n) = a_s + b_s * n`` seconds for a
micro-batch of n, a least-squares line through the recent mean run time at each size tried
(as BentoML regresses batch cost on size). A TorchServe worker runs one frontend batch of B
requests at a time, so what matters is the batch's makespan through the pipeline with
m = ceil(B / n) micro-batches and p_s threads per stage::

    makespan(n) = sum_s cost_s(n)  +  (m - 1) * max_s cost_s(n) / p_s

(filling and draining the pipeline, then one micro-batch per bottleneck period: the slowest
stage kept busy). Small n pays the fixed costs a_s many times; large n leaves the stages
unoverlapped: the minimum sits between. The model's size is the n in [min, max] (and <= B)
with the least predicted makespan; among sizes within 2% of it, the smallest.

The measurement. The model cannot see costs outside the stage calls (threads on shared
cores slowing each other, per-micro-batch bookkeeping, metrics), so the pipeline also
reports each batch's wall time. Per size, a moving average of seconds per request over
near-full batches is kept. The size used is the measured best, among sizes measured in
the last ``memory_batches`` batches (again the smallest within 2%); a size the model
proposes that has no recent measurement is tried first.

Settling and adapting. Until every stage has runs at two sizes it explores (min, max,
their geometric mean), so the model speaks after three batches and its size is measured on
the fourth. Every ``explore_every`` batches it tries a neighbour of the chosen size, so
both the fit and the measurements follow changes in load or stage costs: the sizes that
split the batch into one micro-batch fewer or one more (for 32: 32, 16, 11, 8, 7, 6, ...),
alternately; a neighbour that measures better is kept and the next one the same way is
tried at once. In the fit, a size weighs by how often it ran (up to 8 runs), halved for
every ``explore_every`` batches since it last ran; measurements older than
``memory_batches`` batches are forgotten.

Allowed sizes. With ``allowed_sizes`` (a compiled model's ``allowed_micro_batch_sizes``),
every size it considers, proposes, explores or climbs to is one of them within [min, max];
a neighbour is rounded to the allowed size in its direction.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .errors import ConfigError

TOLERANCE = 1.02  # sizes within 2% of the best count as equal; the smallest wins


class StageCost(NamedTuple):
    """Fitted cost of a stage: ``fixed_s + per_item_s * n`` seconds for n requests."""

    fixed_s: float
    per_item_s: float

    def at(self, n: int) -> float:
        return max(0.0, self.fixed_s + self.per_item_s * n)


def fit_cost(
    samples: list[tuple[int, float]], weights: list[float] | None = None
) -> StageCost | None:
    """Weighted least-squares line through (size, seconds); None without two distinct sizes."""
    if len({n for n, _ in samples}) < 2:
        return None
    sizes = np.array([n for n, _ in samples], dtype=float)
    seconds = np.array([t for _, t in samples], dtype=float)
    w = np.array(weights if weights is not None else [1.0] * len(samples), dtype=float)
    # polyfit weighs residuals, not squared residuals: sqrt gives weighted least squares.
    slope, intercept = np.polyfit(sizes, seconds, 1, w=np.sqrt(w))
    if slope < 0:  # noise can tilt it below zero; cost never falls with size
        slope, intercept = 0.0, float(np.average(seconds, weights=w))
    return StageCost(max(float(intercept), 0.0), float(slope))


def predicted_makespan_s(
    costs: Mapping[str, StageCost], threads: Mapping[str, int], batch: int, n: int
) -> float:
    per_stage = [cost.at(n) for cost in costs.values()]
    bottleneck = max(cost.at(n) / max(1, threads.get(s, 1)) for s, cost in costs.items())
    return sum(per_stage) + (math.ceil(batch / n) - 1) * bottleneck


@dataclass
class _Average:
    """A moving average that remembers when it was last fed."""

    value: float
    count: int
    last_batch: int

    def add(self, value: float, batch: int, smoothing: float) -> None:
        # The first few samples are averaged plainly, later ones exponentially.
        weight = max(smoothing, 1.0 / (self.count + 1))
        self.value += weight * (value - self.value)
        self.count += 1
        self.last_batch = batch


def _smallest_near_best(scores: Mapping[int, float]) -> int:
    least = min(scores.values())
    return min(n for n, score in scores.items() if score <= least * TOLERANCE)


class AutoMicroBatchSize:
    """Chooses micro-batch sizes; fed by the pipeline with every successful stage run and
    every batch's wall time.

    Args:
        min_size, max_size: the bounds of the sizes it may choose.
        allowed_sizes: when given, the only sizes it may choose (those within the bounds).
        explore_every: batches between two tries of a neighbouring size.
        memory_batches: measurements older than this many batches are forgotten.
        smoothing: weight of a new measurement in the moving averages.
    """

    def __init__(
        self,
        min_size: int,
        max_size: int,
        *,
        allowed_sizes: tuple[int, ...] | None = None,
        explore_every: int = 8,
        memory_batches: int = 64,
        smoothing: float = 0.25,
    ) -> None:
        if min_size < 1 or max_size < min_size:
            raise ConfigError(
                f"micro_batching: min_micro_batch_size={min_size} and max_micro_batch_size="
                f"{max_size}, expected 1 <= min <= max"
            )
        self.min_size = min_size
        self.max_size = max_size
        self._allowed = None
        if allowed_sizes is not None:
            self._allowed = tuple(sorted(n for n in allowed_sizes if min_size <= n <= max_size))
            if not self._allowed:
                raise ConfigError(
                    f"micro_batching.allowed_micro_batch_sizes: got {list(allowed_sizes)}, "
                    f"expected one within {min_size}..{max_size}"
                )
        self._explore_every = explore_every
        self._memory = memory_batches
        self._smoothing = smoothing
        self._stage_runs: dict[str, dict[int, _Average]] = {}
        self._per_request: dict[int, _Average] = {}
        self._batch_sizes: deque[int] = deque(maxlen=memory_batches)
        self._lock = threading.Lock()  # guards the measurements
        self._choosing = threading.Lock()  # one choice at a time: it moves the climb state
        self._batches = 0
        self._direction = 0  # index in _DIRECTIONS of the next neighbour to try
        self._trying: int | None = None  # the neighbour being tried
        self._next_try = explore_every
        self.last_size = self._allowed[0] if self._allowed else min_size

    def observe(self, stage: str, size: int, run_s: float) -> None:
        """Records that ``stage`` took ``run_s`` seconds for ``size`` requests."""
        with self._lock:
            self._feed(self._stage_runs.setdefault(stage, {}), size, run_s)

    def batch_reporter(self, size: int) -> Callable[[Any], None]:
        """A callback for ``Batch.when_answered``: reports the batch's wall time, unless a
        request of it failed (retries would skew it)."""

        def report(batch: Any) -> None:
            if batch.succeeded():
                self.observe_batch(size, len(batch), time.monotonic() - batch.created_at)

        return report

    def observe_batch(self, size: int, requests: int, seconds: float) -> None:
        """Records that a batch of ``requests`` split at ``size`` took ``seconds`` in all."""
        with self._lock:
            # Only near-full batches compare sizes fairly: a batch of 3 costs more per
            # request than a batch of 32 whatever the size.
            self._batch_sizes.append(requests)
            if requests >= max(self._batch_sizes) / 2:
                self._feed(self._per_request, size, seconds / requests)

    def _feed(self, averages: MutableMapping[int, _Average], size: int, value: float) -> None:
        """Adds ``value`` to the moving average kept for ``size``; the caller holds the lock."""
        if size in averages:
            averages[size].add(value, self._batches, self._smoothing)
        else:
            averages[size] = _Average(value, 1, self._batches)

    def _recent(self, averages: Mapping[int, _Average]) -> dict[int, _Average]:
        return {n: a for n, a in averages.items() if self._batches - a.last_batch < self._memory}

    def costs(self) -> dict[str, StageCost] | None:
        """The fitted cost of every stage seen, or None while one cannot be fitted yet."""
        with self._lock:
            fits = {}
            for stage, runs in self._stage_runs.items():
                recent = sorted(self._recent(runs).items())
                # Sizes tried often weigh more, sizes not tried lately less (halving every
                # `explore_every` batches), so the line follows a change in costs.
                weights = [
                    min(a.count, 8) * 0.5 ** ((self._batches - a.last_batch) / self._explore_every)
                    for _, a in recent
                ]
                fits[stage] = fit_cost([(n, a.value) for n, a in recent], weights)
        if not fits or any(f is None for f in fits.values()):
            return None
        return {s: f for s, f in fits.items() if f is not None}

    def best(self, batch: int, threads: Mapping[str, int]) -> int | None:
        """The size the cost model prefers for a batch of ``batch``; None while exploring."""
        costs = self.costs()
        if costs is None:
            return None
        return _smallest_near_best(
            {n: predicted_makespan_s(costs, threads, batch, n) for n in self._candidates(batch)}
        )

    def measured(self, batch: int) -> dict[int, float]:
        """Recent mean seconds per request for each size tried (sizes <= ``batch``)."""
        candidates = set(self._candidates(batch))
        with self._lock:
            recent = self._recent(self._per_request)
        return {n: a.value for n, a in recent.items() if n in candidates}

    def choose(self, batch: int, threads: Mapping[str, int]) -> int:
        """The size for the next batch of ``batch`` requests."""
        candidates = self._candidates(batch)
        lo, hi = candidates[0], candidates[-1]
        with self._choosing:
            with self._lock:
                self._batches += 1
            proposed = self.best(batch, threads)
            measured = self.measured(batch)
            if proposed is None:
                middle = _snap(candidates, round(math.sqrt(lo * hi)), up=True)
                size = self._least_tried((lo, hi, middle))
            elif proposed not in measured:
                size = proposed
            else:
                size = self._climb(_smallest_near_best(measured), batch)
            self.last_size = size
        return size

    def _climb(self, best: int, batch: int) -> int:
        """``best``, or every ``explore_every`` batches a neighbour of it. A neighbour that
        measured better becomes ``best`` and the next one the same way is tried at once;
        one that lost turns the search to the next direction."""
        if self._trying is not None:
            if best == self._trying:  # it won: keep going that way now
                self._next_try = self._batches
            else:
                self._direction = (self._direction + 1) % len(_DIRECTIONS)
            self._trying = None
        if self._batches < self._next_try:
            return best
        self._next_try = self._batches + self._explore_every
        direction = _DIRECTIONS[self._direction]
        size = _snap(
            self._candidates(batch),
            _neighbour(best, batch, direction),
            up=direction in ("fewer", "larger"),
        )
        if size == best:  # at a bound: another way next time
            self._direction = (self._direction + 1) % len(_DIRECTIONS)
            return best
        self._trying = size
        return size

    def _candidates(self, batch: int) -> list[int]:
        """The sizes it may choose for a batch of ``batch``, ascending; never empty."""
        hi = max(1, min(self.max_size, batch))
        if self._allowed is None:
            return list(range(min(self.min_size, hi), hi + 1))
        # Sizes up to the batch, and the smallest one that holds it whole (padded).
        fits = [n for n in self._allowed if n < batch]
        return fits + [next((n for n in self._allowed if n >= batch), self._allowed[-1])]

    def _least_tried(self, candidates: tuple[int, ...]) -> int:
        with self._lock:
            runs = next(iter(self._stage_runs.values()), {})
            tried = {n: a.count for n, a in runs.items()}
        return min(sorted(set(candidates)), key=lambda n: tried.get(n, 0))


# The neighbours of a size: one micro-batch fewer or more (balanced splits), and one
# request larger or smaller (an uneven split: 4+2 can beat 3+3 when the small micro-batch
# overtakes the large one on a second thread).
_DIRECTIONS = ("fewer", "more", "larger", "smaller")


def _snap(candidates: list[int], n: int, *, up: bool) -> int:
    """The candidate nearest ``n`` on its side (``up``: the smallest >= n), else the bound."""
    if up:
        return next((c for c in candidates if c >= n), candidates[-1])
    return next((c for c in reversed(candidates) if c <= n), candidates[0])


def _neighbour(best: int, batch: int, direction: str) -> int:
    count = math.ceil(batch / best)
    if direction == "fewer":
        return math.ceil(batch / max(1, count - 1))
    if direction == "more":
        return math.ceil(batch / (count + 1))
    return best + 1 if direction == "larger" else best - 1
