"""Whether the worker's garbage collector makes the tail's hiccups, and whether
``freeze_gc`` removes them (issue 51, docs/metrics.md "Hiccups").

    .venv/bin/python benchmarks/dev/gc_pauses.py [--rate 1200] [--requests 20000] \\
        [--rounds 2] [--out benchmarks/dev/results/gc_pauses]

The fraud scorer example (examples/tabular_scorer: an MLP over 128 JSON features, the
fastest model here, where a 100 ms pause is most of a P99) is served by a fresh TorchServe
per round and variant, ``freeze_gc`` false and true, interleaved, and offered ``--rate``
req/s open loop (after 2,000 requests of warm-up at the same rate). Every collection of
generation 2, and any other over 5 ms, that the server's Python processes make (the
worker's, and TorchServe's launcher and metrics collector) is written with its monotonic
start time by a ``sitecustomize`` hook on their PYTHONPATH (no handler change). The report
puts them beside the requests: each variant's P50, P99, P99.9, max and requests lost, the
full collections and their milliseconds, and how many of the slowest 1% of requests were in
flight during a collection of 10 ms or more.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ts_microbatch.tools.corpus import read_corpus  # noqa: E402
from ts_microbatch.tools.intervals import percentile, percentile_interval  # noqa: E402
from ts_microbatch.tools.mar import override_mar  # noqa: E402
from ts_microbatch.tools.openloop import run_open_loop  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

HOOK = """import gc, json, os, time
_path = os.environ.get("GC_PAUSES_LOG")
if _path:
    _started = [0.0]
    def _record(phase, info):
        if phase == "start":
            _started[0] = time.monotonic()
            return
        ms = 1000 * (time.monotonic() - _started[0])
        if info["generation"] == 2 or ms > 5:
            with open(f"{_path}.{os.getpid()}", "a") as out:
                out.write(json.dumps({"start": _started[0], "ms": ms,
                    "generation": info["generation"], "collected": info["collected"]}) + "\\n")
    gc.callbacks.append(_record)
