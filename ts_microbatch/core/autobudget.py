"""``micro_batch_size: "auto"`` with lengths: each batch's token budget chosen from its shape.

With items of variable length a micro-batch's cost follows its shape, not its count: n items
padded to length L. ``AutoMicroBatchSize`` models cost per item, which cannot tell a
micro-batch of eight short queries from one of eight long documents. This one models each
stage as::

    cost_s(n, L) = a_s + b_s * n * L + c_s * n * L**2

seconds: a fixed cost per call (on a CPU, the small matrix products of a small micro-batch
are slow per token, which shows here), the work per padded token, and attention's, which
grows with the length. The coefficients are a least-squares fit (none below zero) through
the stage's recent runs, newer ones weighing more; a feature the runs do not vary (one
length only) is left out rather than guessed.

For each batch, every candidate budget (the padded length of its longest item times 1, 2,
4, ... up to the whole batch) gives a cut of the batch's own lengths
(``lengths.cut_sizes``), and that cut's makespan is simulated through the stages and their
threads: micro-batches in cut order, each entering stage s when it has left stage s-1 and a
thread of s is free. The budget with the least makespan wins; among those within 2% of it,
the largest, that is the fewest micro-batches: a split that gains nothing is not made, so
with equal lengths and nothing to overlap it is the whole batch, the plain handler's shape.

Until the fit has what it needs it runs the start budget (``max_micro_batch_tokens``, else
the middle of the candidates) and its neighbours, half and double, in turn: never the whole
batch of a long tail, which costs what the plain handler does. Afterwards, every
``explore_every`` batches, it runs the chosen budget's neighbour (half, then double), so the
fit keeps seeing both sides of what it chose.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from .autosize import TOLERANCE
from .lengths import LengthRule, cut_sizes

logger = logging.getLogger(__name__)

_L_SCALE = 512.0  # keeps n * L**2 of the order of n * L in the fit
_MEMORY = 256  # runs kept per stage
_HALF_LIFE = 64  # runs after which a run weighs half as much


class ShapeCost(NamedTuple):
    """Fitted cost of a stage for a micro-batch of n items padded to length L."""

    fixed_s: float
    per_token_s: float
    per_token_length_s: float  # times n * L**2 / _L_SCALE

    def at(self, n: int, length: int) -> float:
        tokens = n * length
        return (
            self.fixed_s
            + self.per_token_s * tokens
            + self.per_token_length_s * (tokens * length / _L_SCALE)
        )


def fit_shape_cost(runs: Sequence[tuple[int, int, float]]) -> ShapeCost | None:
    """``ShapeCost`` through (n, L, seconds) runs, the newest last; None while the runs
    cover fewer than two token counts."""
    if len({n * length for n, length, _ in runs}) < 2:
        return None
    tokens = np.array([n * length for n, length, _ in runs], dtype=float)
    lengths = np.array([length for _, length, _ in runs], dtype=float)
    seconds = np.array([s for _, _, s in runs], dtype=float)
    weights = np.sqrt(0.5 ** (np.arange(len(runs))[::-1] / _HALF_LIFE))
    columns = {0: np.ones_like(tokens), 1: tokens, 2: tokens * lengths / _L_SCALE}
    if len(set(lengths.tolist())) < 2:
        del columns[2]  # one length: attention cannot be told from the rest
    # Least squares with no coefficient below zero: a negative one (noise) is dropped and
    # the rest refitted; cost never falls with size.
    while True:
        keys = sorted(columns)
        matrix = np.stack([columns[k] for k in keys], axis=1) * weights[:, None]
        solution = np.linalg.lstsq(matrix, seconds * weights, rcond=None)[0]
        negative = [k for k, c in zip(keys, solution) if c < 0]
        if not negative or len(keys) == 1:
            break
        del columns[negative[0]]
    coefficients = dict.fromkeys(range(3), 0.0)
    coefficients.update({k: max(0.0, float(c)) for k, c in zip(keys, solution)})
    return ShapeCost(coefficients[0], coefficients[1], coefficients[2])


class AutoTokenBudget:
    """Chooses each batch's token budget from fitted stage costs; thread-safe.

    Args:
        max_items: the most items a micro-batch may hold (max_micro_batch_size).
        start_budget: where to start before costs are known (max_micro_batch_tokens); None:
            the middle of each batch's candidates.
        explore_every: batches between two runs of a neighbouring budget.
    """

    def __init__(
        self, max_items: int, start_budget: int | None = None, *, explore_every: int = 8
    ) -> None:
        self.max_items = max_items
        self.start_budget = start_budget
        self._explore_every = explore_every
        self._lock = threading.Lock()
        self._runs: dict[str, deque[tuple[int, int, float]]] = {}
        self._batches = 0
        self.last_budget: int | None = start_budget
        self.last_sizes: tuple[int, ...] = ()

    def observe(self, stage: str, items: int, padded_length: int, run_s: float) -> None:
        """Records that ``stage`` took ``run_s`` seconds for ``items`` rows padded to
        ``padded_length``."""
        if not (math.isfinite(run_s) and run_s >= 0 and items >= 1 and padded_length >= 1):
            return  # nothing a fit can use
        with self._lock:
            runs = self._runs.setdefault(stage, deque(maxlen=_MEMORY))
            runs.append((items, padded_length, run_s))

    def costs(self) -> dict[str, ShapeCost] | None:
        """Each stage's fitted cost; None until every stage seen can be fitted."""
        with self._lock:
            runs = {stage: list(r) for stage, r in self._runs.items()}
        if not runs:
            return None
        try:
            fits = {stage: fit_shape_cost(r) for stage, r in runs.items()}
        except Exception:  # a fit that cannot be solved: run the start budget meanwhile
            logger.warning(
                "the token budget's cost fit failed; using the start budget", exc_info=True
            )
            return None
        if any(fit is None for fit in fits.values()):
            return None
        return {s: f for s, f in fits.items() if f is not None}

    def choose(
        self, rule: LengthRule, lengths: Sequence[int], threads: Mapping[str, int]
    ) -> tuple[int, ...]:
        """The micro-batch sizes for a batch of ``lengths`` (in cut order)."""
        if not lengths:
            return ()
        with self._lock:
            self._batches += 1
            batch = self._batches
        unit = rule.padded(max(max(lengths), 1))
        whole = unit * min(len(lengths), self.max_items)
        candidates = sorted({min(unit << k, whole) for k in range(len(lengths).bit_length() + 1)})
        costs = self.costs()
        if costs is None:
            start = self._start(candidates)
            budget = _neighbour(candidates, start, (0, -1, 1)[batch % 3])
        else:
            budget = self._best(costs, threads, rule, lengths, candidates)
            if batch % self._explore_every == 0:
                # A neighbour, half then double, so the fit keeps both sides of the choice.
                step = -1 if (batch // self._explore_every) % 2 else 1
                budget = _neighbour(candidates, budget, step)
        sizes = cut_sizes(_with_budget(rule, budget), lengths, self.max_items)
        self.last_budget, self.last_sizes = budget, sizes
        return sizes

    def _start(self, candidates: Sequence[int]) -> int:
        if self.start_budget is None:
            return candidates[len(candidates) // 2]
        return min(candidates, key=lambda b: abs(b - self.start_budget))  # type: ignore[operator]

    def _best(
        self,
        costs: Mapping[str, ShapeCost],
        threads: Mapping[str, int],
        rule: LengthRule,
        lengths: Sequence[int],
        candidates: Sequence[int],
    ) -> int:
        """The largest budget whose predicted makespan is within 2% of the least."""
        spans = {
            b: predicted_makespan_s(costs, threads, rule, lengths, b, self.max_items)
            for b in candidates
        }
        least = min(spans.values())
        return max(b for b, span in spans.items() if span <= least * TOLERANCE)


def _neighbour(candidates: Sequence[int], budget: int, step: int) -> int:
    """The candidate ``step`` places from ``budget``; the other way at an end."""
    index = candidates.index(budget)
    if not 0 <= index + step < len(candidates):
        step = -step
    return candidates[min(max(index + step, 0), len(candidates) - 1)]


def _with_budget(rule: LengthRule, budget: int) -> LengthRule:
    return replace(rule, max_micro_batch_tokens=budget)


def predicted_makespan_s(
    costs: Mapping[str, ShapeCost],
    threads: Mapping[str, int],
    rule: LengthRule,
    lengths: Sequence[int],
    budget: int,
    max_items: int,
) -> float:
    """Seconds from the first stage call to the last for ``lengths`` cut by ``budget``."""
    sizes = cut_sizes(_with_budget(rule, budget), lengths, max_items)
    shapes, offset = [], 0
    for size in sizes:
        shapes.append((size, rule.padded(max(max(lengths[offset : offset + size]), 1))))
        offset += size
    ready = [0.0] * len(shapes)  # when each micro-batch left the previous stage
    for stage, threads_of_stage in threads.items():  # in pipeline order
        cost = costs.get(stage)
        if cost is None:
            continue
        free = [0.0] * max(1, threads_of_stage)  # when each thread is next free
        for j, (n, length) in enumerate(shapes):
            start = max(heapq.heappop(free), ready[j])
            ready[j] = start + cost.at(n, length)
            heapq.heappush(free, ready[j])
    return max(ready)
