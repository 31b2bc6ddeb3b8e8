"""Fair rounds in ts-microbatch-benchmark (ts_microbatch.tools.runs, cpu): each round's
order shuffled from a recorded seed, each run's CPU per request in the tables, and a
warning when a variant's CPU per request moves by more than a quarter between rounds.
The servers are fakes; no timings."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.tools.test_outputs import benchmark_args
from ts_microbatch.tools import benchmark, runs
from ts_microbatch.tools.cpu import CpuReading, cpu_per_request

NAMES = ["plain", "ours", "arrival", "mbs8"]


def test_each_round_is_shuffled_from_the_seed_and_repeatable() -> None:
    for seed in (1, 2, 3):
        orders = [runs.round_order(NAMES, r, seed) for r in range(6)]
        assert orders == [runs.round_order(NAMES, r, seed) for r in range(6)]
        assert all(sorted(order) == sorted(NAMES) for order in orders)
        assert len({tuple(order) for order in orders}) > 1
    # Round 1 is shuffled too: with some seeds it does not start with the baseline.
    assert {runs.round_order(NAMES, 0, seed)[0] for seed in range(1, 30)} == set(NAMES)
    assert runs.round_order(NAMES, 0, 5) != runs.round_order(NAMES, 0, 6)


def test_compare_keeps_its_orders_round_one_as_given_then_seeded_by_the_round() -> None:
    # benchmarks/compare.py's committed results were taken with these orders.
    assert runs.round_order(NAMES, 0, first_as_given=True) == NAMES
    for round_no in range(1, 5):
        before = list(NAMES)
        random.Random(round_no).shuffle(before)
        assert runs.round_order(NAMES, round_no, first_as_given=True) == before


def run(handler: str, repeat: int, frontend: float, worker: float) -> dict[str, Any]:
    return {
        "handler": handler,
        "repeat": repeat,
        "position": 1,
        "requests_per_s": 100.0,
        "p99_ms": 50.0,
        "frontend_cpu_ms_per_request": frontend,
        "workers_cpu_ms_per_request": worker,
    }


def test_a_variant_whose_cpu_per_request_moves_by_a_quarter_is_the_machine() -> None:
    # The incident: the baseline's worker CPU per request doubled in rounds 2-3 on a busy
    # machine, and the printed 2.00x median came from those rounds.
    measured = [
        run("plain", 1, 1.0, 5.0),
        run("ours", 1, 1.0, 5.0),
        run("plain", 2, 1.1, 10.1),
        run("ours", 2, 1.0, 5.2),
        run("plain", 3, 1.0, 9.8),
        run("ours", 3, 1.2, 5.1),
    ]
    (warning,) = runs.cpu_drift(measured)
    assert warning.startswith("plain: worker CPU per request moved 2.02x between rounds")
    assert "round 1 5.00, round 2 10.10, round 3 9.80 ms" in warning
    assert "the machine changed, not the variant" in warning
    # A quarter is allowed; more is not; a run without a CPU reading is left out.
    assert runs.cpu_drift([run("ours", 1, 1.0, 4.0), run("ours", 2, 1.0, 5.0)]) == []
    moved = [run("ours", 1, 1.0, 4.0), run("ours", 2, 1.26, 4.0)]
    assert runs.cpu_drift(moved)[0].startswith("ours: frontend CPU per request moved 1.26x")
    missing = run("ours", 2, 1.0, 4.0)
    del missing["workers_cpu_ms_per_request"]
    assert runs.cpu_drift([run("ours", 1, 1.0, 9.0), missing]) == []


def test_cpu_per_request_is_the_difference_of_two_readings_over_the_requests() -> None:
    before = CpuReading(2.0, 10.0, {"tsmb-preprocess": (4.0, 100), "other": (1.0, 10)})
    after = CpuReading(2.5, 12.0, {"tsmb-preprocess": (5.5, 300), "other": (1.5, 10)})
    cpu = cpu_per_request(before, after, 100)
    assert cpu["frontend_cpu_ms_per_request"] == pytest.approx(5.0)
    assert cpu["workers_cpu_ms_per_request"] == pytest.approx(20.0)
    assert cpu["worker_threads_ms_per_request"] == pytest.approx(
        {"other": 5.0, "tsmb-preprocess": 15.0}
    )
    assert cpu["worker_threads_wakeups_per_request"]["tsmb-preprocess"] == pytest.approx(2.0)


def busy_machine_measure() -> Any:
    """Every run's result with CPU per request: the baseline's worker doubles from round 2."""

    def measure(server_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        name, repeat = server_dir.name.rsplit("-r", 1)
        worker = 10.0 if name == "plain" and repeat != "1" else 5.0
        return {
            "requests_per_s": 100.0 if name == "plain" else 150.0,
            "p99_ms": 100.0,
            "errors": 0,
            "frontend_cpu_ms_per_request": 1.0,
            "workers_cpu_ms_per_request": worker,
        }

    return measure


def test_the_benchmark_shuffles_its_rounds_shows_cpu_and_warns_of_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(benchmark, "measure", busy_machine_measure())
    args = benchmark_args(tmp_path, tmp_path / "out")
    args.rounds, args.seed = 3, None
    args.variant = [("arrival", {"order": "arrival"})]
    assert benchmark.run(args, None, tmp_path) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    seed = results["seed"]
    assert isinstance(seed, int) and f"seed {seed}" in printed
    names = ["plain", "plain1", "ours", "arrival"]
    orders = results["round_orders"]
    assert orders == {str(r + 1): runs.round_order(names, r, seed) for r in range(3)}
    # Every run's CPU per request in the tables, and the machine's drift named.
    assert "frontend_cpu_ms_per_request | workers_cpu_ms_per_request" in printed
    per_run = printed.split("every run")[1]
    assert per_run.count("| 1.00 | 5.00") == 10 and per_run.count("| 1.00 | 10.00") == 2
    (warning,) = results["cpu_warnings"]
    assert warning.startswith("plain: worker CPU per request moved 2.00x")
    assert f"WARNING {warning}" in printed
    # The same seed gives the same orders.
    again = benchmark_args(tmp_path, tmp_path / "again")
    again.rounds, again.seed, again.variant = 3, seed, args.variant
    assert benchmark.run(again, None, tmp_path) == 0
    repeated = json.loads((tmp_path / "again" / "results.json").read_text())["round_orders"]
    assert repeated == orders


def test_each_variant_says_its_threads_and_a_baseline_at_other_threads_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 50: plain at torch's default intra-op threads had a P99 8-12x its own at one
    # thread; the benchmark's plain baseline said neither its threads nor that ours differs.
    import torch

    monkeypatch.setattr(benchmark, "measure", busy_machine_measure())
    args = benchmark_args(tmp_path, tmp_path / "out")
    args.rounds = 1
    assert benchmark.run(args, None, tmp_path) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    threads = {r["handler"]: r["intra_op_threads"] for r in results["runs"]}
    default = str(torch.get_num_threads())
    assert threads == {"plain": default, "plain1": "1", "ours": f"1/{default}/1"}
    assert "intra_op_threads" in printed.split("every run")[0]  # a column of the table
    comparisons = {c["comparison"] for c in results["comparisons"]}
    assert comparisons == {"ours / plain", "ours / plain1"}  # each baseline, marked
    if default != "1":
        assert results["threads_warning"].startswith("ours runs its stages at 1/")
        assert f"WARNING {results['threads_warning']}" in printed
