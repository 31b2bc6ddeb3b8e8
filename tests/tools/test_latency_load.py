"""benchmarks/latency_load.py's report (never its speed): the rate each variant held within
each objective, the ratios at each variant family's best, and the workloads' defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import load_module

study = load_module("benchmarks/latency_load.py", "latency_load")


def point(offered: float, p99_ms: float, achieved: float | None = None) -> dict[str, Any]:
    return {
        "offered_per_s": offered,
        "realized_per_s": offered,
        "achieved_per_s": offered if achieved is None else achieved,
        "requests": 50,
        "p50_ms": p99_ms / 2,
        "p99_ms": p99_ms,
        "errors": 0,
        "timeouts": 0,
        "late_sends": 0,
        "queue_growth_ms": 0.0,
    }


def run(name: str, repeat: int, p99s: list[float]) -> dict[str, Any]:
    return {
        "handler": name,
        "repeat": repeat,
        "curve": [point(10.0 * (i + 1), p) for i, p in enumerate(p99s)],
    }


def test_report_gives_the_rate_held_within_each_objective_and_the_ratios_per_objective() -> None:
    rows = [
        run("upstream-w5", 1, [80, 120, 300]),
        run("upstream-w5", 2, [90, 260, 400]),
        run("ours-w5", 1, [50, 90, 200]),
        run("ours-w5", 2, [60, 95, 240]),
        run("ours-w50", 1, [150, 160, 170]),
        run("ours-w50", 2, [150, 160, 170]),
        run("plain-w50", 1, [300, 900, 2000]),
        run("plain-w50", 2, [300, 900, 2000]),
    ]
    names = ["plain-w50", "upstream-w5", "ours-w50", "ours-w5"]
    info = {"label": "x", "rounds": 2, "seed": 0, "seconds": 5.0}
    text = study.report(rows, names, [100.0, 250.0], info)
    assert "| upstream-w5 | **10** (10, 10) | **20** (10, 20) |" in text
    assert "| ours-w5 | **20** (20, 20) | **30** (30, 30) |" in text
    assert "| ours-w50 | **0** (0, 0) | **30** (30, 30) |" in text
    assert "| plain-w50 | **0** (0, 0) | **0** (0, 0) |" in text
    assert "Within P99 100 ms, ours at its best against upstream at its best window: 2.00x" in text
    # the better round of two is the median (the upper of the pair), as for the rates
    assert "Within P99 250 ms, ours at its best against upstream at its best window: 1.50x" in text


def test_the_plot_draws_every_round_of_every_variant(tmp_path: Path) -> None:
    rows = [run("plain-w5", 1, [300, float("inf")]), run("ours-w5", 1, [60, 70])]
    rows.append(run("ours-w5", 2, [65]))
    study.plot(rows, tmp_path / "p99.png", "x", 100.0)
    assert (tmp_path / "p99.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_workload_has_rates_and_an_objective_and_text_is_250_ms() -> None:
    for spec in study.WORKLOADS.values():
        assert spec["rates"] and spec["slo_p99_ms"] > 0
    assert study.WORKLOADS["text"]["slo_p99_ms"] == 250.0
    assert study.WORKLOADS["resnet18"]["rates"] == "4:40:4"


def test_p99_near_a_load_shows_every_round_and_the_round_that_stopped_before_it() -> None:
    rows = [run("ours-w5", 1, [50, 90, 200]), run("ours-w5", 2, [60, 95])]
    rows[0]["curve"][2].update(p99_low_ms=180.0, p99_high_ms=230.0)
    # The old figure was the median of the rounds that reached the rate: round 1's alone.
    assert study.p99_near(rows, "ours-w5", 29.0) == "30/s: 200 [180, 230] · -"


def test_the_report_compares_p99_at_equal_load_with_an_interval_and_says_the_niceness() -> None:
    import random

    def latencies(seed: int, scale: float) -> list[float]:
        rng = random.Random(seed)
        return [scale * rng.expovariate(1.0) for _ in range(1500)]

    rows = []
    for n in (1, 2, 3):
        for name, scale, p99s in (("ours-w5", 20.0, [50, 90]), ("upstream-w5", 60.0, [300, 400])):
            row = run(name, n, p99s)
            for i, p in enumerate(row["curve"]):
                p["latencies_ms"] = latencies(10 * n + i + (0 if name[0] == "o" else 5), scale)
                p["generator_nice"] = -10
            rows.append(row)
    info = {"label": "x", "rounds": 3, "seed": 0, "seconds": 5.0, "min_answers": 1500,
            "nice": -10}  # fmt: skip
    text = study.report(rows, ["upstream-w5", "ours-w5"], [100.0], info)
    assert "at least 1500 requests" in text
    assert "the generator asked for niceness -10 and ran at -10" in text
    assert "ours-w5 / upstream-w5 at 10 req/s offered: P99 0.3" in text
    assert text.count("**win**") == 2 and "throughput" not in text


def test_the_tabular_workload_serves_the_example_and_its_stages_under_each_baseline(
    tmp_path: Path,
) -> None:
    import json
    import zipfile

    sources, corpus = study.tabular_models({"head-example", "plain", "upstream"}, tmp_path)

    def read(model: str, name: str) -> Any:
        with zipfile.ZipFile(sources[model]) as mar:
            return json.loads(mar.read(name))

    handlers = {m: read(m, "MAR-INF/MANIFEST.json")["model"]["handler"] for m in sources}
    assert handlers == {
        "head-example": "tabular_handler.py",
        "plain": "plain_tabular_handler.py",
        "upstream": "upstream_tabular_handler.py",
    }
    # Upstream reads the example's micro-batch size and threads; ours is off beside it.
    upstream = read("upstream", "micro_batching.json")
    assert upstream["enabled"] is False and upstream["micro_batch_size"] == 8
    assert read("head-example", "micro_batching.json")["micro_batch_size"] == 8
    assert len(corpus.bodies) == 512
    assert {b.content_type for b in corpus.bodies} == {"application/json"}
    assert len(json.loads(corpus.bodies[0].data)["features"]) == 128
    assert study.WORKLOADS["tabular"]["slo_p99_ms"] == 25.0


def test_batch_sizes_give_ours_at_each_window_and_size_and_leave_the_baselines_alone() -> None:
    chosen = study.variants({"ours": [2], "upstream": [5]}, None, [8, 32])
    assert chosen["ours-w2-b8"] == ("head-example", (None, {"maxBatchDelay": 2, "batchSize": 8}))
    assert chosen["ours-w2-b32"][1][1] == {"maxBatchDelay": 2, "batchSize": 32}
    assert "ours-w2" not in chosen
    assert chosen["upstream-w5"] == ("upstream", (None, {"maxBatchDelay": 5}))


def test_a_malformed_windows_argument_is_refused_by_name_not_with_a_traceback(
    monkeypatch: Any, capsys: Any, tmp_path: Path
) -> None:
    import pytest

    for windows in ["1", "ours:", "ours:1,,5", "mine:5", "ours:1;plain"]:
        argv = ["latency_load.py", "--windows", windows, "--report-only", "--out", str(tmp_path)]
        monkeypatch.setattr("sys.argv", argv)
        with pytest.raises(SystemExit) as exited:
            study.main()
        assert exited.value.code == 2
        assert "--windows: expected MODEL:MS[,MS...]" in capsys.readouterr().err
