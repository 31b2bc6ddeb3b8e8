"""benchmark-ab.py's config and plots (benchmarks/bench_lib.py) and the statistics it shares
with ts-microbatch-benchmark (ts_microbatch.tools.runs, .measure), never its speed; reading
`ab`'s output is tested with benchmarks/ab.py in test_ab.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_module
from ts_microbatch.tools import runs

bench = load_module("benchmarks/bench_lib.py", "bench_lib")


def test_statistics() -> None:
    assert runs.summarize([1.0, 2.0, 3.0]) == {"mean": 2.0, "p50": 2.0, "p99": 3.0}


def test_ideal_throughput_adds_up_stages_that_share_the_cpu() -> None:
    rates = {"server": 500.0, "preprocess": 500.0, "inference": 1000.0}
    assert bench.ideal_throughput(rates) == 500.0
    assert bench.ideal_throughput(rates, shared_cpu=("server", "preprocess")) == pytest.approx(
        250.0
    )
    assert bench.ideal_throughput(
        rates, shared_cpu=("server", "preprocess", "inference")
    ) == pytest.approx(200.0)


def test_config_defaults_sweeps_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "url": "m.mar",
                "requests": 100,
                "workers": "1",
                "batch_size": [8, 32],
                "micro_batch_size": [2, 4],
            }
        )
    )
    config = bench.load_config(path)
    assert config["workers"] == 1 and config["concurrency"] == 64
    points = bench.sweep_points(config)
    assert len(points) == 4 and points[0] == {
        "body": "720px",
        "requests": 100,
        "batch_size": 8,
        "micro_batch_size": 2,
        "max_batch_delay": 50,
        "concurrency": 64,
        "workers": 1,
        "parallelism": "2/1/2",
        "micro_batching": {
            "micro_batch_size": 2,
            "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
        },
    }
    assert len({bench.point_tag(p) for p in points}) == 4
    path.write_text(json.dumps({"requets": 10}))
    with pytest.raises(bench.BenchConfigError, match="unknown key 'requets'"):
        bench.load_config(path)
    path.write_text(json.dumps({"batch_size": [8, 0]}))
    with pytest.raises(bench.BenchConfigError, match="batch_size: got 0"):
        bench.load_config(path)
    path.write_text(json.dumps({"requests": 100, "concurrency": [1, 200]}))
    with pytest.raises(bench.BenchConfigError, match="requests: got 100, expected at least"):
        bench.load_config(path)
    path.write_text(json.dumps({"handlers": ["mine"]}))
    with pytest.raises(bench.BenchConfigError, match="handlers: got 'mine'"):
        bench.load_config(path)
    path.write_text(json.dumps({"micro_batch_size": [4, "big"]}))
    with pytest.raises(bench.BenchConfigError, match="micro_batch_size: got 'big'"):
        bench.load_config(path)
    path.write_text(json.dumps({"scenarios": ["mar"]}))
    with pytest.raises(bench.BenchConfigError, match="'mar' needs"):
        bench.load_config(path)
    path.write_text(json.dumps({"metrics_mode": "statsd"}))
    with pytest.raises(bench.BenchConfigError, match="metrics_mode: got 'statsd'"):
        bench.load_config(path)
    path.write_text(json.dumps({"bodies": ["8k"]}))
    with pytest.raises(bench.BenchConfigError, match="bodies: got '8k', expected one of 720px"):
        bench.load_config(path)
    path.write_text(json.dumps({"bodies": [{"body": "12mp", "concurency": 8}]}))
    with pytest.raises(bench.BenchConfigError, match="expected a name or a mapping"):
        bench.load_config(path)


def test_bodies_are_a_sweep_with_their_own_concurrency_and_requests(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    bodies = ["720px", {"body": "12mp", "concurrency": 32, "requests": 300}, "mix"]
    path.write_text(json.dumps({"requests": 1500, "concurrency": 64, "bodies": bodies}))
    points = bench.sweep_points(bench.load_config(path))
    assert [(p["body"], p["concurrency"], p["requests"]) for p in points] == [
        ("720px", 64, 1500),
        ("12mp", 32, 300),
        ("mix", 64, 1500),
    ]
    assert len({bench.point_tag(p) for p in points}) == 3


def test_auto_parallelism_sweeps_and_explicit_micro_batching_configs(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "micro_batch_size": [4, "auto"],
                "parallelism": [{"preprocess": 1}, {"preprocess": 2, "postprocess": 2}],
            }
        )
    )
    points = bench.sweep_points(bench.load_config(path))
    assert [(p["micro_batch_size"], p["parallelism"]) for p in points] == [
        (4, "1/1/1"),
        (4, "2/1/2"),
        ("auto", "1/1/1"),
        ("auto", "2/1/2"),
    ]
    explicit = [
        {"micro_batch_size": 8, "parallelism": {"preprocess": 2}},
        {"micro_batch_size": 8, "parallelism": {"preprocess": 2}, "max_queued_micro_batches": 1},
    ]
    path.write_text(json.dumps({"micro_batching": explicit, "batch_size": [16, 32]}))
    points = bench.sweep_points(bench.load_config(path))
    assert [p["micro_batching"] for p in points] == explicit * 2
    assert len({bench.point_tag(p) for p in points}) == 4  # names stay apart
    path.write_text(json.dumps({"workers": ["1", 2]}))  # the reference writes "1"
    assert [p["workers"] for p in bench.sweep_points(bench.load_config(path))] == [1, 2]
    path.write_text(json.dumps({"workers": [1, "two"]}))
    with pytest.raises(bench.BenchConfigError, match="workers: got 'two'"):
        bench.load_config(path)
    path.write_text(json.dumps({"micro_batching": [{"parallelism": {"inference": 0}}]}))
    with pytest.raises(
        bench.BenchConfigError, match=r"micro_batching\[0\]: .*parallelism.inference: got 0"
    ):
        bench.load_config(path)


def test_shipped_config_is_valid() -> None:
    config = bench.load_config(Path(__file__).resolve().parents[2] / "benchmarks/config.json")
    assert set(config["handlers"]) == {"plain", "upstream", "ours"}


def test_outputs(tmp_path: Path) -> None:
    rows = [
        {
            "scenario": "accelerator",
            "handler": h,
            "batch_size": b,
            "micro_batch_size": 4,
            "max_batch_delay": 50,
            "concurrency": 64,
            "requests_per_s": float(b * k),
            "p50_ms": 10.0,
            "p99_ms": 20.0 * k,
            "errors": 0,
            "ideal_requests_per_s": 300.0,
            "efficiency": b * k / 300.0,
            "stage_rates": {"server": 1.0},
        }
        for k, h in enumerate(["plain", "upstream", "ours"], start=1)
        for b in (8, 32)
    ]
    png = tmp_path / "plot.png"
    assert bench.plot_sweep(rows, png, "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not bench.plot_sweep(rows[:1], tmp_path / "none.png", "one point")
    runs.write_csv(rows, tmp_path / "r.csv")
    header = (tmp_path / "r.csv").read_text().splitlines()[0]
    assert "requests_per_s" in header and "stage_rates" not in header
    table = runs.format_table(rows)
    assert "NO MB" not in table and table.count("\n") == len(rows) + 1
    # A micro-batch size sweep with "auto" plots on a categorical axis.
    sizes = [dict(rows[-1], micro_batch_size=m) for m in (2, 8, "auto")]
    assert bench.plot_sweep(sizes, tmp_path / "sizes.png", "sizes", "micro_batch_size")


def test_comparisons_are_ratios_within_each_round() -> None:
    measured = [
        {
            "scenario": "accelerator",
            "handler": h,
            "repeat": r,
            "requests_per_s": rate,
            "p99_ms": p99,
        }
        | {"body": "12mp", "batch_size": 32, "micro_batch_size": 4, "max_batch_delay": 50}
        | {"concurrency": 32, "workers": 1, "parallelism": "2/1/2", "micro_batching": {}}
        for h, r, rate, p99 in [
            ("upstream", 1, 10.0, 1000.0),
            ("ours-same", 1, 11.0, 900.0),
            ("ours", 1, 40.0, 300.0),
            ("upstream", 2, 20.0, 500.0),
            ("ours-same", 2, 20.0, 500.0),
            ("ours", 2, 60.0, 250.0),
        ]
    ]
    same, best = runs.compare_rounds(measured, bench.COMPARISONS, bench.point_tag)
    assert same["comparison"] == "ours-same / upstream" and same["body"] == "12mp"
    assert [r["throughput"] for r in same["rounds"]] == pytest.approx([1.1, 1.0])
    assert best["median_throughput"] == pytest.approx((4.0 + 3.0) / 2)
    assert [r["p99"] for r in best["rounds"]] == pytest.approx([0.3, 0.5])
