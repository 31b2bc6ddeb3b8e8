#!/usr/bin/env python3
"""Eager vs ``torch.compile`` (inductor) ResNet-18 under the pipeline, on this CPU, in one run.

Each variant is the example image handler (torchvision decoder, micro-batch 8, threads
2/1/2, batch 32, maxBatchDelay 50) with a different model-config.yaml:

- ``eager``: no compile;
- ``eager-padded``: allowed sizes [1, 2, 4, 8] and warm-up: what padding costs;
- ``compiled``: TorchServe's ``pt2:`` section (inductor, dynamic=False), no padding, no
  warm-up: every micro-batch size compiles on the request path;
- ``compiled-padded``: compiled with allowed sizes, no warm-up;
- ``compiled-padded-warm``: compiled with allowed sizes and warm-up at load.

Phase 1, one variant at a time on a quiet machine, each TorchServe with its own empty
TORCHINDUCTOR_CACHE_DIR (a fresh pod): time to register (synchronous POST /models),
latency of the first request and of the next five single requests (steady state), time
from registration to the first answer. Phase 2: round-robin rounds of ab over the running
servers at concurrency 24 with batch 32, so frontend batches vary in size: throughput,
P50/P99, and from /metrics the recompiles, padding and batch sizes. Closed-loop clients
make the frontend's batches as large as the concurrency, so each round drives three
concurrency levels in turn, 3, 13 and 30 (micro-batches of 3; 8+5; 8+8+8+6): the sizes a
server sees as load rises; throughput and P99 are the level-30 run's, recompiles all
levels'. Phase 3: the warm
variant registered again on a new server that reuses its inductor cache (a restart with
TORCHINDUCTOR_CACHE_DIR on a persistent volume).

    python benchmarks/dev/compiled.py --rounds 3 --out benchmarks/results/compiled
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE.parent), str(ROOT), str(ROOT / "examples" / "image_classifier")]

import bench_lib  # noqa: E402
import build_mar  # noqa: E402
import prepare  # noqa: E402
from ab import run_ab  # noqa: E402

from ts_microbatch.tools.scrape import summarize  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

BATCH, DELAY_MS = 32, 50
MICRO_BATCHING = {
    "micro_batch_size": 8,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
}
PADDING = {"allowed_micro_batch_sizes": [1, 2, 4, 8]}
# The image handler's preprocess stacks one row per request: its tensors can be padded,
# which pad: tensors declares (checked by the warm-up it requires).
WARMUP = {"warmup": {}, "pad": "tensors"}
PT2 = {"pt2": {"compile": {"enable": True, "backend": "inductor", "dynamic": False}}}
VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {"micro_batching": MICRO_BATCHING},
    "eager-padded": {"micro_batching": {**MICRO_BATCHING, **PADDING, **WARMUP}},
    "compiled": {"micro_batching": MICRO_BATCHING, **PT2},
    "compiled-padded": {"micro_batching": {**MICRO_BATCHING, **PADDING}, **PT2},
    "compiled-padded-warm": {"micro_batching": {**MICRO_BATCHING, **PADDING, **WARMUP}, **PT2},
}
WARM = "compiled-padded-warm"


def model_config(variant: str) -> str:
    config = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": BATCH,
        "maxBatchDelay": DELAY_MS,
        "responseTimeout": 300,
        "startupTimeout": 600,
        "handler": {"decoder": "torchvision"},
        **VARIANTS[variant],
    }
    return yaml.safe_dump(config, sort_keys=False)


def start(work: Path, variant: str, label: str, cache: Path) -> TorchServe:
    store = work / "store"
    server = bench_lib.project_server(
        store, work / f"server-{variant}-{label}", env={"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    )
    return server.start()


def first_requests(
    server: TorchServe, variant: str, body: bytes, name: str | None = None
) -> dict[str, Any]:
    """Registers the variant and times its first answers."""
    started = time.monotonic()
    resp = server.register(
        f"{variant}.mar",
        model_name=name,
        batch_size=BATCH,
        max_batch_delay_ms=DELAY_MS,
        response_timeout_s=300,
        timeout_s=900,
    )
    registered = time.monotonic()
    if resp.status != 200:
        raise RuntimeError(f"register {variant}: {resp.status} {resp.body!r}")
    latencies = []
    for _ in range(6):
        sent = time.monotonic()
        answer = server.predict(name or variant, body, timeout_s=300, content_type="image/jpeg")
        latencies.append(time.monotonic() - sent)
        if answer.status != 200:
            raise RuntimeError(f"{variant}: {answer.status} {answer.body!r}")
    return {
        "register_s": registered - started,
        "first_request_ms": 1000 * latencies[0],
        "steady_single_request_ms": 1000 * statistics.median(latencies[1:]),
        "to_first_answer_s": registered - started + latencies[0],
    }


LEVELS = (3, 13, 30)  # concurrency levels of one round, in order


def steady(
    server: TorchServe, variant: str, body: Path, args: argparse.Namespace, label: str
) -> dict[str, Any]:
    before = server.scrape_metrics()
    url = f"{server.inference_url}/predictions/{variant}"
    token = server.token("inference")
    work = server.workdir
    failed = 0
    for level in LEVELS:
        requests = max(level * 8, args.requests * level // LEVELS[-1])
        summary, latency = run_ab(
            url,
            body,
            requests,
            level,
            work / "ab.csv",
            token=token,
            content_type="image/jpeg",
            label=f"{label} c={level}",
            progress=bench_lib.log,
        )
        failed += int(summary["failed_requests"]) + int(summary["non_2xx_responses"])
    time.sleep(2)  # the worker's metric lines reach the frontend asynchronously
    pipeline = summarize(server.scrape_metrics(), before, variant)
    return {
        "requests_per_s": summary["requests_per_s"],
        "p50_ms": latency.get("p50_ms"),
        "p99_ms": latency.get("p99_ms"),
        "failed": failed,
        "mean_batch_size": pipeline["mean_batch_size"],
        "mean_micro_batch_size": pipeline["mean_micro_batch_size"],
        "padded_share": pipeline["padded_share"],
        "recompiles": pipeline["recompiles"],
        "inference_ms": pipeline["stage_ms"]["inference"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=480, help="at the highest level")
    parser.add_argument("--weights", default=None, help="real ResNet-18 weights (.pth)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = bench_lib.scratch_dir("compiled_")
    for variant in VARIANTS:
        (work / f"{variant}.yaml").write_text(model_config(variant))
        build_mar.build_mar(
            work / "store",
            model_name=variant,
            weights=args.weights,
            work_dir=work / f"build-{variant}",
            model_config=work / f"{variant}.yaml",
            archive_format="zip-store",
        )
    image = prepare.make_jpeg(seed=0)
    body = work / "image.jpg"
    body.write_bytes(image)
    servers: dict[str, TorchServe] = {}
    first: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    try:
        for variant in VARIANTS:
            bench_lib.log(f"{variant}: registering (cold inductor cache)")
            servers[variant] = start(work, variant, "cold", work / f"inductor-{variant}")
            first[variant] = first_requests(servers[variant], variant, image)
            bench_lib.log(f"{variant}: {first[variant]}")
        for round_ in range(1, args.rounds + 1):
            for variant, server in servers.items():
                label = f"round {round_} {variant}"
                result = steady(server, variant, body, args, label)
                runs.append({"variant": variant, "round": round_, **result})
                bench_lib.log(f"{label}: {result}")
        for server in servers.values():
            server.stop()
        servers.clear()
        bench_lib.log(f"{WARM}: registering again on a new server with its inductor cache")
        servers["restart"] = start(work, WARM, "restart", work / f"inductor-{WARM}")
        restart = first_requests(servers["restart"], WARM, image)
        bench_lib.log(f"restart: {restart}")
    finally:
        for server in servers.values():
            server.stop()
    report = report_of(first, runs, restart, args)
    bench_lib.save_json(args.out, "results.json", report)
    return 0


def report_of(
    first: dict[str, Any], runs: list[dict[str, Any]], restart: dict[str, Any], args: Any
) -> dict[str, Any]:
    medians = {}
    for variant in VARIANTS:
        rows = [r for r in runs if r["variant"] == variant]
        medians[variant] = {
            key: statistics.median(r[key] for r in rows)
            for key in ("requests_per_s", "p50_ms", "p99_ms", "recompiles", "padded_share")
        }
        medians[variant]["recompiles_per_round"] = [r["recompiles"] for r in rows]
        medians[variant]["failed"] = sum(r["failed"] for r in rows)
    ratios = [
        {
            "round": round_,
            "warm_vs_eager": by(runs, WARM, round_) / by(runs, "eager", round_),
            "eager_padded_vs_eager": by(runs, "eager-padded", round_) / by(runs, "eager", round_),
        }
        for round_ in range(1, args.rounds + 1)
    ]
    print("variant | register s | first request ms | steady single ms | req/s | p99 ms")
    for variant in VARIANTS:
        f, m = first[variant], medians[variant]
        print(
            f"{variant} | {f['register_s']:.1f} | {f['first_request_ms']:.0f} | "
            f"{f['steady_single_request_ms']:.0f} | {m['requests_per_s']:.1f} | "
            f"{m['p99_ms']:.0f} | recompiles {m['recompiles_per_round']}"
        )
    print(f"restart of {WARM} with its inductor cache: {restart}")
    for r in ratios:
        print(
            f"round {r['round']}: {WARM} / eager {r['warm_vs_eager']:.2f}x, "
            f"eager-padded / eager {r['eager_padded_vs_eager']:.2f}x"
        )
    return {
        "machine": bench_lib.machine_info(),
        "settings": {
            "batch_size": BATCH,
            "max_batch_delay_ms": DELAY_MS,
            "requests_at_highest_level": args.requests,
            "concurrency_levels": LEVELS,
            "weights": args.weights or "untrained (weights=None)",
            "variants": VARIANTS,
        },
        "first_requests": first,
        "restart_with_cache": restart,
        "medians": medians,
        "ratios": ratios,
        "runs": runs,
    }


def by(runs: list[dict[str, Any]], variant: str, round_: int) -> float:
    row = next(r for r in runs if r["variant"] == variant and r["round"] == round_)
    return float(row["requests_per_s"])


if __name__ == "__main__":
    raise SystemExit(main())
