"""Whether the latency tuner may replace the configuration a user serves (``tools/tune.py``).

The user's current configuration (the .mar's model-config.yaml and micro_batching settings,
with ``--out``'s keys over them, ``"auto"`` included) is confirmed on the same ladder of
rates as the tuner's candidates, and it stays unless a candidate beat it with intervals
that part (``beats``): at some rate the candidate's P99 interval lay wholly within the
objective, and at that rate or a lower one the current configuration's lay wholly above
it (or it lost or dropped requests there), a rate above every one it surely held (a miss
below a rate it held is a hiccup, not its limit). A point a busy machine measured, or one of fewer
than ``MIN_ANSWERS`` answers, decides nothing either way. A tie, a difference within the
noise, or a current configuration that was never surely missed keeps the user's file as it
is: the tuner never replaces what it did not beat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .curves import behind
from .slo_plan import Candidate

# Answers a confirm point needs before it decides anything: a P99 of 400 is its fifth
# slowest answer, with a 95% interval about the 3rd to the 8th.
MIN_ANSWERS = 400


def decides(row: dict[str, Any]) -> bool:
    """Whether a point can carry a verdict: enough answers, and the machine not busy."""
    return not row.get("busy") and row.get("answers", row["requests"]) >= MIN_ANSWERS


def surely_held(row: dict[str, Any], slo_p99_ms: float) -> bool:
    """The point held the objective beyond its noise: its P99 interval within it, nothing
    lost, the server keeping up."""
    return (
        decides(row)
        and row["p99_high_ms"] <= slo_p99_ms
        and row["errors"] == 0
        and row["timeouts"] == 0
        and not behind(row)
    )


def surely_missed(row: dict[str, Any], slo_p99_ms: float) -> bool:
    """The point missed the objective beyond its noise: its P99 interval above it, or
    requests lost, or the server falling behind."""
    if not decides(row):
        return False
    lost = row["errors"] > 0 or row["timeouts"] > 0 or behind(row)
    return lost or row["p99_low_ms"] > slo_p99_ms


class Parting(NamedTuple):
    """Where a candidate's and the current configuration's intervals part: the candidate's
    highest point surely held, and the current's lowest surely missed at or below it (None
    when the current configuration was refused by the server)."""

    held: dict[str, Any]
    missed: dict[str, Any] | None


def beats(candidate: Candidate, current: Candidate, slo_p99_ms: float) -> Parting | None:
    """How ``candidate`` beat ``current`` (the module's rule), or None when it did not."""
    held = [row for row in candidate.curve or () if surely_held(row, slo_p99_ms)]
    if not held:
        return None
    best = max(held, key=lambda row: row["offered_per_s"])
    if current.curve is None:  # the server refused the current configuration
        return Parting(best, None)
    # A miss below a rate it surely held is a hiccup, not its limit.
    floor = max(
        (row["offered_per_s"] for row in current.curve if surely_held(row, slo_p99_ms)),
        default=0.0,
    )
    missed = [
        row
        for row in current.curve
        if surely_missed(row, slo_p99_ms) and floor < row["offered_per_s"] <= best["offered_per_s"]
    ]
    if not missed:
        return None
    return Parting(best, min(missed, key=lambda row: row["offered_per_s"]))


def decide(
    current: Candidate, others: Sequence[Candidate], slo_p99_ms: float, rate: float | None
) -> tuple[Candidate, Parting] | None:
    """The candidate that replaces ``current``: of those that beat it (and held ``rate``
    when given), the one that held the highest rate, the model's rank breaking a tie; None
    keeps ``current``."""
    winners = []
    for c in others:
        parting = beats(c, current, slo_p99_ms)
        if parting is not None and c.measured_per_s >= (rate or 0.0):
            winners.append((c, parting))
    return max(winners, key=lambda pair: pair[0].measured_per_s, default=None)


def point(row: dict[str, Any] | None) -> str:
    """A confirm point as the output shows it: rate, P99 with its interval and answers."""
    if row is None:
        return "refused by the server"
    answers = row.get("answers", row["requests"])
    lost = row["errors"] + row["timeouts"]
    return (
        f"{row['offered_per_s']:g} req/s: P99 {row['p99_ms']:.0f} ms "
        f"[{row['p99_low_ms']:.0f}, {row['p99_high_ms']:.0f}] of {answers} answers"
        + (f", {lost} lost" if lost else "")
        + (", behind" if behind(row) else "")
    )


def margin(winner: Candidate, current: Candidate) -> str:
    """``winner``'s held rate against ``current``'s, as a ratio."""
    if current.measured_per_s <= 0:
        return f"{winner.measured_per_s:g} req/s against none"
    ratio = winner.measured_per_s / current.measured_per_s
    return f"{winner.measured_per_s:g} against {current.measured_per_s:g} req/s ({ratio:.2f}x)"


def optimism(confirmed: Sequence[Candidate]) -> str:
    """The model's predicted / held ratios over the confirmed candidates it predicted."""
    ratios = [
        c.held_per_s / c.measured_per_s
        for c in confirmed
        if c.tail is not None and c.measured_per_s > 0
    ]
    if not ratios:
        return "nothing the model predicted was held on the server: no ratio"
    low, high = min(ratios), max(ratios)
    shown = f"{low:.2f}x" if math.isclose(low, high, rel_tol=0.005) else f"{low:.2f}-{high:.2f}x"
    fits = low >= 1 / 1.5 and high <= 1.5
    verdict = "within 1.5x" if fits else "outside 1.5x: take its ranking, not its rates"
    return f"predicted / held on the server: {shown} ({verdict})"
