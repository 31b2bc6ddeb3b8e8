"""Latency-load curves: rates parsed, the sweep's stopping rule, the objective read off a
curve, the report (ts_microbatch.tools.curves, curve_report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ts_microbatch.tools import curve_report, curves


def row(offered: float, achieved: float, p99: float, **extra: Any) -> dict[str, Any]:
    base = {
        "offered_per_s": offered,
        "achieved_per_s": achieved,
        "p50_ms": p99 / 3,
        "p90_ms": p99 / 2,
        "p99_ms": p99,
        "errors": 0,
        "timeouts": 0,
        "late_sends": 0,
    }
    return {**base, **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "rates"),
    [("20,40,80", [20.0, 40.0, 80.0]), ("20:100:20", [20.0, 40.0, 60.0, 80.0, 100.0]),
     ("0.5:1.5:0.5", [0.5, 1.0, 1.5])],
)  # fmt: skip
def test_rates_are_a_list_or_a_range(text: str, rates: list[float]) -> None:
    assert curves.parse_rates(text) == rates


@pytest.mark.parametrize("text", ["", "a,b", "0,10", "-5", "40,20", "20:10:0", "20,20"])
def test_bad_rates_are_refused_saying_what_was_expected(text: str) -> None:
    # argparse names the option ("argument --rates: got ..."): the message does not again.
    with pytest.raises(ValueError, match=f"got {text!r}, expected"):
        curves.parse_rates(text)


class FakeResult:
    other_cpu_cores = float("nan")  # not measured
    busy_retried_cores = None

    def __init__(self, summary: dict[str, Any]) -> None:
        self._summary = summary

    def summary(self) -> dict[str, Any]:
        return self._summary


def test_the_sweep_stops_one_rate_after_the_model_fell_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capacity = 100.0
    offered: list[tuple[float, int]] = []

    def fake_run(url: str, bodies: Any, rate: float, count: int, **kw: Any) -> FakeResult:
        offered.append((rate, count))
        return FakeResult(row(rate, min(rate, capacity), 50 if rate <= capacity else 5000))

    monkeypatch.setattr(curves, "run_open_loop", fake_run)
    results = curves.sweep("http://x/", [b"a"], [50, 90, 200, 400, 800], meter=None,
                           requests_per_rate=lambda rate: int(rate * 2))  # fmt: skip
    rows = [result.summary() for result in results]
    assert [r["offered_per_s"] for r in rows] == [50, 90, 200, 400]  # 200 behind, 400 shown
    assert [count for _, count in offered] == [100, 180, 400, 800]  # ~2 s a point


def test_the_objective_is_read_as_the_highest_rate_held_without_loss() -> None:
    rows = [
        row(50, 50, 40), row(100, 99, 80), row(150, 149, 95, errors=1),
        row(200, 170, 90), row(250, 240, 120),
    ]  # fmt: skip
    assert curves.sustained(rows, 100) == 100  # 150 lost one, 200 fell behind
    assert curves.sustained(rows, 10) == 0


def test_each_variant_says_the_rate_each_round_held() -> None:
    runs = [
        {"handler": "plain", "repeat": 1, "curve": [row(50, 50, 300), row(100, 60, float("inf"))]},
        {"handler": "ours", "repeat": 1, "curve": [row(50, 50, 60), row(100, 100, 70)]},
        {"handler": "ours", "repeat": 2, "curve": [row(50, 50, 65)]},
    ]
    table = curve_report.format_curves(runs, 100)
    assert "**ours**, holds 100, 50 req/s within P99 100 ms (round by round)" in table
    assert "**plain**, holds 0 req/s" in table


def test_a_point_is_behind_when_its_queue_grows_or_answers_fall_short() -> None:
    assert not curves.behind(row(100, 98, 80, queue_growth_ms=30))
    assert curves.behind(row(100, 98, 80, queue_growth_ms=400))
    assert curves.behind(row(100, 80, 80))
    assert not curves.behind(row(100, 80, 80, realized_per_s=85))  # the draw was slow
    assert not curves.sustained([row(100, 99, 80, queue_growth_ms=400)], 100)


def test_a_p99_of_a_few_seconds_a_rate_rests_on_enough_answers() -> None:
    # 5 s at 4 req/s was 20 answers: their maximum was the P99. A point now lasts until it
    # has 1,500, or longer when the seconds configured give more.
    assert curves.requests_for(4, 5) == 1500
    assert curves.requests_for(390, 5) == 1950
    assert curves.requests_for(4, 5, min_answers=50) == 50


class FakeMeter:
    """ts_microbatch.tools.curves.OtherCpu with readings given: each start/stop pair returns
    the next of ``cores``."""

    def __init__(self, cores: list[float]) -> None:
        self.cores = cores
        self.started = 0

    def __call__(self) -> FakeMeter:
        return self

    def start(self) -> None:
        self.started += 1

    def stop(self) -> float:
        return self.cores.pop(0)


def fake_sweep(monkeypatch: pytest.MonkeyPatch, meter: FakeMeter, rates: list[float]) -> Any:
    seeds: list[int] = []

    class Result(FakeResult):
        def summary(self) -> dict[str, Any]:
            return {**super().summary(), "other_cpu_cores": self.other_cpu_cores,
                    "busy": self.other_cpu_cores > 0.1, "busy_retried_cores":
                    self.busy_retried_cores}  # fmt: skip

    def fake_run(url: str, bodies: Any, rate: float, count: int, **kw: Any) -> Result:
        seeds.append(kw["seed"])
        return Result(row(rate, rate, 50))

    monkeypatch.setattr(curves, "run_open_loop", fake_run)
    results = curves.sweep("http://x/", [b"a"], rates, requests_per_rate=10, meter=meter)
    return [r.summary() for r in results], seeds


def test_busy_run_a_point_others_took_cpu_during_is_run_once_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Others used 0.5 cores during the first try at 20 req/s, then 0.02.
    meter = FakeMeter([0.01, 0.5, 0.02])
    rows, seeds = fake_sweep(monkeypatch, meter, [10, 20])
    assert meter.started == 3 and len(seeds) == 3  # the scenario: 20 req/s ran twice
    assert seeds[1] != seeds[2]  # a new draw, not the same arrivals again
    assert [r["busy"] for r in rows] == [False, False]
    assert rows[1]["busy_retried_cores"] == 0.5 and rows[0]["busy_retried_cores"] is None


def test_busy_run_busy_twice_is_kept_flagged_and_not_run_a_third_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    meter = FakeMeter([0.3, 0.4])
    rows, seeds = fake_sweep(monkeypatch, meter, [10])
    assert len(seeds) == 2 and meter.cores == []
    assert rows[0]["busy"] and rows[0]["other_cpu_cores"] == 0.4
    assert rows[0]["busy_retried_cores"] == 0.3


def test_others_cpu_is_the_machines_busy_time_less_ours_over_the_run() -> None:
    from ts_microbatch.tools.curves import OtherCpu
    from ts_microbatch.tools.openloop import OpenLoopResult, Sent

    def busy(cores: float) -> bool:  # as a point's summary flags it
        sends = [Sent(0.0, 0.0, 0.01, 200)]
        return bool(OpenLoopResult(10.0, sends, 0.01, 0.0, other_cpu_cores=cores).summary()["busy"])

    readings = {"machine": [100.0, 103.0], "ours": [40.0, 41.5], "clock": [0.0, 10.0]}
    meter = OtherCpu(*(lambda k=k: readings[k].pop(0) for k in ("machine", "ours", "clock")))
    meter.start()
    cores = meter.stop()
    assert cores == pytest.approx(0.15)  # (3.0 - 1.5) s over 10 s
    assert busy(cores) and not busy(0.05) and not busy(float("nan"))


def latency_point(offered: float, latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {**row(offered, offered, ordered[int(0.99 * len(ordered))]),
            "latencies_ms": latencies}  # fmt: skip


def draws(seed: int, scale: float, n: int = 1500) -> list[float]:
    import random

    rng = random.Random(seed)
    return [scale * rng.expovariate(1.0) for _ in range(n)]


def test_p99_is_compared_at_equal_load_and_called_only_when_the_interval_says_so() -> None:
    runs = []
    for n in (1, 2):  # ours: half plain's latency at 10 req/s, the same at 20
        plain = [latency_point(10, draws(n, 100)), latency_point(20, draws(n + 10, 100))]
        ours = [latency_point(10, draws(n + 20, 50)), latency_point(20, draws(n + 30, 100))]
        runs.append({"handler": "plain", "repeat": n, "curve": plain})
        runs.append({"handler": "ours", "repeat": n, "curve": ours})
    found = curve_report.compare_curves(runs, [("ours", "plain")])
    assert [(c["offered_per_s"], c["call"]) for c in found] == [(10, "win"), (20, "no difference")]
    assert found[0]["high"] < 1 and found[1]["low"] <= 1 <= found[1]["high"]
    assert all(c["pooled"] and c["all_rounds"] and c["rounds"] == [1, 2] for c in found)
    text = curve_report.format_comparisons(found)
    assert "ours / plain at 10 req/s offered: P99 0.5" in text and "**win**" in text
    assert "**no difference**" in text and "throughput" not in text


def test_median_over_rounds_that_reached_different_points_a_point_only_some_reached_is_marked(
    tmp_path: Path,
) -> None:
    # Round 1 reached 30 req/s, round 2 stopped at 20: the 30 req/s line is round 1's
    # alone, and says so; no figure is a median over the rounds.
    runs = [
        {"handler": "ours", "repeat": 1,
         "curve": [row(10, 10, 40), row(20, 20, 60), row(30, 30, 90)]},
        {"handler": "ours", "repeat": 2, "curve": [row(10, 10, 44), row(20, 15, 900)]},
    ]  # fmt: skip
    table = curve_report.write_curves(tmp_path, runs, None)
    lines = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert "| all | 10.0 · 10.0 | 40 · 44 |" in lines["| 10"]
    assert "| only 1 of 2 † | 30.0 · - | 90 · - |" in lines["| 30"]
    assert "† a rate only those rounds reached" in table
    saved = json.loads((tmp_path / "curves.json").read_text())
    assert "medians" not in saved and len(saved["runs"]) == 2
    assert not (tmp_path / "p99.png").exists()  # benchmarks/latency_load.py draws it


def test_a_busy_point_decides_nothing_and_every_verdict_names_its_answers() -> None:
    # Issue 50: a user's study flagged the first rate of every server BUSY, and its summary
    # still called a win from those points. Round 2 at 10 req/s is busy here: the verdict
    # rests on round 1 alone; at 5 req/s every round is busy: no verdict.
    runs = []
    for n in (1, 2):
        plain = [latency_point(5, draws(n, 100)), latency_point(10, draws(n + 10, 100))]
        ours = [latency_point(5, draws(n + 20, 10)), latency_point(10, draws(n + 30, 50))]
        ours[0]["busy"] = True
        if n == 2:
            plain[1]["busy"] = True
        runs.append({"handler": "plain", "repeat": n, "curve": plain})
        runs.append({"handler": "ours", "repeat": n, "curve": ours})
    found = curve_report.compare_curves(runs, [("ours", "plain")])
    assert [(c["offered_per_s"], c["call"]) for c in found] == [(5, "no verdict"), (10, "win")]
    assert found[0]["busy_rounds"] == [1, 2]
    assert found[1]["rounds"] == [1] and found[1]["busy_rounds"] == [2]
    text = curve_report.format_comparisons(found)
    five, ten = text.splitlines()
    assert "no verdict, every round's point was busy" in five and "**" not in five
    assert "busy, left out: rounds 2" in ten and "at least 1500 answers a P99" in ten


def test_achieved_above_offered_is_explained() -> None:
    runs = [{"handler": "ours", "repeat": 1, "curve": [row(80, 87.8, 40)]}]
    assert "seeded random (Poisson) arrivals" in curve_report.format_curves(runs, None)


class Sent:
    status = 200
    latency_s = 0.01


class SweptPoint(FakeResult):
    sends = [Sent()] * 3
    elapsed_s = 1.0
    cpu_s = 0.1

    def latencies_ms(self) -> list[float]:
        return [10.0] * 3


@pytest.mark.parametrize("floor_requests", [0, 1500])
def test_the_floor_is_measured_after_the_warm_up_before_the_run_is(
    monkeypatch: pytest.MonkeyPatch, floor_requests: int
) -> None:
    from ts_microbatch.tools.corpus import Body, Corpus

    order: list[tuple[str, int]] = []

    def fake_floor(url: str, corpus: Any, requests: int, *, token: Any = None) -> dict[str, Any]:
        order.append(("floor", requests))
        return {"requests": requests, "answers": requests, "errors": 0, "p50_ms": 9.0,
                "p99_ms": 12.0, "p99_low_ms": 11.0, "p99_high_ms": 14.0}  # fmt: skip

    def fake_warm_up(url: str, corpus: Any, requests: int, clients: int, **kw: Any) -> Any:
        order.append(("warm-up", requests))
        return {}, {}

    def fake_sweep(url: str, bodies: Any, rates: list[float], **kw: Any) -> list[SweptPoint]:
        order.append(("sweep", len(rates)))
        for rate in rates:
            kw["progress"](row(rate, rate, 30, other_cpu_cores=float("nan"), busy=False,
                               p99_low_ms=25, p99_high_ms=35, requests=3), "")  # fmt: skip
        return [SweptPoint(row(rate, rate, 30)) for rate in rates]

    monkeypatch.setattr(curves, "floor", fake_floor)
    monkeypatch.setattr(curves, "send_corpus", fake_warm_up)
    monkeypatch.setattr(curves, "sweep", fake_sweep)

    def fake_open_loop(url: str, bodies: Any, rate: float, count: int, **kw: Any) -> None:
        order.append(("settling", rate, count))

    monkeypatch.setattr(curves, "run_open_loop", fake_open_loop)
    logs: list[str] = []
    corpus = Corpus("one", (Body("x", b"x", "text/plain"),))
    sender = curves.CurveSender(
        corpus, [20.0, 10.0, 40.0], 1.0, 4, logs.append, floor_requests=floor_requests
    )
    url = "http://127.0.0.1:1/p"
    for _ in range(2):  # warming until the frontend's JIT settles: open loop, no floor yet
        sender(url, None, 8, Path("."), "ours settling")
    # the sweep's middle rate for a slice (2 s): the paths the sweep's small batches take
    assert order == [("settling", 20.0, 40)] * 2
    del order[:]
    sender(url, None, 8, Path("."), "ours warm-up")
    # measure() reads the run's CPU and metrics here: the floor must be behind us
    measured_from = len(order)
    summary, _ = sender(url, None, 1, Path("."), "ours")
    runs = [{"handler": "ours", "repeat": 1, "curve": summary["curve"], **summary}]
    table = curve_report.format_curves(runs, None)
    if not floor_requests:
        assert order == [("warm-up", 8), ("sweep", 3)] and "floor" not in summary
        assert "one request at a time" not in table
        return
    assert order == [("warm-up", 8), ("floor", 1500), ("sweep", 3)]
    assert ("floor", 1500) not in order[measured_from:]
    assert summary["floor"]["p99_ms"] == 12.0
    assert any("one at a time, P99 12.0 ms [11.0, 14.0] of 1500" in line for line in logs)
    assert "its window included: P99 ms 12 [11, 14] of 1500" in table
    # the next run's floor is its own: none is carried over, and without a warm-up the
    # floor is measured before the sweep
    order.clear()
    again, _ = sender(url, None, 1, Path("."), "ours")
    assert order == [("floor", 1500), ("sweep", 3)] and again["floor"]["p99_ms"] == 12.0
