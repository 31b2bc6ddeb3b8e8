"""KServe v1 protocol under load: ts_microbatch at batch 32 against TorchServe's own envelope.

TorchServe's KServe envelope works only with batchSize 1 (it answers the first request of
a batch; pytorch/serve#2158), so that is upstream's only working KServe setting. Every
request here is a single-instance v1 body (``{"instances": [{"data": <base64 JPEG>}]}``)
POSTed to ``/v1/models/<name>:predict`` by ab, on the accelerator stand-in:

- ``envelope-b1``: the stock ImageClassifier under ``service_envelope=kserve``, batch 1;
- ``ours-b32``: our handler (same PIL decoding as ImageClassifier: like for like), batch 32;
- ``envelope-b32``: the envelope at batch 32: what it answers, from a burst of parallel
  requests (ab cannot measure it: TorchServe resets its connections after the errors).

Round-robin rounds, medians and per-round ratios; results as JSON.

    python benchmarks/dev/kserve_v1.py --rounds 3 --out benchmarks/results/kserve_v1
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "image_classifier"))

import bench_lib  # noqa: E402
import prepare  # noqa: E402
from ab import run_ab  # noqa: E402
from bench_packaging import package  # noqa: E402

from ts_microbatch.tools.server import TorchServe  # noqa: E402

JSON = "application/json"
# name: (handler, batch size, TorchServe properties)
SETUPS: dict[str, tuple[str, int, dict[str, str]]] = {
    "envelope-b1": ("plain", 1, {"service_envelope": "kserve"}),
    "ours-b32": ("ours", 32, {}),
}
BROKEN = ("envelope-b32", "plain", 32, {"service_envelope": "kserve"})


def serve(
    work: Path,
    config: dict[str, Any],
    setup: str,
    handler: str,
    batch_size: int,
    properties: dict[str, str],
    label: str,
) -> tuple[TorchServe, str]:
    """Packages ``handler`` on the accelerator stand-in and starts a TorchServe serving it;
    the caller stops the server."""
    point = {**bench_lib.sweep_points(config)[0], "batch_size": batch_size}
    store = work / f"store-{setup}"
    build = work / f"build-{setup}"
    name = package(store, build, setup, "accelerator", handler, config, point, None)
    server = bench_lib.project_server(store, work / f"server-{setup}-{label}", properties).start()
    resp = server.register(name, batch_size=batch_size, max_batch_delay_ms=point["max_batch_delay"])
    if resp.status != 200:
        server.stop()
        raise RuntimeError(f"register {setup}: {resp.status} {resp.body!r}")
    return server, f"{server.inference_url}/v1/models/{name}:predict"


def burst(work: Path, config: dict[str, Any], body: Path, requests: int) -> dict[str, Any]:
    """What TorchServe's envelope answers at batch 32: status counts of a parallel burst."""
    setup, handler, batch_size, properties = BROKEN
    server, url = serve(work, config, setup, handler, batch_size, properties, "burst")
    try:

        def send(_: int) -> int:
            try:
                return server.request(
                    "POST",
                    url,
                    body=body.read_bytes(),
                    headers={"Content-Type": JSON},
                    timeout_s=60,
                ).status
            except OSError:
                return -1

        with ThreadPoolExecutor(max_workers=64) as pool:
            statuses = list(pool.map(send, range(requests)))
    finally:
        server.stop()
    counts = {str(code): statuses.count(code) for code in sorted(set(statuses))}
    print(f"{setup}: {requests} parallel single-instance requests answered {counts}")
    return {"setup": setup, "requests": requests, "statuses": counts}


def run_one(
    work: Path,
    config: dict[str, Any],
    setup: str,
    body: Path,
    requests: int,
    concurrency: int,
    label: str,
) -> dict[str, Any]:
    handler, batch_size, properties = SETUPS[setup]
    server, url = serve(work, config, setup, handler, batch_size, properties, label)
    try:
        token = server.token("inference")
        common: dict[str, Any] = {"token": token, "content_type": JSON, "progress": bench_lib.log}
        run_ab(url, body, 200, concurrency, work / "w.csv", label=f"{label} warm-up", **common)
        summary, latency = run_ab(
            url, body, requests, concurrency, work / "m.csv", label=label, **common
        )
        sample = server.request("POST", url, body=body.read_bytes(), headers={"Content-Type": JSON})
    finally:
        server.stop()
    return {
        "setup": setup,
        "requests_per_s": summary["requests_per_s"],
        "p50_ms": latency.get("p50_ms"),
        "p99_ms": latency.get("p99_ms"),
        "non_2xx": int(summary["non_2xx_responses"]),
        "failed": int(summary["failed_requests"]),
        "sample_status": sample.status,
        "sample_body": sample.body.decode(errors="replace")[:300],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=HERE.parent / "config.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    config = {**bench_lib.load_config(args.config), "decoder": "pil"}  # like for like
    work = bench_lib.scratch_dir("kserve_v1_")
    image = prepare.make_jpeg(seed=0)
    body = work / "v1.json"
    body.write_text(json.dumps({"instances": [{"data": base64.b64encode(image).decode()}]}))
    runs = []
    for round_ in range(1, args.rounds + 1):
        for setup in SETUPS:
            label = f"round {round_} {setup}"
            result = run_one(work, config, setup, body, args.requests, args.concurrency, label)
            result["round"] = round_
            runs.append(result)
            bench_lib.log(
                f"{label}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']} ms, "
                f"non-2xx {result['non_2xx']}, sample {result['sample_status']}"
            )
    report = summarize(runs, args)
    report["envelope_b32"] = burst(work, config, body, 256)
    bench_lib.save_json(args.out, "results.json", report)
    return 0


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    medians = {}
    for setup in SETUPS:
        rows = [r for r in runs if r["setup"] == setup]
        medians[setup] = {
            key: statistics.median(r[key] for r in rows)
            for key in ("requests_per_s", "p50_ms", "p99_ms", "non_2xx")
        }
    ratios = []
    for round_ in sorted({r["round"] for r in runs}):
        ours = next(r for r in runs if r["round"] == round_ and r["setup"] == "ours-b32")
        env = next(r for r in runs if r["round"] == round_ and r["setup"] == "envelope-b1")
        ratios.append(
            {
                "round": round_,
                "throughput": ours["requests_per_s"] / env["requests_per_s"],
                "p99": ours["p99_ms"] / env["p99_ms"],
            }
        )
    print("setup | req/s | p50 ms | p99 ms | non-2xx (medians)")
    for setup, row in medians.items():
        print(
            f"{setup} | {row['requests_per_s']:.1f} | {row['p50_ms']:.0f} | "
            f"{row['p99_ms']:.0f} | {row['non_2xx']:.0f}"
        )
    for r in ratios:
        print(
            f"round {r['round']}: ours-b32 / envelope-b1 throughput {r['throughput']:.2f}x, "
            f"p99 {r['p99']:.2f}x"
        )
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "medians": medians,
        "ratios": ratios,
        "runs": runs,
    }


if __name__ == "__main__":
    raise SystemExit(main())
