"""Fair rounds: the order each round serves its variants in, and whether the machine held
still while they ran.

A benchmark on a shared machine runs every variant once per round and compares them
within a round. Two things can still fall on one variant rather than the machine: its
place in the order (a variant run right after another pays for what its predecessor
left: garbage, caches, a frontend's JIT), and a slow phase of the machine during its runs.
``round_order`` shuffles each round from a seed that the report prints and records, so
the order is repeatable and no variant keeps its place; ``cpu_drift`` flags a variant
whose CPU per request moved by more than a quarter between rounds. Its code did not
change between rounds, so the machine did: in the incident that named this check, the
baseline's worker CPU per request doubled in rounds 2-3 on a busy machine, and the
printed 2.00x median came from those rounds.

Shared by ``ts-microbatch-benchmark`` (ts_microbatch.tools.benchmark) and the repository's
benchmarks/compare.py.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

# A variant's CPU per request may move this much (max / min - 1) between rounds before
# the report warns.
CPU_DRIFT_TOLERANCE = 0.25
CPU_SIDES = (("frontend", "frontend_cpu_ms_per_request"), ("worker", "workers_cpu_ms_per_request"))


def new_seed() -> int:
    """A seed for a run that was given none (printed and recorded, so it can be given)."""
    return random.SystemRandom().randrange(1, 1_000_000)


def round_order(
    names: Sequence[str], round_no: int, seed: int = 0, first_as_given: bool = False
) -> list[str]:
    """The order of round ``round_no`` (from 0): ``names`` shuffled by a generator seeded
    from ``seed`` and the round, so that no name keeps its place or its predecessor.
    ``first_as_given`` leaves round 0 in the given order (benchmarks/compare.py's rounds,
    whose committed results used seed 0 that way: a 12 MP model run right after another
    measured 7-10% low in every round when the order only turned by one)."""
    order = list(names)
    if round_no or not first_as_given:
        random.Random(seed * 1_000_003 + round_no).shuffle(order)
    return order


def cpu_drift(runs: Sequence[dict[str, Any]], tolerance: float = CPU_DRIFT_TOLERANCE) -> list[str]:
    """A warning for each variant (``handler``) and side (frontend, worker) whose CPU per
    request moved by more than ``tolerance`` (max / min - 1) over its rounds (``repeat``)."""
    warnings = []
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_variant.setdefault(run["handler"], []).append(run)
    for name, rows in by_variant.items():
        rows = sorted(rows, key=lambda r: r["repeat"])
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


def format_runs(runs: Sequence[dict[str, Any]]) -> str:
    """Every run in the order it ran, with its CPU per request: a Markdown table."""
    lines = [
        "round | position | variant | req/s | p99 ms | CPU ms/req frontend | worker",
        "--- | --- | --- | --- | --- | --- | ---",
    ]
    for run in sorted(runs, key=lambda r: (r["repeat"], r.get("position", 0))):
        cpu = [run.get(key) for _, key in CPU_SIDES]
        shown = [f"{v:.2f}" if isinstance(v, (int, float)) else "-" for v in cpu]
        lines.append(
            f"{run['repeat']} | {run.get('position', '-')} | {run['handler']} | "
            f"{run['requests_per_s']:.1f} | {run['p99_ms']:.0f} | {shown[0]} | {shown[1]}"
        )
    return "\n".join(lines)
