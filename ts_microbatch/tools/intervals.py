"""Bootstrap intervals on a latency percentile and on the ratio of two, and the call they
allow.

A P99 of 20 answers is their maximum: it moves with one slow answer. A percentile is
reported with the samples that carry it and a 95% percentile-bootstrap interval, a ratio
of two with the interval over independent resamples of each; a difference is a win or a
loss only when that interval excludes 1 (``call``). Everything is seeded: the same
latencies give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
# A P99 with 15 answers above it: 1,500 samples (a P99 of 100 is their maximum but one).
MIN_ANSWERS = 1500
WIN, LOSS, SAME = "win", "loss", "no difference"
_CHUNK = 250  # resamples drawn at once: 250 x 4,500 indices is 9 MB


class Interval(NamedTuple):
    """A statistic, its bootstrap interval and the samples it came from (for a ratio, the
    smaller of the two samples)."""

    value: float
    low: float
    high: float
    samples: int


def _rank(n: int, q: float) -> int:
    return max(0, math.ceil(q / 100 * n) - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank (``inf``, an unanswered request,
    counts as the slowest); NaN for no values."""
    if not len(values):
        return math.nan
    ordered = np.sort(np.asarray(values, dtype=float))
    return float(ordered[_rank(len(ordered), q)])


def _resampled(
    values: Sequence[float], q: float, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """The ``q``-th percentile of each of ``resamples`` resamples of ``values``: the k-th
    smallest of n indices drawn into the sorted sample picks its k-th order statistic."""
    if not len(values):
        raise ValueError("got no values, expected at least one latency")
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    k = _rank(n, q)
    out = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        rows = min(_CHUNK, resamples - start)
        drawn = rng.integers(0, n, size=(rows, n), dtype=np.int32)
        out[start : start + rows] = ordered[np.partition(drawn, k, axis=1)[:, k]]
    return out


def _bounds(draws: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2
    # inverted_cdf picks drawn values: no interpolation between inf and inf (NaN).
    low, high = np.quantile(draws, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def percentile_interval(
    values: Sequence[float], q: float = 99, *, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """The ``q``-th percentile of ``values`` and its percentile-bootstrap interval."""
    draws = _resampled(values, q, resamples, np.random.default_rng(seed))
    return Interval(percentile(values, q), *_bounds(draws), len(values))


def _ratio(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """a / b, where both infinite (both lost past the percentile) is 1, not NaN."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isinf(a) & np.isinf(b), 1.0, a / b)
    return np.where(np.isnan(out), 1.0, out)  # 0 / 0: both answered in no time


def ratio_interval(
    a: Sequence[float],
    b: Sequence[float],
    q: float = 99,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """P``q`` of ``a`` over P``q`` of ``b`` and its interval: each resampled on its own
    (the two are independent runs), the ratio taken per resample."""
    rng = np.random.default_rng(seed)
    draws = _ratio(_resampled(a, q, resamples, rng), _resampled(b, q, resamples, rng))
    value = float(_ratio(percentile(a, q), percentile(b, q)))
    return Interval(value, *_bounds(draws), min(len(a), len(b)))


def call(ratio: Interval) -> str:
    """``WIN`` or ``LOSS`` when a latency ratio's interval excludes 1, else ``SAME``."""
    return WIN if ratio.high < 1 else LOSS if ratio.low > 1 else SAME


def _called(r: Interval) -> dict[str, Any]:
    return {"ratio": r.value, "low": r.low, "high": r.high, "call": call(r)}


def agree(intervals: Sequence[Interval]) -> bool:
    """Whether the intervals share a value (rounds that may be pooled)."""
    return bool(intervals) and max(i.low for i in intervals) <= min(i.high for i in intervals)


def compare_rounds(
    a_rounds: Sequence[Sequence[float]],
    b_rounds: Sequence[Sequence[float]],
    q: float = 99,
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict[str, Any]:
    """``a`` against ``b`` at one point, from their latencies round by round. Where each
    side's rounds ``agree`` on their P``q`` intervals, the latencies are pooled and one
    ratio decides; otherwise a win or a loss needs every round's call to say it. Returns
    ``ratio``, ``low``, ``high`` (pooled, or the rounds' median and widest bounds),
    ``call``, ``pooled`` and ``rounds`` (each round's ratio, bounds and call)."""
    pairs = list(zip(a_rounds, b_rounds))
    if not pairs:
        raise ValueError("compare_rounds: no round has both sides")
    per_round = [
        ratio_interval(a, b, q, seed=seed + index, resamples=resamples)
        for index, (a, b) in enumerate(pairs)
    ]
    rounds = [_called(r) for r in per_round]
    sides = ([a for a, _ in pairs], [b for _, b in pairs])

    def agreeing(side: list[Sequence[float]]) -> bool:
        return agree(
            [
                percentile_interval(x, q, seed=seed + i, resamples=resamples)
                for i, x in enumerate(side)
            ]
        )

    if len(pairs) == 1 or all(agreeing(side) for side in sides):
        a, b = ([v for run in side for v in run] for side in sides)
        r = ratio_interval(a, b, q, seed=seed, resamples=resamples)
        return {**_called(r), "pooled": True, "rounds": rounds}
    calls = {call(r) for r in per_round}
    ratios = sorted(r.value for r in per_round)
    return {
        "ratio": ratios[(len(ratios) - 1) // 2],
        "low": min(r.low for r in per_round),
        "high": max(r.high for r in per_round),
        "call": calls.pop() if len(calls) == 1 else SAME,
        "pooled": False,
        "rounds": rounds,
    }
