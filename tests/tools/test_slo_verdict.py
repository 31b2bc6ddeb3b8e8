"""When the latency tuner may replace the user's configuration (ts_microbatch.tools.slo_verdict),
and the model's capacity scaled by what a server answered (slo_plan.capacity_per_s)."""

from __future__ import annotations

from typing import Any

import pytest

from ts_microbatch import MicroBatchingConfig
from ts_microbatch.tools.batching_model import Tail
from ts_microbatch.tools.slo_plan import Candidate, StageCosts, capacity_per_s, plan
from ts_microbatch.tools.slo_verdict import MIN_ANSWERS, beats, decide, optimism

SLO = 100.0


def row(rate: float, p99: float, low: float, high: float, **extra: Any) -> dict[str, Any]:
    """A confirm point: ``MIN_ANSWERS`` answers, nothing lost, the machine quiet."""
    return {
        "offered_per_s": rate, "realized_per_s": rate, "achieved_per_s": rate,
        "requests": MIN_ANSWERS, "answers": MIN_ANSWERS, "errors": 0, "timeouts": 0,
        "queue_growth_ms": 0.0, "p99_ms": p99, "p99_low_ms": low, "p99_high_ms": high,
        "busy": False, **extra,
    }  # fmt: skip


def served(curve: list[dict[str, Any]] | None, held: float, predicted: float = 0.0) -> Candidate:
    tail = Tail(predicted, 50.0, 1.0, 1.0, 48.0) if predicted else None
    c = Candidate(MicroBatchingConfig().as_dict(), 8, 1, tail, curve=curve)
    c.measured_per_s = held
    return c


def test_a_candidate_beats_the_current_only_where_the_intervals_part() -> None:
    # The user's case: the pick held 40 req/s and the user's "auto" 30, but at 40 the
    # user's P99 interval still reached under the objective: neither wins.
    current = served([row(20, 50, 45, 60), row(30, 90, 80, 99), row(40, 120, 95, 140)], 30)
    pick = served([row(20, 40, 35, 45), row(30, 60, 55, 70), row(40, 95, 85, 99)], 40)
    assert beats(pick, current, SLO) is None
    assert decide(current, [pick], SLO, None) is None
    # Yours surely above the objective at 40 (its whole interval), the pick surely within.
    current.curve[-1] = row(40, 150, 120, 180)  # type: ignore[index]
    parting = beats(pick, current, SLO)
    assert parting is not None
    assert (parting.held["offered_per_s"], parting.missed["offered_per_s"]) == (40, 40)  # type: ignore[index]
    assert decide(current, [pick], SLO, None) == (pick, parting)
    assert decide(current, [pick], SLO, rate=50.0) is None  # --rate: it must hold that


def test_a_miss_below_a_rate_the_current_surely_held_is_a_hiccup_not_its_limit() -> None:
    # The embedding run: yours missed 15 req/s (128 ms [107, 163]) and held 21.6 (85 [76,
    # 90]); the pick held 30.6. The parting is where yours missed above what it held.
    current = served([row(15, 128, 107, 163), row(21.6, 85, 76, 90), row(30.6, 90, 80, 110)], 21.6)
    pick = served([row(15, 40, 35, 45), row(21.6, 60, 55, 70), row(30.6, 88, 85, 97)], 30.6)
    assert beats(pick, current, SLO) is None  # yours' 30.6 straddles the objective
    current.curve[-1] = row(30.6, 150, 120, 180)  # type: ignore[index]
    parting = beats(pick, current, SLO)
    assert parting is not None and parting.missed["offered_per_s"] == 30.6  # type: ignore[index]


def test_a_busy_or_thin_point_decides_nothing() -> None:
    current = served([row(20, 50, 45, 60), row(40, 150, 120, 180, busy=True)], 20)
    pick = served([row(20, 40, 35, 45), row(40, 60, 55, 70)], 40)
    assert beats(pick, current, SLO) is None  # yours missed 40 only while the machine was busy
    current.curve[-1]["busy"] = False  # type: ignore[index]
    assert beats(pick, current, SLO) is not None
    pick.curve[-1]["answers"] = MIN_ANSWERS - 1  # type: ignore[index]
    pick.curve[0]["answers"] = MIN_ANSWERS - 1  # type: ignore[index]
    assert beats(pick, current, SLO) is None  # the pick's holds rest on too few answers


def test_lost_requests_are_a_sure_miss_and_a_refused_current_loses_to_any_sure_hold() -> None:
    current = served([row(20, 50, 45, 60), row(40, 60, 55, 70, errors=3)], 20)
    pick = served([row(20, 40, 35, 45), row(40, 60, 55, 70)], 40)
    assert beats(pick, current, SLO) is not None  # yours lost requests at 40
    refused = served(None, 0.0)
    assert beats(pick, refused, SLO) is not None
    nothing = served([row(20, 140, 110, 190)], 0.0)
    assert beats(nothing, refused, SLO) is None  # held nothing surely: no win over anything


