"""Reading `ab`'s output (benchmarks/ab.py), for the benchmark scripts measured with it."""

from __future__ import annotations

import pytest

from tests.helpers import load_module

ab = load_module("benchmarks/ab.py", "ab")

AB_OUTPUT = """This is ApacheBench, Version 2.3 <$Revision: 1903618 $>
Benchmarking 127.0.0.1 (be patient)

Server Software:
Document Length:        2 bytes

Concurrency Level:      64
Time taken for tests:   5.614 seconds
Complete requests:      1500
Failed requests:        3
   (Connect: 0, Receive: 0, Length: 3, Exceptions: 0)
Non-2xx responses:      2
Keep-Alive requests:    1500
Requests per second:    267.19 [#/sec] (mean)
Time per request:       239.531 [ms] (mean)
"""

PERCENTILES = "Percentage served,Time in ms\n" + "\n".join(f"{p},{p * 2.5}" for p in range(101))


def test_parse_ab_summary() -> None:
    assert ab.parse_ab(AB_OUTPUT) == {
        "complete_requests": 1500.0,
        "failed_requests": 0.0,
        "length_mismatches": 3.0,
        "non_2xx_responses": 2.0,
        "requests_per_s": 267.19,
        "time_taken_s": 5.614,
    }
    clean = AB_OUTPUT.replace("Non-2xx responses:      2\n", "")
    assert ab.parse_ab(clean)["non_2xx_responses"] == 0.0
    with pytest.raises(ValueError, match="ab output has no"):
        ab.parse_ab("ab died")


def test_parse_percentiles() -> None:
    assert ab.parse_percentiles(PERCENTILES) == {
        "p50_ms": 125.0,
        "p90_ms": 225.0,
        "p99_ms": 247.5,
        "max_ms": 250.0,
    }


def test_a_mix_of_ab_runs_adds_counts_and_takes_percentiles_over_every_request() -> None:
    gnuplot = "starttime\tseconds\tctime\tdtime\tttime\twait\n" + "".join(
        f"Mon Nov 23 2026\t1795000000\t0\t{t}\t{t}\t{t}\n" for t in range(1, 101)
    )
    times = ab.parse_gnuplot(gnuplot)
    assert times == [float(t) for t in range(1, 101)]
    run = ab.parse_ab(AB_OUTPUT)
    summary, latency = ab.merge_ab([run, {**run, "time_taken_s": 11.228}], times)
    assert summary["complete_requests"] == 3000 and summary["non_2xx_responses"] == 4
    assert summary["requests_per_s"] == pytest.approx(3000 / 11.228)
    assert (latency["p50_ms"], latency["p99_ms"], latency["max_ms"]) == (50.0, 99.0, 100.0)
