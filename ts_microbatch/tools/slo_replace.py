"""The latency tuner's third step (``ts_microbatch.tools.tune``): the configuration the
user serves now against the model's best, on a real TorchServe, and the file kept or the
winner chosen.

The current configuration is read from the .mar and ``--out`` (``current_candidate``), the
same ladder is offered to it and to each candidate (``slo_confirm.confirm``), and it is
replaced only by one that beat it with intervals that part (``slo_verdict.decide``); either
way the output says why, with the points that decided.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from ..core.config import YAML_SECTION, MicroBatchingConfig
from ..core.errors import ConfigError
from .mar import MarError, merge, read_entries, settings_of
from .merge import MergeError, read_existing
from .slo_confirm import Servers, confirm, confirm_slots
from .slo_plan import Candidate
from .slo_verdict import MIN_ANSWERS, decide, margin, optimism, point

# TorchServe 0.12.0's batchSize and maxBatchDelay for a model whose config has none.
TORCHSERVE_BATCH_SIZE, TORCHSERVE_MAX_BATCH_DELAY_MS = 1, 100


def current_candidate(mar: Path, out: Path) -> Candidate:
    """What the user serves now: the .mar's batchSize, maxBatchDelay and micro-batching
    settings (TorchServe's defaults where it has none), ``out``'s over them when it exists.

    Raises:
        SystemExit: the .mar cannot be read, or the settings are not ones the package loads.
    """
    try:
        found = settings_of(read_entries(mar))
        users = read_existing(out) or {}
        section = merge(found["effective"], users.get(YAML_SECTION) or {})
        settings = MicroBatchingConfig.from_mapping(section).as_dict()
        frontend = {**(found["yaml"] or {}), **users}
        batch_size = int(frontend.get("batchSize", TORCHSERVE_BATCH_SIZE))
        window_ms = int(frontend.get("maxBatchDelay", TORCHSERVE_MAX_BATCH_DELAY_MS))
    except (MarError, MergeError, ConfigError, TypeError, ValueError, yaml.YAMLError) as err:
        raise SystemExit(f"error: your current configuration: {err}") from None
    return Candidate(settings, batch_size, window_ms, None, current=True)


def print_confirmed(top: list[Candidate], ranked: list[Candidate], slo_p99_ms: float) -> None:
    print(f"\nOn TorchServe, within P99 {slo_p99_ms:g} ms ({optimism(top)}):")
    print(
        "model rank | configuration | predicted req/s | held req/s | predicted/held | "
        "frontend CPU ms/req"
    )
    for c in top:
        cpu = "-" if c.frontend_cpu_ms is None else f"{c.frontend_cpu_ms:.2f}"
        rank = ranked.index(c) + 1 if c in ranked else "-"
        predicted = f"{c.held_per_s:.0f}" if c.tail else "-"
        ratio = f"{c.held_per_s / c.measured_per_s:.2f}x" if c.tail and c.measured_per_s else "-"
        print(f"{rank:>10} | {c.describe()} | {predicted} | {c.measured_per_s:g} | {ratio} | {cpu}")


def confirm_best(
    candidates: list[Candidate], current: Candidate, args: argparse.Namespace, servers: Servers
) -> tuple[Candidate, str] | None:
    """Step 3: the user's current configuration and the best that differ in more than the
    window on a real server, the same ladder for each; the one that beat the current with
    intervals that part (``slo_verdict.decide``) and why, or None: the file stays (said)."""
    top = confirm_slots(candidates, args.confirm)
    skipped = [c for c in candidates[: candidates.index(top[-1])] if c not in top]
    if skipped:
        ranks = ", ".join(str(candidates.index(c) + 1) for c in skipped)
        print(
            "\nNot confirmed, as each differs from one confirmed in maxBatchDelay alone: "
            f"model ranks {ranks}"
        )
    same = next((c for c in top if c.model_config() == current.model_config()), None)
    if same is not None:
        same.current, current = True, same  # served once, as a candidate and as yours
    served = top if same is not None else [current, *top]
    confirm(served, servers, args.slo_p99_ms, args.rate)
    print_confirmed(served, candidates, args.slo_p99_ms)
    others = [c for c in top if c is not current]
    decided = decide(current, others, args.slo_p99_ms, args.rate)
    if decided is None:
        keep(current, others, args, servers)
        return None
    winner, parting = decided
    why = (
        f"held {margin(winner, current)} for your configuration; the intervals part at "
        f"{point(parting.held)} (its), {point(parting.missed)} (yours)"
    )
    print(f"\nReplacing your configuration: {winner.describe()} {why}")
    servers.record.append({"kind": "replaced", "current": current.outcome(), **winner.outcome()})
    return winner, f"held {margin(winner, current)} for the configuration it replaced"


def keep(
    current: Candidate, others: list[Candidate], args: argparse.Namespace, servers: Servers
) -> None:
    """Says why the user's configuration stays, and records it."""
    slo = f"P99 {args.slo_p99_ms:g} ms"
    best = max((c.measured_per_s for c in others), default=0.0)
    servers.record.append(
        {"kind": "kept", "current": current.outcome(), "tried": [c.outcome() for c in others]}
    )
    if current.measured_per_s <= 0 and best <= 0:
        at = f" at {args.rate:g} req/s or more" if args.rate else ""
        print(
            f"\nNothing written to {args.out}: the server held nothing within {slo}{at} for any "
            f"of the {len(others) + 1} configurations confirmed, yours included (above: what "
            "each was predicted and held). Try a longer objective, smaller batches or windows, "
            "or measure at the loads you run with ts-microbatch-benchmark --rates."
        )
        return
    where = (
        f"{args.out} left as it is"
        if args.out.exists()
        else f"Nothing written to {args.out}: the .mar's own configuration stays"
    )
    print(
        f"\n{where}: your configuration held {current.measured_per_s:g} req/s within {slo} "
        f"and none beat it with intervals that part (the best of the others held {best:g} "
        "req/s; a win needs its P99 interval within the objective at a rate where yours was "
        f"surely above it, each on {MIN_ANSWERS} answers or more, the machine not busy)."
    )