def test_of_several_winners_the_one_that_held_most_replaces() -> None:
    current = served([row(20, 150, 120, 180)], 0.0)
    first = served([row(20, 40, 35, 45)], 20)
    second = served([row(20, 40, 35, 45), row(40, 60, 55, 70)], 40)
    assert decide(current, [first, second], SLO, None)[0] is second  # type: ignore[index]


def test_the_predicted_to_held_ratio_is_said() -> None:
    assert "1.41x (within 1.5x)" in optimism([served([], 100, predicted=141)])
    text = optimism([served([], 30, predicted=163), served([], 46.4, predicted=131)])
    assert "2.82-5.43x" in text and "take its ranking, not its rates" in text
    assert "no ratio" in optimism([served([], 0.0, predicted=100)])


def test_the_calibration_scales_every_configurations_capacity() -> None:
    threads = {"preprocess": 1, "inference": 1, "postprocess": 1}
    cost = StageCosts({"micro_batch_size": 4, "parallelism": threads}, {4: 10.0}, {4: 8.0})
    # A batch of 4 in 10 ms: 400 req/s for the worker; the CPU: 2 cores, 5 + 2 ms a request.
    assert capacity_per_s(cost, 4, None, 2) == pytest.approx(400.0)
    assert capacity_per_s(cost, 4, 5.0, 2) == pytest.approx(2000 / 7)
    (free,) = plan([cost], [4], [1], 1000.0)
    (scaled,) = plan([cost], [4], [1], 1000.0, capacity_scale=0.25)  # served 100, not 400
    assert free.held_per_s == pytest.approx(4 * scaled.held_per_s, rel=0.05)
    assert scaled.held_per_s <= 100.0


def test_what_a_request_alone_takes_outside_the_stages_counts_in_every_p99() -> None:
    from ts_microbatch.tools.slo_confirm import Calibration, fit
    from ts_microbatch.tools.slo_plan import floor_ms

    threads = {"preprocess": 1, "inference": 1, "postprocess": 1}
    cost = StageCosts({"micro_batch_size": 4, "parallelism": threads}, {1: 5.0, 4: 10.0}, {})
    alone = floor_ms([cost], cost, 4, 1, 1.0)
    assert alone == pytest.approx(6.0)  # a batch of one, the 1 ms window waited out
    # The embedding workload: the server's P99 alone was 60 ms against the model's 17.
    (free,) = plan([cost], [4], [1], 100.0)
    (counted,) = plan([cost], [4], [1], 100.0, overhead_ms=60.0 - alone)
    assert counted.tail is not None and free.tail is not None
    assert counted.tail.p99_ms <= 100.0 and counted.held_per_s < free.held_per_s
    first = Candidate(cost.settings, 4, 1, counted.tail)
    said = fit(Calibration(2.0, 5.0, 390.0, 60.0), 400.0, alone, 1.0, first)
    assert len(said) == 1 and "one request at a time, the server's P99 was 60.0 ms" in said[0]
    assert fit(Calibration(2.0, 5.0, 390.0, 7.0), 400.0, alone, 1.0, first) == []
    capacity = fit(Calibration(2.0, 5.0, 100.0, 7.0), 400.0, alone, 1.0, first)
    assert len(capacity) == 1 and "answered 100.0 req/s" in capacity[0] and "4.00x" in capacity[0]


def test_a_thin_point_that_lost_a_request_decides_nothing_either() -> None:
    thin = row(4.2, 60, 50, 70, answers=252, requests=252, timeouts=1)
    current = served([thin], 0.0)
    pick = served([row(4.2, 40, 35, 45)], 4.2)
    assert beats(pick, current, SLO) is None  # 252 answers: not the current's limit


def test_a_pessimistic_calibration_never_holds_a_rate_the_frontend_alone_cannot_serve() -> None:
    # The review's case: scaled up by 1.1, the cap passed 1000 * cores / frontend ms; the
    # frontend left no core, the replay's P99 was NaN, and NaN passed as held.
    threads = {"preprocess": 1, "inference": 1, "postprocess": 1}
    batch_ms = {1: 0.5, 2: 0.6, 4: 0.7, 8: 0.8}
    cost = StageCosts({"micro_batch_size": 4, "parallelism": threads}, batch_ms, {8: 0.08})
    for scale in (1.1, 2.0, 3.9):
        (c,) = plan([cost], [8], [1], 50.0, None, 2.0, 2, 1.0, scale)
        assert c.held_per_s <= 1000.0 and (c.tail is None or c.tail.p99_ms == c.tail.p99_ms)
