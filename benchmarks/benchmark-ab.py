#!/usr/bin/env python3
"""Benchmarks TorchServe handlers side by side with apache bench, on this machine, in one run.

    python benchmarks/benchmark-ab.py --config benchmarks/config.json [--out benchmarks/runs/NAME]

For each scenario (real ResNet-18 on the CPU; or the accelerator stand-in, a SIMULATED
device whose forward costs a + b*n ms of wall time and no CPU) and each sweep point (lists
in the config are swept), every handler (plain ImageClassifier, upstream MicroBatching,
ours) is packaged, registered on a fresh TorchServe on loopback, warmed up, and driven by
`ab`. Next to each result: the ideal throughput its stage costs imply and the efficiency.
Writes results.json, results.csv and, for batch-size sweeps, PNG plots.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "examples/image_classifier")]

import bench_lib  # noqa: E402
import prepare  # noqa: E402

from ts_microbatch.server import TorchServe  # noqa: E402

HANDLER_FILES = {
    "plain": "image_classifier",
    "upstream": str(HERE / "handlers/upstream_mb_handler.py"),
    "ours": str(ROOT / "handlers/micro_batching_handler.py"),
    "noop": str(HERE / "handlers/noop_handler.py"),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- packaging ---------------------------------------------------------------------------


def model_config_yaml(config: dict[str, Any], point: dict[str, Any], handler: str) -> str:
    parallelism = config["parallelism"]
    lines = [
        f"minWorkers: {config['workers']}",
        f"maxWorkers: {config['workers']}",
        f"batchSize: {point['batch_size']}",
        f"maxBatchDelay: {point['max_batch_delay']}",
        f"responseTimeout: {config['response_timeout']}",
        "micro_batching:",
        f"  micro_batch_size: {point['micro_batch_size']}",
        "  parallelism:",
    ]
    lines += [
        f"    {stage}: {parallelism.get(stage, 1)}"
        for stage in ("preprocess", "inference", "postprocess")
    ]
    if handler == "ours":
        lines += ["handler:", f"  decoder: {config['decoder']}"]
    return "\n".join(lines) + "\n"


def package(
    store: Path,
    work: Path,
    name: str,
    scenario: str,
    handler: str,
    config: dict[str, Any],
    point: dict[str, Any],
    weights: str | None,
) -> str:
    """An unarchived model directory in the store (no zip: large weights pack slowly)."""
    import torch

    work.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    extra = [prepare.write_labels(str(work))]
    if scenario == "real":
        model_file = ROOT / "examples/image_classifier/model.py"
        serialized = work / "resnet18.pth"
        if not serialized.exists():  # made once per run; untrained unless --weights
            serialized = Path(prepare.write_weights(str(work), weights))
    else:
        model_file = HERE / "models/sim_accelerator.py"
        serialized = work / "sim.pth"
        torch.save({"scale": torch.ones(1)}, serialized)
        cost = work / "sim_accelerator.json"
        cost.write_text(json.dumps(config["accelerator"]))
        extra.append(str(cost))
    yaml = work / f"{name}.yaml"
    yaml.write_text(model_config_yaml(config, point, handler))
    cmd = [
        str(Path(sys.executable).with_name("torch-model-archiver")),
        "--force",
        "--model-name",
        name,
        "--version",
        "1.0",
        "--handler",
        HANDLER_FILES[handler],
        "--config-file",
        str(yaml),
        "--export-path",
        str(store),
        "--archive-format",
        "no-archive",
    ]
    if handler != "noop":
        cmd += [
            "--model-file",
            str(model_file),
            "--serialized-file",
            str(serialized),
            "--extra-files",
            ",".join(extra),
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"torch-model-archiver failed for {name}:\n{proc.stdout}{proc.stderr}")
    return name


# -- one measurement -----------------------------------------------------------------------


def run_ab(
    url: str,
    body: Path,
    requests: int,
    concurrency: int,
    token: str | None,
    csv_path: Path,
    label: str,
) -> tuple[dict[str, float], dict[str, float]]:
    # -k: TorchServe answers ab's HTTP/1.0 requests with "connection: keep-alive" and keeps
    # the socket open, so without keep-alive ab waits on every response until its timeout.
    cmd = [
        "ab",
        "-k",
        "-n",
        str(requests),
        "-c",
        str(concurrency),
        "-p",
        str(body),
        "-T",
        "image/jpeg",
        "-s",
        "180",
        "-e",
        str(csv_path),
    ]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    proc = subprocess.Popen(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []

    def progress() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("Completed"):
                log(f"  {label}: {line.strip()} of {requests}")
            elif not line.startswith("Finished"):
                errors.append(line)

    reader = threading.Thread(target=progress, daemon=True)
    reader.start()
    stdout, _ = proc.communicate()
    reader.join(5)
    if proc.returncode != 0:
        raise RuntimeError(f"ab failed ({proc.returncode}): {''.join(errors)}\n{stdout}")
    return bench_lib.parse_ab(stdout), bench_lib.parse_percentiles(csv_path.read_text())


def measure(
    server_dir: Path,
    store: Path,
    model: str,
    body: Path,
    config: dict[str, Any],
    point: dict[str, Any],
    label: str,
) -> dict[str, Any]:
    # Log mode: the per-batch HandlerTime and per-request QueueTime lines are read back
    # from the metric logs (Prometheus would only give aggregates).
    with TorchServe(
        model_store=store,
        workdir=server_dir,
        properties={"metrics_mode": "log"},
        base_config=ROOT / "configs/config.properties",
    ) as server:
        resp = server.register(
            model,
            batch_size=point["batch_size"],
            max_batch_delay_ms=point["max_batch_delay"],
            initial_workers=config["workers"],
            response_timeout_s=config["response_timeout"],
        )
        if resp.status != 200:
            raise RuntimeError(
                f"registering {model} failed: {resp.status} {resp.body!r}\n{server.log()[-3000:]}"
            )
        url = f"{server.inference_url}/predictions/{model}"
        token = server._token("inference")
        if config["warmup_requests"]:
            run_ab(
                url,
                body,
                max(config["warmup_requests"], point["concurrency"]),  # ab refuses n < c
                point["concurrency"],
                token,
                server_dir / "warmup.csv",
                f"{label} warm-up",
            )
        logs = {name: len(server.log(name)) for name in ("model_metrics.log", "ts_metrics.log")}
        summary, latency = run_ab(
            url,
            body,
            config["requests"],
            point["concurrency"],
            token,
            server_dir / "percentiles.csv",
            label,
        )
        handler_times = bench_lib.parse_handler_times(
            server.log("model_metrics.log")[logs["model_metrics.log"] :]
        )
        queue_times = bench_lib.parse_queue_times(
            server.log("ts_metrics.log")[logs["ts_metrics.log"] :]
        )
    batch_sizes = [n for _, n in handler_times]
    return {
        **summary,
        **latency,
        "errors": int(summary["failed_requests"] + summary["non_2xx_responses"]),
        "server_handler_ms": bench_lib.summarize([ms for ms, _ in handler_times]),
        "server_queue_ms": bench_lib.summarize(queue_times),
        "mean_batch_size": sum(batch_sizes) / len(batch_sizes) if batch_sizes else float("nan"),
    }


# -- stage limits, measured in-process -----------------------------------------------------


def preprocess_rate(
    decoder: str, threads: int, micro_batch_size: int, body: bytes, seconds: float = 3.0
) -> float:
    """Images/s the handler's preprocess reaches on this machine with `threads` threads."""
    import torch

    sys.path.insert(0, str(ROOT / "handlers"))
    from micro_batching_handler import MicroBatchingHandler

    handler = MicroBatchingHandler()
    handler.decoder = decoder
    handler.device = torch.device("cpu")
    rows = [{"body": body}] * micro_batch_size
    handler.preprocess(rows)
    done = [0] * threads
    deadline = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < deadline:
            handler.preprocess(rows)
            done[i] += micro_batch_size

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(loop, range(threads)))
    return sum(done) / (time.perf_counter() - start)


