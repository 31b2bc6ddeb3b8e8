"""Rows of measured runs: each config's median run, ratios within rounds, the table and files.

A benchmark serves several configs (handlers, variants, sweep points) in round-robin rounds
on a shared machine, one row per run. A config's result is its median-throughput run, with
the spread of every round's throughput; two configs are compared within each round (they
ran minutes apart, not hours) and the median of those ratios is the headline.

Shared by ``ts-microbatch-benchmark`` (ts_microbatch.tools.benchmark) and the repository's
benchmarks/benchmark-ab.py.
"""

from __future__ import annotations

import csv
import math
import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .ab import percentile

Row = dict[str, Any]
Tag = Callable[[Row], str]

TABLE_COLUMNS = (
    "scenario",
    "handler",
    "batch_size",
    "micro_batch_size",
    "max_batch_delay",
    "concurrency",
    "workers",
    "parallelism",
    "mean_micro_batch_size",
    "requests_per_s",
    "spread",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "errors",
    # CPU per request (ms): what the throughput follows on a shared machine
    "frontend_cpu_ms_per_request",
    "workers_cpu_ms_per_request",
    "ideal_requests_per_s",
    "efficiency",
)


def medians(runs: list[Row], tag: Tag) -> list[Row]:
    """One row per scenario, handler and ``tag`` (the load or point): the run with the
    median throughput, with ``runs``, the throughput of every run, and their relative spread
    (max - min) / median."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for run in runs:
        groups.setdefault((run["scenario"], run["handler"], tag(run)), []).append(run)
    rows = []
    for group in groups.values():
        rates = sorted(r["requests_per_s"] for r in group)
        middle = sorted(group, key=lambda r: r["requests_per_s"])[(len(group) - 1) // 2]
        row = {k: v for k, v in middle.items() if k != "repeat"}
        row["runs"] = [r["requests_per_s"] for r in group]
        row["spread"] = (rates[-1] - rates[0]) / middle["requests_per_s"]
        rows.append(row)
    return rows


def compare_rounds(runs: list[Row], pairs: Sequence[tuple[str, str]], tag: Tag) -> list[Row]:
    """Per scenario, ``tag`` and round: each of ``pairs`` (numerator, denominator handler)
    as throughput and P99 ratios, and their medians over the rounds. Ratios are taken
    within a round: the machine is shared."""
    by_round: dict[tuple[str, str, int], dict[str, Row]] = {}
    for run in runs:
        key = (run["scenario"], tag(run), run["repeat"])
        by_round.setdefault(key, {})[run["handler"]] = run
    out = []
    for numerator, denominator in pairs:
        groups: dict[tuple[str, str], list[Row]] = {}
        for (scenario, point, repeat), handlers in sorted(by_round.items()):
            if numerator in handlers and denominator in handlers:
                a, b = handlers[numerator], handlers[denominator]
                groups.setdefault((scenario, point), []).append(
                    {
                        "round": repeat,
                        "throughput": a["requests_per_s"] / b["requests_per_s"],
                        "p99": a["p99_ms"] / b["p99_ms"],
                        "body": a.get("body"),
                    }
                )
        for (scenario, point), rounds in groups.items():
            out.append(
                {
                    "scenario": scenario,
                    "point": point,
                    "body": rounds[0]["body"],
                    "comparison": f"{numerator} / {denominator}",
                    "rounds": rounds,
                    "median_throughput": statistics.median([r["throughput"] for r in rounds]),
                    "median_p99": statistics.median([r["p99"] for r in rounds]),
                }
            )
    return out


def format_comparisons(comparisons: list[Row]) -> str:
    lines = []
    for c in comparisons:
        per_round = ", ".join(f"{r['throughput']:.2f}x/{r['p99']:.2f}x" for r in c["rounds"])
        lines.append(
            f"{c['scenario']} {c['body']} {c['comparison']}: throughput "
            f"{c['median_throughput']:.2f}x, p99 {c['median_p99']:.2f}x (median); "
            f"per round throughput/p99 {per_round}"
        )
    return "\n".join(lines)


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if column == "spread":
            return f"{value:.0%}"
        if column.endswith("cpu_ms_per_request"):
            return f"{value:.2f}"
        return f"{value:.3f}" if column == "efficiency" else f"{value:.1f}"
    return str(value)


def format_table(rows: list[Row]) -> str:
    """The medians as a Markdown table (the columns of TABLE_COLUMNS, "-" where missing)."""
    lines = [" | ".join(TABLE_COLUMNS), " | ".join("---" for _ in TABLE_COLUMNS)]
    for row in rows:
        lines.append(" | ".join(_cell(c, row.get(c)) for c in TABLE_COLUMNS))
    return "\n".join(lines)


def write_csv(rows: list[Row], path: Path) -> None:
    """The rows' scalar columns (sorted by name) as CSV; nested values are left out."""
    keys = sorted({k for row in rows for k in row if not isinstance(row[k], (dict, list))})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def flatten_pipeline(pipeline: dict[str, Any]) -> Row:
    """ts_microbatch.tools.scrape.summarize's result as result-row columns (and kept whole)."""
    row: Row = {
        "pipeline": pipeline,
        "mean_batch_size": pipeline["mean_batch_size"],
        "mean_micro_batch_size": pipeline["mean_micro_batch_size"],
        "micro_batches_per_batch": pipeline["micro_batches_per_batch"],
        # Real tokens over what they were padded to (NaN when nothing counted them).
        "tokens": pipeline.get("tokens"),
        "padded_tokens": pipeline.get("padded_tokens"),
        "useful_token_share": pipeline.get("useful_token_share"),
    }
    for stage, ms in pipeline["stage_ms"].items():
        row[f"{stage}_ms"] = ms
        row[f"{stage}_wait_ms"] = pipeline["stage_wait_ms"][stage]
    return row


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, P50 and P99 (NaN for no values)."""
    mean = sum(values) / len(values) if values else math.nan
    return {"mean": mean, "p50": percentile(values, 50), "p99": percentile(values, 99)}


def machine_info() -> dict[str, Any]:
    """Cores, memory and versions: what a result file says it was measured on."""
    import os

    import torch
    import ts

    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gib = math.nan
    return {
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchserve": ts.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
