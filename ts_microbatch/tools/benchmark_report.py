"""What ts-microbatch-benchmark leaves behind when its rounds are done (tools.benchmark runs
them): results.json (what was sent, each variant's settings, the median round, every run,
the ratios), results.csv, runs.csv, comparisons.json, with --rates the curves; the table,
every run and the ratios printed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .corpus import Corpus
from .curve_report import compare_curves, held_lines, write_curves
from .rounds import cpu_drift, format_runs
from .runs import compare_rounds, format_comparisons, format_table, machine_info, medians, write_csv
from .variants import AS_PACKAGED, BASELINE

__all__ = ["load_tag", "report"]


def load_tag(row: dict[str, Any]) -> str:
    """What every variant of a run shares: the load, not the micro-batching settings."""
    return f"{row['body']}|{row['batch_size']}|{row['max_batch_delay']}|{row['concurrency']}"


def report(
    args: argparse.Namespace,
    out: Path,
    corpus: Corpus,
    variants: list[tuple[str, dict[str, Any] | None]],
    effective: dict[str, dict[str, Any]],
    point: dict[str, Any],
    rows: list[dict[str, Any]],
    refused: dict[str, str],
    handlers: dict[str, Path] | None = None,
    served: dict[str, dict[str, int]] | None = None,
) -> None:
    """results.json (what was sent, each variant's settings, medians, every run, ratios),
    results.csv, runs.csv, comparisons.json; the table and ratios printed."""
    names = list(dict.fromkeys(row["handler"] for row in rows))
    reference = BASELINE if BASELINE in names else AS_PACKAGED
    pairs = [(name, reference) for name in names if name != reference]
    middle = medians(rows, load_tag)
    curve = any(row.get("curve") for row in rows)
    # --rates: the variants are compared by P99 at equal offered load, with an interval;
    # a sweep's throughput is the schedule's, the same for every variant.
    comparisons = compare_curves(rows, pairs) if curve else compare_rounds(rows, pairs, load_tag)
    warnings = cpu_drift(rows)
    orders: dict[int, list[str]] = {}
    for row in sorted(rows, key=lambda r: (r["repeat"], r["position"])):
        orders.setdefault(row["repeat"], []).append(row["handler"])
    (out / "results.json").write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "mar": str(Path(args.mar).resolve()),
                "corpus": corpus.describe(point["requests"]),
                "load": point,
                "variants": {
                    n: {
                        "override": o,
                        "micro_batching": effective[n],
                        "frontend": (served or {}).get(n),
                        "handler": str((handlers or {}).get(n) or "as packaged"),
                    }
                    for n, o in variants
                },
                "results": middle,
                "runs": rows,
                "comparisons": comparisons,
                "not_measured": refused,
                "seed": args.seed,
                "round_orders": orders,
                "cpu_warnings": warnings,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    write_csv(rows, out / "runs.csv")
    write_csv(middle, out / "results.csv")
    (out / "comparisons.json").write_text(json.dumps(comparisons, indent=2) + "\n")
    print(f"\nbody: {corpus.label}\n" + format_table(middle))
    print(f"\nevery run (rounds shuffled with seed {args.seed}):\n" + format_runs(rows))
    if comparisons and not curve:
        print("\n" + format_comparisons(comparisons))
    for warning in warnings:
        print(f"\nWARNING {warning}")
    for name, why in refused.items():
        print(f"\n{name}: not measured: {why.splitlines()[0]}")
    if curve:
        title = f"{Path(args.mar).name}, {corpus.label}"
        print("\nlatency against offered load (open loop, every round):\n")
        print(write_curves(out, rows, args.slo_p99_ms, title, pairs))
        print(f"\n{out / 'p99.png'}\n\n" + held_lines(rows, names, args.slo_p99_ms))
