#!/usr/bin/env python3
"""Benchmarks TorchServe handlers side by side with apache bench, on this machine, in one run.

    python benchmarks/benchmark-ab.py --config benchmarks/config.json [--out benchmarks/runs/NAME]

For each scenario (real ResNet-18 on the CPU; or the accelerator stand-in, a SIMULATED
device whose forward costs a + b*n ms of wall time and no CPU) and each sweep point (lists
in the config are swept), every handler (plain ImageClassifier, upstream MicroBatching,
ours) is packaged, registered on a fresh TorchServe on loopback, warmed up, and driven by
`ab`. Next to each result: the ideal throughput its stage costs imply and the efficiency.
Writes results.json, results.csv and, for batch-size sweeps, PNG plots.

    python benchmarks/benchmark-ab.py --mar PATH.mar --corpus DIR|FILE.jsonl [--variant NAME=JSON]

benchmarks a user's own .mar instead (benchmarks/bench_mar.py): as packaged ("ours"), against
the same .mar with micro-batching turned off ("plain"), and any named overrides.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "examples/image_classifier")]

import bench_lib  # noqa: E402
import bench_mar  # noqa: E402
import corpus  # noqa: E402
from bench_lib import log  # noqa: E402
from bench_limits import ideal_for, stage_limits  # noqa: E402
from bench_packaging import package  # noqa: E402

from ts_microbatch.tools import ab  # noqa: E402
from ts_microbatch.tools.corpus import content_type_of  # noqa: E402
from ts_microbatch.tools.scrape import format_summary, summarize  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

# -- one measurement -----------------------------------------------------------------------


def run_bodies(
    url: str,
    sends: list[tuple[Path, str, int, int]],
    token: str | None,
    work: Path,
    label: str,
) -> tuple[dict[str, float], dict[str, float]]:
    """One `ab` per (body, content type, requests, clients), all at once; throughput over
    the longest, percentiles over every request's time (`ab -g`), so a single body and a
    mix are measured the same way."""
    running = []
    for i, (body, content_type, requests, clients) in enumerate(sends):
        tsv = work / f"ab-{i}.tsv"
        name = f"{label} {body.stem}" if len(sends) > 1 else label
        wait = ab.start_ab(
            url,
            body,
            requests,
            clients,
            token=token,
            output=["-g", str(tsv)],
            content_type=content_type,
            label=name,
            progress=log,
        )
        running.append((wait, tsv))
    runs = [ab.parse_ab(wait()) for wait, _ in running]
    ttimes = [t for _, tsv in running for t in ab.parse_gnuplot(tsv.read_text())]
    return ab.merge_ab(runs, ttimes)


def drive(
    point: dict[str, Any],
    url: str,
    paths: dict[str, Path],
    requests: int,
    token: str | None,
    work: Path,
    label: str,
) -> tuple[dict[str, float], dict[str, float]]:
    """ab at the point's concurrency with its body, or with the corpus mix: each body of
    corpus.MIX with its share of the clients and of the requests."""
    shares = corpus.MIX if point["body"] == "mix" else {point["body"]: 1.0}
    clients = corpus.split(point["concurrency"], shares)
    counts = corpus.split(requests, shares)
    sends = []
    for name, share in clients.items():
        path = paths[name]
        sends.append((path, content_type_of(path), max(counts[name], share), share))
    return run_bodies(url, sends, token, work, label)


Send = Callable[[str, Optional[str], int, Path, str], tuple[dict[str, Any], dict[str, float]]]


def image_sender(point: dict[str, Any], paths: dict[str, Path]) -> tuple[Send, tuple[bytes, str]]:
    """How a point's body (or the mix) is sent, and the body its sample responses use."""

    def send(
        url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        return drive(point, url, paths, requests, token, work, label)

    sample = paths["1080p" if point["body"] == "mix" else point["body"]]
    return send, (sample.read_bytes(), content_type_of(sample))


def measure(
    server_dir: Path,
    store: Path,
    model: str,
    config: dict[str, Any],
    point: dict[str, Any],
    label: str,
    scrape_path: Path,
    send: Send,
    sample: tuple[bytes, str],
    archive: str | None = None,
) -> dict[str, Any]:
    """One server, one model (the store's ``archive``, a .mar, when given; else its
    directory ``model``), warm-up then the measured run: ``send``, the image bodies'
    `ab` runs or the corpus driver. ``sample`` (body, content type): the sample answers.

    In log mode the per-batch HandlerTime and per-request QueueTime lines are read back
    from the metric logs. In prometheus mode (TorchServe then writes no metric logs)
    ``/metrics`` is scraped before and after the measured run, the second scrape is saved
    to ``scrape_path`` and the difference gives the pipeline's per-stage times and sizes.
    """
    mode = config["metrics_mode"]
    with bench_lib.project_server(store, server_dir, {"metrics_mode": mode}) as server:
        resp = server.register(
            archive or model,
            model_name=model if archive else None,
            batch_size=point["batch_size"],
            max_batch_delay_ms=point["max_batch_delay"],
            initial_workers=point["workers"],
            response_timeout_s=config["response_timeout"],
        )
        if resp.status != 200:
            raise bench_lib.RegistrationError(
                f"registering {model} failed: {resp.status} {resp.body!r}\n{server.log()[-3000:]}"
            )
        url = f"{server.inference_url}/predictions/{model}"
        token = server.token("inference")
        server_dir.mkdir(parents=True, exist_ok=True)
        if config["warmup_requests"]:
            # ab refuses fewer requests than clients
            warmup = max(config["warmup_requests"], point["concurrency"])
            send(url, token, warmup, server_dir, f"{label} warm-up")
        if mode == "prometheus":
            before = settled_scrape(server)
        else:  # where the measured run's lines will start
            logs = {name: len(server.log(name)) for name in ("model_metrics.log", "ts_metrics.log")}
        cpu_before = bench_lib.cpu_seconds(server)
        summary, latency = send(url, token, point["requests"], server_dir, label)
        cpu_after = bench_lib.cpu_seconds(server)
        # Where each request's CPU goes: the frontend (HTTP, batching, the bodies' bytes)
        # and the worker (decoding, the pipeline, the model).
        cpu_ms = {
            f"{side}_cpu_ms_per_request": 1000
            * (cpu_after[side] - cpu_before[side])
            / max(1.0, summary["complete_requests"])
            for side in cpu_before
        }
        samples = sample_responses(server, model, *sample)
        samples_path = scrape_path.parent.parent / "samples" / f"{scrape_path.stem}.json"
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        samples_path.write_text(json.dumps(samples, indent=2) + "\n")
        if mode == "prometheus":
            after = settled_scrape(server)
            scrape_path.parent.mkdir(parents=True, exist_ok=True)
            scrape_path.write_text(after)
            pipeline = summarize(after, before, model)
            handler_times: list[tuple[float, int]] = []
            queue_times = [pipeline["frontend_queue_ms"]]
        else:
            pipeline = None
            handler_times = bench_lib.parse_handler_times(
                server.log("model_metrics.log")[logs["model_metrics.log"] :]
            )
            queue_times = bench_lib.parse_queue_times(
                server.log("ts_metrics.log")[logs["ts_metrics.log"] :]
            )
    batch_sizes = [n for _, n in handler_times]
    result = {
        **summary,
        **latency,
        **cpu_ms,
        "errors": int(summary["failed_requests"] + summary["non_2xx_responses"]),
        "server_handler_ms": bench_lib.summarize([ms for ms, _ in handler_times]),
        "server_queue_ms": bench_lib.summarize(queue_times),
        "mean_batch_size": sum(batch_sizes) / len(batch_sizes) if batch_sizes else float("nan"),
        "sample_lengths": sorted({s["length"] for s in samples}),
    }
    if pipeline is not None:
        result.update(bench_lib.flatten_pipeline(pipeline))
    return result


def sample_responses(
    server: TorchServe, model: str, body: bytes, content_type: str
) -> list[dict[str, Any]]:
    """Sample answers kept with each run: 2 sent alone (micro-batches of 1) and 8 at once.

    ab counts a response whose length differs from the first one's as failed. The same
    image gives last-bit-different probabilities in micro-batches of 1-3 and of 4 or more
    (oneDNN chooses kernels by batch size; benchmarks/response_lengths.py measures it), so
    JSON bodies differ by a byte or two; these samples show it run by run."""

    def one(_: int) -> dict[str, Any]:
        resp = server.predict(model, body, content_type=content_type)
        return {"status": resp.status, "length": len(resp.body), "body": resp.body.decode()}

    alone = [one(i) for i in range(2)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(one, range(8)))
    return alone + together


def settled_scrape(server: TorchServe, timeout_s: float = 10.0) -> str:
    """A scrape of /metrics once the backend's metric lines have reached the frontend:
    two scrapes in a row that agree on every sample but the host gauges."""
    previous = None
    deadline = time.monotonic() + timeout_s
    while True:
        text = server.scrape_metrics()
        counted = [line for line in text.splitlines() if 'Level="Host"' not in line]
        if counted == previous or time.monotonic() > deadline:
            return text
        previous = counted
        time.sleep(0.25)  # the frontend has no "metrics flushed" event to wait on


def handlers_for(scenario: str, point: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """The runs at one point: the noop server-cost run first (unless turned off), then each
    handler. A user's .mar runs alone; upstream has no "auto"."""
    if scenario == "mar":
        return ["mar"]
    handlers = list(config["handlers"])
    if point["micro_batch_size"] == "auto":
        handlers = [h for h in handlers if h != "upstream"]
    return (["noop"] if config["server_overhead"] else []) + handlers


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
    parser.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="DIR",
        help="only write the first scenario's model with our handler, at the first point, as "
        "a model directory DIR (for python -m ts_microbatch.tools.tune --mar DIR), and exit",
    )
    bench_mar.add_arguments(parser)
    args = parser.parse_args()
    if args.mar:
        return bench_mar.main(args, measure, HERE / "runs")
    if ab.ab_problem():
        print(f"error: {ab.ab_problem()}", file=sys.stderr)
        return 2
    try:
        config = bench_lib.load_config(args.config)
    except bench_lib.BenchConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.export:
        target = args.export.resolve()
        scenario, point = config["scenarios"][0], bench_lib.sweep_points(config)[0]
        with tempfile.TemporaryDirectory() as work:
            package(target.parent, Path(work), target.name, scenario, "ours", config, point, None)
        log(f"wrote the {scenario} model with our handler to {target}")
        return 0
    out = Path(args.out or HERE / "runs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if config.get("input"):  # the user's body, named after its file
        paths = {Path(config["input"]).name: Path(config["input"])}
    else:
        paths = corpus.write(out / "bodies")
    for point_body in sorted({p["body"] for p in bench_lib.sweep_points(config)}):
        shown = corpus.MIX if point_body == "mix" else paths[point_body]
        log(f"body {point_body}: {shown}")
    log(f"results in {out}")
    runs = run_all(config, out, paths, args.weights)
    bench_lib.write_csv(runs, out / "runs.csv")
    rows = bench_lib.medians(runs)
    bench_lib.write_csv(rows, out / "results.csv")
    for scenario in config["scenarios"]:
        scenario_rows = [r for r in rows if r["scenario"] == scenario]
        for x_key in bench_lib.SWEEP_KEYS:
            png = out / f"{x_key}_{scenario}.png"
            if bench_lib.plot_sweep(scenario_rows, png, f"{scenario} scenario", x_key):
                log(f"wrote {png}")
    png = out / "bodies.png"
    if bench_lib.plot_bodies(rows, png, "medians by request body"):
        log(f"wrote {png}")
    print("\n" + bench_lib.format_table(rows))
    comparisons = bench_lib.compare_rounds(runs)
    if comparisons:
        (out / "comparisons.json").write_text(json.dumps(comparisons, indent=2) + "\n")
        print("\n" + bench_lib.format_comparisons(comparisons))
    for scratch in ("store", "work", "bodies") + (() if args.keep_logs else ("servers",)):
        shutil.rmtree(out / scratch, ignore_errors=True)
    return 0


def run_all(
    config: dict[str, Any], out: Path, paths: dict[str, Path], weights: str | None
) -> list[dict[str, Any]]:
    """Every scenario, point and handler, ``repeats`` times round-robin (so slow phases of a
    shared machine hit every config alike); one row per run. results.json is rewritten
    after each point with the runs so far and their medians."""
    points = bench_lib.sweep_points(config)
    plan = [
        (repeat, scenario, point, handler)
        for repeat in range(1, config["repeats"] + 1)
        for scenario in config["scenarios"]
        for point in points
        for handler in handlers_for(scenario, point, config)
    ]
    rows: list[dict[str, Any]] = []
    cache: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    for step, (repeat, scenario, point, handler) in enumerate(plan, start=1):
        limits = stage_limits(scenario, point, config, paths, cache, log)
        name = f"{scenario}-{handler}-{bench_lib.point_tag(point)}"
        shown = {k: v for k, v in point.items() if k != "micro_batching"}
        label = f"[{step}/{len(plan)}] {scenario} {handler} {shown}"
        log(f"{label}: packaging and starting TorchServe")
        work = out / "work" / scenario
        package(out / "store", work, name, scenario, handler, config, point, weights)
        send, sample = image_sender(point, paths)
        result = measure(
            out / "servers" / f"{name}-r{repeat}",
            out / "store",
            name,
            config,
            point,
            label,
            out / "metrics" / f"{name}-r{repeat}.prom",
            send,
            sample,
        )
        log(
            f"{label}: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.0f} ms, "
            f"{result['errors']} errors"
        )
        if "pipeline" in result and result["pipeline"]["micro_batches"]:
            log(f"  /metrics: {format_summary(result['pipeline'])}")
        results[handler] = result
        if step < len(plan) and plan[step][:3] == (repeat, scenario, point):
            continue  # more handlers at this point
        overhead = results.pop("noop", {}).get("requests_per_s")
        for run_handler, run in results.items():
            ideal = (
                ideal_for(scenario, run_handler, limits, overhead) if limits and overhead else None
            )
            rows.append(
                {
                    "scenario": scenario,
                    "handler": run_handler,
                    **point,
                    "repeat": repeat,
                    **run,
                    "server_overhead_requests_per_s": overhead,
                    "stage_limits": limits,
                    "ideal_requests_per_s": ideal,
                    "efficiency": run["requests_per_s"] / ideal if ideal else None,
                }
            )
        results = {}
        (out / "results.json").write_text(
            json.dumps(
                {
                    "machine": bench_lib.machine_info(),
                    "config": config,
                    "stage_limits": cache,
                    "results": bench_lib.medians(rows),
                    "runs": rows,
                },
                indent=2,
                default=str,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
