"""Bootstrap intervals on a latency percentile and on the ratio of two, and the call they
allow.

A P99 of 20 answers is their maximum: it moves with one slow answer, and two of them
decide nothing. A percentile here is reported with the samples that carry it and a 95%
percentile-bootstrap interval (the sample resampled with replacement ``RESAMPLES`` times,
the percentile taken each time, the 2.5th and 97.5th of those), and a ratio of two
variants' percentiles with the interval of the ratio over independent resamples of each.
A difference is called a win or a loss only when that interval excludes 1 (``call``);
otherwise it is "no difference", whatever the two point values say.

``MIN_ANSWERS``: the samples a P99 needs to carry 15 answers above it (HdrHistogram and
wrk2 print the count beside each percentile for the same reason). Everything is seeded:
the same latencies give the same interval.
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


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank, as the open-loop results take it
    (an unanswered request is ``inf`` and counts as the slowest); NaN for no values."""
    if not len(values):
        return math.nan
    ordered = np.sort(np.asarray(values, dtype=float))
    return float(ordered[_rank(len(ordered), q)])


def _rank(n: int, q: float) -> int:
    return max(0, math.ceil(q / 100 * n) - 1)


def _resampled(
    values: Sequence[float], q: float, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """The ``q``-th percentile of each of ``resamples`` resamples of ``values``: the k-th
    smallest of n indices drawn into the sorted sample picks its k-th order statistic."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    k = _rank(n, q)
    out = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        rows = min(_CHUNK, resamples - start)
        drawn = rng.integers(0, n, size=(rows, n), dtype=np.int32)
        out[start : start + rows] = ordered[np.partition(drawn, k, axis=1)[:, k]]
    return out


def _bounds(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    # inverted_cdf picks drawn values: no interpolation between inf and inf (NaN).
    low, high = np.quantile(draws, [tail, 1 - tail], method="inverted_cdf")
    return float(low), float(high)


def _check(values: Sequence[float], name: str) -> None:
    if not len(values):
        raise ValueError(f"{name}: got no values, expected at least one latency")


def percentile_interval(
    values: Sequence[float],
    q: float = 99,
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """The ``q``-th percentile of ``values`` and its percentile-bootstrap interval."""
    _check(values, "values")
    rng = np.random.default_rng(seed)
    low, high = _bounds(_resampled(values, q, resamples, rng), confidence)
    return Interval(percentile(values, q), low, high, len(values))


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
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """P``q`` of ``a`` over P``q`` of ``b`` and its interval: each resampled on its own
    (the two are independent runs), the ratio taken per resample."""
    _check(a, "a")
    _check(b, "b")
    rng = np.random.default_rng(seed)
    draws = _ratio(_resampled(a, q, resamples, rng), _resampled(b, q, resamples, rng))
    low, high = _bounds(draws, confidence)
    value = float(_ratio(percentile(a, q), percentile(b, q)))
    return Interval(value, low, high, min(len(a), len(b)))


def call(ratio: Interval, lower_is_better: bool = True) -> str:
    """``WIN`` or ``LOSS`` when the ratio's interval excludes 1 (a latency ratio under 1 is a
    win), else ``SAME``."""
    if ratio.high < 1:
        return WIN if lower_is_better else LOSS
    if ratio.low > 1:
        return LOSS if lower_is_better else WIN
    return SAME


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
    """``a`` against ``b`` at one point, from each one's latencies in each round (round i
    of one beside round i of the other). Where each side's rounds agree (``agree`` on their
    P``q`` intervals), their latencies are pooled and one ratio decides; otherwise the
    ratio is taken round by round and called a win or a loss only when every round's call
    is that. Returns ``ratio``, ``low``, ``high`` (the pooled ratio's, or the per-round
    ratios' median and the widest bounds), ``call``, ``pooled`` and ``rounds`` (each
    round's ratio, bounds and call)."""
    pairs = list(zip(a_rounds, b_rounds))
    if not pairs:
        raise ValueError("compare_rounds: no round has both sides")
    per_round = [
        ratio_interval(a, b, q, seed=seed + index, resamples=resamples)
        for index, (a, b) in enumerate(pairs)
    ]
    rounds = [{"ratio": r.value, "low": r.low, "high": r.high, "call": call(r)} for r in per_round]
    each = [
        [percentile_interval(x, q, seed=seed + i, resamples=resamples) for i, x in enumerate(side)]
        for side in ([a for a, _ in pairs], [b for _, b in pairs])
    ]
    if len(pairs) == 1 or all(agree(side) for side in each):
        pooled_a = [v for a, _ in pairs for v in a]
        pooled_b = [v for _, b in pairs for v in b]
        r = ratio_interval(pooled_a, pooled_b, q, seed=seed, resamples=resamples)
        return {"ratio": r.value, "low": r.low, "high": r.high, "call": call(r),
                "pooled": True, "rounds": rounds}  # fmt: skip
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
