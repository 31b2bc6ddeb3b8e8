"""``ts-microbatch-benchmark --rates``' summary compares P99 at equal offered load, with an
interval, and the rate each round held: never the schedule's throughput (no server run)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.tools.test_outputs import benchmark_args
from ts_microbatch.tools import benchmark


def point(offered: float, scale_ms: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    latencies = sorted(scale_ms * rng.expovariate(1.0) for _ in range(1500))
    return {
        "offered_per_s": offered, "realized_per_s": offered, "achieved_per_s": offered,
        "requests": 1500, "answers": 1500, "p50_ms": latencies[749], "p90_ms": latencies[1349],
        "p99_ms": latencies[1484], "p99_low_ms": latencies[1475], "p99_high_ms": latencies[1492],
        "errors": 0, "timeouts": 0, "late_sends": 0, "queue_growth_ms": 0.0,
        "latencies_ms": latencies,
    }  # fmt: skip


def test_rates_summary_printed_the_schedules_throughput_ratio_now_p99_at_equal_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every variant is offered the same schedule, so "throughput 1.00x" was the schedule's
    # ratio, printed as if it compared the variants.
    def measure(server_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        name, repeat = server_dir.name.rsplit("-r", 1)
        scale = 20.0 if name == "ours" else 40.0  # ours: half plain's latency at 10 req/s
        curve = [point(10, scale, int(repeat)), point(20, 40.0, 10 + int(repeat))]
        return {"requests_per_s": 15.0, "p99_ms": 100.0, "p50_ms": 50.0, "errors": 0,
                "curve": curve}  # fmt: skip

    monkeypatch.setattr(benchmark, "measure", measure)
    args = benchmark_args(tmp_path, tmp_path / "out")
    args.rates, args.slo_p99_ms = [10.0, 20.0], 1000.0
    assert benchmark.run(args, None, tmp_path) == 0
    printed = capsys.readouterr().out
    assert "throughput" not in printed.split("every run")[1]  # the scenario's old line
    assert "ours / plain at 10 req/s offered: P99 0.5" in printed and "**win**" in printed
    assert "ours / plain at 20 req/s offered" in printed and "**no difference**" in printed
    assert "ours: held 20, 20 req/s within P99 1000 ms" in printed
    saved = json.loads((tmp_path / "out" / "comparisons.json").read_text())
    assert {c["call"] for c in saved} == {"win", "no difference"}
