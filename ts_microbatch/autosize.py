"""``micro_batch_size: "auto"``: the micro-batch size chosen from measured stage costs.

The rule. Each stage s is modelled as ``cost_s(n) = a_s + b_s * n`` seconds for a
micro-batch of n, fitted by least squares over its recent runs (as BentoML regresses batch
cost on size). A TorchServe worker runs one frontend batch of B requests at a time, so
what matters is the batch's makespan through the pipeline with m = ceil(B / n)
micro-batches and p_s threads per stage::

    makespan(n) = sum_s cost_s(n)  +  (m - 1) * max_s cost_s(n) / p_s

(filling and draining the pipeline, then one micro-batch per bottleneck period). The size
is the n in [min, max] (and <= B) with the least predicted makespan; among sizes within
2% of it, the smallest, which has the lowest latency. Small n pays the fixed costs a_s
many times; large n leaves the stages unoverlapped: the minimum sits between.

Until every stage has runs at two sizes it explores (min, max, their geometric mean); then
every ``explore_every`` batches it tries the size next to the chosen one, so the fit
follows changes in load or stage costs, and old runs leave the window.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

from .errors import ConfigError


class StageCost(NamedTuple):
    """Fitted cost of a stage: ``fixed_s + per_item_s * n`` seconds for n requests."""

    fixed_s: float
    per_item_s: float

    def at(self, n: int) -> float:
        return max(0.0, self.fixed_s + self.per_item_s * n)


def fit_cost(samples: list[tuple[int, float]]) -> StageCost | None:
    """Least-squares line through (size, seconds); None without two distinct sizes."""
    sizes = {n for n, _ in samples}
    if len(sizes) < 2:
        return None
    count = len(samples)
    mean_n = sum(n for n, _ in samples) / count
    mean_t = sum(t for _, t in samples) / count
    var = sum((n - mean_n) ** 2 for n, _ in samples)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in samples) / var
    slope = max(slope, 0.0)  # noise can tilt it below zero; cost never falls with size
    return StageCost(max(mean_t - slope * mean_n, 0.0), slope)


def predicted_makespan_s(
    costs: Mapping[str, StageCost], threads: Mapping[str, int], batch: int, n: int
) -> float:
    per_stage = [cost.at(n) for cost in costs.values()]
    bottleneck = max(cost.at(n) / max(1, threads.get(s, 1)) for s, cost in costs.items())
    return sum(per_stage) + (math.ceil(batch / n) - 1) * bottleneck


class AutoMicroBatchSize:
    """Chooses micro-batch sizes; fed by the pipeline with every successful stage run.

    Args:
        min_size, max_size: the bounds of the sizes it may choose.
        window: runs per stage kept for the fit.
        explore_every: batches between two tries of a neighbouring size.
    """

    def __init__(
        self, min_size: int, max_size: int, *, window: int = 64, explore_every: int = 8
    ) -> None:
        if min_size < 1 or max_size < min_size:
            raise ConfigError(
                f"micro_batching: min_micro_batch_size={min_size} and max_micro_batch_size="
                f"{max_size}, expected 1 <= min <= max"
            )
        self.min_size = min_size
        self.max_size = max_size
        self._explore_every = explore_every
        self._window = window
        self._samples: dict[str, deque[tuple[int, float]]] = {}
        self._lock = threading.Lock()
        self._batches = 0
        self._explore_up = True
        self.last_size = min_size

    def observe(self, stage: str, size: int, run_s: float) -> None:
        """Records that ``stage`` took ``run_s`` seconds for ``size`` requests."""
        with self._lock:
            self._samples.setdefault(stage, deque(maxlen=self._window)).append((size, run_s))

    def costs(self) -> dict[str, StageCost] | None:
        """The fitted cost of every stage seen, or None while one cannot be fitted yet."""
        with self._lock:
            fits = {stage: fit_cost(list(s)) for stage, s in self._samples.items()}
        if not fits or any(f is None for f in fits.values()):
            return None
        return {s: f for s, f in fits.items() if f is not None}

    def best(self, batch: int, threads: Mapping[str, int]) -> int | None:
        """The size the cost model prefers for a batch of ``batch``; None while exploring."""
        costs = self.costs()
        if costs is None:
            return None
        hi = max(1, min(self.max_size, batch))
        lo = min(self.min_size, hi)
        spans = {n: predicted_makespan_s(costs, threads, batch, n) for n in range(lo, hi + 1)}
        least = min(spans.values())
        return min(n for n, span in spans.items() if span <= least * 1.02)

    def choose(self, batch: int, threads: Mapping[str, int]) -> int:
        """The size for the next batch of ``batch`` requests."""
        hi = max(1, min(self.max_size, batch))
        lo = min(self.min_size, hi)
        with self._lock:
            self._batches += 1
            explore = self._batches % self._explore_every == 0
        best = self.best(batch, threads)
        if best is None:
            size = self._least_tried((lo, hi, round(math.sqrt(lo * hi))))
        elif explore:
            self._explore_up = not self._explore_up
            size = min(hi, best * 2) if self._explore_up else max(lo, best // 2)
        else:
            size = best
        self.last_size = size
        return size

    def _least_tried(self, candidates: tuple[int, ...]) -> int:
        with self._lock:
            first = next(iter(self._samples.values()), deque())
            tried = [n for n, _ in first]
        return min(sorted(set(candidates)), key=tried.count)
