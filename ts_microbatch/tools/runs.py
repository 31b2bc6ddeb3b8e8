"""Rows of measured runs: each round's order, the machine's drift, medians, ratios within
rounds, the tables and the files a benchmark leaves behind.

A benchmark serves several configs in rounds on a shared machine, one row per run. Each
round's order is shuffled from a recorded seed (``round_order``), so no variant keeps its
place or its predecessor (one run right after another pays for what that one left). A
variant's CPU per request did not change between rounds unless the machine did, so a move
by more than a quarter is warned about (``cpu_drift``). A config's result is its
median-throughput run; two configs are compared within each round, and the median of
those ratios is the headline.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .corpus import Corpus
from .curve_report import compare_curves, held_lines, write_curves
from .intervals import percentile
from .ledger import MAIN_PARTS
from .ledger import summary as ledger_summary
from .mar import AS_PACKAGED, BASELINE, BASELINE_ONE

Row = dict[str, Any]
Tag = Callable[[Row], str]

CPU_DRIFT_TOLERANCE = 0.25  # max / min - 1 of a variant's CPU per request over its rounds
CPU_SIDES = (("frontend", "frontend_cpu_ms_per_request"), ("worker", "workers_cpu_ms_per_request"))
TABLE_COLUMNS = (
    "scenario",
    "handler",
    "batch_size",
    "micro_batch_size",
    "max_batch_delay",
    "concurrency",
    "workers",
    "parallelism",
    "intra_op_threads",
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


def new_seed() -> int:
    """A seed for a run that was given none (printed and recorded, so it can be given)."""
    return random.SystemRandom().randrange(1, 1_000_000)


def round_order(
    names: Sequence[str], round_no: int, seed: int = 0, first_as_given: bool = False
) -> list[str]:
    """Round ``round_no`` (from 0): ``names`` shuffled from ``seed`` and the round.
    ``first_as_given`` leaves round 0 as given (benchmarks/compare.py's committed results
    used seed 0 that way)."""
    order = list(names)
    if round_no or not first_as_given:
        random.Random(seed * 1_000_003 + round_no).shuffle(order)
    return order


def cpu_drift(runs: Sequence[Row], tolerance: float = CPU_DRIFT_TOLERANCE) -> list[str]:
    """A warning for each variant (``handler``) and side whose CPU per request moved by
    more than ``tolerance`` (max / min - 1) over its rounds (``repeat``)."""
    warnings = []
    for name in dict.fromkeys(run["handler"] for run in runs):
        rows = sorted((r for r in runs if r["handler"] == name), key=lambda r: r["repeat"])
        for side, key in CPU_SIDES:
            values = [(r["repeat"], r.get(key)) for r in rows]
            measured = [(n, v) for n, v in values if isinstance(v, (int, float)) and v > 0]
            if len(measured) < 2:
                continue
            low, high = min(v for _, v in measured), max(v for _, v in measured)
            if high / low - 1 > tolerance:
                per_round = ", ".join(f"round {n} {v:.2f}" for n, v in measured)
                warnings.append(
                    f"{name}: {side} CPU per request moved {high / low:.2f}x between rounds "
                    f"({per_round} ms): the machine changed, not the variant; ratios from "
                    "those rounds measure the machine too"
                )
    return warnings


def _markdown(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    rows = [header, ["---"] * len(header), *lines]
    return "\n".join(" | ".join(row) for row in rows)


def format_runs(runs: Sequence[Row]) -> str:
    """Every run in the order it ran, with its CPU per request and its ledger (the cores
    each part used, ts_microbatch.tools.ledger): a Markdown table."""
    header = ["round", "position", "variant", "req/s", "p99 ms", "CPU ms/req frontend", "worker"]
    header += [f"cores {part}" for part in MAIN_PARTS] + ["accounted"]
    lines = []
    for run in sorted(runs, key=lambda r: (r["repeat"], r.get("position", 0))):
        cpu = [run.get(key) for _, key in CPU_SIDES]
        shown = [f"{v:.2f}" if isinstance(v, (int, float)) else "-" for v in cpu]
        entry = run.get("ledger") or {}
        cores = (
            [f"{v:.2f}" for v in ledger_summary(entry).values()]
            if entry
            else ["-"] * len(MAIN_PARTS)
        )
        accounted = f"{entry['accounted']:.0%}" if entry else "-"
        lines.append(
            [str(run["repeat"]), str(run.get("position", "-")), run["handler"]]
            + [f"{run['requests_per_s']:.1f}", f"{run['p99_ms']:.0f}", *shown, *cores, accounted]
        )
    return _markdown(header, lines)


def medians(runs: list[Row], tag: Tag) -> list[Row]:
    """One row per scenario, handler and ``tag`` (the load or point): the run with the
    median throughput, with ``runs``, every run's throughput, and ``spread``,
    (max - min) / median."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for run in runs:
        groups.setdefault((run["scenario"], run["handler"], tag(run)), []).append(run)
    rows = []
    for group in groups.values():
        rates = [r["requests_per_s"] for r in group]
        middle = sorted(group, key=lambda r: r["requests_per_s"])[(len(group) - 1) // 2]
        row = {k: v for k, v in middle.items() if k != "repeat"}
        spread = (max(rates) - min(rates)) / middle["requests_per_s"]
        rows.append({**row, "runs": rates, "spread": spread})
    return rows


def compare_rounds(runs: list[Row], pairs: Sequence[tuple[str, str]], tag: Tag) -> list[Row]:
    """Per scenario, ``tag`` and round: each of ``pairs`` (numerator, denominator handler)
    as throughput and P99 ratios within the round, and their medians over the rounds."""
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
    lines = [[_cell(c, row.get(c)) for c in TABLE_COLUMNS] for row in rows]
    return _markdown(TABLE_COLUMNS, lines)


def write_csv(rows: list[Row], path: Path) -> None:
    """The rows' scalar columns (sorted by name) as CSV; nested values are left out."""
    keys = sorted({k for row in rows for k in row if not isinstance(row[k], (dict, list))})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, P50 and P99 (NaN for no values)."""
    mean = sum(values) / len(values) if values else math.nan
    return {"mean": mean, "p50": percentile(values, 50), "p99": percentile(values, 99)}


def machine_info() -> dict[str, Any]:
    """Cores, memory and versions: what a result file says it was measured on."""
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


def shown(effective: dict[str, Any]) -> tuple[Any, str]:
    """micro_batch_size and threads (pre/inf/post) for the table; "off" when disabled."""
    if effective.get("enabled", True) is False:
        return "off", "-"
    threads = effective.get("parallelism") or {}
    stages = ("preprocess", "inference", "postprocess")
    return effective.get("micro_batch_size", 1), "/".join(str(threads.get(s, 1)) for s in stages)


def intra_op_threads(effective: dict[str, Any], env: dict[str, str] | None = None) -> str:
    """A variant's torch intra-op threads per stage, as its worker runs them: a stage's own
    setting (``intra_op_threads``), else the process's (``OMP_NUM_THREADS`` in ``env``, else
    torch's default on this machine); the whole batch's when micro-batching is off."""
    import torch

    process = (env or {}).get("OMP_NUM_THREADS") or str(torch.get_num_threads())
    if effective.get("enabled", True) is False:
        return process
    own = {"preprocess": 1, "postprocess": 1, **(effective.get("intra_op_threads") or {})}
    return "/".join(str(own.get(s) or process) for s in ("preprocess", "inference", "postprocess"))


def threads_warning(rows: list[Row]) -> str | None:
    """A warning when a variant's stages run at other intra-op threads than a baseline's:
    a ratio to that baseline then mixes threading with batching."""
    threads = {row["handler"]: row.get("intra_op_threads") for row in rows}
    plain, one, ours = threads.get(BASELINE), threads.get(BASELINE_ONE), threads.get(AS_PACKAGED)
    if plain is None or ours is None or set(ours.split("/")) == {plain}:
        return None
    also = f"; {BASELINE_ONE} (the same handler at {one}) is the baseline at one" if one else ""
    return (
        f"{AS_PACKAGED} runs its stages at {ours} intra-op threads (pre/inference/post), "
        f"{BASELINE} at {plain}: a ratio to {BASELINE} mixes threading with batching{also}"
    )


def load_tag(row: Row) -> str:
    """What every variant of a run shares: the load, not the micro-batching settings."""
    return f"{row['body']}|{row['batch_size']}|{row['max_batch_delay']}|{row['concurrency']}"


def report(
    args: argparse.Namespace,
    out: Path,
    corpus: Corpus,
    variants: list[tuple[str, dict[str, Any] | None]],
    effective: dict[str, dict[str, Any]],
    point: dict[str, Any],
    rows: list[Row],
    refused: dict[str, str],
    handlers: dict[str, Path] | None = None,
    served: dict[str, dict[str, int]] | None = None,
) -> None:
    """ts-microbatch-benchmark's files: results.json (what was sent, each variant's
    settings, medians, every run, ratios), results.csv, runs.csv, comparisons.json, with
    ``--rates`` the curves; the table, every run and the ratios printed."""
    names = list(dict.fromkeys(row["handler"] for row in rows))
    baselines = [b for b in (BASELINE, BASELINE_ONE) if b in names] or [AS_PACKAGED]
    pairs = [(name, ref) for ref in baselines for name in names if name not in baselines]
    middle = medians(rows, load_tag)
    curve = any(row.get("curve") for row in rows)
    # --rates: P99 at equal offered load, with an interval; a sweep's throughput is the
    # schedule's, the same for every variant.
    comparisons = compare_curves(rows, pairs) if curve else compare_rounds(rows, pairs, load_tag)
    warnings = cpu_drift(rows)
    threads = threads_warning(rows)
    orders: dict[int, list[str]] = {}
    for row in sorted(rows, key=lambda r: (r["repeat"], r["position"])):
        orders.setdefault(row["repeat"], []).append(row["handler"])
    every = {
        n: {
            "override": o,
            "micro_batching": effective[n],
            "frontend": (served or {}).get(n),
            "handler": str((handlers or {}).get(n) or "as packaged"),
        }
        for n, o in variants
    }
    results = {
        "machine": machine_info(),
        "mar": str(Path(args.mar).resolve()),
        "corpus": corpus.describe(point["requests"]),
        "load": point,
        "variants": every,
        "results": middle,
        "runs": rows,
        "comparisons": comparisons,
        "not_measured": refused,
        "seed": args.seed,
        "round_orders": orders,
        "cpu_warnings": warnings,
        "threads_warning": threads,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    write_csv(rows, out / "runs.csv")
    write_csv(middle, out / "results.csv")
    (out / "comparisons.json").write_text(json.dumps(comparisons, indent=2) + "\n")
    print(f"\nbody: {corpus.label}\n" + format_table(middle))
    print(f"\nevery run (rounds shuffled with seed {args.seed}):\n" + format_runs(rows))
    if comparisons and not curve:
        print("\n" + format_comparisons(comparisons))
    for warning in [*warnings, *([threads] if threads else [])]:
        print(f"\nWARNING {warning}")
    for name, why in refused.items():
        print(f"\n{name}: not measured: {why.splitlines()[0]}")
    if curve:
        print("\nlatency against offered load (open loop, every round):\n")
        print(write_curves(out, rows, args.slo_p99_ms, pairs))
        print("\n" + held_lines(rows, names, args.slo_p99_ms))
