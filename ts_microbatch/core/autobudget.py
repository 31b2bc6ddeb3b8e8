"""``micro_batch_size: "auto"`` with lengths: each batch's token budget chosen from its shape.

With items of variable length a micro-batch's cost follows its shape, not its count: items x
the length they are padded to. ``AutoMicroBatchSize`` models cost per item, which cannot
tell a micro-batch of eight short queries from one of eight long documents. This one models
each stage as ``cost_s(t) = a_s + b_s * t`` seconds for a micro-batch of t padded tokens, a
weighted least-squares line (``autosize.fit_cost``) through the recent mean run time of each
token-count bin (bins a factor sqrt(2) wide).

For each batch, every candidate budget (the padded length of its longest item times 1, 2, 4,
... up to the whole batch) gives a cut of the batch's own lengths (``lengths.cut_sizes``), and
that cut's makespan is simulated through the stages and their threads: micro-batches in cut
order, each entering stage s when it has left stage s-1 and a thread of s is free. The budget
with the least makespan wins; among those within 2% of it, the largest, that is the fewest
micro-batches: a split that gains nothing is not made, so with equal lengths and nothing to
overlap it is the whole batch, the plain handler's shape.

Until every stage has been seen at two token counts apart it alternates the whole batch and
one micro-batch per longest item's length, which spans the range; afterwards, every
``explore_every`` batches, it runs the chosen budget's neighbour (half, then double), so the
fit keeps seeing both sides of what it chose. Attention's square in the length is not
modelled: the line is refitted where the batches are, which is what it must predict.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .autosize import TOLERANCE, StageCost, fit_cost
from .lengths import LengthRule, cut_sizes

_BIN = math.sqrt(2)
_MIN_SPAN = 1.5  # token counts this far apart fit a line; closer ones measure noise


class AutoTokenBudget:
    """Chooses each batch's token budget from fitted stage costs; thread-safe.

    Args:
        max_items: the most items a micro-batch may hold (max_micro_batch_size).
        start_budget: the budget before costs are known (max_micro_batch_tokens); None:
            explore from the whole batch.
        explore_every: batches between two runs of a neighbouring budget.
        smoothing: weight of a new run in the mean of its bin.
    """

    def __init__(
        self,
        max_items: int,
        start_budget: int | None = None,
        *,
        explore_every: int = 8,
        smoothing: float = 0.25,
    ) -> None:
        self.max_items = max_items
        self.start_budget = start_budget
        self._explore_every = explore_every
        self._smoothing = smoothing
        self._lock = threading.Lock()
        # stage -> bin -> [mean tokens, mean seconds, runs]
        self._bins: dict[str, dict[int, list[float]]] = {}
        self._batches = 0
        self.last_budget: int | None = start_budget
        self.last_sizes: tuple[int, ...] = ()

    def observe(self, stage: str, tokens: int, run_s: float) -> None:
        """Records that ``stage`` took ``run_s`` seconds for a micro-batch of ``tokens``
        padded tokens."""
        key = round(math.log(max(tokens, 1), _BIN))
        with self._lock:
            mean = self._bins.setdefault(stage, {}).setdefault(key, [float(tokens), run_s, 0])
            weight = max(self._smoothing, 1.0 / (mean[2] + 1))
            mean[0] += weight * (tokens - mean[0])
            mean[1] += weight * (run_s - mean[1])
            mean[2] += 1

    def costs(self) -> dict[str, StageCost] | None:
        """Each stage's fitted cost per padded token; None until every stage seen has runs
        at token counts ``_MIN_SPAN`` apart."""
        with self._lock:
            bins = {s: [tuple(m) for m in b.values()] for s, b in self._bins.items()}
        if not bins:
            return None
        fits: dict[str, StageCost] = {}
        for stage, means in bins.items():
            counts = [t for t, _, _ in means]
            if max(counts) < _MIN_SPAN * min(counts):
                return None
            fit = fit_cost([(round(t), s) for t, s, _ in means], [min(n, 8) for _, _, n in means])
            if fit is None:
                return None
            fits[stage] = fit
        return fits

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
            if self.start_budget is not None and batch % 2:
                budget = self.start_budget
            else:
                budget = whole if batch % 2 else unit
        else:
            budget = self._best(costs, threads, rule, lengths, candidates)
            if batch % self._explore_every == 0:
                # A neighbour, half then double, so the fit keeps both sides of the choice.
                index = candidates.index(budget)
                step = -1 if (batch // self._explore_every) % 2 else 1
                if not 0 <= index + step < len(candidates):
                    step = -step  # at an end: the one neighbour there is
                budget = candidates[min(max(index + step, 0), len(candidates) - 1)]
        sizes = cut_sizes(_with_budget(rule, budget), lengths, self.max_items)
        self.last_budget, self.last_sizes = budget, sizes
        return sizes

    def _best(
        self,
        costs: Mapping[str, StageCost],
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


def _with_budget(rule: LengthRule, budget: int) -> LengthRule:
    return replace(rule, max_micro_batch_tokens=budget)


def predicted_makespan_s(
    costs: Mapping[str, StageCost],
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
        shapes.append(size * rule.padded(max(max(lengths[offset : offset + size]), 1)))
        offset += size
    ready = [0.0] * len(shapes)  # when each micro-batch left the previous stage
    for stage, threads_of_stage in threads.items():  # in pipeline order
        cost = costs.get(stage)
        if cost is None:
            continue
        free = [0.0] * max(1, threads_of_stage)  # when each thread is next free
        for j, tokens in enumerate(shapes):
            start = max(heapq.heappop(free), ready[j])
            ready[j] = start + cost.at(tokens)
            heapq.heappush(free, ready[j])
    return max(ready)