def inference_rate(
    scenario: str, config: dict[str, Any], micro_batch_size: int, seconds: float = 3.0
) -> float:
    threads = config["parallelism"].get("inference", 1)
    if scenario == "accelerator":
        cost = config["accelerator"]
        # Sleeps overlap across threads: a device with `threads` streams, by construction.
        return (
            threads
            * micro_batch_size
            * 1000.0
            / (cost["fixed_ms"] + cost["per_item_ms"] * micro_batch_size)
        )
    import torch
    from torchvision.models import resnet18

    model = resnet18(weights=None).eval()
    x = torch.randn(micro_batch_size, 3, 224, 224)
    with torch.inference_mode():
        model(x)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            model(x)
            n += micro_batch_size
    return n / (time.perf_counter() - start)


# -- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(HERE / "config.json"))
    parser.add_argument(
        "--out", default=None, help="result directory (default benchmarks/runs/<time>)"
    )
    parser.add_argument(
        "--weights", default=None, help="torchvision resnet18-f37072fd.pth for the real scenario"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep each server's logs in servers/"
    )
    args = parser.parse_args()
    if shutil.which("ab") is None:
        print(
            "error: `ab` not found: apt-get install apache2-utils (make bench does it)",
            file=sys.stderr,
        )
        return 2
    config = bench_lib.load_config(args.config)
    out = Path(args.out or HERE / "runs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    body_path = Path(config["input"]) if config.get("input") else out / "input.jpg"
    if not config.get("input"):
        body_path.write_bytes(prepare.make_jpeg(seed=0))
    body = body_path.read_bytes()
    log(f"input {body_path} ({len(body)} bytes); results in {out}")
    points = bench_lib.sweep_points(config)
    handlers = list(config["handlers"])
    total = len(config["scenarios"]) * len(points) * (len(handlers) + 1)
    rows: list[dict[str, Any]] = []
    limits: dict[str, Any] = {}
    step = 0
    for scenario in config["scenarios"]:
        for point in points:
            mbs = point["micro_batch_size"]
            key = f"{scenario}-mbs{mbs}"
            if key not in limits:
                log(f"measuring stage limits for {key} in-process")
                threads = config["parallelism"].get("preprocess", 1)
                limits[key] = {
                    "preprocess_ours": preprocess_rate(config["decoder"], threads, mbs, body),
                    "preprocess_pil": preprocess_rate("pil", threads, mbs, body),
                    "inference": inference_rate(scenario, config, mbs),
                }
                log("  " + ", ".join(f"{k} {v:.0f}/s" for k, v in limits[key].items()))
            tag = "-".join(f"{k[:3]}{v}" for k, v in point.items())
            results: dict[str, dict[str, Any]] = {}
            for handler in ["noop"] + handlers:
                step += 1
                name = f"{scenario}-{handler}-{tag}".replace("_", "")
                label = f"[{step}/{total}] {scenario} {handler} {point}"
                log(f"{label}: packaging and starting TorchServe")
                package(
                    out / "store",
                    out / "work" / scenario,
                    name,
                    scenario,
                    handler,
                    config,
                    point,
                    args.weights,
                )
                results[handler] = measure(
                    out / "servers" / name, out / "store", name, body_path, config, point, label
                )
                log(
                    f"{label}: {results[handler]['requests_per_s']:.1f} req/s, "
                    f"p99 {results[handler]['p99_ms']:.0f} ms, "
                    f"{results[handler]['errors']} errors"
                )
            overhead = results.pop("noop")["requests_per_s"]
            lim = limits[key]
            for handler, result in results.items():
                rates = {
                    "server": overhead,
                    "inference": lim["inference"],
                    "preprocess": lim["preprocess_ours"]
                    if handler == "ours"
                    else lim["preprocess_pil"],
                }
                # On this machine's cores the server's own work (frontend, ab, IPC: the noop
                # run) and preprocessing compete, and so does inference when it runs on the
                # CPU: their per-request times add. The simulated device's sleep does not.
                shared = ("server", "preprocess") + (("inference",) if scenario == "real" else ())
                ideal = bench_lib.ideal_throughput(rates, shared_cpu=shared)
                rows.append(
                    {
                        "scenario": scenario,
                        "handler": handler,
                        **point,
                        **result,
                        "server_overhead_requests_per_s": overhead,
                        "stage_rates": rates,
                        "ideal_requests_per_s": ideal,
                        "efficiency": result["requests_per_s"] / ideal,
                    }
                )
            (out / "results.json").write_text(
                json.dumps(
                    {
                        "machine": bench_lib.machine_info(),
                        "config": config,
                        "stage_limits": limits,
                        "results": rows,
                    },
                    indent=2,
                    default=str,
                )
            )
    bench_lib.write_csv(rows, out / "results.csv")
    for scenario in config["scenarios"]:
        scenario_rows = [r for r in rows if r["scenario"] == scenario]
        for x_key in bench_lib.SWEEP_KEYS:
            png = out / f"{x_key}_{scenario}.png"
            if bench_lib.plot_sweep(scenario_rows, png, f"{scenario} scenario", x_key):
                log(f"wrote {png}")
    print("\n" + bench_lib.format_table(rows))
    for scratch in ("store", "work") + (() if args.keep_logs else ("servers",)):
        shutil.rmtree(out / scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
