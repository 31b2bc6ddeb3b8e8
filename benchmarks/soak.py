"""Soak: many requests through one worker, its memory sampled all along (not part of CI).

The accelerator stand-in with our handler and the default benchmark settings
(benchmarks/config.json), on a TorchServe on loopback; ab sends the requests in chunks
(progress after each); a thread samples the worker's RSS every few seconds. The run
passes when no request failed, the worker never restarted, and RSS grows by less than
``--max-growth-mb-per-10k`` per 10,000 requests over the second half of the run (a leak
grows all along; the allocator's warm-up settles within the first half). The fit over
every chunk after the first is reported too.

    python benchmarks/soak.py --requests 100000 --concurrency 200 --out benchmarks/results/soak
    make soak
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "image_classifier"))

import bench_lib  # noqa: E402
import prepare  # noqa: E402
from ab import run_ab  # noqa: E402
from bench_packaging import package  # noqa: E402


class RssSampler(threading.Thread):
    """Samples a process's resident memory every ``interval_s`` until stopped."""

    def __init__(self, pid: int, interval_s: float) -> None:
        super().__init__(name="soak-rss", daemon=True)
        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MiB)
        self.stopped = threading.Event()
        self.started_at = time.monotonic()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                rss = self.process.memory_info().rss / 2**20
            except psutil.NoSuchProcess:
                return  # the worker died; the pid check reports it
            self.samples.append((time.monotonic() - self.started_at, rss))
            self.stopped.wait(self.interval_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=HERE / "config.json")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--rss-interval-s", type=float, default=2.0)
    parser.add_argument("--max-growth-mb-per-10k", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--from-json", type=Path, default=None, help="re-report a saved run")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        (pid,) = saved["chunks"][0]["worker_pids"]
        return report(args, saved["chunks"], [tuple(s) for s in saved["rss_samples"]], pid)
    config = bench_lib.load_config(args.config)
    point = {**bench_lib.sweep_points(config)[0], "concurrency": args.concurrency}
    work = bench_lib.scratch_dir("soak_")
    body = work / "input.jpg"
    body.write_bytes(prepare.make_jpeg(seed=0))
    name = package(
        work / "store", work / "build", "soak", "accelerator", "ours", config, point, None
    )
    chunks: list[dict[str, Any]] = []
    with bench_lib.project_server(work / "store", work / "server") as server:
        resp = server.register(
            name,
            batch_size=point["batch_size"],
            max_batch_delay_ms=point["max_batch_delay"],
            response_timeout_s=config["response_timeout"],
        )
        if resp.status != 200:
            raise SystemExit(f"register failed: {resp.status} {resp.body!r}")
        url = f"{server.inference_url}/predictions/{name}"
        token = server.token("inference")
        (pid,) = [w["pid"] for w in server.describe(name)["workers"]]
        sampler = RssSampler(pid, args.rss_interval_s)
        sampler.start()
        common: dict[str, Any] = {"token": token, "content_type": "image/jpeg"}
        common["progress"] = bench_lib.log
        run_ab(url, body, args.warmup, args.concurrency, work / "w.csv", label="warm-up", **common)
        done = 0
        while done < args.requests:
            n = min(args.chunk, args.requests - done)
            summary, latency = run_ab(
                url, body, n, args.concurrency, work / "c.csv", label=f"soak {done + n}", **common
            )
            done += n
            pids = [w["pid"] for w in server.describe(name)["workers"]]
            rss = psutil.Process(pid).memory_info().rss / 2**20 if pids == [pid] else None
            chunks.append(
                {
                    "requests_done": done,
                    "requests_per_s": summary["requests_per_s"],
                    "p99_ms": latency.get("p99_ms"),
                    "failed": int(summary["failed_requests"] + summary["non_2xx_responses"]),
                    "worker_pids": pids,
                    "rss_mib": rss,
                }
            )
            bench_lib.log(
                f"{done}/{args.requests}: {summary['requests_per_s']:.1f} req/s, "
                f"failed {chunks[-1]['failed']}, worker {pids}, RSS "
                + (f"{rss:.1f} MiB" if rss is not None else "gone")
            )
            if pids != [pid]:
                break
        sampler.stopped.set()
        sampler.join()
    return report(args, chunks, sampler.samples, pid)


def growth_per_10k(chunks: list[dict[str, Any]]) -> float:
    """MiB per 10,000 requests, from a straight line through the chunks' RSS."""
    points = [(c["requests_done"], c["rss_mib"]) for c in chunks if c["rss_mib"] is not None]
    if len(points) < 2:
        return float("nan")
    slope = np.polyfit([n for n, _ in points], [mib for _, mib in points], 1)[0]
    return float(slope) * 10_000


def report(
    args: argparse.Namespace,
    chunks: list[dict[str, Any]],
    samples: list[tuple[float, float]],
    pid: int,
) -> int:
    second_half = growth_per_10k(chunks[len(chunks) // 2 :])
    after_first = growth_per_10k(chunks[1:])
    requests = chunks[-1]["requests_done"] if chunks else 0
    result = {
        "requests": requests,
        "concurrency": args.concurrency,
        "failed": sum(c["failed"] for c in chunks),
        "worker_restarted": any(c["worker_pids"] != [pid] for c in chunks),
        "rss_growth_mib_per_10k_second_half": second_half,
        "rss_growth_mib_per_10k_after_first_chunk": after_first,
        "rss_by_chunk_mib": [c["rss_mib"] for c in chunks],
        "chunks": chunks,
        "rss_samples": samples,
    }
    passed = (
        result["failed"] == 0
        and not result["worker_restarted"]
        and second_half < args.max_growth_mb_per_10k
        and requests == args.requests
    )
    result["passed"] = passed
    print(
        f"soak {'PASSED' if passed else 'FAILED'}: {requests} requests at concurrency "
        f"{args.concurrency}, {result['failed']} failed, worker restarted: "
        f"{result['worker_restarted']}, RSS growth {second_half:.2f} MiB per 10,000 requests "
        f"over the second half (limit {args.max_growth_mb_per_10k}), {after_first:.2f} after "
        f"the first chunk; RSS by chunk {[round(m or 0, 1) for m in result['rss_by_chunk_mib']]}"
    )
    bench_lib.save_json(args.out, "soak.json", result)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
