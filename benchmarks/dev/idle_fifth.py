#!/usr/bin/env python3
"""What idles the machine when the example is at saturation: the CPU ledger of each change.

    python benchmarks/dev/idle_fifth.py [--rounds 2] [--requests 3000] [--out DIR]

The image example (the working tree's handler, ``configs/micro_batching.json`` and its
decoder) on benchmarks/compare.py's ``compute`` stand-in, 720px photos, closed loop with
``ab -k``, a fresh TorchServe per variant and round (interleaved, shuffled from round to
round), warmed up with 1,000 requests. Each run prints its throughput, P99 and CPU ledger
(ts_microbatch.tools.ledger: frontend, worker threads, ``ab``, others, steal, idle, in
cores). The variants change one thing each from ``shipped`` (batch 32, 2 ms, 64 clients,
one worker, micro-batch 4, threads 2/1/2): more clients in flight, a second worker (also
with more clients), a second inference thread, a third preprocess thread, larger
micro-batches, larger batches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]

import bench_lib  # noqa: E402
import compare  # noqa: E402

from ts_microbatch.tools.ledger import MAIN_PARTS, format_ledger  # noqa: E402
from ts_microbatch.tools.ledger import summary as ledger_summary  # noqa: E402
from ts_microbatch.tools.runs import round_order  # noqa: E402

MODEL = "head-example"
WORKLOAD = "compute"
BODY = "720px"
SHIPPED: dict[str, Any] = {
    "batch_size": 32,
    "max_batch_delay_ms": 2,
    "initial_workers": 1,
    "concurrency": 64,
    "micro_batching": {},
}
# name -> what it changes from SHIPPED
VARIANTS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "clients-128": {"concurrency": 128},
    "workers-2": {"initial_workers": 2},
    "workers-2-clients-128": {"initial_workers": 2, "concurrency": 128},
    "inference-2": {"micro_batching": {"parallelism": {"inference": 2}}},
    "preprocess-3": {"micro_batching": {"parallelism": {"preprocess": 3}}},
    "micro-batch-8": {"micro_batching": {"micro_batch_size": 8}},
    "batch-64": {"batch_size": 64, "concurrency": 128},
}


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def model_dir(store: Path, variant: dict[str, Any], shipped_config: dict[str, Any]) -> None:
    """The packaged model's model-config.yaml with the variant's micro_batching keys and
    workers."""
    config = merged(shipped_config, {"micro_batching": variant["micro_batching"]})
    # TorchServe caps a registration's initial_workers at the config's maxWorkers
    config["minWorkers"] = config["maxWorkers"] = variant["initial_workers"]
    (store / f"{MODEL}-{WORKLOAD}" / "model-config.yaml").write_text(
        yaml.safe_dump(config, sort_keys=False)
    )


def one_run(
    plan: compare.Plan, name: str, variant: dict[str, Any], round_no: int
) -> dict[str, Any]:
    path, content_type = compare.bodies()[BODY]
    with compare.server_for(plan, f"{name}-{round_no}") as server:
        target = compare.register(
            server,
            f"{MODEL}-{WORKLOAD}",
            MODEL,
            path,
            content_type,
            compare.frontend_pid(server),
            batch_size=variant["batch_size"],
            max_batch_delay_ms=variant["max_batch_delay_ms"],
            initial_workers=variant["initial_workers"],
        )
        clients = variant["concurrency"]
        compare.warm_up(target, path, content_type, clients, compare.ALONE_WARMUP)
        result = compare.ab_run(target, path, content_type, plan.requests, clients, plan.work)
    if len(target.worker_pids) != variant["initial_workers"]:
        raise RuntimeError(
            f"{name}: {len(target.worker_pids)} workers, expected {variant['initial_workers']}"
        )
    result.update(variant=name, round=round_no, workers=len(target.worker_pids))
    bench_lib.log(
        f"  round {round_no + 1} {name:14} {result['requests_per_s']:6.1f} req/s  "
        f"P99 {result['p99_ms']:5.0f} ms  {format_ledger(result['ledger'])}"
    )
    return result


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "| variant | req/s per round | median | P99 ms | "
        + " | ".join(MAIN_PARTS)
        + " | accounted |",
        "|---|---|---|---|" + "---|" * len(MAIN_PARTS) + "---|",
    ]
    for name in VARIANTS:
        runs = [r for r in results if r["variant"] == name]
        if not runs:
            continue
        folded = [ledger_summary(r["ledger"]) for r in runs]
        cores = [statistics.median(f[p] for f in folded) for p in MAIN_PARTS]
        accounted = statistics.median(r["ledger"]["accounted"] for r in runs)
        per_round = ", ".join(f"{r['requests_per_s']:.0f}" for r in runs)
        lines.append(
            f"| {name} | {per_round} | {statistics.median(r['requests_per_s'] for r in runs):.0f} "
            f"| {statistics.median(r['p99_ms'] for r in runs):.0f} | "
            + " | ".join(f"{c:.2f}" for c in cores)
            + f" | {accounted:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3000, help="measured per run")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    work = bench_lib.scratch_dir("ts-microbatch-idle-")
    sides = {"head": compare.checkout("head", compare.WORKTREE, work / "head")}
    compare.write_bodies(work, [BODY])
    plan = compare.Plan(
        sides,
        [WORKLOAD],
        ["alone"],
        [MODEL],
        [BODY],
        args.rounds,
        args.requests,
        args.requests,
        work / "store",
        work,
    )
    compare.package(plan.store, work / "build", MODEL, WORKLOAD, sides)
    shipped_config = yaml.safe_load(
        (plan.store / f"{MODEL}-{WORKLOAD}" / "model-config.yaml").read_text()
    )
    results: list[dict[str, Any]] = []
    try:
        for round_no in range(args.rounds):
            for name in round_order(names, round_no, first_as_given=True):
                variant = merged(SHIPPED, VARIANTS[name])
                model_dir(plan.store, variant, shipped_config)
                results.append(one_run(plan, name, variant, round_no))
    finally:
        text = report(results)
        print(text)
        bench_lib.save_json(args.out, "results.json", {"variants": VARIANTS, "results": results})
        if args.out is not None:
            (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
