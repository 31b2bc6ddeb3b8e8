"""benchmarks/compare.py's bookkeeping (never its speed): what a side's tree holds, how
thread names are grouped, and the ratios taken within each round."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from ts_microbatch.tools.cpu import thread_group

sys.path[:0] = [str(Path(ROOT) / "benchmarks"), str(Path(ROOT) / "examples/image_classifier")]
compare = pytest.importorskip("compare")


def result(model: str, round_no: int, rps: float, p99: float, **threads: float) -> dict[str, Any]:
    return {
        "layout": "shared",
        "workload": "compute",
        "body": "720px",
        "round": round_no,
        "model": model,
        "requests_per_s": rps,
        "p99_ms": p99,
        "cpu_ms_per_request": {"frontend": 0.5, "worker": sum(threads.values())},
        "worker_threads_ms_per_request": threads,
        "bound_requests_per_s": 2000 / (0.5 + sum(threads.values())),
    }


def test_ratios_are_taken_within_each_round_then_their_median() -> None:
    results = [
        result("upstream", 0, 200, 400, other=6),
        result("head-same", 0, 220, 300, other=5),
        result("upstream", 1, 100, 800, other=6),  # a slow round: both slow alike
        result("head-same", 1, 105, 900, other=5),
        result("upstream", 2, 210, 400, other=6),
        result("head-same", 2, 231, 360, other=5),
    ]
    rows = {row["ratio"]: row for row in compare.ratios(results)}
    row = rows["head-same / upstream"]
    assert row["throughput"] == pytest.approx([1.10, 1.05, 1.10])
    assert row["throughput_median"] == pytest.approx(1.10)
    assert row["p99_median"] == pytest.approx(0.9)
    assert "base-same / upstream" not in rows  # no base model ran: no ratio made up
    assert "head-same / plain" not in rows


def test_the_plain_handler_is_compared_with_when_it_ran() -> None:
    results = [result("plain", 0, 150, 450, other=11), result("head-same", 0, 270, 270, other=6)]
    results += [result("head-example", 0, 390, 180, other=3)]
    rows = {row["ratio"]: row for row in compare.ratios(results)}
    assert rows["head-same / plain"]["throughput_median"] == pytest.approx(1.8)
    assert rows["head-example / plain"]["p99_median"] == pytest.approx(0.4)
    assert "upstream / plain" not in rows


def test_model_rows_give_medians_and_the_bound_two_cores_allow() -> None:
    results = [
        result("head-same", r, 200 + r, 300, **{"tsmb-prepr": 4.0, "other": 1.5}) for r in range(3)
    ]
    (row,) = compare.model_rows(results)
    assert row["requests_per_s"] == 201
    assert row["threads_ms"] == {"other": 1.5, "tsmb-prepr": 4.0}
    assert row["bound_requests_per_s"] == pytest.approx(2000 / 6.0)
    assert "| head-same |" in compare.report(
        {"head": "h", "base": "b", "rounds": 3, "machine": "2 cores"}, results
    )


def test_the_report_gives_each_models_ledger_in_cores() -> None:
    results = []
    for r, idle in enumerate((0.4, 0.5, 0.6)):
        row = result("head-example", r, 300, 200, other=3)
        parts = {"frontend": 0.5, "frontend children": 0.1, "worker tsmb-infer": 0.6}
        parts |= {"worker other": 0.2, "generator": 0.1, "others": 0.1, "steal": 0.0}
        parts["idle"] = idle
        row["ledger"] = {"parts": parts, "cores": 2, "seconds": 10.0, "accounted": 0.95}
        results.append(row)
    (row,) = compare.model_rows(results)
    assert row["ledger"]["frontend"] == pytest.approx(0.6)  # its exited children with it
    assert row["ledger"]["worker"] == pytest.approx(0.8)
    assert row["ledger"]["idle"] == pytest.approx(0.5)
    text = compare.report({"head": "h", "base": "b", "rounds": 3, "machine": "2 cores"}, results)
    # frontend, worker, ab, others, steal, idle; accounted; served over what ab left
    assert "| head-example | 0.60 | 0.80 | 0.10 | 0.10 | 0.00 | 0.50 | 95% | 74% |" in text


def test_a_result_without_a_ledger_is_reported_without_one() -> None:
    text = compare.report(
        {"head": "h", "base": "b", "rounds": 1, "machine": "2 cores"},
        [result("head-same", 0, 200, 300, other=5)],
    )
    assert "| head-same | 200.0 |" in text
    assert "| head-same | 0." not in text.split("Where the")[-1]


@pytest.mark.parametrize(
    ("name", "group"),
    [("tsmb-prepr-0", "tsmb-prepr"), ("tsmb-infer-12", "tsmb-infer"), ("python3", "other")],
)
def test_worker_threads_are_grouped_by_stage(name: str, group: str) -> None:
    assert thread_group(name) == group


def test_a_commit_side_holds_that_commits_package_handler_and_configs(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    side = compare.checkout("base", "HEAD", tmp_path / "base")
    assert side.commit == head.stdout.strip()
    for path in ("ts_microbatch/__init__.py", "handlers/micro_batching_handler.py"):
        assert (side.tree / path).is_file()
    assert (side.tree / "configs/micro_batching.json").is_file()
