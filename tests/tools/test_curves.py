"""Latency-load curves: rates parsed, the sweep's stopping rule, the objective read off a
curve, the plot (ts_microbatch.tools.curves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ts_microbatch.tools import curves


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
def test_bad_rates_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(ValueError, match="--rates"):
        curves.parse_rates(text)


class FakeResult:
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
    results = curves.sweep("http://x/", [b"a"], [50, 90, 200, 400, 800],
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


def test_the_plot_has_every_variant(tmp_path: Path) -> None:
    data = {"plain": [row(50, 50, 300), row(100, 60, float("inf"))],
            "ours": [row(50, 50, 60), row(100, 100, 70)]}  # fmt: skip
    path = curves.plot(data, tmp_path / "out" / "p99.png", slo_p99_ms=100)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = curves.format_curves(data, 100)
    assert "**ours**, holds 100 req/s within P99 100 ms" in table
    assert "**plain**, holds 0 req/s" in table


def test_a_point_is_behind_when_its_queue_grows_or_answers_fall_short() -> None:
    assert not curves.behind(row(100, 98, 80, queue_growth_ms=30))
    assert curves.behind(row(100, 98, 80, queue_growth_ms=400))
    assert curves.behind(row(100, 80, 80))
    assert not curves.behind(row(100, 80, 80, realized_per_s=85))  # the draw was slow
    assert not curves.sustained([row(100, 99, 80, queue_growth_ms=400)], 100)