"""
VARIANTS = {"unfrozen": {"freeze_gc": False}, "frozen": {"freeze_gc": True}}
WARMUP_REQUESTS = 2000
SLOW_PAUSE_MS = 10.0


def workload_mar(workload: str, work: Path) -> tuple[Path, list[bytes]]:
    """The workload's .mar, built from the checkout, and its corpus's bodies: the fraud
    scorer (``tabular``) or the sentence embedder (``embedding``, benchmarks/dev/embedding)."""
    if workload == "tabular":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from tabular_workload import tabular_models

        sources, corpus = tabular_models({"head-example"}, work)
        mar = sources["head-example"]
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "embedding_build", ROOT / "benchmarks/dev/embedding/build.py"
        )
        assert spec is not None and spec.loader is not None
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        mar = build.build_mar(work / "built", work_dir=work / "embedding")
        corpus = read_corpus(work / "embedding" / build.CORPUS_FILE)
    return mar, [corpus.bodies[i].data for i in corpus.sequence(len(corpus.order))]


def run_variant(
    work: Path, name: str, server_dir: Path, bodies: list[bytes], rate: float, requests: int
) -> dict[str, Any]:
    """A fresh server serving ``work/store/<name>.mar``: warm-up, then the measured run."""
    store, hook, log = work / "store", work / "hook", server_dir / "gc.jsonl"
    server_dir.mkdir(parents=True, exist_ok=True)
    pythonpath = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": pythonpath, "GC_PAUSES_LOG": str(log)}
    with TorchServe(store, server_dir, token_auth=False, env=env) as server:
        registered = server.register(
            f"{name}.mar", batch_size=32, max_batch_delay_ms=1, model_name=name
        )
        if registered.status != 200:
            raise SystemExit(f"{name}: not registered: {registered.body[:300]!r}")
        url = f"{server.inference_url}/predictions/{name}"
        headers = {"Content-Type": "application/json"}
        warmup = min(WARMUP_REQUESTS, requests // 2)
        run_open_loop(url, bodies, rate, warmup, seed=1, headers=headers)
        started = time.monotonic()
        result = run_open_loop(url, bodies, rate, requests, seed=2, headers=headers)
    if len(result.answered) < requests // 2:  # a wrong name or a broken model, not load
        raise SystemExit(f"{name}: {requests - len(result.answered)} failed: {result.errors}")
    pauses = []
    for path in server_dir.glob("gc.jsonl.*"):
        pauses += [json.loads(line) for line in path.read_text().splitlines()]
    return {"result": result, "started": started, "pauses": pauses}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The variant's latencies and its worker's collections during the measured run."""
    result, started = run["result"], run["started"]
    latencies = result.latencies_ms()
    ended = started + result.elapsed_s + 1.0
    during = [p for p in run["pauses"] if started <= p["start"] <= ended]
    full = [p["ms"] for p in during if p["generation"] == 2]
    slow = [p for p in during if p["ms"] >= SLOW_PAUSE_MS]
    p99 = percentile(latencies, 99)
    tail = [s for s, ms in zip(result.sends, latencies) if ms >= p99]

    def overlaps(sent: Any) -> bool:
        begin = started + sent.due_s
        end = started + (sent.done_s if sent.done_s is not None else sent.due_s + 60)
        return any(p["start"] <= end and p["start"] + p["ms"] / 1000 >= begin for p in slow)

    interval = percentile_interval(latencies, 99)
    return {
        "requests": len(latencies),
        "errors": dict(result.errors),  # status (0: no answer) -> count: 503 a full queue
        "p50_ms": percentile(latencies, 50),
        "p99_ms": interval.value,
        "p99_low_ms": interval.low,
        "p99_high_ms": interval.high,
        "p999_ms": percentile(latencies, 99.9),
        "max_ms": max(latencies),
        "full_collections": len(full),
        "full_collection_ms": sorted(round(ms, 1) for ms in full),
        "pauses_over_10ms": len(slow),
        "tail_requests": len(tail),
        "tail_in_a_pause": sum(1 for s in tail if overlaps(s)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("tabular", "embedding"), default="tabular")
    parser.add_argument("--rate", type=float, default=1200.0)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, help="default benchmarks/dev/results/gc_pauses/<workload>"
    )
    args = parser.parse_args()
    args.out = args.out or ROOT / "benchmarks/dev/results/gc_pauses" / args.workload
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gc-pauses-"))
    try:
        (work / "hook").mkdir()
        (work / "hook" / "sitecustomize.py").write_text(HOOK)
        mar, bodies = workload_mar(args.workload, work / "build")
        for name, override in VARIANTS.items():
            override_mar(mar, work / "store" / f"{name}.mar", override)
        rows = []
        for index in range(args.rounds):
            for name in VARIANTS:
                server_dir = work / "servers" / f"{name}-{index + 1}"
                run = run_variant(work, name, server_dir, bodies, args.rate, args.requests)
                row = {"round": index + 1, "variant": name, **summarize(run)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
        print(report(rows, args))
        (args.out / "report.md").write_text(report(rows, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# The worker's garbage collector and the tail: {args.workload} at {args.rate:g} "
        f"req/s open loop, {args.requests} requests a run, {args.rounds} rounds\n",
        "| round | freeze_gc | P50 ms | P99 ms [95%] | P99.9 ms | max ms | lost | full "
        "collections (ms each) | pauses >= 10 ms | slowest 1% in a pause |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = ", ".join(f"{ms:g}" for ms in r["full_collection_ms"][:8])
        lines.append(
            f"| {r['round']} | {r['variant'] == 'frozen'} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} [{r['p99_low_ms']:.1f}, {r['p99_high_ms']:.1f}] | "
            f"{r['p999_ms']:.1f} | {r['max_ms']:.1f} | {sum(r['errors'].values())} | "
            f"{r['full_collections']} ({each}) | "
            f"{r['pauses_over_10ms']} | {r['tail_in_a_pause']} of {r['tail_requests']} |"
        )
    by = {v: [r for r in rows if r["variant"] == v] for v in VARIANTS}
    if all(by.values()):
        ratio = statistics.median(
            a["p99_ms"] / b["p99_ms"] for a, b in zip(by["frozen"], by["unfrozen"]) if b["p99_ms"]
        )
        lines.append(f"\nfrozen / unfrozen P99, median of rounds: {ratio:.2f}x")
    if any(math.isinf(r["max_ms"]) for r in rows):
        lines.append("\n(inf: a request not answered within the 60 s timeout)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
